"""Prometheus metrics of node locks (names and meaning: docs/metrics.md, section ``lockd``).

Labels are bounded: ``node``, ``result``, ``outcome``, ``operation`` — never a pod name or UID.
Every metric lives in the registry given to ``LockMetrics`` so that tests and several processes
in one interpreter do not collide; ``LockMetrics.default()`` is the one instance per process on
prometheus-client's global registry.

Lock wait is measured per holder (pod UID) from the first time this process saw that holder
contend to the time it acquires, so it is complete only in the process that retries (the
extender).  Lock hold is measured from the time this process first saw the acquisition (its own
write, or the watch event) to the release it made.
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

WAIT_BUCKETS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
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
        counts = {"free": 0, "held": 0, "expired": 0}
        latest: dict[str, float] = {}
        self.sources = [ref for ref in self.sources if ref() is not None]
        for ref in self.sources:
            source = ref()
            if source is None:
                continue
            for view in source():
                if view.record.holder is None:
                    counts["free"] += 1
                    continue
                counts["expired" if view.expired else "held"] += 1
                latest[view.node] = max(latest.get(view.node, 0.0), view.unchanged_for_s)
        for state, count in counts.items():
            states.add_metric([state], count)
        for node, seconds in sorted(latest.items()):
            unchanged.add_metric([node], seconds)
        yield states
        yield unchanged

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
        if registry is REGISTRY and LockMetrics._default is None:
            LockMetrics._default = self  # so that default() reuses it instead of colliding

    @classmethod
    def default(cls) -> LockMetrics:
        """The process-wide instance on prometheus-client's global registry (created once)."""
        if cls._default is None:
            cls._default = cls(registry=REGISTRY)
        return cls._default

    def add_view_source(self, source: ViewSource) -> None:
        """Report the views the bound method ``source`` returns in the scrape-time gauges.

        Held weakly: a ``NodeLocks`` that is dropped stops being reported.
        """
        self._observed.sources.append(weakref.WeakMethod(source))

    def contended(self, node: NodeName, holder_uid: str, now: float) -> None:
        """A holder found the lock held; its wait starts now unless it already started."""
        self.acquisitions.labels(node, AcquireResult.CONTENDED.value).inc()
        if holder_uid not in self._first_contention:
            self._first_contention[holder_uid] = now
            while len(self._first_contention) > MAX_WAITING_HOLDERS:
                self._first_contention.popitem(last=False)

    def acquired(self, node: NodeName, holder_uid: str, now: float, *, takeover: bool) -> None:
        """A holder got the lock: count it and observe its wait."""
        result = AcquireResult.TAKEOVER if takeover else AcquireResult.ACQUIRED
        self.acquisitions.labels(node, result.value).inc()
        started = self._first_contention.pop(holder_uid, now)
        self.wait.observe(max(0.0, now - started))

    def failed(self, node: NodeName) -> None:
        """An acquire call ended with an error other than contention."""
        self.acquisitions.labels(node, AcquireResult.ERROR.value).inc()

    def released(self, outcome: Outcome, held_for_s: float) -> None:
        """This process released a lock it had seen held for ``held_for_s``."""
        self.releases.labels(outcome.value).inc()
        self.hold.labels(outcome.value).observe(held_for_s)

    def expired(self, node: NodeName) -> None:
        """This process saw a held lock expire."""
        self.expired_seen.labels(node).inc()

    def stale(self, operation: Operation) -> None:
        """A write with a stale fencing token was refused."""
        self.stale_token.labels(operation.value).inc()
