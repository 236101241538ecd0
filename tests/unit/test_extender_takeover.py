"""The takeover check (docs/design.md, "Expiry and takeover"): an expired lock moves on only
once its holder left handoff."""

from __future__ import annotations

from typing import Any

import pytest

from handoff.holder import Ended, ended
from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX, DEFAULT_RESOURCE, Keys
from lockd.lease import LeaseFormat
from lockd.model import FencingToken, Holder, HolderKey, NodeLockView, NodeName, Outcome
from scheduler_ext.cache import ClusterCache
from scheduler_ext.state import PodState, pod_state
from scheduler_ext.takeover import (
    LATE_BINDING_MARGIN_S,
    HolderState,
    Judgement,
    binding_may_still_land,
    bound_elsewhere,
    cached_ended,
    copy_unneeded,
    ended_holders,
    expired_and_left,
    holder_accounted,
    holder_state,
    judge,
    lease_copy_needed,
)

FMT = LeaseFormat(namespace=DEFAULT_LOCK_NAMESPACE, prefix=DEFAULT_PREFIX)

NODE = NodeName("gpu-1")
UID = "uid-1"


def pod(
    *,
    node: str | None = "gpu-1",
    phase: str = "Pending",
    uid: str = UID,
    statuses: list[dict[str, Any]] | None = None,
    init_statuses: list[dict[str, Any]] | None = None,
    deleting: bool = False,
) -> PodState:
    obj: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": phase},
    }
    if node is not None:
        obj["spec"]["nodeName"] = node
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2024-05-01T12:00:00Z"
    if statuses is not None:
        obj["status"]["containerStatuses"] = statuses
    if init_statuses is not None:
        obj["status"]["initContainerStatuses"] = init_statuses
    return pod_state(obj, keys=Keys(), resource="nvidia.com/gpu")


WAITING = {"name": "c", "state": {"waiting": {"reason": "ContainerCreating"}}}
RUNNING = {"name": "c", "state": {"running": {}}, "containerID": "containerd://abc"}
INIT_DONE = {"name": "i", "state": {"terminated": {"exitCode": 0}}}


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (None, HolderState.GONE),
        (pod(uid="other"), HolderState.GONE),
        (pod(phase="Failed"), HolderState.FINISHED),
        (pod(phase="Succeeded"), HolderState.FINISHED),
        (pod(node=None), HolderState.NOT_BOUND),
        (pod(node="gpu-2"), HolderState.BOUND_ELSEWHERE),
        (pod(phase="Running"), HolderState.ADMITTED),
        (pod(statuses=[RUNNING]), HolderState.ADMITTED),
        (pod(init_statuses=[INIT_DONE]), HolderState.ADMITTED),
        (pod(statuses=[WAITING]), HolderState.ADMITTED),  # kubelet writes statuses once admitted
        (pod(), HolderState.IN_HANDOFF),
        (pod(deleting=True), HolderState.IN_HANDOFF),  # kubelet may still admit it first
        (pod(phase="Unknown"), HolderState.UNKNOWN),
    ],
)
def test_holder_state(state: PodState | None, expected: HolderState) -> None:
    assert holder_state(state, holder_uid=UID, node=NODE) is expected


@pytest.mark.parametrize(
    "state",
    [
        None,
        pod(uid="other"),
        pod(phase="Failed"),
        pod(node=None),
        pod(node="gpu-2"),
        pod(phase="Running"),
    ],
)
def test_fresh_read_allows_takeover_once_the_holder_left_handoff(state: PodState | None) -> None:
    verdict = judge(state, holder_uid=UID, node=NODE, fresh=True)
    assert verdict.allowed is True
    assert verdict.why


@pytest.mark.parametrize("state", [pod(), pod(deleting=True), pod(phase="Unknown")])
def test_pending_unadmitted_holder_keeps_the_lock_however_old(state: PodState) -> None:
    # the HAMi #3096 failure: handing this lock on would let two pods swap devices silently
    for fresh in (True, False):
        verdict = judge(state, holder_uid=UID, node=NODE, fresh=fresh)
        assert verdict.allowed is False


