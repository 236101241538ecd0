"""Binds wait their turn: one fair FIFO per node, woken by the node lock's own changes.

docs/design.md, "Bind": on contention a bind waits, bounded, instead of failing at once and leaving
kube-scheduler to back the pod off for 1-10 s while the node's lock sits idle.  kube-scheduler
runs each binding cycle in its own goroutine (``runBindingCycle`` after ``schedulingCycle``), so
a bind that waits here blocks no other pod's scheduling.

How a bind waits (``BindQueues.turn``):

- It joins its node's queue (FIFO, per extender replica).  Only the queue's *head* ever tries the
  lock; the others wait to become head.  The head waits until the lock looks free (or expired,
  for the takeover check), then its caller runs choose -> acquire -> confirm -> binding.  If the
  acquire loses a race (another replica, a stale view) the head stays head and waits again.
- Wake-ups come from the Lease watch (``lock_changed``) and from the queue itself (the head
  leaving); each wakes the head alone, so there is no polling loop and no thundering herd.
- A waiter gives up (``WaitRefused``) when its budget runs out, or at once when it cannot make
  it: its expected wait (``expected_wait_s``: the holder's expected remaining hold plus one
  recent hold per handoff expected before its own) exceeds what is left of the budget.  The
  handoffs before its own are the waiters ahead of it and, with several replicas, the other
  replicas' binds in between: this replica cannot see their queues, but the Lease watch shows
  every new holder, and while binds of this replica queue for a node, the share of new holders
  that are none of them (``foreign_share``) stretches the wait.  A waiter whose caller is
  abandoned (kube-scheduler stopped waiting) leaves too.
- A head whose acquire lost the write race waits for the Lease to change before it tries again,
  unless the lock is free: then it tries again at once (a race lost twice may end on a read that
  shows the lock free, and no change need follow).

Guarantees: waiting never writes, so a waiter that gives up or is abandoned leaves the Lease as
it was; a node's head is served in FIFO order within this replica (replicas race only on the
conditional write, which lockd keeps exclusive); a waiter never waits past its deadline by more
than one event-loop turn.  Not guaranteed: fairness *across* replicas (each has its own queue;
the foreign share only estimates the others' demand from the handoffs they won), or that an
expected wait is met (it is an estimate from recent holds).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum

from lockd.model import Holder, NodeLockView, NodeName, Outcome

DEFAULT_HOLD_S = 0.2  # the hold estimate before any hold was seen
STEERING_SHARE = 1 / 8  # of the wait budget: a wait prioritize accepts to keep the policy
HOLD_SMOOTHING = 0.2  # weight of the newest hold in the moving average
MAX_HOLD_SAMPLE_S = 30.0  # a longer hold (a stuck holder) is capped in the estimate
MAX_FOREIGN_SHARE = 0.8  # of handoffs seen going to other replicas' binds, in the estimate


class GiveUp(StrEnum):
    """Why a waiter left its queue without its turn (metric label ``reason``)."""

    BUDGET = "budget"  # the budget ran out
    FAIL_FAST = "fail_fast"  # the expected wait exceeded what was left of the budget
    ABANDONED = "abandoned"  # the caller stopped waiting (kube-scheduler's timeout, disconnect)
    DUPLICATE = "duplicate"  # a bind of the same pod is already queued here


class WaitRefused(Exception):
    """A bind could not get its turn; the message names the holder, its age and the queue."""

    def __init__(self, reason: GiveUp, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class WaitPicture:
    """What a waiter sees of its node: enough to judge and to explain a refusal."""

    position: int  # waiters ahead of this one (0: the head)
    depth: int  # waiters in the queue, this one included
    holder: str | None  # the lock holder's pod key, None when free
    holder_age_s: float  # since this process first saw that holder
    hold_s: float  # the recent hold estimate
    token: int = 0  # the lock's fencing token as last seen
    foreign_share: float = 0.0  # of recent handoffs, the share other replicas' binds took


def expected_wait_s(picture: WaitPicture) -> float:
    """Seconds until this waiter's turn: the current holder's expected remaining hold plus one
    recent hold per handoff expected before this waiter's.  A holder within the recent hold time
    is expected to finish by then; one past it is overdue (a slow or stuck admission) and is
    expected to take as long again as it already has.  The handoffs before this waiter's are the
    waiters ahead of it here and, in between, the other replicas' binds (``foreign_share``)."""
    return wait_behind(
        held=bool(picture.holder),
        holder_age_s=picture.holder_age_s,
        position=picture.position,
        hold_s=picture.hold_s,
        foreign_share=picture.foreign_share,
    )


