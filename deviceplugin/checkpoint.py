"""The plugin's node-local checkpoint: handoff progress and releases still to be made.

kubelet keeps its own device checkpoint and, after a restart, asks again only for containers it
has no devices for; the plugin's progress must survive its own restart the same way, or it would
repeat or skip a container.  A release that could not be written (API server down) is kept here
too, so a restart retries it instead of leaking the lock.

Guarantees: ``save`` replaces the file atomically (temporary file, fsync, rename, fsync of the
directory), so a crash leaves either the old or the new checkpoint, never a torn one.  ``load``
refuses a file it cannot read rather than guessing (``CheckpointError``, user-facing).
Not guaranteed: safety when two processes use one file (one plugin per node and state dir).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from deviceplugin.decide import HandoffProgress
from handoff.wire import ContainerName, DeviceID, valid_device_id
from lockd.model import FencingToken, Holder, HolderKey, NodeName, Outcome

VERSION = 1
SERVED_PODS_KEPT = 64  # UIDs of the pods served most recently (their statuses may still lag)


class CheckpointError(Exception):
    """The checkpoint file exists but cannot be used."""

    user_facing = True


@dataclass(frozen=True)
class PendingRelease:
    """A lock release decided but not yet written: holder, token and how the handoff ended."""

    holder: HolderKey
    uid: str
    token: FencingToken
    outcome: Outcome

    @classmethod
    def of(cls, holder: Holder, token: FencingToken, outcome: Outcome) -> PendingRelease:
        return cls(holder.key, holder.uid, token, outcome)


@dataclass(frozen=True)
class Checkpoint:
    """Everything the plugin must not forget across a restart."""

    node: NodeName
    progress: HandoffProgress | None = None
    pending: tuple[PendingRelease, ...] = ()
    served_pods: tuple[str, ...] = ()  # UIDs, oldest first, at most SERVED_PODS_KEPT

    def with_pending(self, release: PendingRelease) -> Checkpoint:
        kept = tuple(p for p in self.pending if p.token != release.token)
        return replace(self, pending=(*kept, release))

    def without_pending(self, token: FencingToken) -> Checkpoint:
        return replace(self, pending=tuple(p for p in self.pending if p.token != token))

    def with_progress(self, progress: HandoffProgress | None) -> Checkpoint:
        return replace(self, progress=progress)

    def with_served(self, uid: str) -> Checkpoint:
        """Remember that a container of pod ``uid`` was served (bounded, newest last)."""
        kept = tuple(u for u in self.served_pods if u != uid)
        return replace(self, served_pods=(*kept, uid)[-SERVED_PODS_KEPT:])


def checkpoint_path(state_dir: Path, node: NodeName) -> Path:
    """One file per node, so simulated nodes may share a state directory."""
    return state_dir / f"deviceplugin-{node}.json"


def to_json(cp: Checkpoint) -> dict[str, Any]:
    progress = None
    if cp.progress is not None:
        progress = {
            "holder": cp.progress.holder,
            "uid": cp.progress.uid,
            "token": cp.progress.token,
            "served": list(cp.progress.served),
            "given": [list(ids) for ids in cp.progress.given],
        }
        if cp.progress.resources:  # absent while every served container had whole GPUs
            progress["resources"] = list(cp.progress.resources)
    return {
        "version": VERSION,
        "node": cp.node,
        "progress": progress,
        "pending": [
            {"holder": p.holder, "uid": p.uid, "token": p.token, "outcome": p.outcome.value}
            for p in cp.pending
        ],
        "served_pods": list(cp.served_pods),
    }


def from_json(raw: Any, node: NodeName) -> Checkpoint:
    """Parse a checkpoint; raises ``ValueError`` (with what is wrong) for anything unexpected."""
    if not isinstance(raw, dict) or raw.get("version") != VERSION:
        raise ValueError(f"not a version {VERSION} device plugin checkpoint")
    if raw.get("node") != node:
        raise ValueError(f"it belongs to node {raw.get('node')!r}, not {node!r}")
    progress = None
    p = raw.get("progress")
    if p is not None:
        served = p["served"]
        if not isinstance(served, list) or not all(isinstance(c, str) for c in served):
            raise ValueError("progress.served must be a list of container names")
        given = p.get("given") or []  # absent in checkpoints written before it was kept
        if (
            not isinstance(given, list)
            or len(given) > len(served)
            or not all(isinstance(g, list) and all(valid_device_id(d) for d in g) for g in given)
        ):
            raise ValueError(
                "progress.given must be a list (one per served container) of device ID lists"
            )
        resources = p.get("resources") or []  # absent: every entry had whole GPUs
        if (
            not isinstance(resources, list)
            or len(resources) > len(served)
            or not all(isinstance(r, str) and r for r in resources)
        ):
            raise ValueError(
                "progress.resources must be a list (one per served container) of resource names"
            )
        progress = HandoffProgress(
            holder=HolderKey(str(p["holder"])),
            uid=str(p["uid"]),
            token=FencingToken(_int(p["token"])),
            served=tuple(ContainerName(c) for c in served),
            given=tuple(tuple(DeviceID(d) for d in g) for g in given),
            resources=tuple(str(r) for r in resources),
        )
    pending = tuple(
        PendingRelease(
            holder=HolderKey(str(r["holder"])),
            uid=str(r["uid"]),
            token=FencingToken(_int(r["token"])),
            outcome=Outcome(r["outcome"]),
        )
        for r in raw.get("pending") or []
    )
    served_pods = raw.get("served_pods") or []  # absent in files written before it was kept
    if not isinstance(served_pods, list) or not all(isinstance(u, str) for u in served_pods):
        raise ValueError("served_pods must be a list of pod UIDs")
    return Checkpoint(node, progress, pending, tuple(served_pods[-SERVED_PODS_KEPT:]))


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value


def load(path: Path, node: NodeName) -> Checkpoint:
    """Read the checkpoint at ``path``; an empty one when the file does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Checkpoint(node)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    try:
        return from_json(json.loads(text), node)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"checkpoint {path} is unusable ({exc}); it records which containers of the pod in "
            "handoff were served — move it aside only when no GPU pod is being admitted here"
        ) from exc


def save(path: Path, cp: Checkpoint, *, durable: bool = True) -> None:
    """Replace the checkpoint at ``path`` atomically, and durably (fsync of the file and its
    directory) unless ``durable`` is False: then a crash may leave the previous checkpoint,
    which must be safe to resume from."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(to_json(cp), indent=1, sort_keys=True).encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
