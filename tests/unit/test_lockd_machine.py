"""Property-based test of the lock decisions under random interleavings.

Several processes, each with its own (possibly out-of-date) observations and its own skewed wall
clock, acquire, release, renew, re-read, crash and wait, against a plain-data model of the one
thing the API server guarantees here: a create fails if the object exists, and a write carrying a
resourceVersion fails unless it is the current one.  Every decision comes from ``lockd.decide``
and ``lockd.observed`` exactly as ``NodeLocks`` uses them.

Invariants checked after every step:
- the token never decreases, and each acquisition gets exactly the previous token + 1;
- a release or renew succeeds only for the holder of the current token (fencing);
- a takeover happens only with the caller's consent and only after the record stood unchanged
  for its full duration in real time (so a holder that renewed is never taken over);
- a lock believed with the current token belongs to the Lease's holder; none is newer.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX
from lockd.decide import (
    AskTakeover,
    Create,
    Read,
    Refuse,
    Write,
    decide_acquire,
    decide_release,
    decide_renew,
)
from lockd.errors import LockHeld, LockLost, StaleToken
from lockd.lease import LeaseFormat
from lockd.microtime import microtime_from_epoch
from lockd.model import HeldLock, Holder, HolderKey, LockRecord, NodeName, Outcome
from lockd.observed import Observations, same_content

FMT = LeaseFormat(namespace=DEFAULT_LOCK_NAMESPACE, prefix=DEFAULT_PREFIX)
NODE = NodeName("gpu-1")
DURATION = 10
HOLDERS = [Holder(HolderKey(f"ns/p{i}"), f"uid-{i}") for i in range(4)]
EPOCH = 1_714_564_800.0


class Lost(Exception):
    """The model store refused a write (409 / 404)."""


@dataclass
class Store:
    """The API server's guarantees for one Lease, and when its record last changed."""

    lease: dict[str, Any] | None = None
    version: int = 0
    changed_at: float = 0.0

    def record(self) -> LockRecord | None:
        return FMT.parse(self.lease) if self.lease is not None else None

    def create(self, body: dict[str, Any], now: float) -> dict[str, Any]:
        if self.lease is not None:
            raise Lost("AlreadyExists")
        return self._set(body, now)

    def replace(self, body: dict[str, Any], now: float) -> dict[str, Any]:
        if self.lease is None:
            raise Lost("NotFound")
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise Lost("Conflict")
        return self._set(body, now)

    def _set(self, body: dict[str, Any], now: float) -> dict[str, Any]:
        before = self.record()
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        if before is None or not same_content(before, FMT.parse(stored)):
            self.changed_at = now
        self.lease = stored
        return copy.deepcopy(stored)


@dataclass
class Process:
    """One lock user: its observations, its wall clock skew, the locks it believes it holds."""

    skew: float
    obs: Observations = field(default_factory=Observations)
    held: list[HeldLock] = field(default_factory=list)


class LockMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = Store()
        self.now = 0.0
        self.procs: list[Process] = []
        self.tokens: list[int] = []  # every token handed out, in order

    @initialize(skews=st.lists(st.floats(-86_400, 86_400), min_size=2, max_size=4))
    def start(self, skews: list[float]) -> None:
        self.procs = [Process(skew) for skew in skews]

    # -- helpers -------------------------------------------------------------------------------

    def proc(self, index: int) -> Process:
        return self.procs[index % len(self.procs)]

    def wall(self, proc: Process) -> str:
        return microtime_from_epoch(EPOCH + self.now + proc.skew)

    def read(self, proc: Process) -> None:
        if self.store.lease is None:
            proc.obs.forget(NODE)
        else:
            lease = copy.deepcopy(self.store.lease)
            proc.obs.observe(FMT.parse(lease), lease, self.now, replace=True)

    def known(self, proc: Process) -> tuple[Any, Any]:
        seen = proc.obs.get(NODE)
        return (seen.view(self.now), seen.lease) if seen is not None else (None, None)

    def took(self, proc: Process, lease: dict[str, Any]) -> None:
        proc.obs.observe(FMT.parse(lease), lease, self.now, replace=True)

    # -- rules ---------------------------------------------------------------------------------

    @rule(p=st.integers(0, 3), h=st.sampled_from(HOLDERS), consent=st.booleans())
    def acquire(self, p: int, h: Holder, consent: bool) -> None:
        proc = self.proc(p)
        view, lease = self.known(proc)
        action = decide_acquire(
            NODE, view, lease, h, fmt=FMT, duration_s=DURATION, now=self.wall(proc)
        )
        if isinstance(action, AskTakeover):
            action = decide_acquire(
                NODE,
                view,
                lease,
                h,
                fmt=FMT,
                duration_s=DURATION,
                now=self.wall(proc),
                takeover_allowed=consent,
            )
        if isinstance(action, Refuse):
            assert isinstance(action.error, LockHeld)
            return
        assert isinstance(action, Create | Write)
        before = self.store.record()
        unchanged_since = self.store.changed_at
        try:
            if isinstance(action, Create):
                stored = self.store.create(action.body, self.now)
            else:
                stored = self.store.replace(action.body, self.now)
        except Lost:
            event("acquire lost a race")
            self.read(proc)  # lost the race: re-read, never overwrite
            return
        # the write landed: it must be a legitimate acquisition
        previous = before.token if before is not None else 0
        assert action.token == previous + 1
        assert not self.tokens or action.token > self.tokens[-1]
        event(f"acquired ({type(action).__name__})")
        if isinstance(action, Write) and action.taken_from is not None:
            event("takeover")
            assert consent
            assert before is not None
            assert before.holder is not None
            assert (before.holder.key, before.holder.uid) != (h.key, h.uid)
            assert self.now - unchanged_since >= DURATION
        elif before is not None and before.holder is not None:
            assert (before.holder.key, before.holder.uid) == (h.key, h.uid)
        self.tokens.append(action.token)
        self.took(proc, stored)
        proc.held.append(HeldLock(NODE, h, action.token, stored["metadata"]["resourceVersion"]))

    @rule(p=st.integers(0, 3), i=st.integers(0, 10), release=st.booleans())
    def release_or_renew(self, p: int, i: int, release: bool) -> None:
        proc = self.proc(p)
        if not proc.held:
            return
        lock = proc.held[i % len(proc.held)]
        for _attempt in range(2):
            view, lease = self.known(proc)
            if release:
                action = decide_release(
                    view, lease, lock, fmt=FMT, outcome=Outcome.ALLOCATED, now=self.wall(proc)
                )
            else:
                action = decide_renew(view, lease, lock, fmt=FMT, now=self.wall(proc))
            if isinstance(action, Read):
                self.read(proc)
                continue
            if isinstance(action, Refuse):
                assert isinstance(action.error, StaleToken | LockLost)
                current = self.store.record()
                assert current is not None
                event(f"refused: {type(action.error).__name__}")
                if isinstance(action.error, StaleToken):
                    assert current.token > lock.token
                proc.held.remove(lock)
                return
            assert isinstance(action, Write)
            before = self.store.record()
            try:
                stored = self.store.replace(action.body, self.now)
            except Lost:
                event("release/renew lost a race")
                self.read(proc)
                continue
            # fencing: only the current token's holder could write
            assert before is not None
            assert before.token == lock.token
            assert before.holder is not None
            assert (before.holder.key, before.holder.uid) == (lock.holder.key, lock.holder.uid)
            self.took(proc, stored)
            proc.held.remove(lock)
            if not release:
                proc.held.append(
                    HeldLock(NODE, lock.holder, lock.token, stored["metadata"]["resourceVersion"])
                )
            return

    @rule(p=st.integers(0, 3))
    def device_plugin_releases_what_it_sees(self, p: int) -> None:
        """A process releasing the lock it observes held (as the device plugin does)."""
        proc = self.proc(p)
        view, _ = self.known(proc)
        if view is None or view.record.holder is None:
            return
        proc.held.append(
            HeldLock(NODE, view.record.holder, view.record.token, view.record.resource_version)
        )
        self.release_or_renew(p, len(proc.held) - 1, True)

    @rule(p=st.integers(0, 3))
    def reread(self, p: int) -> None:
        self.read(self.proc(p))

    @rule(dt=st.sampled_from([0.5, 3.0, DURATION, 2 * DURATION]))
    def wait(self, dt: float) -> None:
        self.now += dt

    @rule(p=st.integers(0, 3))
    def crash(self, p: int) -> None:
        """A restart forgets every observation and every lock it believed it held."""
        proc = self.proc(p)
        proc.obs = Observations()
        proc.held.clear()

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def token_matches_acquisitions(self) -> None:
        record = self.store.record()
        assert (record.token if record is not None else 0) == len(self.tokens)
        assert self.tokens == list(range(1, len(self.tokens) + 1))

    @precondition(lambda self: self.store.lease is not None)
    @invariant()
    def one_current_believer(self) -> None:
        record = self.store.record()
        assert record is not None
        current = [lock for proc in self.procs for lock in proc.held if lock.token == record.token]
        for lock in current:  # a believer of the current token is its holder (or it was freed)
            assert record.holder is None or lock.holder.key == record.holder.key
        assert all(lock.token <= record.token for proc in self.procs for lock in proc.held)


LockMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=80, deadline=None)
TestLockMachine = LockMachine.TestCase
