"""The checkpoint: progress survives a restart, writes are atomic and synced before the rename,
a damaged file is set aside for the safe state, another version's or node's file is refused."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from deviceplugin import checkpoint
from deviceplugin.checkpoint import (
    SERVED_PODS_KEPT,
    Checkpoint,
    CheckpointError,
    PendingRelease,
)
from deviceplugin.decide import (
    Allocation,
    Context,
    HandoffProgress,
    decide_allocate,
)
from handoff.wire import ContainerName, DeviceID, format_assignment
from lockd.model import FencingToken, Holder, HolderKey, LockRecord, NodeLockView, NodeName, Outcome

NODE = NodeName("n1")
GPUS = [DeviceID(f"GPU-{i}") for i in range(4)]
CTX = Context(node=NODE, devices=dict.fromkeys(GPUS, True))
ASSIGNMENT = {ContainerName("a"): [GPUS[0]], ContainerName("b"): [GPUS[1], GPUS[2]]}
HOLDER = Holder(HolderKey("ns/p"), "uid-1", {"assignment": format_assignment(ASSIGNMENT)})
VIEW = NodeLockView(
    LockRecord(NODE, HOLDER, FencingToken(4), 15, None, None, "9"), 0.0, expired=False
)
POD = {
    "metadata": {
        "namespace": "ns",
        "name": "p",
        "uid": "uid-1",
        "annotations": {
            "nodelock.io/assignment": format_assignment(ASSIGNMENT),
            "nodelock.io/token": "4",
        },
    },
    "spec": {
        "nodeName": "n1",
        "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
        ],
    },
}


def test_progress_survives_a_restart_without_repeating_or_skipping(tmp_path: Path) -> None:
    path = checkpoint.checkpoint_path(tmp_path, NODE)
    cp = checkpoint.load(path, NODE)
    assert cp == Checkpoint(NODE)

    first = decide_allocate(VIEW, POD, [GPUS[0]], cp.progress, CTX)
    assert isinstance(first, Allocation)
    assert first.container == "a"
    checkpoint.save(path, cp.with_progress(first.progress))

    restarted = checkpoint.load(path, NODE)  # a new process reads the file
    assert restarted.progress == first.progress
    second = decide_allocate(VIEW, POD, [GPUS[2], GPUS[1]], restarted.progress, CTX)
    assert isinstance(second, Allocation)
    assert second.container == "b"
    assert second.last


def test_round_trip_with_pending_releases(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    cp = (
        Checkpoint(NODE)
        .with_progress(
            HandoffProgress(HolderKey("ns/p"), "u", FencingToken(3), (ContainerName("x"),))
        )
        .with_pending(PendingRelease.of(HOLDER, FencingToken(2), Outcome.ALLOCATED))
        .with_pending(PendingRelease.of(HOLDER, FencingToken(3), Outcome.REJECTED))
    )
    checkpoint.save(path, cp)
    again = checkpoint.load(path, NODE)
    assert again == cp
    assert again.without_pending(FencingToken(2)).pending == (
        PendingRelease(HolderKey("ns/p"), "uid-1", FencingToken(3), Outcome.REJECTED),
    )


def test_pending_release_for_one_token_is_kept_once() -> None:
    cp = Checkpoint(NODE).with_pending(PendingRelease.of(HOLDER, FencingToken(2), Outcome.REJECTED))
    cp = cp.with_pending(PendingRelease.of(HOLDER, FencingToken(2), Outcome.ALLOCATED))
    assert [p.outcome for p in cp.pending] == [Outcome.ALLOCATED]


def test_save_replaces_atomically_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / "state" / "cp.json"
    for token in range(1, 4):
        progress = HandoffProgress(HolderKey("ns/p"), "u", FencingToken(token), ())
        checkpoint.save(path, Checkpoint(NODE, progress))
    assert os.listdir(path.parent) == ["cp.json"]
    loaded = checkpoint.load(path, NODE)
    assert loaded.progress is not None
    assert loaded.progress.token == 3


DAMAGED = [
    "",  # a rename of data that never reached the disk, after a power loss
    "{",
    "[]",
    json.dumps({"version": 1, "node": "n1", "progress": {"holder": "a/b"}}),
    json.dumps(
        {
            "version": 1,
            "node": "n1",
            "progress": {"holder": "a/b", "uid": "u", "token": -1, "served": []},
        }
    ),
    json.dumps(
        {
            "version": 1,
            "node": "n1",
            "pending": [{"holder": "a/b", "uid": "u", "token": 1, "outcome": "nope"}],
        }
    ),
]


@pytest.mark.parametrize("content", DAMAGED)
def test_a_damaged_checkpoint_starts_from_the_safe_state_and_is_kept_aside(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "cp.json"
    path.write_text(content)
    with caplog.at_level(logging.ERROR):
        loaded = checkpoint.load(path, NODE)
    assert loaded == Checkpoint(NODE)  # no progress, no pending release, no served pod
    kept = tmp_path / "cp.json.damaged"
    assert kept.read_text() == content  # nothing lost: the damaged file is set aside
    assert not path.exists()
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "cp.json" in record.getMessage()
    assert "cp.json.damaged" in record.getMessage()


@pytest.mark.parametrize(
    "content",
    [
        json.dumps({"version": 99, "node": "n1"}),
        json.dumps({"version": 1, "node": "n2"}),
    ],
)
def test_a_checkpoint_of_another_version_or_node_is_refused_with_its_path(
    tmp_path: Path, content: str
) -> None:
    """Not damage but a configuration to fix (a downgrade, a renamed node): refused as before."""
    path = tmp_path / "cp.json"
    path.write_text(content)
    with pytest.raises(CheckpointError, match=r"cp\.json"):
        checkpoint.load(path, NODE)
    assert path.read_text() == content


@pytest.mark.parametrize("durable", [True, False])
def test_every_save_syncs_the_file_before_it_renames_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    """Write, fsync, rename (then fsync the directory when ``durable``): a rename of data not yet
    on the disk can leave an empty file after a power loss.  The system calls run for real; the
    test only records their order."""
    path = tmp_path / "cp.json"
    checkpoint.save(path, Checkpoint(NODE))
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        calls.append("fsync dir" if Path(target) == tmp_path else "fsync file")
        real_fsync(fd)

    def replace(src: str, dst: str | Path) -> None:
        calls.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    checkpoint.save(path, Checkpoint(NODE, served_pods=("u",)), durable=durable)
    expected = ["fsync file", "rename", "fsync dir"] if durable else ["fsync file", "rename"]
    assert calls == expected
    assert checkpoint.load(path, NODE).served_pods == ("u",)


def test_checkpoint_files_are_per_node(tmp_path: Path) -> None:
    a = checkpoint.checkpoint_path(tmp_path, NodeName("n1"))
    b = checkpoint.checkpoint_path(tmp_path, NodeName("n2"))
    assert a != b
    assert a.parent == b.parent == tmp_path


def test_served_pods_are_kept_bounded_and_survive_a_restart(tmp_path: Path) -> None:
    cp = Checkpoint(NodeName("n1"))
    for i in range(SERVED_PODS_KEPT + 5):
        cp = cp.with_served(f"uid-{i}")
    cp = cp.with_served(f"uid-{SERVED_PODS_KEPT}")  # again: moves to the end, no duplicate
    assert len(cp.served_pods) == SERVED_PODS_KEPT
    assert cp.served_pods[-1] == f"uid-{SERVED_PODS_KEPT}"
    assert "uid-0" not in cp.served_pods
    path = tmp_path / "cp.json"
    checkpoint.save(path, cp)
    assert checkpoint.load(path, NodeName("n1")) == cp
