"""Prometheus metrics of the extender (names and meaning: docs/metrics.md, section ``extender``).

Labels are bounded: ``verb``, ``result``, ``resource``, ``node`` — never a pod name or UID.  Lock
wait per pod is measured from the first bind of that pod that met a held lock to its successful
bind; the first-contention times are kept in a bounded map keyed by pod UID (oldest dropped), not
as labels.  Per-node GPU gauges and cache staleness are computed at scrape time from the cache.
Labelled counters exist at 0 for every label value from the start, so queries return data before
the first event.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from enum import StrEnum

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kube.build import register_build_info
from lockd.metrics import WAIT_BUCKETS
from lockd.model import NodeName
from scheduler_ext.cache import ClusterCache
from scheduler_ext.config import DEFAULT_HTTP_TIMEOUT_S
from scheduler_ext.waiting import GiveUp

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
MAX_WAITING_PODS = 10_000


def latency_buckets(http_timeout_s: float) -> tuple[float, ...]:
    """``LATENCY_BUCKETS`` with kube-scheduler's ``httpTimeout`` among the bounds, so that the
    answers it no longer waited for are countable: ``_count`` minus ``_bucket{le="<timeout>"}``."""
    return tuple(sorted({*LATENCY_BUCKETS, float(http_timeout_s)}))


class Verb(StrEnum):
    """An extender endpoint (label ``verb``)."""

    FILTER = "filter"
    PRIORITIZE = "prioritize"
    BIND = "bind"


class Result(StrEnum):
    """How a call ended (label ``result``)."""

    OK = "ok"  # answered (filter/prioritize), bound (bind)
    BAD_REQUEST = "bad_request"  # 4xx: the body was not the protocol
    CONTENDED = "contended"  # bind: the node's lock is held
    NO_FIT = "no_fit"  # bind: the pod no longer fits the node
    CONFLICT = "conflict"  # bind: the confirm step found the choice taken
    ERROR = "error"  # anything else (API server errors, pod gone, …)


class _CacheGauges(Collector):
    def __init__(self, cache: ClusterCache, queues: Callable[[], dict[NodeName, int]]) -> None:
        self.cache = cache
        self.queues = queues

    def collect(self) -> Iterator[Metric]:
        total = GaugeMetricFamily(
            "nodelock_extender_gpus",
            "GPUs in each node's published inventory.",
            labels=["node"],
        )
        assigned = GaugeMetricFamily(
            "nodelock_extender_gpus_assigned",
            "GPUs of each node assigned to live pods, as the extender's cache sees them.",
            labels=["node"],
        )
        for node, (n_total, n_assigned) in sorted(self.cache.gpu_counts().items()):
            total.add_metric([node], n_total)
            assigned.add_metric([node], n_assigned)
        stale = GaugeMetricFamily(
            "nodelock_extender_cache_staleness_seconds",
            "Seconds since the cache last heard from the API server (watch event, bookmark or "
            "relist), by resource; absent until the first list.",
            labels=["resource"],
        )
        for resource in ("nodes", "pods"):
            age = self.cache.staleness_s(resource)
            if age is not None:
                stale.add_metric([resource], age)
        synced = GaugeMetricFamily(
            "nodelock_extender_cache_synced",
            "1 once the node and pod caches have been listed.",
        )
        synced.add_metric([], 1.0 if self.cache.synced else 0.0)
        depth = GaugeMetricFamily(
            "nodelock_extender_bind_queue_depth",
            "Binds waiting their turn (or being carried out) per node, in this replica.",
            labels=["node"],
        )
        depths = self.queues()
        for node in sorted(self.cache.gpu_counts()):
            depth.add_metric([node], depths.get(node, 0))
        yield depth
        yield total
        yield assigned
        yield stale
        yield synced


class ExtenderMetrics:
    """The extender's metrics in one registry (prometheus-client's global one by default)."""

    def __init__(
        self,
        cache: ClusterCache,
        *,
        registry: CollectorRegistry = REGISTRY,
        clock: Callable[[], float] = time.monotonic,
        http_timeout_s: float = DEFAULT_HTTP_TIMEOUT_S,
    ) -> None:
        """``http_timeout_s``: kube-scheduler's ``httpTimeout``, a bound of the request-duration
        buckets (``latency_buckets``)."""
        self.registry = registry
        register_build_info(registry)
        self._queue_depths: Callable[[], dict[NodeName, int]] = dict
        self._clock = clock
        self.latency = Histogram(
            "nodelock_extender_request_duration_seconds",
            "Time to answer a filter, prioritize or bind call, server side.",
            ["verb"],
            buckets=latency_buckets(http_timeout_s),
            registry=registry,
        )
        self.requests = Counter(
            "nodelock_extender_requests",
            "Extender calls by verb and result.",
            ["verb", "result"],
            registry=registry,
        )
        self.filter_nodes = Counter(
            "nodelock_extender_filter_nodes",
            "Nodes judged by filter calls, by verdict (passed, failed, unresolvable).",
            ["result"],
            registry=registry,
        )
        self.contention = Counter(
            "nodelock_extender_bind_contended",
            "Binds that found the node's lock held (the scheduler retries the pod later).",
            registry=registry,
        )
        self.lock_wait = Histogram(
            "nodelock_extender_lock_wait_seconds",
            "Per pod that met a held lock: first contention to successful bind.",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.bind_attempts = Histogram(
            "nodelock_extender_bind_attempts",
            "Bind calls a pod needed until it was bound (1 = no contention).",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
            registry=registry,
        )
        self.confirm_wait = Histogram(
            "nodelock_extender_confirm_wait_seconds",
            "Bind's confirm step: time waiting for the cache to see the previous handoff.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.confirm_fallbacks = Counter(
            "nodelock_extender_confirm_fallbacks",
            "Confirm steps that listed the node's pods because the cache could not prove its "
            "view complete (previous holder never bound, or not seen in time).",
            registry=registry,
        )
        self.relists = Counter(
            "nodelock_extender_cache_relists",
            "Full LISTs of a cached resource (start, 410 Gone, errors).",
            ["resource"],
            registry=registry,
        )
        self.queue_wait = Histogram(
            "nodelock_extender_bind_queue_wait_seconds",
            "Per bind that took its node's lock: joining the node's queue to acquiring.",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.wait_refusals = Counter(
            "nodelock_extender_bind_wait_refusals",
            "Binds that left their node's queue without the lock, by reason (budget: the wait "
            "budget ran out; fail_fast: the expected wait exceeded it; abandoned: the scheduler "
            "stopped waiting; duplicate: a bind of the same pod was already queued).",
            ["reason"],
            registry=registry,
        )
        self.asked_again = Counter(
            "nodelock_extender_turned_away_asked_again",
            "Pods filter turned away for want of room, updated so that kube-scheduler asks "
            "again once the cache saw room for them, by result (asked; gone: the pod was "
            "deleted; failed: the update failed).",
            ["result"],
            registry=registry,
        )
        self._first_contention: OrderedDict[str, tuple[float, int]] = OrderedDict()
        registry.register(_CacheGauges(cache, lambda: self._queue_depths()))
        # Every series a dashboard or alert asks for exists (at 0) before its first event.
        for verb in Verb:
            self.latency.labels(verb.value)
            for result in Result:
                self.requests.labels(verb.value, result.value)
        for verdict in ("passed", "failed", "unresolvable"):
            self.filter_nodes.labels(verdict)
        for resource in ("nodes", "pods"):
            self.relists.labels(resource)
        for reason in GiveUp:
            self.wait_refusals.labels(reason.value)
        for outcome in ("asked", "gone", "failed"):
            self.asked_again.labels(outcome)

    def follow_queues(self, depths: Callable[[], dict[NodeName, int]]) -> None:
        """Report ``depths()`` (node -> queued binds) as the queue-depth gauge."""
        self._queue_depths = depths

    def refused(self, reason: GiveUp) -> None:
        """A bind left its node's queue without the lock."""
        self.wait_refusals.labels(reason.value).inc()

    def contended(self, pod_uid: str) -> None:
        """A bind of ``pod_uid`` met a held lock."""
        self.contention.inc()
        first = self._first_contention.get(pod_uid)
        if first is None:
            self._first_contention[pod_uid] = (self._clock(), 1)
            while len(self._first_contention) > MAX_WAITING_PODS:
                self._first_contention.popitem(last=False)
        else:
            self._first_contention[pod_uid] = (first[0], first[1] + 1)

    def bound(self, pod_uid: str) -> None:
        """``pod_uid`` was bound: close its lock wait, if it had one."""
        first = self._first_contention.pop(pod_uid, None)
        if first is None:
            self.bind_attempts.observe(1)
            return
        self.lock_wait.observe(max(0.0, self._clock() - first[0]))
        self.bind_attempts.observe(first[1] + 1)

    def waiting_pods(self) -> int:
        return len(self._first_contention)
