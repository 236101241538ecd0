"""What ``nodelock locks`` says about a lock, from plain data; and where a holder pod stands."""

from __future__ import annotations

from typing import Any

import pytest

from handoff.holder import HolderState, HolderStatus, holder_status
from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX
from lockd.lease import LeaseFormat
from lockd.model import FencingToken, Holder, HolderKey, NodeLockView, NodeName, Outcome
from nodelock.locks import Row, describe, duration_text, render_table, state_text

FMT = LeaseFormat(namespace=DEFAULT_LOCK_NAMESPACE, prefix=DEFAULT_PREFIX)
NODE = NodeName("gpu-1")
POD = Holder(HolderKey("team/train-0"), "uid-0", {"assignment": '{"c":["GPU-0"]}'})
T0 = "2024-05-01T12:00:00.000000Z"


def pod(**status: Any) -> dict[str, Any]:
    node = status.pop("node", "gpu-1")
    return {
        "metadata": {"name": "train-0", "namespace": "team", "uid": status.pop("uid", "uid-0")},
        "spec": {"nodeName": node} if node else {},
        "status": status,
    }


@pytest.mark.parametrize(
    ("obj", "state"),
    [
        (None, HolderState.GONE),
        (pod(uid="uid-other"), HolderState.GONE),
        (pod(phase="Failed", reason="UnexpectedAdmissionError"), HolderState.FINISHED),
        (pod(phase="Succeeded"), HolderState.FINISHED),
        (pod(phase="Pending", node=None), HolderState.NOT_BOUND),
        (pod(phase="Pending", node="gpu-2"), HolderState.BOUND_ELSEWHERE),
        (pod(phase="Running"), HolderState.ADMITTED),
        (
            pod(phase="Pending", containerStatuses=[{"state": {"waiting": {}}}]),
            HolderState.ADMITTED,
        ),
        (pod(phase="Unknown"), HolderState.UNKNOWN),
        (pod(phase="Pending"), HolderState.IN_HANDOFF),
        (pod(), HolderState.IN_HANDOFF),
    ],
)
def test_holder_status(obj: dict[str, Any] | None, state: HolderState) -> None:
    status = holder_status(obj, uid="uid-0", node="gpu-1")
    assert status.state is state
    assert status.in_handoff == (state in (HolderState.IN_HANDOFF, HolderState.UNKNOWN))


def held_row(holder: HolderStatus, *, expired: str) -> Row:
    body = FMT.acquired(
        {"metadata": {"name": NODE, "resourceVersion": "5"}},
        POD,
        token=FencingToken(7),
        duration_s=15,
        now=T0,
    )
    return Row(NodeLockView(FMT.parse(body), 0.0, False), holder, 200.0, expired, False)


def test_a_stuck_lock_says_why() -> None:
    row = held_row(holder_status(pod(phase="Pending"), uid="uid-0", node="gpu-1"), expired="yes")
    assert state_text(row).startswith("STUCK: holder pod is Pending on this node and not admitted")
    assert "never taken over" in state_text(row)


def test_an_expired_lock_whose_holder_left_can_be_taken_over() -> None:
    row = held_row(holder_status(None, uid="uid-0", node="gpu-1"), expired="yes")
    assert state_text(row) == "expired, can be taken over: holder pod no longer exists"


def test_a_fresh_lock_is_in_handoff() -> None:
    row = held_row(holder_status(pod(), uid="uid-0", node="gpu-1"), expired="no")
    assert state_text(row).startswith("in handoff:")


def test_table_and_description() -> None:
    held = held_row(holder_status(pod(), uid="uid-0", node="gpu-1"), expired="no")
    free_body = FMT.released(
        FMT.new_lease(NodeName("gpu-2"), POD, duration_s=15, now=T0),
        outcome=Outcome.ALLOCATED,
        now=T0,
    )
    free = Row(NodeLockView(FMT.parse(free_body), 0.0, False), None, None, "-", False)
    lines = render_table([held, free]).splitlines()
    assert lines[0].split() == ["NODE", "HOLDER", "TOKEN", "AGE", "EXPIRED", "STATE"]
    assert lines[1].split()[:5] == ["gpu-1", "team/train-0", "7", "3m20s", "no"]
    assert lines[2].split()[:5] == ["gpu-2", "-", "1", "-", "-"]
    assert lines[2].endswith("free (last: team/train-0 allocated, token 1)")
    fields = dict(
        line.split(": ", 1) for line in describe(held, namespace="nodelock-system").splitlines()
    )
    assert fields["holder"].strip() == "team/train-0 (uid uid-0)"
    assert fields["fencing token"].strip() == "7"
    assert fields["data assignment"].strip() == '{"c":["GPU-0"]}'
    assert fields["state"].strip().startswith("in handoff")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "0s"), (59.9, "59s"), (192, "3m12s"), (7500, "2h05m"), (356400, "4d03h")],
)
def test_duration_text(seconds: float | None, text: str) -> None:
    assert duration_text(seconds) == text
