"""The pure lock decisions: one action from what is known."""

from __future__ import annotations

from typing import Any

import pytest

from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX
from lockd.decide import (
    AskTakeover,
    Create,
    Read,
    Refuse,
    Write,
    decide_acquire,
    decide_break,
    decide_release,
    decide_renew,
)
from lockd.errors import LockHeld, LockLost, StaleToken
from lockd.lease import LeaseFormat
from lockd.model import (
    FencingToken,
    HeldLock,
    Holder,
    HolderKey,
    NodeLockView,
    NodeName,
    Outcome,
)

FMT = LeaseFormat(namespace=DEFAULT_LOCK_NAMESPACE, prefix=DEFAULT_PREFIX)
NODE = NodeName("gpu-1")
A = Holder(HolderKey("ns/a"), "uid-a", {"assignment": "{}"})
B = Holder(HolderKey("ns/b"), "uid-b")
NOW = "2024-05-01T12:00:00.000000Z"


def held_by(holder: Holder, token: int, *, expired: bool = False) -> tuple[NodeLockView, Any]:
    body = FMT.acquired(
        {"metadata": {"name": NODE, "resourceVersion": f"rv{token}"}},
        holder,
        token=FencingToken(token),
        duration_s=15,
        now=NOW,
    )
    view = NodeLockView(FMT.parse(body), 20.0 if expired else 1.0, expired, held_for_s=20.0)
    return view, body


def free(token: int) -> tuple[NodeLockView, Any]:
    _, body = held_by(A, token)
    body = FMT.released(body, outcome=Outcome.ALLOCATED, now=NOW)
    return NodeLockView(FMT.parse(body), 1.0, False), body


def acquire(known: tuple[NodeLockView, Any] | None, holder: Holder, **kw: Any) -> Any:
    view, body = known if known is not None else (None, None)
    return decide_acquire(NODE, view, body, holder, fmt=FMT, duration_s=15, now=NOW, **kw)


def test_unknown_lease_is_created_with_token_one() -> None:
    action = acquire(None, A)
    assert isinstance(action, Create)
    assert action.token == 1
    record = FMT.parse(action.body)
    assert (record.holder, record.token, record.node) == (A, 1, NODE)


def test_free_lease_is_written_with_the_next_token_conditionally() -> None:
    action = acquire(free(6), B)
    assert isinstance(action, Write)
    assert action.token == 7
    assert action.taken_from is None
    assert action.body["metadata"]["resourceVersion"] == "rv6"
    record = FMT.parse(action.body)
    assert (record.holder, record.token) == (B, 7)


def test_held_by_another_is_refused_with_holder_age_and_token() -> None:
    action = acquire(held_by(A, 3), B)
    assert isinstance(action, Refuse)
    assert isinstance(action.error, LockHeld)
    assert (action.error.holder, action.error.token, action.error.held_for_s) == ("ns/a", 3, 20.0)


def test_the_same_holder_re_acquires_with_a_new_token() -> None:
    action = acquire(held_by(A, 3), A)
    assert isinstance(action, Write)
    assert action.token == 4
    assert action.body["metadata"]["resourceVersion"] == "rv3"  # conditional on what was read
    record = FMT.parse(action.body)
    assert (record.holder, record.token) == (A, 4)


def test_without_reacquire_the_same_holder_is_refused_until_the_check_allows() -> None:
    """The binder's second bind of a pod (the model found it: kube-scheduler retried the pod on
    a replica whose Lease watch had not shown the first bind's lock, which re-acquired it, and
    the first bind's binding then landed with the old token)."""
    action = acquire(held_by(A, 4), A, reacquire=False)
    assert isinstance(action, Refuse)
    assert isinstance(action.error, LockHeld)
    assert (action.error.holder, action.error.token) == ("ns/a", 4)
    ask = acquire(held_by(A, 4, expired=True), A, reacquire=False)
    assert isinstance(ask, AskTakeover)
    assert (ask.record.holder, ask.record.token) == (A, 4)
    refused = acquire(held_by(A, 4, expired=True), A, reacquire=False, takeover_allowed=False)
    assert isinstance(refused, Refuse)
    assert isinstance(refused.error, LockHeld)
    assert (refused.error.holder, refused.error.token) == ("ns/a", 4)
    allowed = acquire(held_by(A, 4, expired=True), A, reacquire=False, takeover_allowed=True)
    assert isinstance(allowed, Write)
    assert allowed.token == 5
    assert (FMT.parse(allowed.body).holder, FMT.parse(allowed.body).token) == (A, 5)
    after_free = acquire(free(4), A, reacquire=False)
    assert isinstance(after_free, Write)
    assert after_free.token == 5
    assert FMT.parse(after_free.body).holder == A


