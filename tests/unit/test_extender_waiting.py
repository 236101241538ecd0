"""The per-node bind queue: FIFO turns, head-only wake-ups, budgets, cancellation, arithmetic.

The clock is injected; the lock is a plain view the test changes.  Waiting never writes, so the
"Lease" here is only read: a bind's acquire is modelled by the test taking the turn and counting.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from lockd.model import (
    FencingToken,
    Holder,
    HolderKey,
    LastHandoff,
    LockRecord,
    NodeLockView,
    NodeName,
)
from scheduler_ext.waiting import (
    BindQueues,
    GiveUp,
    HoldEstimate,
    WaitPicture,
    WaitRefused,
    expected_wait_s,
    give_up_reason,
)

N = NodeName("gpu-node-01")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Lock:
    """The node lock as the Lease watch last showed it; every change gets a new version."""

    def __init__(self) -> None:
        self.version = 0
        self.view: NodeLockView | None = None
        self.held_for_s = 0.0

    def hold(self, uid: str, *, expired: bool = False) -> None:
        self.version += 1
        holder = Holder(HolderKey(f"ns/{uid}"), uid)
        self.view = NodeLockView(self._record(holder), 0.0, expired, self.held_for_s)

    def free(self) -> None:
        self.version += 1
        self.view = NodeLockView(self._record(None), 0.0, False)

    def _record(self, holder: Holder | None) -> LockRecord:
        return LockRecord(N, holder, FencingToken(self.version), 15, None, None, str(self.version))

    def __call__(self) -> NodeLockView | None:
        return self.view


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_binds_take_their_turns_in_arrival_order_and_only_the_head_is_woken() -> None:
    clock, lock = Clock(), Lock()
    queues = BindQueues(budget_s=4.0, clock=clock)
    lock.hold("holder")
    order: list[str] = []
    release = {uid: asyncio.Event() for uid in ("p1", "p2", "p3")}

    async def bind(uid: str) -> None:
        async with queues.turn(N, uid, f"ns/{uid}") as turn:
            await turn.ready(lock)
            order.append(uid)
            lock.hold(uid)  # the acquire
            await release[uid].wait()  # the rest of the bind, lock held

    tasks = [asyncio.create_task(bind(uid)) for uid in ("p1", "p2", "p3")]
    await settle()
    assert order == []
    assert queues.depth(N) == 3
    waiters = list(queues._queues[N])
    queues.notify(N)
    assert [w.wake.is_set() for w in waiters] == [True, False, False]  # no thundering herd
    await settle()
    assert order == []  # woken, but the lock is still held: back to waiting
    lock.free()
    queues.lock_changed(lock(), N)
    await settle()
    assert order == ["p1"]
    release["p1"].set()
    await settle()
    assert order == ["p1"]  # p2 is head now, but p1 still holds the lock (its handoff)
    lock.free()
    queues.lock_changed(lock(), N)
    await settle()
    assert order == ["p1", "p2"]
    release["p2"].set()
    lock.free()
    queues.lock_changed(lock(), N)
    await settle()
    release["p3"].set()
    await asyncio.gather(*tasks)
    assert order == ["p1", "p2", "p3"]
    assert queues.depth(N) == 0


async def test_a_free_lock_with_an_empty_queue_is_taken_at_once() -> None:
    queues = BindQueues(budget_s=4.0, clock=Clock())
    lock = Lock()
    async with queues.turn(N, "p1", "ns/p1") as turn:
        await asyncio.wait_for(turn.ready(lock), 1.0)  # no Lease yet
        lock.free()
        await asyncio.wait_for(turn.ready(lock), 1.0)


async def test_an_expired_lock_lets_the_head_try_a_takeover_once_per_version() -> None:
    clock, lock = Clock(), Lock()
    queues = BindQueues(budget_s=4.0, clock=clock)
    lock.hold("stuck", expired=True)
    async with queues.turn(N, "p1", "ns/p1") as turn:
        await asyncio.wait_for(turn.ready(lock), 1.0)  # may ask the takeover check
        turn.lost(lock())  # the check said no
        waiting = asyncio.create_task(turn.ready(lock))
        await settle()
        assert not waiting.done()  # the same record is not asked about again
        lock.hold("stuck", expired=True)  # the Lease changed (a new version)
        queues.notify(N)
        await asyncio.wait_for(waiting, 10.0)  # returns as soon as it is done


async def test_the_budget_running_out_refuses_with_the_holder_and_the_queue() -> None:
    clock, lock = Clock(), Lock()
    refused: list[GiveUp] = []
    queues = BindQueues(budget_s=4.0, clock=clock, on_refused=refused.append)
    lock.held_for_s = 3.5
    lock.hold("holder")
    queues.hold.add(0.1)

    async def bind() -> None:
        async with queues.turn(N, "p1", "ns/p1") as turn:
            await turn.ready(lock)

    task = asyncio.create_task(bind())
    await settle()
    clock.t += 4.0
    queues.notify(N)
    with pytest.raises(WaitRefused) as caught:
        await asyncio.wait_for(task, 10.0)  # returns as soon as it is done
    assert caught.value.reason is GiveUp.BUDGET
    message = str(caught.value)
    assert "held by ns/holder for 3.5s" in message
    assert "1 bind(s) queued, 0 ahead" in message
    assert "4.0s budget" in message
    assert refused == [GiveUp.BUDGET]
    assert queues.depth(N) == 0


async def test_a_waiter_that_cannot_make_it_fails_fast_and_leaves_the_others() -> None:
    clock, lock = Clock(), Lock()
    queues = BindQueues(budget_s=1.0, clock=clock)
    lock.hold("holder")
    for _ in range(5):
        queues.hold.add(0.3)  # 0.3 s per handoff, and the holder has just taken the lock

    results: dict[str, str] = {}

    async def bind(uid: str) -> None:
        try:
            async with queues.turn(N, uid, f"ns/{uid}") as turn:
                await turn.ready(lock)
                results[uid] = "turn"
        except WaitRefused as exc:
            results[uid] = exc.reason.value

    tasks = [asyncio.create_task(bind(f"p{i}")) for i in range(5)]
    await settle()
    # p2 expects 0.3 + 2 x 0.3 = 0.9 s and waits; p3 (1.2 s) and p4 (1.5 s) cannot make 1 s
    assert results == {"p3": "fail_fast", "p4": "fail_fast"}
    assert queues.depth(N) == 3
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert queues.depth(N) == 0


async def test_an_abandoned_waiter_leaves_and_wakes_the_next() -> None:
    clock, lock = Clock(), Lock()
    queues = BindQueues(budget_s=4.0, clock=clock)
    lock.hold("holder")
    got: dict[str, str] = {}

    async def bind(uid: str) -> None:
        try:
            async with queues.turn(N, uid, f"ns/{uid}") as turn:
                await turn.ready(lock)
                got[uid] = "turn"
        except WaitRefused as exc:
            got[uid] = exc.reason.value

    first = asyncio.create_task(bind("p1"))
    second = asyncio.create_task(bind("p2"))
    await settle()
    queues.abandon(N, "p1")
    await settle()
    assert got == {"p1": "abandoned"}
    lock.free()
    queues.lock_changed(lock(), N)
    await asyncio.wait_for(asyncio.gather(first, second), 1.0)
    assert got == {"p1": "abandoned", "p2": "turn"}


async def test_a_second_bind_of_the_same_pod_is_refused_while_the_first_waits() -> None:
    queues = BindQueues(budget_s=4.0, clock=Clock())
    async with queues.turn(N, "p1", "ns/p1"):
        with pytest.raises(WaitRefused) as caught:
            async with queues.turn(N, "p1", "ns/p1"):
                pass
        assert caught.value.reason is GiveUp.DUPLICATE
        assert queues.depth(N) == 1


def test_expected_wait_is_the_holders_remainder_plus_a_hold_per_waiter_ahead() -> None:
    picture = WaitPicture(position=2, depth=3, holder="ns/h", holder_age_s=0.05, hold_s=0.2)
    assert expected_wait_s(picture) == pytest.approx(0.15 + 2 * 0.2)
    late = WaitPicture(position=0, depth=1, holder="ns/h", holder_age_s=9.0, hold_s=0.2)
    assert expected_wait_s(late) == 9.0  # overdue (stuck?): expected to take as long again
    free = WaitPicture(position=1, depth=2, holder=None, holder_age_s=0.0, hold_s=0.2)
    assert expected_wait_s(free) == pytest.approx(0.2)
    assert give_up_reason(picture, left_s=1.0) is None
    assert give_up_reason(picture, left_s=0.5) is GiveUp.FAIL_FAST
    assert give_up_reason(picture, left_s=0.0) is GiveUp.BUDGET


def test_hold_estimate_follows_recent_holds_and_caps_stuck_ones() -> None:
    est = HoldEstimate(initial_s=0.2)
    est.add(0.1)
    assert est.value_s == pytest.approx(0.1)  # the first sample replaces the guess
    est.add(0.2)
    assert 0.1 < est.value_s < 0.2
    est.add(10_000.0)
    assert est.value_s < 10.0


def test_lock_changes_teach_the_hold_time_and_prioritize_sees_expected_waits() -> None:
    clock, lock = Clock(), Lock()
    queues = BindQueues(budget_s=4.0, clock=clock)
    lock.hold("a")
    queues.lock_changed(lock(), N)
    clock.t += 0.12
    lock.free()
    queues.lock_changed(lock(), N)
    assert queues.hold.value_s == pytest.approx(0.12)
    other = NodeName("gpu-node-02")
    lock.hold("b")
    view = lock()
    assert view is not None
    assert view.record.holder is not None
    holder = view.record.holder
    waits = queues.expected_waits({N: holder}, {N: 0.0}, {other: 2}, pod_uid="x")
    # N: b's remaining hold (it has just taken it); the other node: two binds on their way
    assert waits == {N: pytest.approx(0.12), other: pytest.approx(0.24)}
    assert queues.expected_waits({N: holder}, {N: 0.0}, {}, pod_uid="b") == {}  # its own lock
    # held for longer than a hold: expected to take as long again
    assert queues.expected_waits({N: holder}, {N: 0.5}, {}, pod_uid="x") == {N: pytest.approx(0.5)}


async def test_a_zero_budget_fails_at_once_on_a_held_lock_as_the_peers_do() -> None:
    clock, lock = Clock(), Lock()
    queues = BindQueues(budget_s=0.0, clock=clock)
    async with queues.turn(N, "p1", "ns/p1") as turn:
        await asyncio.wait_for(turn.ready(lock), 1.0)  # free and first: no wait at all
    lock.hold("holder")
    with pytest.raises(WaitRefused) as caught:
        async with queues.turn(N, "p2", "ns/p2") as turn:
            await asyncio.wait_for(turn.ready(lock), 1.0)
    assert caught.value.reason is GiveUp.BUDGET


def test_prioritize_tolerates_an_eighth_of_the_budget_before_steering_away() -> None:
    queues = BindQueues(budget_s=4.0, clock=Clock())
    assert queues.steering_tolerance_s() == pytest.approx(0.5)
    queues.hold.add(3.0)  # very long holds: at least half a hold
    assert queues.steering_tolerance_s() == pytest.approx(1.5)


async def test_a_waiter_cancelled_as_it_is_woken_stays_cancelled() -> None:
    """A bind whose task is cancelled (the extender stopping) in the same turn as its wake-up
    ends with the cancellation: it neither waits on nor takes its turn."""
    clock, lock = Clock(), Lock()
    queues = BindQueues(budget_s=4.0, clock=clock)
    lock.hold("holder")
    turns: list[str] = []

    async def bind() -> None:
        async with queues.turn(N, "p1", "ns/p1") as turn:
            await turn.ready(lock)
            turns.append("p1")

    task = asyncio.create_task(bind())
    await settle()  # parked: the lock is held
    lock.free()
    queues.notify(N)  # the Lease watch's wake-up ...
    task.cancel()  # ... and the cancellation, in the same turn of the loop
    with pytest.raises(asyncio.CancelledError):
        await task
    assert turns == []
    assert queues.depths() == {}


@pytest.mark.parametrize(
    ("outcome", "learnt"),
    [("allocated", True), ("rejected", False), ("deleted", False), ("expired", False)],
)
def test_only_a_handoff_that_allocated_teaches_the_hold_time(outcome: str, learnt: bool) -> None:
    """issue 52: a holder kubelet rejected after a restart held the lock for as long as kubelet
    was away; learnt, that hold made the next binds expect as long a wait and fail fast."""
    clock, lock = Clock(), Lock()
    queues = BindQueues(budget_s=4.0, clock=clock)
    lock.hold("a")
    queues.lock_changed(lock(), N)
    clock.t += 12.0
    lock.free()
    freed = lock()
    assert freed is not None
    last = LastHandoff(HolderKey("ns/a"), "uid-a", freed.record.token, outcome)
    queues.lock_changed(replace(freed, record=replace(freed.record, last=last)), N)
    assert queues.hold.samples == (1 if learnt else 0)
