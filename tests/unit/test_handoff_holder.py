"""The one classifier of a lock holder's pod (docs/design.md, "Expiry and takeover"), and that
every part uses it."""

from __future__ import annotations

from typing import Any

import pytest

from deviceplugin.decide import HandoffProgress, handoff_abandoned
from handoff.holder import HolderState, holder_status, pod_facts
from handoff.wire import ContainerName, Keys
from lockd.model import FencingToken, HolderKey, NodeName
from scheduler_ext.state import pod_state
from scheduler_ext.takeover import judge

NODE = NodeName("gpu-1")
UID = "uid-0"

WAITING = {"name": "c", "state": {"waiting": {"reason": "ContainerCreating"}}}
RUNNING = {"name": "c", "state": {"running": {}}, "containerID": "containerd://abc"}
INIT_DONE = {"name": "i", "state": {"terminated": {"exitCode": 0}}}
DELETING = "2024-05-01T12:00:00Z"


def pod(
    *,
    phase: str | None = "Pending",
    node: str | None = NODE,
    uid: str = UID,
    deleting: bool = False,
    **status: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "train-0", "namespace": "team", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = DELETING
    obj: dict[str, Any] = {"metadata": meta, "spec": {"containers": [{"name": "c"}]}}
    if node is not None:
        obj["spec"]["nodeName"] = node
    if phase is not None:
        status["phase"] = phase
    obj["status"] = status
    return obj


TABLE: list[tuple[str, dict[str, Any] | None, HolderState]] = [
    ("no pod", None, HolderState.GONE),
    ("another uid", pod(uid="uid-other"), HolderState.GONE),
    ("another uid, Pending here", pod(uid="uid-other", deleting=True), HolderState.GONE),
    ("Failed", pod(phase="Failed", reason="UnexpectedAdmissionError"), HolderState.FINISHED),
    ("Succeeded", pod(phase="Succeeded"), HolderState.FINISHED),
    ("Failed, unbound", pod(phase="Failed", node=None), HolderState.FINISHED),
    ("Failed, deleting", pod(phase="Failed", deleting=True), HolderState.FINISHED),
    ("not bound", pod(node=None), HolderState.NOT_BOUND),
    ("not bound, deleting", pod(node=None, deleting=True), HolderState.NOT_BOUND),
    ("bound elsewhere", pod(node="gpu-2"), HolderState.BOUND_ELSEWHERE),
    ("bound elsewhere, Running", pod(node="gpu-2", phase="Running"), HolderState.BOUND_ELSEWHERE),
    ("Running", pod(phase="Running"), HolderState.ADMITTED),
    ("Running, deleting", pod(phase="Running", deleting=True), HolderState.ADMITTED),
    ("container Waiting", pod(containerStatuses=[WAITING]), HolderState.ADMITTED),
    ("container started", pod(containerStatuses=[RUNNING]), HolderState.ADMITTED),
    ("init done", pod(initContainerStatuses=[INIT_DONE]), HolderState.ADMITTED),
    ("init Waiting", pod(initContainerStatuses=[WAITING]), HolderState.ADMITTED),
    ("Waiting, deleting", pod(containerStatuses=[WAITING], deleting=True), HolderState.ADMITTED),
    ("phase Unknown", pod(phase="Unknown"), HolderState.UNKNOWN),
    ("Pending", pod(), HolderState.IN_HANDOFF),
    ("no phase yet", pod(phase=None), HolderState.IN_HANDOFF),
    ("empty status lists", pod(containerStatuses=[]), HolderState.IN_HANDOFF),
    ("Pending, deleting", pod(deleting=True), HolderState.IN_HANDOFF),
]
IDS = [name for name, _, _ in TABLE]


@pytest.mark.parametrize(("obj", "state"), [(o, s) for _, o, s in TABLE], ids=IDS)
def test_every_phase(obj: dict[str, Any] | None, state: HolderState) -> None:
    status = holder_status(obj, uid=UID, node=NODE)
    assert status.state is state
    assert status.why
    assert status.in_handoff == (state in (HolderState.IN_HANDOFF, HolderState.UNKNOWN))
    assert status.final == (
        state not in (HolderState.IN_HANDOFF, HolderState.UNKNOWN, HolderState.NOT_BOUND)
    )


def test_a_deleting_pod_says_so() -> None:
    assert "being deleted" in holder_status(pod(deleting=True), uid=UID, node=NODE).why


def test_an_empty_uid_matches_any_pod_of_the_name() -> None:
    assert holder_status(pod(uid="x"), uid="", node=NODE).state is HolderState.IN_HANDOFF


def test_mistyped_fields_do_not_crash() -> None:
    facts = pod_facts({"metadata": "x", "spec": [], "status": {"containerStatuses": "x"}})
    assert (facts.uid, facts.node, facts.has_statuses) == ("", "", False)


@pytest.mark.parametrize(("obj", "state"), [(o, s) for _, o, s in TABLE], ids=IDS)
def test_the_extender_and_the_plugin_agree_with_it(
    obj: dict[str, Any] | None, state: HolderState
) -> None:
    """The takeover check allows exactly what the plugin calls abandoned: a pod out of handoff."""
    left = not holder_status(obj, uid=UID, node=NODE).in_handoff
    cached = None if obj is None else pod_state(obj, keys=Keys(), resource="nvidia.com/gpu")
    verdict = judge(cached, holder_uid=UID, node=NODE, fresh=True)
    assert verdict.allowed is left, verdict
    assert verdict.state is state
    progress = HandoffProgress(
        HolderKey("team/train-0"), UID, FencingToken(3), (ContainerName("c"),)
    )
    assert handoff_abandoned(obj, progress, NODE) is left
