"""Hole 7: a bind interrupted after its binding was sent keeps the lock (the outcome is unknown);
before the write, or refused by the API server, it releases it."""

from __future__ import annotations

import asyncio

from kube.errors import ApiError, ApiUnavailable
from lockd.errors import LockLost
from lockd.model import NodeName
from scheduler_ext.binder import BindFailed, keep_lock_after
from scheduler_ext.metrics import Result


def test_cancellation_after_the_binding_was_sent_keeps_the_lock() -> None:
    assert keep_lock_after(asyncio.CancelledError(), binding_sent=True)
    assert keep_lock_after(RuntimeError("a bug mid-write"), binding_sent=True)
    assert keep_lock_after(ApiUnavailable("connection reset"), binding_sent=True)


def test_before_the_write_or_on_a_refusal_the_lock_is_released() -> None:
    assert not keep_lock_after(asyncio.CancelledError(), binding_sent=False)
    assert not keep_lock_after(ApiError(422, "Invalid", "bad binding"), binding_sent=True)
    assert not keep_lock_after(BindFailed(Result.ERROR, "binding refused"), binding_sent=True)
    assert not keep_lock_after(LockLost(NodeName("n"), "gone"), binding_sent=True)
