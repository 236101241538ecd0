"""Where a lock holder's pod stands in its handoff, from the pod object alone (pure).

DESIGN §3.4: an expired lock may be taken over only when its holder has left the handoff — the pod
is gone (or replaced by another pod of the same name), bound to another node, admitted by kubelet
(Running, or container statuses written), or finished (Failed: rejected; Succeeded).  A holder
Pending on the lock's node and not admitted keeps the lock however old it is.  ``nodelock locks``
uses this to say *why* a lock is stuck; a caller may build its takeover check on it.

A pod that is not bound yet is reported as such; whether that allows a takeover is the caller's
policy (the bind may still be in flight).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class HolderState(StrEnum):
    """The holder pod's place in the handoff."""

    GONE = "gone"
    FINISHED = "finished"
    NOT_BOUND = "not-bound"
    BOUND_ELSEWHERE = "bound-elsewhere"
    ADMITTED = "admitted"
    PENDING_HERE = "pending-here"  # bound here, not admitted: in handoff, never taken over
    UNKNOWN = "unknown"  # kubelet lost contact (phase Unknown): cannot tell, never taken over


IN_HANDOFF = frozenset({HolderState.PENDING_HERE, HolderState.UNKNOWN})


@dataclass(frozen=True)
class HolderStatus:
    state: HolderState
    why: str

    @property
    def in_handoff(self) -> bool:
        """True when an expired lock of this holder must still not be taken over."""
        return self.state in IN_HANDOFF


def holder_status(pod: Mapping[str, Any] | None, *, uid: str, node: str) -> HolderStatus:
    """Classify the holder's pod (``None``: it does not exist) for a lock on ``node``."""
    if pod is None:
        return HolderStatus(HolderState.GONE, "holder pod no longer exists")
    meta = pod.get("metadata") or {}
    if uid and meta.get("uid") != uid:
        return HolderStatus(
            HolderState.GONE, "holder pod was deleted (a new pod has the same name, another UID)"
        )
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase in ("Failed", "Succeeded"):
        reason = status.get("reason")
        return HolderStatus(
            HolderState.FINISHED, f"holder pod {phase}" + (f" ({reason})" if reason else "")
        )
    bound = spec.get("nodeName")
    if not bound:
        return HolderStatus(HolderState.NOT_BOUND, "holder pod is not bound to a node yet")
    if bound != node:
        return HolderStatus(HolderState.BOUND_ELSEWHERE, f"holder pod is bound to node {bound}")
    if phase == "Running" or status.get("containerStatuses") or status.get("initContainerStatuses"):
        return HolderStatus(HolderState.ADMITTED, f"holder pod was admitted by kubelet ({phase})")
    if phase == "Unknown":
        return HolderStatus(
            HolderState.UNKNOWN, "holder pod's phase is Unknown (kubelet lost contact)"
        )
    return HolderStatus(
        HolderState.PENDING_HERE,
        "holder pod is Pending on this node and not admitted by kubelet yet",
    )
