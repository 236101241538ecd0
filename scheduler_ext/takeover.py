"""May an expired node lock be taken from its holder? (docs/design.md, "Expiry and takeover"; pure.)

Expiry alone never hands a lock on.  Where the holder's pod stands is ``handoff.holder``'s
classification, the same one the device plugin and ``nodelock locks`` use: the lock may be taken
over only when the holder has left the handoff (gone, bound elsewhere, never bound, admitted or
finished).  A holder Pending on the lock's node and not admitted — also one being deleted — or of
phase Unknown keeps the lock however old it is: kubelet may still admit it, and the device plugin
could not tell the two pods apart.

Filter and Bind count an expired lock's devices as taken (the Lease's copy of the holder's
assignment) unless the cache accounts for the holder or has no record of it at all
(``lease_copy_needed``): a holder deleted before this replica started would otherwise block its
devices forever, since takeover happens only inside a Bind that filter then never sends there.

A holder that Succeeded or was seen deleted (``handoff.holder.ended``) needs no expiry at all:
``ended_holders`` names those locks for the sweep to release at once (issue 52, decision 0012).
A holder seen Failed (rejected) is not among them: only the node's device plugin, while it
serves, releases it at once (``handoff.holder.released_by_extender``); here it waits for expiry
(``expired_and_left``), which keeps a node whose plugin is down out of a burst.

A cached pod can only lag; the final phases (gone, bound elsewhere, admitted, finished) never
revert for a UID, so the cache may answer yes for them.  "Not bound" can turn into "bound here" at
any moment, so for it (and for a pod the cache never saw) ``judge`` asks for a fresh read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from handoff.holder import (
    Ended,
    HolderState,
    HolderStatus,
    classify,
    ended,
    released_by_extender,
)
from lockd.model import Holder, NodeLockView, NodeName
from scheduler_ext.cache import ClusterCache
from scheduler_ext.state import PodState

__all__ = [
    "HolderState",
    "Judgement",
    "binding_may_still_land",
    "cached_ended",
    "cached_judgement",
    "copy_unneeded",
    "ended_holders",
    "expired_and_left",
    "holder_accounted",
    "holder_state",
    "judge",
    "lease_copy_needed",
]

DEFAULT_REQUEST_TIMEOUT_S = 60.0  # kube-apiserver's --request-timeout default
LATE_BINDING_MARGIN_S = 5.0


@dataclass(frozen=True)
class Judgement:
    """``allowed`` None means: read the pod from the API server and judge again (fresh)."""

    allowed: bool | None
    state: HolderState | None
    why: str


def holder_status(pod: PodState | None, *, holder_uid: str, node: NodeName) -> HolderStatus:
    """Classify the holder's cached pod (None: it does not exist)."""
    return classify(None if pod is None else pod.facts, uid=holder_uid, node=node)


def holder_state(pod: PodState | None, *, holder_uid: str, node: NodeName) -> HolderState:
    """The holder's phase (None: the pod does not exist)."""
    return holder_status(pod, holder_uid=holder_uid, node=node).state


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
    status = holder_status(pod, holder_uid=holder_uid, node=node)
    allowed = not status.in_handoff
    if not fresh and allowed and not status.final:
        return Judgement(None, status.state, f"cache says {status.state.value}; confirming")
    return Judgement(allowed, status.state, status.why)


def binding_may_still_land(
    state: HolderState | None,
    *,
    held_for_s: float,
    duration_s: int,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
) -> bool:
    """Whether a holder seen not bound may still become bound by its own bind's binding.

    The binding is sent at most ``duration_s / 3`` after the lock was taken; the API server may
    apply a binding it accepted (an etcd stall) up to its request timeout later.  Until both
    have passed, plus a margin, "not bound" is not final: taking the lock over could hand its
    devices to a second pod while kubelet admits the first.  ``held_for_s`` is how long this
    process has seen the lock held by that holder (the observed-time rule: never a remote
    timestamp).
    """
    if state is not HolderState.NOT_BOUND:
        return False
    return held_for_s < duration_s / 3 + request_timeout_s + LATE_BINDING_MARGIN_S


def lease_copy_needed(*, accounted_for: bool, known: bool, expired: bool) -> bool:
    """Whether filter and Bind must count the lock holder's devices from the Lease's copy.

    Not when the cache accounts for the holder (``ClusterCache.accounts_for``: it saw the pod
    deleted, terminal, or bound, where its own annotations count).  Nor when the cache has no
    record of the holder at all (``known`` False) and the lock has expired (unchanged for its
    whole duration as this process saw it): the holder was deleted before this replica listed
    the cluster, or the cache lags far behind.  Leaving the copy out is safe either way: the bind
    that follows asks ``judge`` on a fresh read of the holder before taking the lock, and lists
    the node before binding (no proven previous handoff), so a wrong guess costs a failed bind,
    never a device given twice.  A lock that has not expired is counted: its holder may be a pod
    created a moment ago that the cache has not seen yet.
    """
    if accounted_for:
        return False
    return known or not expired


