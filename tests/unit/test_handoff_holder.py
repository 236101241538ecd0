"""The one classifier of a lock holder's pod (docs/design.md, "Expiry and takeover"), and that
every part uses it."""

from __future__ import annotations

from typing import Any

import pytest

from deviceplugin.decide import HandoffProgress, handoff_abandoned
from handoff.holder import (
    Ended,
    HolderState,
    ended,
    holder_status,
    pod_facts,
    released_by_extender,
    released_by_plugin,
)
from handoff.wire import ContainerName, Keys
from lockd.model import FencingToken, HolderKey, NodeName, Outcome
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


# -- a holder that has ended: its lock is released at once (issue 52) --------------------------


def test_a_holder_kubelet_rejected_has_ended_rejected_with_a_cause_a_person_can_act_on() -> None:
    rejected = pod(phase="Failed", reason="UnexpectedAdmissionError")
    got = ended(pod_facts(rejected), uid=UID, seen_gone=False)
    assert got is not None
    assert got.outcome is Outcome.REJECTED
    assert "before the device plugin had reported its devices" in got.why
    assert "created again" in got.why
    assert "controller" in got.why


def test_a_holder_failed_otherwise_has_ended_rejected() -> None:
    got = ended(
        pod_facts(pod(phase="Failed", reason="OutOfnvidia.com/gpu")), uid=UID, seen_gone=False
    )
    assert got is not None
    assert got.outcome is Outcome.REJECTED
    assert "device plugin" not in got.why


def test_a_holder_that_succeeded_has_ended_finished() -> None:
    got = ended(pod_facts(pod(phase="Succeeded")), uid=UID, seen_gone=False)
    assert got is not None
    assert got.outcome is Outcome.FINISHED


def test_a_holder_seen_deleted_or_replaced_has_ended_deleted() -> None:
    gone = ended(None, uid=UID, seen_gone=True)
    assert gone is not None
    assert gone.outcome is Outcome.DELETED
    replaced = ended(pod_facts(pod(uid="uid-new")), uid=UID, seen_gone=False)
    assert replaced is not None
    assert replaced.outcome is Outcome.DELETED


@pytest.mark.parametrize(
    "obj",
    [
        pod(),  # in handoff
        pod(deleting=True),  # being deleted: kubelet may still admit it
        pod(phase="Unknown"),
        pod(node=None),  # not bound yet
        pod(phase="Running", containerStatuses=[RUNNING]),  # admitted: kubelet may still ask
        pod(node="gpu-2"),  # bound elsewhere: the sweep's own rule
        pod(containerStatuses=[WAITING]),
    ],
)
def test_a_holder_that_may_still_be_admitted_or_asked_for_has_not_ended(obj: Any) -> None:
    assert ended(pod_facts(obj), uid=UID, seen_gone=False) is None


def test_a_holder_merely_missing_from_the_view_has_not_ended() -> None:
    assert ended(None, uid=UID, seen_gone=False) is None


def test_a_holder_failed_then_deleted_has_ended_rejected() -> None:
    """A controller that deletes its failed pods (a StatefulSet) does not turn a rejected
    holder into a deleted one: who may release it is decided by its rejection."""
    got = ended(None, uid=UID, seen_gone=True, failed_before_gone=True)
    assert got is not None
    assert got.outcome is Outcome.REJECTED
    assert "created again" in got.why


@pytest.mark.parametrize(
    ("outcome", "extender", "plugin_not_serving", "plugin_serving"),
    [
        (Outcome.REJECTED, False, False, True),
        (Outcome.FINISHED, True, True, True),
        (Outcome.DELETED, True, True, True),
    ],
)
def test_a_rejected_holder_is_released_at_once_only_by_a_serving_plugin(
    outcome: Outcome, extender: bool, plugin_not_serving: bool, plugin_serving: bool
) -> None:
    """The brake (decision 0012): kubelet rejects every pod it admits while the node's plugin
    has reported no device, so a rejected holder's lock is released at once only by that plugin
    once it serves; a holder that Succeeded or was deleted, by either part at once."""
    end = Ended(outcome, "why")
    assert released_by_extender(end) is extender
    assert released_by_plugin(end, serving=False) is plugin_not_serving
    assert released_by_plugin(end, serving=True) is plugin_serving