def test_same_name_other_uid_is_another_holder() -> None:
    action = acquire(held_by(A, 3), Holder(A.key, "uid-new"))
    assert isinstance(action, Refuse)
    assert isinstance(action.error, LockHeld)
    assert (action.error.holder, action.error.token) == ("ns/a", 3)


def test_expired_lock_asks_the_callers_check_first() -> None:
    known = held_by(A, 3, expired=True)
    ask = acquire(known, B)
    assert isinstance(ask, AskTakeover)
    assert ask.record == known[0].record
    refused = acquire(known, B, takeover_allowed=False)
    assert isinstance(refused, Refuse)
    assert isinstance(refused.error, LockHeld)
    assert (refused.error.holder, refused.error.token) == ("ns/a", 3)
    taken = acquire(known, B, takeover_allowed=True)
    assert isinstance(taken, Write)
    assert taken.token == 4
    assert taken.taken_from == known[0].record
    record = FMT.parse(taken.body)
    assert (record.holder, record.token) == (B, 4)
    assert record.last is not None
    assert (record.last.holder, record.last.uid, record.last.token) == ("ns/a", "uid-a", 3)
    assert record.last.outcome == Outcome.TAKEN_OVER


def test_takeover_permission_without_expiry_is_not_enough() -> None:
    action = acquire(held_by(A, 3, expired=False), B, takeover_allowed=True)
    assert isinstance(action, Refuse)
    assert isinstance(action.error, LockHeld)
    assert (action.error.holder, action.error.token) == ("ns/a", 3)


def lock(holder: Holder, token: int) -> HeldLock:
    return HeldLock(NODE, holder, FencingToken(token), f"rv{token}")


@pytest.mark.parametrize("decide", ["release", "renew"])
def test_release_and_renew_by_the_holder_write(decide: str) -> None:
    view, body = held_by(A, 5)
    if decide == "release":
        action = decide_release(view, body, lock(A, 5), fmt=FMT, outcome=Outcome.ALLOCATED, now=NOW)
        assert isinstance(action, Write)
        record = FMT.parse(action.body)
        assert record.holder is None
        assert record.last is not None
        assert (record.last.holder, record.last.token) == ("ns/a", 5)
        assert record.last.outcome == Outcome.ALLOCATED
    else:
        action = decide_renew(view, body, lock(A, 5), fmt=FMT, now=NOW)
        assert isinstance(action, Write)
        assert FMT.parse(action.body).holder == A
    assert FMT.parse(action.body).token == 5
    assert action.token == 5
    assert action.body["metadata"]["resourceVersion"] == "rv5"


@pytest.mark.parametrize("decide", ["release", "renew"])
def test_a_stale_token_changes_nothing(decide: str) -> None:
    view, body = held_by(B, 6)  # A's lock (token 5) was taken over
    if decide == "release":
        action = decide_release(view, body, lock(A, 5), fmt=FMT, outcome=Outcome.ALLOCATED, now=NOW)
    else:
        action = decide_renew(view, body, lock(A, 5), fmt=FMT, now=NOW)
    assert isinstance(action, Refuse)
    assert isinstance(action.error, StaleToken)
    assert (action.error.token, action.error.current) == (5, 6)


def test_release_of_an_already_released_lock_is_lost() -> None:
    view, body = free(5)
    action = decide_release(view, body, lock(A, 5), fmt=FMT, outcome=Outcome.ALLOCATED, now=NOW)
    assert isinstance(action, Refuse)
    assert isinstance(action.error, LockLost)
    assert action.error.node == NODE


def test_a_view_older_than_the_lock_must_be_read_first() -> None:
    view, body = free(4)
    assert isinstance(decide_renew(view, body, lock(A, 5), fmt=FMT, now=NOW), Read)
    assert isinstance(decide_renew(None, None, lock(A, 5), fmt=FMT, now=NOW), Read)


def test_break_releases_whoever_holds_and_ignores_a_free_lock() -> None:
    view, body = held_by(A, 5)
    action = decide_break(view, body, fmt=FMT, now=NOW)
    assert isinstance(action, Write)
    assert action.token == 5
    assert action.body["metadata"]["resourceVersion"] == "rv5"
    record = FMT.parse(action.body)
    assert record.holder is None
    assert record.token == 5  # a break keeps the token: the next holder gets 6
    assert record.last is not None
    assert (record.last.holder, record.last.token, record.last.outcome) == ("ns/a", 5, "broken")
    view, body = free(5)
    assert decide_break(view, body, fmt=FMT, now=NOW) is None
