"""Where a node lock holder's pod stands in its handoff: the one classifier (pure).

The extender's takeover check, the device plugin (Allocate, and its check of an interrupted
handoff) and ``nodelock locks`` all judge the holder's pod with this module, so they cannot
disagree.  docs/design.md, "Expiry and takeover": an expired lock may be taken over only when
its holder has left the handoff — the pod is gone, bound to another node, admitted by kubelet or
finished (rejected or completed).  A holder Pending on the lock's node and not admitted keeps
the lock however old it is: kubelet may still admit it, and the device plugin could not tell it
from another pod.

The phases, decided in this order from the pod object alone:

- ``GONE``: no such pod, or a pod of the same name with another UID (the holder was deleted).
- ``FINISHED``: phase Failed (kubelet rejected it, or it failed) or Succeeded.
- ``NOT_BOUND``: ``spec.nodeName`` is empty.  Whether that allows a takeover is the caller's
  policy: a bind may be in flight (the extender confirms with a fresh read).
- ``BOUND_ELSEWHERE``: bound to another node than the lock's.
- ``ADMITTED``: phase Running, or kubelet wrote a status for any container or init container, in
  any state (Waiting included).  kubelet writes container statuses only for a pod it admitted,
  and it calls the device plugin for every container during admission, so the admitted pod has
  left *this handoff*: its lock may be taken over.  It is not a pod that asks for no more
  devices: a kubelet that restarts without its device checkpoint (it writes it only after the
  plugin answered, cm/devicemanager/manager.go ``writeCheckpoint``) admits the pod again and
  may call Allocate for it then; its pod worker would call Allocate for a container it has no
  record of (``GetDeviceRunContainerOptions``, v1.31.9 line 968, v1.37.2 line 1010) if
  nodelock's plugin did not require ``PreStartContainer``.  Whether such a pod may still ask is
  kubelet's own record, not this classifier's: ``deviceplugin.decide`` counts a pod as done with
  its devices only while kubelet's PodResources ``List`` or checkpoint records them, or once
  kubelet admitted it before the lock's holder (``deviceplugin.decide.admitted_before``).
- ``UNKNOWN``: phase Unknown (kubelet lost contact): cannot tell, so it stays in handoff.
- ``IN_HANDOFF``: bound here, Pending, no container status.  This holds also for a pod that is
  being deleted (``deletionTimestamp`` set): kubelet admits a pod it has not seen before it stops
  it, so the plugin may still be asked for its devices; it leaves the handoff when kubelet
  removes it (``GONE``) or writes its statuses.

Every phase but ``NOT_BOUND`` and ``IN_HANDOFF``/``UNKNOWN`` is final for a given UID: a cached
(lagging) copy of the pod may be trusted for it.

``ended`` picks, of those, the holders whose lock is released at once, not at expiry: a pod that
has ended (Failed, Succeeded, or seen deleted) can never be admitted again, so no Allocate can
come for it and its lock serves no one (docs/design.md, "Expiry and takeover").  ``ADMITTED``
and ``BOUND_ELSEWHERE`` are final too but not ended: kubelet may still call Allocate for an
admitted pod it has no device record of, and those keep the expiry rule.  Who may release
it at once (the brake on a node whose device plugin is down): ``released_by_extender`` and
``released_by_plugin`` — a rejected holder only by the node's device plugin while it serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from lockd.model import Outcome


class HolderState(StrEnum):
    """The holder pod's place in the handoff."""

    GONE = "gone"
    FINISHED = "finished"
    NOT_BOUND = "not-bound"
    BOUND_ELSEWHERE = "bound-elsewhere"
    ADMITTED = "admitted"
    UNKNOWN = "unknown"  # phase Unknown: kubelet lost contact; in handoff
    IN_HANDOFF = "in-handoff"  # Pending on this node, not admitted: never taken over


IN_HANDOFF_STATES = frozenset({HolderState.IN_HANDOFF, HolderState.UNKNOWN})
FINAL_STATES = frozenset(
    {
        HolderState.GONE,
        HolderState.FINISHED,
        HolderState.BOUND_ELSEWHERE,
        HolderState.ADMITTED,
    }
)