def handoffs_before(position: int, foreign_share: float) -> float:
    """Handoffs expected before the turn of a waiter with ``position`` waiters ahead of it, when
    a share ``foreign_share`` of handoffs goes to other replicas' binds: this replica's
    ``position + 1`` turns take ``(position + 1) / (1 - share)`` handoffs in all, the waiter's
    own last.  ``position`` itself when no other replica takes the lock."""
    share = min(max(foreign_share, 0.0), MAX_FOREIGN_SHARE)
    if share == 0.0:
        return float(position)
    return (position + 1) / (1 - share) - 1


def wait_behind(
    *,
    held: bool,
    holder_age_s: float,
    position: int,
    hold_s: float,
    foreign_share: float = 0.0,
) -> float:
    """``expected_wait_s`` from its parts (no picture to build: prioritize asks it for every
    held lock)."""
    remaining = 0.0
    if held:
        remaining = hold_s - holder_age_s if holder_age_s < hold_s else holder_age_s
    return remaining + handoffs_before(position, foreign_share) * hold_s


def give_up_reason(picture: WaitPicture, left_s: float) -> GiveUp | None:
    """``BUDGET`` when nothing is left; ``FAIL_FAST`` when the expected wait does not fit in
    ``left_s``; None to keep waiting."""
    if left_s <= 0:
        return GiveUp.BUDGET
    if expected_wait_s(picture) > left_s:
        return GiveUp.FAIL_FAST
    return None


def explain(reason: GiveUp, node: NodeName, picture: WaitPicture, budget_s: float) -> str:
    """The refusal as kube-scheduler shows it in the pod's events."""
    if picture.holder is not None:
        held = (
            f"held by {picture.holder} for {picture.holder_age_s:.1f}s "
            f"(fencing token {picture.token})"
        )
    else:
        held = "free, another bind's turn"
    queue = f"{picture.depth} bind(s) queued, {picture.position} ahead of this one"
    if reason is GiveUp.FAIL_FAST:
        others = ""
        if picture.foreign_share > 0:
            others = (
                f", {min(picture.foreign_share, MAX_FOREIGN_SHARE) * 100:.0f}% of handoffs "
                "going to other replicas' binds"
            )
        why = (
            f"cannot be served within the {budget_s:.1f}s wait budget (expected "
            f"{expected_wait_s(picture):.1f}s at {picture.hold_s * 1000:.0f}ms per handoff"
            f"{others})"
        )
    elif reason is GiveUp.BUDGET:
        why = f"waited the whole {budget_s:.1f}s budget"
    elif reason is GiveUp.DUPLICATE:
        why = "a bind of this pod is already waiting here"
    else:
        why = "the scheduler stopped waiting"
    return f"node {node}: lock {held}; {queue}; {why}; the scheduler will retry"


@dataclass
class _Waiter:
    uid: str
    key: str
    enqueued_at: float
    deadline: float
    abandoned: bool = False
    timed_out: bool = False  # its budget ran out on the event loop's own clock
    wake: asyncio.Event = field(default_factory=asyncio.Event)


def teaches_hold(released: NodeLockView | None) -> bool:
    """Whether a lock's release says how long a handoff holds it: only a handoff that ended
    ``allocated`` (or a release that names no outcome) does.  A holder that ended without one —
    rejected by kubelet before any Allocate, deleted, finished, expired, taken over, a failed
    bind — held it for as long as kubelet was away or the pod waited, which says nothing about
    the next pod's wait: learnt, a kubelet restart's rejected holder (issue 52) made the next
    binds expect a wait of that length and fail fast while the lock was free again."""
    if released is None:
        return False
    last = released.record.last
    return last is None or last.outcome == Outcome.ALLOCATED.value