def holder_accounted(cache: ClusterCache, view: NodeLockView | None) -> Callable[[str], bool]:
    """The ``finished`` argument of ``verbs.with_lock_holder`` for the lock in ``view``: True
    (the Lease's copy is not needed) by ``lease_copy_needed``."""
    expired = view is not None and view.expired
    return lambda uid: copy_unneeded(cache, uid, lambda: expired)


def copy_unneeded(cache: ClusterCache, uid: str, expired: Callable[[], bool]) -> bool:
    """Whether the Lease's copy of holder ``uid``'s assignment is not needed, by
    ``lease_copy_needed``; ``expired()`` (the lock's expiry) is asked only when it decides:
    when the cache has no record of the holder at all."""
    accounted_for = cache.accounts_for(uid)
    known = accounted_for or cache.pod(uid) is not None or cache.is_gone(uid)
    return not lease_copy_needed(
        accounted_for=accounted_for, known=known, expired=not known and expired()
    )


def cached_judgement(cache: ClusterCache) -> Callable[[NodeName, Holder], Judgement]:
    """``judge`` of a lock's holder from ``cache`` alone (``fresh`` False), as the sweep asks
    ``expired_and_left``."""

    def of(node: NodeName, holder: Holder) -> Judgement:
        return judge(
            cache.pod(holder.uid),
            holder_uid=holder.uid,
            node=node,
            fresh=False,
            known_gone=cache.is_gone(holder.uid),
        )

    return of


def expired_and_left(
    held: Mapping[NodeName, Holder],
    *,
    expired: Callable[[NodeName], bool],
    cached_judgement: Callable[[NodeName, Holder], Judgement],
) -> list[tuple[NodeName, Holder, str]]:
    """The held locks that have expired and whose holder the cache saw leave the handoff for
    good, with why (pure).

    Nothing else would end such a lock until a bind for its node takes it over: the device
    plugin releases only a lock it served or refused, and a holder admitted without it (kubelet
    admitting before the plugin registered), rejected while the plugin was down, or deleted
    left it held.  Only a cached judgement that allows (``judge`` with ``fresh`` False: the
    states that never revert for a UID) counts; one that asks for a fresh read is left to a
    Bind's takeover, which reads the pod.
    """
    out: list[tuple[NodeName, Holder, str]] = []
    for node, holder in sorted(held.items()):
        if not expired(node):
            continue
        verdict = cached_judgement(node, holder)
        if verdict.allowed:
            out.append((node, holder, verdict.why))
    return out


def cached_ended(cache: ClusterCache) -> Callable[[NodeName, Holder], Ended | None]:
    """``handoff.holder.ended`` of a lock's holder from ``cache`` alone: its cached pod, and
    whether the cache saw that UID deleted (and Failed before).  The ended states never revert
    for a UID, so a lagging cache may say them."""

    def of(node: NodeName, holder: Holder) -> Ended | None:
        pod = cache.pod(holder.uid)
        facts = None if pod is None else pod.facts
        return ended(
            facts,
            uid=holder.uid,
            seen_gone=cache.is_gone(holder.uid),
            failed_before_gone=cache.gone_failed(holder.uid),
        )

    return of


def ended_holders(
    held: Mapping[NodeName, Holder],
    ended_of: Callable[[NodeName, Holder], Ended | None],
) -> list[tuple[NodeName, Holder, Ended]]:
    """The held locks whose holder has ended for good and that an extender releases at once,
    expired or not, with the outcome to release them with and why (pure): the holder Succeeded
    (``finished``) or was seen deleted (``deleted``), never seen Failed.

    Such a holder can never be admitted again, so no Allocate can come for it: its lock is
    released at once rather than at expiry.  A holder seen Failed (``rejected``) is left out
    (``handoff.holder.released_by_extender``): its node's device plugin releases it once it
    serves, or the sweep once it expired — a node whose plugin is down, where kubelet rejects
    every pod at once, stays out of a burst for the lock's duration.
    """
    out: list[tuple[NodeName, Holder, Ended]] = []
    for node, holder in sorted(held.items()):
        end = ended_of(node, holder)
        if end is not None and released_by_extender(end):
            out.append((node, holder, end))
    return out


def bound_elsewhere(
    held: Mapping[NodeName, Holder], node_of: Callable[[str], NodeName | None]
) -> list[tuple[NodeName, Holder]]:
    """The held locks whose holder this cache saw bound to another node (pure).

    Such a lock will never be served: kubelet on its node never sees the pod, and a binding to
    it can no longer land (a bound pod takes no second binding).  It is left behind when a
    bind's binding write went unanswered and kube-scheduler bound the pod elsewhere on a retry;
    the extender releases it (fenced by its token) instead of leaving it until some other bind
    for that node takes it over.
    """
    out: list[tuple[NodeName, Holder]] = []
    for node, holder in sorted(held.items()):
        bound = node_of(holder.uid)
        if bound is not None and bound != node:
            out.append((node, holder))
    return out