def test_cache_answers_yes_only_for_states_that_never_revert() -> None:
    for state in (
        pod(phase="Failed"),
        pod(node="gpu-2"),
        pod(phase="Running"),
        pod(statuses=[WAITING]),
        pod(uid="x"),
    ):
        assert judge(state, holder_uid=UID, node=NODE, fresh=False).allowed is True
    # "not bound" may turn into "bound here" any moment: the cache must not decide it
    assert judge(pod(node=None), holder_uid=UID, node=NODE, fresh=False).allowed is None


def test_pod_unknown_to_the_cache_needs_a_read_unless_seen_deleted() -> None:
    assert judge(None, holder_uid=UID, node=NODE, fresh=False).allowed is None
    seen_gone = judge(None, holder_uid=UID, node=NODE, fresh=False, known_gone=True)
    assert seen_gone.allowed is True
    assert seen_gone.state is HolderState.GONE


def test_a_never_bound_holder_is_not_taken_over_while_its_binding_may_still_land() -> None:
    """Hole 5: an accepted binding can be applied up to the API server's request timeout after
    it was sent, and it was sent within a third of the lease duration."""
    window = 15 / 3 + 60 + LATE_BINDING_MARGIN_S
    for held in (15.0, window - 0.1):
        assert binding_may_still_land(HolderState.NOT_BOUND, held_for_s=held, duration_s=15)
    assert not binding_may_still_land(HolderState.NOT_BOUND, held_for_s=window, duration_s=15)
    assert binding_may_still_land(
        HolderState.NOT_BOUND, held_for_s=20.0, duration_s=15, request_timeout_s=15
    )
    assert not binding_may_still_land(
        HolderState.NOT_BOUND, held_for_s=26.0, duration_s=15, request_timeout_s=15
    )
    for final in (HolderState.GONE, HolderState.FINISHED, HolderState.ADMITTED):
        assert not binding_may_still_land(final, held_for_s=15.0, duration_s=15)


@pytest.mark.parametrize(
    ("accounted_for", "known", "expired", "needed"),
    [
        (True, True, True, False),  # seen deleted, terminal or bound: its own state counts
        (True, False, False, False),  # (accounts_for is True for an unknown pod seen deleted)
        (False, True, True, True),  # a known holder still in handoff keeps its devices
        (False, True, False, True),
        (False, False, False, True),  # unknown and fresh: maybe a pod the cache has not seen yet
        (False, False, True, False),  # unknown and expired: deleted before this replica started
    ],
)
def test_lease_copy_needed(accounted_for: bool, known: bool, expired: bool, needed: bool) -> None:
    got = lease_copy_needed(accounted_for=accounted_for, known=known, expired=expired)
    assert got is needed


def _view(*, expired: bool) -> NodeLockView:
    body = FMT.acquired(
        {"metadata": {"name": NODE, "resourceVersion": "7"}},
        Holder(HolderKey("ns/gone"), "uid-gone"),
        token=FencingToken(3),
        duration_s=15,
        now="2026-11-30T12:00:00.000000Z",
    )
    return NodeLockView(
        record=FMT.parse(body),
        unchanged_for_s=15.0 if expired else 1.0,
        expired=expired,
        held_for_s=15.0 if expired else 1.0,
    )


def test_a_holder_deleted_before_the_replica_started_stops_counting_once_expired() -> None:
    """Hole "orphaned lock" (found by the model): the extender crashed holding a lock for a pod
    that was then deleted; after a restart the cache has no tombstone for it.  Counting its
    Lease copy forever kept the node's GPUs out of every filter, and takeover only happens
    inside a Bind; once the lock has expired the copy is left out."""
    cache = ClusterCache()
    cache.replace_pods([])
    assert not holder_accounted(cache, _view(expired=False))("uid-gone")
    assert holder_accounted(cache, _view(expired=True))("uid-gone")
    assert not holder_accounted(cache, None)("uid-gone")