class HoldEstimate:
    """A moving average of recent lock holds (acquire -> release, as this process saw them)."""

    def __init__(self, *, initial_s: float = DEFAULT_HOLD_S) -> None:
        self.value_s = initial_s
        self.samples = 0

    def add(self, hold_s: float) -> None:
        sample = min(max(hold_s, 0.0), MAX_HOLD_SAMPLE_S)
        if self.samples == 0:
            self.value_s = sample
        else:
            self.value_s += HOLD_SMOOTHING * (sample - self.value_s)
        self.samples += 1


class Turn:
    """A waiter's place in its node's queue (``BindQueues.turn``)."""

    def __init__(self, queues: BindQueues, node: NodeName, waiter: _Waiter) -> None:
        self._queues = queues
        self.node = node
        self._waiter = waiter
        self._refused_version: str | None = None

    @property
    def waited_s(self) -> float:
        """Seconds since this bind joined the queue."""
        return self._queues.clock() - self._waiter.enqueued_at

    def lost(self, view: NodeLockView | None) -> None:
        """The acquire found the lock held after all (a race, or a refused takeover): wait for
        the Lease to change before trying again — unless ``view`` shows the lock free, which is
        tried again at once (``ready``)."""
        self._refused_version = view.record.resource_version if view is not None else None

    async def ready(self, view_of: Callable[[], NodeLockView | None]) -> None:
        """Return when this waiter is the head and the lock looks free, expired (a takeover may
        be possible) or held by this waiter's own pod; raise ``WaitRefused`` when it cannot be
        served in time."""
        queues, waiter = self._queues, self._waiter
        while True:
            waiter.wake.clear()
            if waiter.abandoned:
                self._refuse(GiveUp.ABANDONED, view_of())
            view = view_of()
            head = queues.position(self.node, waiter) == 0
            if head and self._may_try(view):
                return
            picture = queues.picture(self.node, waiter, view)
            left = 0.0 if waiter.timed_out else waiter.deadline - queues.clock()
            reason = give_up_reason(picture, left)
            if reason is not None:
                self._refuse(reason, view)
            await queues.sleep(waiter)

    def _may_try(self, view: NodeLockView | None) -> bool:
        if view is None:
            return True
        holder = view.record.holder
        if holder is None:
            # free: try, even at the version of the last refusal.  An acquire that lost the
            # write race twice may end on a read that shows the lock free; no change of the
            # Lease need ever follow, and waiting for one would sit out the whole budget.
            return True
        if view.record.resource_version == self._refused_version:
            return False  # held, and nothing changed since the last refusal
        # a lock held by this very pod is the caller's to judge (an earlier bind of it)
        return holder.uid == self._waiter.uid or view.expired

    def _refuse(self, reason: GiveUp, view: NodeLockView | None) -> None:
        picture = self._queues.picture(self.node, self._waiter, view)
        raise WaitRefused(reason, explain(reason, self.node, picture, self._queues.budget_s))


