"""The bind queue against races it cannot see coming: a head that lost the write race to a lock
now free, and another replica's binds taking the lock while this replica's waiters queue.

The clock is injected; the lock is a plain view the test changes (as in test_extender_waiting).
"""

from __future__ import annotations

import asyncio

import pytest

from lockd.model import FencingToken, Holder, HolderKey, LockRecord, NodeLockView, NodeName
from scheduler_ext.waiting import BindQueues, GiveUp, WaitRefused

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

    def hold(self, uid: str) -> None:
        self.version += 1
        holder = Holder(HolderKey(f"ns/{uid}"), uid)
        self.view = NodeLockView(self._record(holder), 0.0, False)

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


async def test_a_head_that_lost_the_race_to_a_lock_now_free_tries_again_at_once() -> None:
    """Losing the write race twice ends the acquire with the lock free in its last read: no
    change of the Lease may ever come, so waiting for one would sit out the whole budget."""
    queues = BindQueues(budget_s=4.0, clock=Clock())
    lock = Lock()
    lock.free()
    async with queues.turn(N, "p1", "ns/p1") as turn:
        await asyncio.wait_for(turn.ready(lock), 1.0)
        turn.lost(lock())  # the acquire gave up after two lost writes; the last read: free
        await asyncio.wait_for(turn.ready(lock), 1.0)


async def test_a_head_that_lost_to_a_holder_still_waits_for_the_lease_to_change() -> None:
    queues = BindQueues(budget_s=4.0, clock=Clock())
    lock = Lock()
    lock.free()
    async with queues.turn(N, "p1", "ns/p1") as turn:
        await asyncio.wait_for(turn.ready(lock), 1.0)
        lock.hold("winner")  # the race went to another replica's bind
        turn.lost(lock())
        waiting = asyncio.create_task(turn.ready(lock))
        await settle()
        assert not waiting.done()
        lock.free()
        queues.lock_changed(lock(), N)
        await asyncio.wait_for(waiting, 10.0)  # returns as soon as it is done


async def test_waiters_count_the_other_replicas_binds_the_lease_watch_shows() -> None:
    """Two replicas: each has its own queue, and each sees the other's binds only as lock
    holders that are none of its own waiters.  While this replica's waiters queue, the share of
    handoffs that go elsewhere stretches their expected wait, so one that cannot make it in its
    budget fails fast instead of waiting the whole budget."""
    clock, lock = Clock(), Lock()
    queues = BindQueues(budget_s=4.0, clock=clock)
    lock.hold("b0")  # the other replica's bind holds the lock
    queues.lock_changed(lock(), N)
    results: dict[str, str] = {}

    async def bind(uid: str) -> None:
        try:
            async with queues.turn(N, uid, f"ns/{uid}") as turn:
                await turn.ready(lock)
                results[uid] = "turn"
        except WaitRefused as exc:
            results[uid] = exc.reason.value

    waiters = [asyncio.create_task(bind(f"a{i}")) for i in range(4)]
    await settle()
    assert results == {}  # 4 waiters at 0.2 s a handoff: all expect to make the 4 s budget
    # every handoff goes to the other replica: each release is followed by its next bind
    for i in range(1, 8):
        clock.t += 0.2
        lock.free()
        queues.lock_changed(lock(), N)
        lock.hold(f"b{i}")
        queues.lock_changed(lock(), N)
    await settle()
    late = asyncio.create_task(bind("a-late"))
    await asyncio.wait({late}, timeout=10.0)  # returns as soon as it is done
    for t in (*waiters, late):
        t.cancel()
    await asyncio.gather(*waiters, late, return_exceptions=True)
    assert results.get("a-late") == GiveUp.FAIL_FAST.value
    assert queues.foreign_share(N) > 0.5


def test_handoffs_to_this_replicas_own_binds_do_not_count_as_the_others_demand() -> None:
    clock, lock = Clock(), Lock()
    queues = BindQueues(budget_s=4.0, clock=clock)
    assert queues.foreign_share(N) == 0.0
    lock.hold("b0")
    queues.lock_changed(lock(), N)  # no waiter here: nothing is learned of the other replica
    assert queues.foreign_share(N) == 0.0
    assert queues.expected_waits({}, {}, {N: 1}, pod_uid="x") == {N: pytest.approx(0.2)}