@dataclass(frozen=True)
class PodFacts:
    """What the classifier reads of a pod, parsed once (a cache may keep this instead)."""

    uid: str
    node: str  # spec.nodeName; "" while unbound
    phase: str  # status.phase; "Pending" when absent
    reason: str  # status.reason; "" when absent
    deleting: bool  # metadata.deletionTimestamp is set
    has_statuses: bool  # kubelet wrote a container or init container status


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    """Read the classifier's facts from a Pod object; tolerant of missing or mistyped fields."""
    meta = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    status = _mapping(pod.get("status"))
    statuses = [status.get("containerStatuses"), status.get("initContainerStatuses")]
    return PodFacts(
        uid=str(meta.get("uid") or ""),
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        reason=str(status.get("reason") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        has_statuses=any(isinstance(s, list) and len(s) > 0 for s in statuses),
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class HolderStatus:
    """A phase and why, in words a person can act on."""

    state: HolderState
    why: str

    @property
    def in_handoff(self) -> bool:
        """True when an expired lock of this holder must still not be taken over."""
        return self.state in IN_HANDOFF_STATES

    @property
    def final(self) -> bool:
        """True when the phase can never change back for this UID (a lagging copy may say it)."""
        return self.state in FINAL_STATES


def classify(facts: PodFacts | None, *, uid: str, node: str) -> HolderStatus:
    """Classify the holder's pod (``None``: it does not exist) for a lock on ``node``.

    ``uid`` is the holder's UID from the lock; empty means "any pod of that name".
    """
    if facts is None:
        return HolderStatus(HolderState.GONE, "holder pod no longer exists")
    if uid and facts.uid != uid:
        return HolderStatus(
            HolderState.GONE, "holder pod was deleted (a new pod has the same name, another UID)"
        )
    if facts.phase in ("Failed", "Succeeded"):
        reason = f" ({facts.reason})" if facts.reason else ""
        return HolderStatus(HolderState.FINISHED, f"holder pod {facts.phase}{reason}")
    if not facts.node:
        return HolderStatus(HolderState.NOT_BOUND, "holder pod is not bound to a node yet")
    if facts.node != node:
        return HolderStatus(
            HolderState.BOUND_ELSEWHERE, f"holder pod is bound to node {facts.node}"
        )
    if facts.phase == "Running" or facts.has_statuses:
        return HolderStatus(
            HolderState.ADMITTED, f"holder pod was admitted by kubelet ({facts.phase})"
        )
    if facts.phase == "Unknown":
        return HolderStatus(
            HolderState.UNKNOWN, "holder pod's phase is Unknown (kubelet lost contact)"
        )
    if facts.deleting:
        return HolderStatus(
            HolderState.IN_HANDOFF,
            "holder pod is being deleted but is Pending on this node and not admitted by kubelet "
            "yet (kubelet may still admit it before stopping it)",
        )
    return HolderStatus(
        HolderState.IN_HANDOFF,
        "holder pod is Pending on this node and not admitted by kubelet yet",
    )


def holder_status(pod: Mapping[str, Any] | None, *, uid: str, node: str) -> HolderStatus:
    """Classify the holder's pod object (``None``: it does not exist) for a lock on ``node``."""
    return classify(None if pod is None else pod_facts(pod), uid=uid, node=node)


@dataclass(frozen=True)
class Ended:
    """A lock holder that has ended: the outcome its lock is released with, and why, in words
    a person can act on."""

    outcome: Outcome
    why: str


AGAIN = (
    "it never runs: a bare pod must be created again, a controller's pod is replaced by its "
    "controller"
)
# kubelet's reason for a pod its device manager could not give devices at admission
# (``pkg/kubelet/lifecycle/predicate.go``, v1.31.9 and v1.37.2: an admit handler's error that is
# not a known predicate failure)
UNEXPECTED_ADMISSION = "UnexpectedAdmissionError"
REJECTED_AT_RESTART = (
    "kubelet rejected it at admission, its device manager could not give it devices: kubelet "
    "admitted it before the device plugin had reported its devices (right after a kubelet "
    "restart, or while the plugin was down or restarting)"
)


def ended(
    facts: PodFacts | None, *, uid: str, seen_gone: bool, failed_before_gone: bool = False
) -> Ended | None:
    """Whether the holder ``uid`` has ended for good, from its pod's facts (``None``: not in the
    caller's view), whether the caller saw that UID deleted (``seen_gone``) and, if so, whether
    it saw it Failed before (``failed_before_gone``).

    - Failed: ``Outcome.REJECTED``.  A holder in handoff fails only at admission: kubelet
      rejected it (``UnexpectedAdmissionError`` when its device manager had no device to give,
      or any other admit handler), or a controller failed it; either way it is never admitted.
      A bare pod must be created again; a controller's pod is replaced by its controller.
      A holder seen Failed and then deleted (a controller that deletes its failed pods) is
      ``REJECTED`` too: its rejection is what matters to who may release it
      (``released_by_extender``).
    - Succeeded: ``Outcome.FINISHED`` (it ran, so it was admitted, and is done).
    - Deleted (seen so, or a pod of that name with another UID): ``Outcome.DELETED``.

    A pod merely missing from the view is not ended: the view may not have seen it yet.
    """
    if facts is None:
        if not seen_gone:
            return None
        if failed_before_gone:
            return Ended(
                Outcome.REJECTED,
                f"the holder pod was Failed, then deleted: it never ran; {AGAIN}",
            )
        return Ended(Outcome.DELETED, "the holder pod was deleted")
    if uid and facts.uid != uid:
        return Ended(Outcome.DELETED, "the holder pod was deleted (a new pod has the same name)")
    reason = f" ({facts.reason})" if facts.reason else ""
    if facts.phase == "Failed":
        cause = REJECTED_AT_RESTART if facts.reason == UNEXPECTED_ADMISSION else "it failed"
        return Ended(Outcome.REJECTED, f"the holder pod is Failed{reason}: {cause}; {AGAIN}")
    if facts.phase == "Succeeded":
        return Ended(Outcome.FINISHED, "the holder pod Succeeded")
    return None


def released_by_extender(end: Ended) -> bool:
    """Whether an extender may release the lock of a holder that ended at once, not waiting for
    its expiry: for ``finished`` and ``deleted``, not for ``rejected``.

    A rejected holder is, most often, the sign that the node's device plugin is not serving:
    kubelet fails every pod it admits within milliseconds while no device is reported ("no
    healthy devices present", or ``UnexpectedAdmissionError`` after a kubelet restart).
    Released at once, the next pod would be bound there at once and rejected in turn: a burst
    would drain into one broken node.  So only the node's device plugin releases a rejected
    holder at once, and only while it serves (``released_by_plugin``); the extender waits for
    the lock's expiry, which keeps a node whose plugin is down out of a burst.  A holder that
    Succeeded or was deleted is not a sign of a broken node, and at worst one more pod is bound
    there and rejected, whose lock is then held until the plugin serves or the lock expires."""
    return end.outcome is not Outcome.REJECTED


def released_by_plugin(end: Ended, *, serving: bool) -> bool:
    """Whether the node's device plugin may release the lock of a holder that ended at once:
    a rejected holder only while the plugin ``serving`` (its ListAndWatch has sent kubelet the
    devices, so kubelet can admit the next pod; ``/readyz``), any other at once."""
    return serving or released_by_extender(end)


# the Event either part writes, on the holder pod and the node, when it released the lock of a
# holder that ended (docs/events.md)
RELEASED_EVENT = "NodeLockReleased"


def released_message(node: str, holder: str, token: int, end: Ended) -> str:
    """The ``RELEASED_EVENT`` message: which lock, whose, how it ended and what to do."""
    return (
        f"node {node}'s GPU lock held by {holder} (token {token}) was released at once "
        f"({end.outcome.value}): {end.why}"
    )