class BindQueues:
    """The per-node FIFOs of one extender replica.

    ``on_refused(reason)`` counts refusals (a metric); ``clock`` is monotonic seconds.  All
    methods run on one event loop.
    """

    def __init__(
        self,
        *,
        budget_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_refused: Callable[[GiveUp], None] = lambda reason: None,
    ) -> None:
        if budget_s < 0:
            raise ValueError("the bind wait budget cannot be negative")
        self.budget_s = budget_s
        self.clock = clock
        self._on_refused = on_refused
        self._queues: dict[NodeName, collections.deque[_Waiter]] = {}
        self.hold = HoldEstimate()
        self._held_since: dict[NodeName, tuple[int, float]] = {}
        self._foreign: dict[NodeName, float] = {}

    # -- the queue ----------------------------------------------------------------------------

    @asynccontextmanager
    async def turn(
        self, node: NodeName, uid: str, key: str, *, give_up_at: float | None = None
    ) -> AsyncIterator[Turn]:
        """Join ``node``'s queue for the pod ``uid``; leaving the block leaves the queue and
        wakes the next head.  Raises ``WaitRefused(DUPLICATE)`` when that pod already waits.
        The wait ends at the budget's end or at ``give_up_at`` (on ``clock``), the earlier: the
        bind's own deadline less what its steps after the wait need."""
        queue = self._queues.setdefault(node, collections.deque())
        now = self.clock()
        if any(w.uid == uid for w in queue):
            self._on_refused(GiveUp.DUPLICATE)
            picture = WaitPicture(len(queue), len(queue), None, 0.0, self.hold.value_s)
            raise WaitRefused(
                GiveUp.DUPLICATE, explain(GiveUp.DUPLICATE, node, picture, self.budget_s)
            )
        ends = now + self.budget_s if give_up_at is None else min(now + self.budget_s, give_up_at)
        waiter = _Waiter(uid, key, now, ends)
        queue.append(waiter)
        try:
            yield Turn(self, node, waiter)
        except WaitRefused as exc:
            self._on_refused(exc.reason)
            raise
        finally:
            self._leave(node, waiter)

    def _leave(self, node: NodeName, waiter: _Waiter) -> None:
        queue = self._queues.get(node)
        if queue is None:
            return
        was_head = bool(queue) and queue[0] is waiter
        try:
            queue.remove(waiter)
        except ValueError:
            return
        if not queue:
            del self._queues[node]
        elif was_head:
            queue[0].wake.set()

    def abandon(self, node: NodeName, uid: str) -> None:
        """The caller of ``uid``'s bind stopped waiting: it leaves at its next wake (now)."""
        for waiter in self._queues.get(node, ()):
            if waiter.uid == uid:
                waiter.abandoned = True
                waiter.wake.set()

    def position(self, node: NodeName, waiter: _Waiter) -> int:
        queue = self._queues.get(node, collections.deque())
        for i, other in enumerate(queue):
            if other is waiter:
                return i
        return len(queue)

    def depth(self, node: NodeName) -> int:
        """Binds queued for ``node`` in this replica (the one being carried out included)."""
        queue = self._queues.get(node)
        return len(queue) if queue is not None else 0

    def nodes(self) -> dict[str, NodeName]:
        """Pod UID -> node of every bind queued here (the ones being carried out included)."""
        return {w.uid: node for node, queue in self._queues.items() for w in queue}

    def depths(self) -> dict[NodeName, int]:
        """Every node with a non-empty queue and its depth."""
        return {node: len(queue) for node, queue in self._queues.items() if queue}

    def picture(self, node: NodeName, waiter: _Waiter, view: NodeLockView | None) -> WaitPicture:
        holder = view.record.holder if view is not None else None
        return WaitPicture(
            position=self.position(node, waiter),
            depth=self.depth(node),
            holder=holder.key if holder is not None else None,
            holder_age_s=view.held_for_s if view is not None and holder is not None else 0.0,
            hold_s=self.hold.value_s,
            token=view.record.token if view is not None else 0,
            foreign_share=self.foreign_share(node),
        )

    async def sleep(self, waiter: _Waiter) -> None:
        """Wait for a wake-up or the waiter's deadline, whichever comes first."""
        left = waiter.deadline - self.clock()
        if left <= 0:
            return
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation that
            # arrives as the wake-up is set, and the bind would go on after its caller was stopped
            async with asyncio.timeout(left):
                await waiter.wake.wait()
        except TimeoutError:
            waiter.timed_out = True

    # -- wake-ups -----------------------------------------------------------------------------

    def notify(self, node: NodeName) -> None:
        """Something about ``node``'s lock changed: wake its head (only)."""
        queue = self._queues.get(node)
        if queue:
            queue[0].wake.set()

    def lock_changed(self, view: NodeLockView | None, node: NodeName) -> None:
        """The Lease watch's callback: learn hold times, then wake the node's head."""
        now = self.clock()
        holder = view.record.holder if view is not None else None
        since = self._held_since.get(node)
        if holder is not None and view is not None:
            if since is None or since[0] != view.record.token:
                self._held_since[node] = (view.record.token, now - view.held_for_s)
                self._learn_demand(node, holder.uid)
        elif since is not None:
            del self._held_since[node]
            if teaches_hold(view):
                self.hold.add(now - since[1])
        self.notify(node)

    def _learn_demand(self, node: NodeName, uid: str) -> None:
        """A new holder took ``node``'s lock.  While binds of this replica queue for it, a holder
        that is none of them is another replica's bind (or a pod bound without this extender):
        the share of such handoffs is what the Lease watch shows of the other replicas' queues,
        which this replica cannot see.  With no bind queued here nothing is learned: a lock
        that other replicas take while this one does not want it says nothing about a wait."""
        queue = self._queues.get(node)
        if not queue:
            return
        sample = 0.0 if any(w.uid == uid for w in queue) else 1.0
        share = self._foreign.get(node, 0.0)
        self._foreign[node] = share + HOLD_SMOOTHING * (sample - share)

    def foreign_share(self, node: NodeName) -> float:
        """The share of recent handoffs of ``node``'s lock, seen while binds of this replica
        queued for it, that went to other replicas' binds (0: none seen)."""
        return min(self._foreign.get(node, 0.0), MAX_FOREIGN_SHARE)

    def steering_tolerance_s(self) -> float:
        """How much longer than the soonest node a bind may expect to wait on a node before
        prioritize steers away from it: an eighth of the budget (0.5 s by default), at least
        half a recent hold.  Waiting that long costs a pod once; leaving the policy (binpack)
        in a burst scatters small pods over every node and leaves no node free for a large
        one, which costs until those pods end."""
        return max(self.budget_s * STEERING_SHARE, self.hold.value_s / 2)

    def expected_waits(
        self,
        held: Mapping[NodeName, Holder],
        held_for_s: Mapping[NodeName, float],
        extra: Mapping[NodeName, int],
        *,
        pod_uid: str,
    ) -> dict[NodeName, float]:
        """Node -> expected wait of a new bind of ``pod_uid``, for every node where it is not
        zero: the ``held`` nodes (node -> holder of its lock; ``held_for_s``: how long each has
        held it, ``NodeLocks.held_ages``), nodes with binds queued, and nodes with ``extra``
        binds on their way.  A lock held by ``pod_uid`` itself does not count.

        Costs a few operations per held lock: prioritize asks it on every request, and a large
        cluster in a burst holds hundreds of locks at once."""
        waits: dict[NodeName, float] = {}
        hold_s = self.hold.value_s
        queues = self._queues
        for node in held.keys() | queues.keys() | extra.keys():
            holder = held.get(node)
            if holder is not None and holder.uid == pod_uid:
                holder = None
            wait = self._expected_wait_s(
                node, holder, held_for_s.get(node, 0.0), extra.get(node, 0), hold_s
            )
            if wait > 0:
                waits[node] = wait
        return waits

    def _expected_wait_s(
        self, node: NodeName, holder: Holder | None, age_s: float, extra: int, hold_s: float
    ) -> float:
        """The wait a new bind to ``node`` should expect: the holder's remaining hold (held for
        ``age_s``) plus one hold per bind queued here and per ``extra`` bind on its way
        (prioritize's promises)."""
        queue = self._queues.get(node)
        ahead = (len(queue) if queue else 0) + extra
        if holder is not None and queue and queue[0].uid == holder.uid:
            ahead -= 1  # the head holds the lock while it binds: count it once
        return wait_behind(
            held=holder is not None and bool(holder.key),
            holder_age_s=age_s if holder is not None else 0.0,
            position=ahead,
            hold_s=hold_s,
            foreign_share=self._foreign.get(node, 0.0) if ahead or holder is not None else 0.0,
        )
