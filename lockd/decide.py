"""The lock decisions, as pure functions: what is known of a Lease in, one action out.

Like client-go's ``tryAcquireOrRenew`` these functions only decide; ``lockd.locks`` does the one
write.  Every write they ask for is conditional (a create, or a PUT carrying the observed
``resourceVersion``), so acting on an out-of-date view can lose a race but never overwrite
another holder: the server answers 409 and the caller reads again.

Guarantees of the decisions themselves:
- Acquire asks for a write only when the lock is free, is held by the same holder (same key and
  UID: it is re-acquired with a new token, fencing the previous incarnation), or is expired on the
  observer's clock *and* the caller's check said its holder may be taken over.  Every acquisition
  takes ``token + 1``.
- Release and renew ask for a write only when the known record carries the caller's token and
  holder; a newer token is ``StaleToken``, the same token already free (or with another holder) is
  ``LockLost``, an older known token means the view is older than the lock: read first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lockd.errors import LockHeld, LockLost, StaleToken
from lockd.lease import LeaseFormat
from lockd.model import (
    FencingToken,
    HeldLock,
    Holder,
    LockRecord,
    NodeLockView,
    NodeName,
    Outcome,
)

JSON = dict[str, Any]


@dataclass(frozen=True)
class Create:
    """Create the Lease (it is not known to exist)."""

    body: JSON
    token: FencingToken


@dataclass(frozen=True)
class Write:
    """Replace the Lease with ``body``, conditional on the resourceVersion it carries."""

    body: JSON
    token: FencingToken
    taken_from: LockRecord | None = None  # set when this write takes an expired lock over


@dataclass(frozen=True)
class Refuse:
    """Do not write; the caller gets ``error``."""

    error: LockHeld | LockLost | StaleToken


@dataclass(frozen=True)
class AskTakeover:
    """The lock is expired: ask the caller's check whether its holder may be taken over."""

    record: LockRecord


@dataclass(frozen=True)
class Read:
    """What is known is older than the caller's lock: read the Lease before deciding."""


AcquireAction = Create | Write | Refuse | AskTakeover
UpdateAction = Write | Refuse | Read


def same_holder(a: Holder, b: Holder) -> bool:
    """Same pod: the same ``namespace/name`` and the same UID."""
    return a.key == b.key and a.uid == b.uid


def held_error(view: NodeLockView) -> LockHeld:
    """``LockHeld`` describing a held lock as seen."""
    record = view.record
    assert record.holder is not None
    return LockHeld(record.node, record.holder.key, view.held_for_s, record.token)


def decide_acquire(
    node: NodeName,
    view: NodeLockView | None,
    lease: JSON | None,
    holder: Holder,
    *,
    fmt: LeaseFormat,
    duration_s: int,
    now: str,
    takeover_allowed: bool | None = None,
    reacquire: bool = True,
) -> AcquireAction:
    """What to do to acquire ``node`` for ``holder``, given the last view of its Lease.

    ``takeover_allowed`` is the answer of the caller's check for this very record (None: not
    asked yet).  ``now`` is the MicroTime written as acquire/renew time.  ``reacquire`` False:
    a lock held by the same holder is treated like another holder's (refused until expired, then
    only with the caller's check), for callers whose earlier attempt may still act on the old
    token (a binding in flight).
    """
    if view is None or lease is None:
        return Create(fmt.new_lease(node, holder, duration_s=duration_s, now=now), FencingToken(1))
    record = view.record
    token = FencingToken(record.token + 1)
    if record.holder is None or (reacquire and same_holder(record.holder, holder)):
        body = fmt.acquired(lease, holder, token=token, duration_s=duration_s, now=now)
        return Write(body, token)
    if not view.expired or takeover_allowed is False:
        return Refuse(held_error(view))
    if takeover_allowed is None:
        return AskTakeover(record)
    body = fmt.acquired(
        lease, holder, token=token, duration_s=duration_s, now=now, taken_from=record
    )
    return Write(body, token, taken_from=record)


def _check_ours(view: NodeLockView | None, lock: HeldLock) -> Refuse | Read | None:
    if view is None:
        return Read()
    record = view.record
    if record.token > lock.token:
        return Refuse(StaleToken(lock.node, lock.token, record.token))
    if record.token < lock.token:
        return Read()
    if record.holder is None:
        return Refuse(LockLost(lock.node, f"lock with token {lock.token} was already released"))
    if not same_holder(record.holder, lock.holder):
        return Refuse(
            LockLost(lock.node, f"lock with token {lock.token} is held by {record.holder.key}")
        )
    return None


def decide_release(
    view: NodeLockView | None,
    lease: JSON | None,
    lock: HeldLock,
    *,
    fmt: LeaseFormat,
    outcome: Outcome,
    now: str,
) -> UpdateAction:
    """What to do to release ``lock``: keep the Lease and its token, record the last handoff."""
    refusal = _check_ours(view, lock)
    if refusal is not None:
        return refusal
    assert lease is not None
    return Write(fmt.released(lease, outcome=outcome, now=now), lock.token)


def decide_renew(
    view: NodeLockView | None,
    lease: JSON | None,
    lock: HeldLock,
    *,
    fmt: LeaseFormat,
    now: str,
) -> UpdateAction:
    """What to do to renew ``lock`` (and rewrite its holder's data from ``lock.holder``)."""
    refusal = _check_ours(view, lock)
    if refusal is not None:
        return refusal
    assert lease is not None
    return Write(fmt.renewed(lease, lock.holder, now=now), lock.token)


def decide_break(view: NodeLockView, lease: JSON, *, fmt: LeaseFormat, now: str) -> Write | None:
    """Release whoever holds the lock (outcome ``broken``); None when it is free."""
    if view.record.holder is None:
        return None
    return Write(fmt.released(lease, outcome=Outcome.BROKEN, now=now), view.record.token)
