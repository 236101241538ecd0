"""``lockd.locks.NodeLocks`` replayed on the model store: its loops around ``lockd.decide``.

GLUE (replicated from ``lockd/locks.py``, not imported: ``NodeLocks`` does its I/O inside the
loops that call the decisions, so the model cannot call it without an API client).  What is
replayed, step for step:

- ``acquire``: decide from the observation; a refusal or a takeover question from an unread view
  while no watch is live reads first (the model's watches are always live, so it never does);
  ``AskTakeover`` asks the caller's check once per resourceVersion; at most two writes; a 409
  re-reads and decides again; a 404 on replace forgets and creates.
- ``release``/``renew`` (``_update``): ``Read`` reads once (a second ``Read`` after a read is
  ``LockLost``); at most two writes; 409 re-reads; 404 is ``LockLost``.
- ``inspect``: one GET, observed with ``replace=True``; 404 forgets.
- watch events: observed without ``replace``; DELETED forgets.
- a read answered late (``take_answer``, ``Fault.LATE_READ``): a GET served at one step and its
  answer taken in, with ``replace=True``, at a later one, after whatever the watch delivered
  meanwhile.

``newest`` keeps, per node, the highest resourceVersion this process has taken in by any path
(V1 checks its view never goes back below it).

Every decision itself is the project's (``decide_acquire``, ``decide_release``, ``decide_renew``,
``Observations``, ``LeaseFormat``).
"""

from __future__ import annotations

from collections.abc import Callable

from handoff.wire import DEFAULT_PREFIX
from kube.errors import ApiUnavailable, Conflict, NotFound
from lockd.decide import (
    AskTakeover,
    Create,
    Read,
    Refuse,
    UpdateAction,
    Write,
    decide_acquire,
    decide_release,
    decide_renew,
)
from lockd.errors import LockHeld, LockLost
from lockd.lease import LeaseFormat
from lockd.microtime import microtime_from_epoch
from lockd.model import FencingToken, HeldLock, Holder, LockRecord, NodeLockView, NodeName, Outcome
from lockd.observed import Observations, Seen
from tests.model.world import JSON, LEASE_NAMESPACE, Event, Store

FMT = LeaseFormat(namespace=LEASE_NAMESPACE, prefix=DEFAULT_PREFIX)
DURATION_S = 15
MAX_WRITES = 2
EPOCH = 1_764_547_200.0  # 2025-12-01T00:00:00Z, the model's time 0 on a clock without skew


class Clock:
    """The model's global time, read by each actor through its own skewed wall clock.

    Expiry uses a monotonic clock, for which only differences count, so every actor reads the
    global time there; the wall clock (MicroTime written into Leases and pods) is skewed.
    """

    def __init__(self) -> None:
        self.now = 0.0

    def wall(self, skew: float) -> str:
        return microtime_from_epoch(EPOCH + self.now + skew)


