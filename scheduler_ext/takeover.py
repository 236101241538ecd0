"""May an expired node lock be taken from its holder? (DESIGN §3.4, pure.)

Expiry alone never hands a lock on.  The holder may be taken over only when it has left the
handoff: its pod is gone (deleted, or replaced by another pod of the same name), bound to another
node, never bound, admitted by kubelet (Running, or a container created) or finished (Failed:
rejected; Succeeded).  A holder Pending on the lock's node and not admitted keeps the lock however
old it is: kubelet may still admit it, and the device plugin could not tell the two pods apart.

A cached pod can only lag; the states "gone", "bound elsewhere", "admitted" and "finished" never
revert, so the cache may answer yes for them.  "Not bound" can turn into "bound here" at any
moment, so for it (and for a pod the cache never saw) ``judge`` asks for a fresh read.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from lockd.model import NodeName
from scheduler_ext.state import PodPhase, PodState


class HolderState(StrEnum):
    """Where the lock holder's pod stands, as far as the takeover decision cares."""

    GONE = "gone"
    BOUND_ELSEWHERE = "bound-elsewhere"
    NOT_BOUND = "not-bound"
    ADMITTED = "admitted"
    FINISHED = "finished"
    IN_HANDOFF = "in-handoff"  # Pending on this node, not admitted: never take over
    UNKNOWN_PHASE = "unknown-phase"  # kubelet lost contact: cannot know, never take over


@dataclass(frozen=True)
class Judgement:
    """``allowed`` None means: read the pod from the API server and judge again (fresh)."""

    allowed: bool | None
    state: HolderState | None
    why: str


def holder_state(pod: PodState | None, *, holder_uid: str, node: NodeName) -> HolderState:
    """Classify the holder's pod (None: it does not exist)."""
    if pod is None or (holder_uid and pod.uid != holder_uid):
        return HolderState.GONE
    if pod.phase.terminal:
        return HolderState.FINISHED
    if pod.node is None:
        return HolderState.NOT_BOUND
    if pod.node != node:
        return HolderState.BOUND_ELSEWHERE
    if pod.admitted or pod.phase is PodPhase.RUNNING:
        return HolderState.ADMITTED
    if pod.phase is PodPhase.UNKNOWN:
        return HolderState.UNKNOWN_PHASE
    return HolderState.IN_HANDOFF


_ALLOWED = {
    HolderState.GONE: True,
    HolderState.BOUND_ELSEWHERE: True,
    HolderState.NOT_BOUND: True,
    HolderState.ADMITTED: True,
    HolderState.FINISHED: True,
    HolderState.IN_HANDOFF: False,
    HolderState.UNKNOWN_PHASE: False,
}
_NEVER_REVERTS = {
    HolderState.GONE,
    HolderState.BOUND_ELSEWHERE,
    HolderState.ADMITTED,
    HolderState.FINISHED,
}


def judge(
    pod: PodState | None,
    *,
    holder_uid: str,
    node: NodeName,
    fresh: bool,
    known_gone: bool = False,
) -> Judgement:
    """Decide a takeover from the holder's pod as read from the API server (``fresh``) or from
    the cache (``known_gone``: the cache saw that UID deleted)."""
    if not fresh and pod is None:
        if known_gone:
            return Judgement(True, HolderState.GONE, "holder pod was deleted")
        return Judgement(None, None, "holder pod not in cache")
    state = holder_state(pod, holder_uid=holder_uid, node=node)
    if not fresh and state not in _NEVER_REVERTS and _ALLOWED[state]:
        return Judgement(None, state, f"cache says {state.value}; confirming")
    why = {
        HolderState.GONE: "holder pod no longer exists",
        HolderState.BOUND_ELSEWHERE: "holder pod is bound to another node",
        HolderState.NOT_BOUND: "holder pod was never bound",
        HolderState.ADMITTED: "holder pod was admitted by kubelet",
        HolderState.FINISHED: "holder pod finished (rejected or completed)",
        HolderState.IN_HANDOFF: "holder pod is Pending on this node and not admitted",
        HolderState.UNKNOWN_PHASE: "holder pod's phase is Unknown",
    }[state]
    return Judgement(_ALLOWED[state], state, why)