def test_a_known_holder_in_handoff_keeps_counting_however_old() -> None:
    cache = ClusterCache()
    cache.replace_pods(
        [
            {
                "metadata": {"name": "p", "namespace": "ns", "uid": "uid-gone"},
                "spec": {"containers": [{"name": "c"}]},
                "status": {"phase": "Pending"},
            }
        ]
    )
    assert not holder_accounted(cache, _view(expired=True))("uid-gone")


def test_the_lock_expiry_is_read_only_when_the_holder_is_unknown_to_the_cache() -> None:
    """Prioritize reads a held lock's expiry only when it decides (``copy_unneeded``), and
    answers what ``holder_accounted`` answers from a whole view."""
    cache = ClusterCache()
    cache.replace_pods(
        [
            {
                "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
                "spec": {
                    # a GPU pod: a bound CPU pod is not kept (``PodState.quiet``), and no
                    # lock is ever held for one
                    "containers": [{"name": "c", "resources": {"limits": {DEFAULT_RESOURCE: "1"}}}],
                    **({"nodeName": "n"} if bound else {}),
                },
                "status": {"phase": "Pending"},
            }
            for name, bound in (("pending", False), ("bound", True))
        ]
    )
    asked: list[str] = []
    for uid in ("uid-pending", "uid-bound", "uid-unknown"):
        for expired in (False, True):

            def expiry(uid: str = uid, expired: bool = expired) -> bool:
                asked.append(uid)
                return expired

            assert copy_unneeded(cache, uid, expiry) == holder_accounted(
                cache, _view(expired=expired)
            )(uid)
    assert asked == ["uid-unknown", "uid-unknown"]


def test_locks_whose_holder_is_bound_to_another_node_are_left_behind() -> None:
    a, b, c = NodeName("a"), NodeName("b"), NodeName("c")
    held = {
        a: Holder(HolderKey("ns/moved"), "u-moved"),  # bound to c on a retry
        b: Holder(HolderKey("ns/here"), "u-here"),  # bound here: its handoff is under way
        c: Holder(HolderKey("ns/pending"), "u-pending"),  # not bound yet
    }
    nodes = {"u-moved": c, "u-here": b}
    assert bound_elsewhere(held, nodes.get) == [(a, held[a])]
    assert bound_elsewhere({}, nodes.get) == []


def test_expired_locks_whose_holder_left_for_good_are_left_behind() -> None:
    """Only an expired lock whose cached holder is in a state that never reverts (gone,
    finished, admitted, bound elsewhere) is released; in handoff, not bound, unknown to the
    cache or not expired: left to a Bind's takeover (which reads the pod)."""
    nodes = [NodeName(n) for n in "abcdefgh"]
    pods: dict[str, PodState | None] = {
        "a": pod(node="a", phase="Running", uid="u-a"),  # admitted
        "b": pod(node="b", statuses=[WAITING], uid="u-b"),  # admitted, no container created
        "c": pod(node="c", phase="Failed", uid="u-c"),  # rejected by kubelet
        "d": None,  # deleted, and the cache saw it go
        "e": pod(node="e", uid="u-e"),  # Pending here, not admitted: in handoff
        "f": pod(node=None, uid="u-f"),  # not bound: its binding may still land
        "g": None,  # unknown to the cache
        "h": pod(node="h", phase="Running", uid="u-h"),  # admitted, the lock not expired
    }
    held = {n: Holder(HolderKey(f"ns/{n}"), f"u-{n}") for n in nodes}

    def cached(node: NodeName, holder: Holder) -> Judgement:
        return judge(
            pods[node], holder_uid=holder.uid, node=node, fresh=False, known_gone=node == "d"
        )

    left = expired_and_left(held, expired=lambda n: n != "h", cached_judgement=cached)
    assert [(n, h) for n, h, _ in left] == [(n, held[n]) for n in nodes[:4]]
    assert [why for *_, why in left] == [
        "holder pod was admitted by kubelet (Running)",
        "holder pod was admitted by kubelet (Pending)",
        "holder pod Failed",
        "holder pod was deleted",
    ]
    assert expired_and_left(held, expired=lambda n: False, cached_judgement=cached) == []