class LockClient:
    """One process's ``NodeLocks``: its observations and its writes to the model store."""

    def __init__(self, store: Store, clock: Clock, *, name: str, skew: float) -> None:
        self.store = store
        self.clock = clock
        self.name = name
        self.skew = skew
        self.obs = Observations()
        # set by a fault: the next write lands but its answer is lost (ApiUnavailable)
        self.lose_next_answer = False
        # set by a fault: the next write never reaches the API server (ApiUnavailable)
        self.fail_next_write = False
        self.newest: dict[NodeName, int] = {}  # node -> highest resourceVersion taken in
        # a bind's deadline check before each request (``DeadlineClient``): (what, write)
        self.guard: Callable[[str, bool], None] | None = None

    def _saw(self, lease: JSON) -> None:
        node = NodeName(str(lease["metadata"]["name"]))
        rv = int(lease["metadata"]["resourceVersion"])
        self.newest[node] = max(rv, self.newest.get(node, 0))

    # -- observations ------------------------------------------------------------------------

    def view(self, node: NodeName) -> NodeLockView | None:
        seen = self.obs.get(node)
        return seen.view(self.clock.now) if seen is not None else None

    def take_event(self, event: Event) -> None:
        """A Lease watch event, as ``NodeLocks._follow`` takes it."""
        node = NodeName(event.name)
        if event.type == "DELETED":
            self.obs.forget(node)
        else:
            self.obs.observe(FMT.parse(event.obj), event.obj, self.clock.now)
            self._saw(event.obj)

    def take_answer(self, lease: JSON) -> None:
        """The answer of a GET served earlier, taken in now (as ``NodeLocks._read`` does)."""
        self.obs.observe(FMT.parse(lease), lease, self.clock.now, replace=True)
        self._saw(lease)

    def relist(self, *, only: NodeName | None = None) -> None:
        """A LIST at (re)start, as ``NodeLocks._take_list`` takes it."""
        present: set[NodeName] = set()
        for lease in self.store.list_leases():
            record = FMT.parse(lease)
            if only is not None and record.node != only:
                continue
            present.add(record.node)
            self.obs.observe(record, lease, self.clock.now, replace=True)
            self._saw(lease)
        for node in self.obs.nodes():
            if node not in present and (only is None or node == only):
                self.obs.forget(node)

    def _send(self, what: str, *, write: bool) -> None:
        if self.guard is not None:
            self.guard(what, write)

    def read(self, node: NodeName) -> Seen | None:
        self._send(f"GET lease {node}", write=False)
        try:
            lease = self.store.get_lease(node)
        except NotFound:
            self.obs.forget(node)
            return None
        self._saw(lease)
        return self.obs.observe(FMT.parse(lease), lease, self.clock.now, replace=True)

    def inspect(self, node: NodeName) -> NodeLockView | None:
        seen = self.read(node)
        return seen.view(self.clock.now) if seen is not None else None

    def _took(self, lease: JSON) -> Seen:
        if self.lose_next_answer:
            self.lose_next_answer = False
            raise ApiUnavailable(f"{self.name}: the write landed but its answer was lost")
        self._saw(lease)
        return self.obs.observe(FMT.parse(lease), lease, self.clock.now, replace=True)

    # -- operations --------------------------------------------------------------------------

    def acquire(
        self,
        node: NodeName,
        holder: Holder,
        *,
        may_take_over: Callable[[LockRecord], bool] | None = None,
        reacquire: bool = True,
    ) -> tuple[HeldLock, bool]:
        """``NodeLocks.acquire``: raises ``LockHeld``, or ``ApiUnavailable`` (answer lost)."""
        seen = self.obs.get(node)
        asked: tuple[str, bool] | None = None
        writes = 0
        while True:
            view = seen.view(self.clock.now) if seen is not None else None
            allowed = None
            if asked is not None and view is not None:
                allowed = asked[1] if asked[0] == view.record.resource_version else None
            action = decide_acquire(
                node,
                view,
                seen.lease if seen is not None else None,
                holder,
                fmt=FMT,
                duration_s=DURATION_S,
                now=self.clock.wall(self.skew),
                takeover_allowed=allowed,
                reacquire=reacquire,
            )
            # (a refusal from an unread view with no live watch reads first: always live here)
            if isinstance(action, Refuse):
                raise action.error
            if isinstance(action, AskTakeover):
                answer = may_take_over is not None and may_take_over(action.record)
                asked = (action.record.resource_version, answer)
                continue
            if writes == MAX_WRITES:
                token = seen.record.token if seen is not None else 0
                raise LockHeld(node, "(another holder: lost the race twice)", 0.0, token)
            writes += 1
            self._send(f"write lease {node}", write=True)
            try:
                if isinstance(action, Create):
                    lease = self.store.create_lease(action.body, writer=self.name)
                else:
                    lease = self.store.replace_lease(node, action.body, writer=self.name)
            except Conflict:
                seen = self.read(node)
                continue
            except NotFound:
                self.obs.forget(node)
                seen = None
                continue
            got = self._took(lease)
            taken = isinstance(action, Write) and action.taken_from is not None
            return HeldLock(node, holder, action.token, got.record.resource_version), taken

    def release(self, lock: HeldLock, *, outcome: Outcome) -> None:
        """``NodeLocks.release``: raises ``StaleToken``/``LockLost``; changes nothing then."""
        self._update(
            lock,
            lambda view, lease: decide_release(
                view, lease, lock, fmt=FMT, outcome=outcome, now=self.clock.wall(self.skew)
            ),
        )

    def renew(self, lock: HeldLock) -> HeldLock:
        """``NodeLocks.renew``: the lock with its new resourceVersion."""
        seen = self._update(
            lock,
            lambda view, lease: decide_renew(
                view, lease, lock, fmt=FMT, now=self.clock.wall(self.skew)
            ),
        )
        return HeldLock(lock.node, lock.holder, lock.token, seen.record.resource_version)

    def _update(
        self,
        lock: HeldLock,
        decide: Callable[[NodeLockView | None, JSON | None], UpdateAction],
    ) -> Seen:
        seen = self.obs.get(lock.node)
        fresh = False
        writes = 0
        while True:
            view = seen.view(self.clock.now) if seen is not None else None
            action = decide(view, seen.lease if seen is not None else None)
            if isinstance(action, Read):
                if fresh:
                    what = "no longer exists" if seen is None else "was deleted and created again"
                    raise LockLost(lock.node, f"the Lease {what}")
                seen, fresh = self.read(lock.node), True
                continue
            if isinstance(action, Refuse):
                raise action.error
            if writes == MAX_WRITES:
                raise LockLost(lock.node, "the Lease kept changing under the write")
            writes += 1
            self._send(f"write lease {lock.node}", write=True)
            if self.fail_next_write:
                self.fail_next_write = False
                raise ApiUnavailable(f"{self.name}: the API server cannot be reached")
            try:
                lease = self.store.replace_lease(lock.node, action.body, writer=self.name)
            except Conflict:
                seen, fresh = self.read(lock.node), True
                continue
            except NotFound as exc:
                self.obs.forget(lock.node)
                raise LockLost(lock.node, "the Lease was deleted") from exc
            return self._took(lease)


def token_of(lease: JSON | None) -> FencingToken:
    return FencingToken(0) if lease is None else FMT.parse(lease).token
