"""Prometheus metrics of node locks (names and meaning: docs/metrics.md, section ``lockd``).

Labels are bounded: ``node``, ``result``, ``outcome``, ``operation`` — never a pod name or UID.
Every metric lives in the registry given to ``LockMetrics`` so that tests and several processes
in one interpreter do not collide; ``LockMetrics.default()`` is the one instance per process on
prometheus-client's global registry.

Lock wait is measured per holder (pod UID) from the first time this process saw that holder
contend to the time it acquires, so it is complete only in the process that retries (the
extender).  Lock hold is measured from the time this process first saw the acquisition (its own
write, or the watch event) to the release it made.

Series exist before their first event: releases, holds and stale-token rejections for every label
value at once, and a node's acquisition and expiry counters (all results, at 0) the first time
this process acquires, contends on or sees an expiry of that node's lock.  Per node that is at most
four acquisition series, one expiry series and three scrape-time gauges.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from enum import StrEnum
from typing import ClassVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from lockd.model import NodeLockView, NodeName, Outcome

# Fitted to what the demo measures (waits: p50 about 2 s, p99 about 5 s; holds: p50 about 60 ms,
# p99 about 400 ms), with room on both sides for slower clusters and stuck holders.
WAIT_BUCKETS = (
    0.0, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0,
    600.0,
)  # fmt: skip
HOLD_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.4, 0.6, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
MAX_WAITING_HOLDERS = 10_000


class AcquireResult(StrEnum):
    """How an acquire call ended (label ``result``)."""

    ACQUIRED = "acquired"
    CONTENDED = "contended"
    TAKEOVER = "takeover"
    ERROR = "error"


class Operation(StrEnum):
    """A write made with a fencing token (label ``operation``)."""

    RELEASE = "release"
    RENEW = "renew"


ViewSource = Callable[[], Iterable[NodeLockView]]


class _ObservedLocks(Collector):
    """Gauges computed at scrape time from what the registered ``NodeLocks`` have seen."""

    def __init__(self) -> None:
        self.sources: list[weakref.WeakMethod[ViewSource]] = []

    def collect(self) -> Iterator[Metric]:
        states = GaugeMetricFamily(
            "nodelock_locks_observed",
            "Node locks this process has seen, by state (free, held, expired).",
            labels=["state"],
        )
        unchanged = GaugeMetricFamily(
            "nodelock_lock_unchanged_seconds",
            "For each held lock, how long this process has seen its record unchanged.",
            labels=["node"],
        )
        held = GaugeMetricFamily(
            "nodelock_lock_held",
            "For each node lock this process observes: 1 while held, 0 while free.",
            labels=["node"],
        )
        token = GaugeMetricFamily(
            "nodelock_lock_fencing_token",
            "For each node lock this process observes: its fencing token (one step per handoff).",
            labels=["node"],
        )
        counts = {"free": 0, "held": 0, "expired": 0}
        latest: dict[str, float] = {}
        is_held: dict[str, bool] = {}
        tokens: dict[str, int] = {}
        self.sources = [ref for ref in self.sources if ref() is not None]
        for ref in self.sources:
            source = ref()
            if source is None:
                continue
            for view in source():
                tokens[view.node] = max(tokens.get(view.node, 0), int(view.record.token))
                is_held[view.node] = is_held.get(view.node, False) or view.record.holder is not None
                if view.record.holder is None:
                    counts["free"] += 1
                    continue
                counts["expired" if view.expired else "held"] += 1
                latest[view.node] = max(latest.get(view.node, 0.0), view.unchanged_for_s)
        for state, count in counts.items():
            states.add_metric([state], count)
        for node, seconds in sorted(latest.items()):
            unchanged.add_metric([node], seconds)
        for node in sorted(tokens):
            held.add_metric([node], 1.0 if is_held[node] else 0.0)
            token.add_metric([node], float(tokens[node]))
        yield states
        yield unchanged
        yield held
        yield token

    def describe(self) -> Iterator[Metric]:
        return iter(())


class LockMetrics:
    """The lock metrics of one process (or one test), registered in ``registry``."""

    _default: ClassVar[LockMetrics | None] = None

    def __init__(self, *, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.acquisitions = Counter(
            "nodelock_lock_acquisitions_total",
            "Lock acquire calls by node and result (acquired, contended, takeover, error).",
            ["node", "result"],
            registry=registry,
        )
        self.wait = Histogram(
            "nodelock_lock_wait_seconds",
            "From a holder's first contention to its acquisition (0 when it never contended).",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.hold = Histogram(
            "nodelock_lock_hold_seconds",
            "From acquisition (as this process saw it) to release, by outcome.",
            ["outcome"],
            buckets=HOLD_BUCKETS,
            registry=registry,
        )
        self.releases = Counter(
            "nodelock_lock_releases_total",
            "Locks released by this process, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.expired_seen = Counter(
            "nodelock_lock_expired_seen_total",
            "Held locks this process saw expire (unchanged for their duration), once per record.",
            ["node"],
            registry=registry,
        )
        self.stale_token = Counter(
            "nodelock_lock_stale_token_rejections_total",
            "Writes refused because they carried an older fencing token than the Lease's.",
            ["operation"],
            registry=registry,
        )
        self._observed = _ObservedLocks()
        registry.register(self._observed)
        self._first_contention: OrderedDict[str, float] = OrderedDict()
        self._nodes_seen: set[str] = set()
        # Every series a dashboard or alert asks for exists (at 0) before its first event.
        for outcome in Outcome:
            self.releases.labels(outcome.value)
            self.hold.labels(outcome.value)
        for operation in Operation:
            self.stale_token.labels(operation.value)
        if registry is REGISTRY and LockMetrics._default is None:
            LockMetrics._default = self  # so that default() reuses it instead of colliding

    @classmethod
    def default(cls) -> LockMetrics:
        """The process-wide instance on prometheus-client's global registry (created once)."""
        if cls._default is None:
            cls._default = cls(registry=REGISTRY)
        return cls._default

    def _node(self, node: NodeName) -> None:
        """Create the node's counters at 0 for every result the first time it is named."""
        if node in self._nodes_seen:
            return
        self._nodes_seen.add(node)
        for result in AcquireResult:
            self.acquisitions.labels(node, result.value)
        self.expired_seen.labels(node)

    def add_view_source(self, source: ViewSource) -> None:
        """Report the views the bound method ``source`` returns in the scrape-time gauges.

        Held weakly: a ``NodeLocks`` that is dropped stops being reported.
        """
        self._observed.sources.append(weakref.WeakMethod(source))

    def contended(self, node: NodeName, holder_uid: str, now: float) -> None:
        """A holder found the lock held; its wait starts now unless it already started."""
        self._node(node)
        self.acquisitions.labels(node, AcquireResult.CONTENDED.value).inc()
        if holder_uid not in self._first_contention:
            self._first_contention[holder_uid] = now
            while len(self._first_contention) > MAX_WAITING_HOLDERS:
                self._first_contention.popitem(last=False)

    def acquired(self, node: NodeName, holder_uid: str, now: float, *, takeover: bool) -> None:
        """A holder got the lock: count it and observe its wait."""
        self._node(node)
        result = AcquireResult.TAKEOVER if takeover else AcquireResult.ACQUIRED
        self.acquisitions.labels(node, result.value).inc()
        started = self._first_contention.pop(holder_uid, now)
        self.wait.observe(max(0.0, now - started))

    def failed(self, node: NodeName) -> None:
        """An acquire call ended with an error other than contention."""
        self._node(node)
        self.acquisitions.labels(node, AcquireResult.ERROR.value).inc()

    def released(self, outcome: Outcome, held_for_s: float) -> None:
        """This process released a lock it had seen held for ``held_for_s``."""
        self.releases.labels(outcome.value).inc()
        self.hold.labels(outcome.value).observe(held_for_s)

    def expired(self, node: NodeName) -> None:
        """This process saw a held lock expire."""
        self._node(node)
        self.expired_seen.labels(node).inc()

    def stale(self, operation: Operation) -> None:
        """A write with a stale fencing token was refused."""
        self.stale_token.labels(operation.value).inc()