def test_locks_whose_holder_finished_or_was_deleted_are_released_at_once_expired_or_not() -> None:
    """issue 52: a holder Succeeded or seen deleted ends its lock at once, with the outcome
    named; one that kubelet may still admit, or ask devices for (admitted), or that the cache
    has no record of, does not.  Nor does one kubelet rejected (Failed), also once deleted: the
    extender leaves it to the node's serving device plugin, or to expiry (the brake on a node
    whose plugin is down)."""
    nodes = [NodeName(n) for n in "abcdefghi"]
    pods: dict[str, PodState | None] = {
        "a": pod(node="a", phase="Failed", uid="u-a"),  # rejected by kubelet
        "b": pod(node="b", phase="Succeeded", uid="u-b"),
        "c": None,  # deleted, and the cache saw it go
        "d": pod(node="d", uid="other"),  # a new pod of the same name
        "e": pod(node="e", uid="u-e"),  # in handoff
        "f": pod(node="f", phase="Running", uid="u-f"),  # admitted: the expiry rule
        "g": None,  # unknown to the cache
        "h": pod(node=None, uid="u-h"),  # not bound
        "i": None,  # Failed, then deleted (a controller that deletes its failed pods)
    }
    held = {n: Holder(HolderKey(f"ns/{n}"), f"u-{n}") for n in nodes}

    def of(node: NodeName, holder: Holder) -> Ended | None:
        p = pods[node]
        return ended(
            None if p is None else p.facts,
            uid=holder.uid,
            seen_gone=node in ("c", "i"),
            failed_before_gone=node == "i",
        )

    assert of(nodes[0], held[nodes[0]]) is not None
    assert of(nodes[8], held[nodes[8]]) is not None
    got = ended_holders(held, of)
    assert [(n, h, e.outcome) for n, h, e in got] == [
        (nodes[1], held[nodes[1]], Outcome.FINISHED),
        (nodes[2], held[nodes[2]], Outcome.DELETED),
        (nodes[3], held[nodes[3]], Outcome.DELETED),
    ]


def test_the_cache_says_a_holder_ended_only_for_what_it_saw() -> None:
    cache = ClusterCache()
    holder = Holder(HolderKey("ns/p"), UID)
    assert cached_ended(cache)(NODE, holder) is None  # never seen: may not have arrived yet
    # a GPU pod, as every lock holder is (the cache keeps nothing of a bound CPU pod)
    obj: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": UID, "resourceVersion": "1"},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": {DEFAULT_RESOURCE: "1"}}}],
            "nodeName": "gpu-1",
        },
        "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError"},
    }
    cache.apply_pod("ADDED", obj)
    end = cached_ended(cache)(NODE, holder)
    assert end is not None
    assert end.outcome is Outcome.REJECTED
    cache.apply_pod("DELETED", obj)
    end = cached_ended(cache)(NODE, holder)
    assert end is not None
    assert end.outcome is Outcome.REJECTED  # Failed, then deleted: still a rejected holder
    assert "Failed, then deleted" in end.why
    gpu = [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    pending: dict[str, Any] = {
        "metadata": {**obj["metadata"], "uid": "u-2"},
        "spec": {"containers": gpu, "nodeName": "gpu-1"},
        "status": {},
    }
    cache.apply_pod("ADDED", pending)
    cache.apply_pod("DELETED", pending)
    end = cached_ended(cache)(NODE, Holder(HolderKey("ns/p"), "u-2"))
    assert end is not None
    assert end.outcome is Outcome.DELETED
    # a deletion whose last state says Failed, though the cache never saw it Failed
    failed = {**pending, "metadata": {**obj["metadata"], "uid": "u-3"}, "status": obj["status"]}
    cache.apply_pod("ADDED", pending | {"metadata": failed["metadata"]})
    cache.apply_pod("DELETED", failed)
    end = cached_ended(cache)(NODE, Holder(HolderKey("ns/p"), "u-3"))
    assert end is not None
    assert end.outcome is Outcome.REJECTED
