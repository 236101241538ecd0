"""Series the dashboards and alerts read exist before their first event; per-node lock gauges.

A rate of refusals must be 0 on a healthy cluster, not "no data" (docs/metrics.md, conventions).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from deviceplugin.decide import RefusalKind
from deviceplugin.metrics import PluginMetrics
from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX
from lockd.lease import LeaseFormat
from lockd.metrics import AcquireResult, LockMetrics, Operation
from lockd.model import Holder, HolderKey, NodeLockView, NodeName, Outcome
from scheduler_ext.cache import ClusterCache
from scheduler_ext.config import DEFAULT_HTTP_TIMEOUT_S
from scheduler_ext.metrics import LATENCY_BUCKETS, ExtenderMetrics, Result, Verb, latency_buckets

NODE = NodeName("gpu-1")


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_lock_counters_exist_at_zero_for_every_label_value() -> None:
    registry = CollectorRegistry()
    metrics = LockMetrics(registry=registry)
    for outcome in Outcome:
        assert sample(registry, "nodelock_lock_releases_total", outcome=outcome.value) == 0
        assert sample(registry, "nodelock_lock_hold_seconds_count", outcome=outcome.value) == 0
    for op in Operation:
        assert sample(registry, "nodelock_lock_stale_token_rejections_total", operation=op) == 0
    # a node's counters appear, all results at 0, the first time the node is touched
    assert sample(registry, "nodelock_lock_acquisitions_total", node=NODE, result="error") is None
    metrics.acquired(NODE, "uid", 1.0, takeover=False)
    for result in AcquireResult:
        want = 1 if result is AcquireResult.ACQUIRED else 0
        got = sample(registry, "nodelock_lock_acquisitions_total", node=NODE, result=result)
        assert got == want, result
    assert sample(registry, "nodelock_lock_expired_seen_total", node=NODE) == 0


class Views:
    def __init__(self, views: list[NodeLockView]) -> None:
        self.items = views

    def views(self) -> list[NodeLockView]:
        return self.items


def test_held_and_fencing_token_per_node_are_read_at_scrape_time() -> None:
    fmt = LeaseFormat(namespace=DEFAULT_LOCK_NAMESPACE, prefix=DEFAULT_PREFIX)
    held_body = fmt.new_lease(NODE, Holder(HolderKey("ns/a"), "u"), duration_s=15, now="x")
    held = NodeLockView(fmt.parse(held_body), 2.0, False)
    other = NodeName("gpu-2")
    free_body = fmt.released(
        fmt.new_lease(other, Holder(HolderKey("ns/b"), "v"), duration_s=15, now="x"),
        outcome=Outcome.ALLOCATED,
        now="x",
    )
    free = NodeLockView(fmt.parse(free_body), 1.0, False)
    registry = CollectorRegistry()
    metrics = LockMetrics(registry=registry)
    source = Views([held, free])
    metrics.add_view_source(source.views)
    assert sample(registry, "nodelock_lock_held", node=NODE) == 1
    assert sample(registry, "nodelock_lock_held", node=other) == 0
    assert sample(registry, "nodelock_lock_fencing_token", node=NODE) == int(held.record.token)
    assert sample(registry, "nodelock_lock_fencing_token", node=other) == int(free.record.token)
    assert sample(registry, "nodelock_lock_unchanged_seconds", node=other) is None  # free
    source.items = [held]
    assert sample(registry, "nodelock_lock_held", node=other) is None  # no longer observed


def test_extender_series_exist_at_zero_for_every_verb_and_result() -> None:
    registry = CollectorRegistry()
    ExtenderMetrics(ClusterCache(), registry=registry)
    for verb in Verb:
        count = "nodelock_extender_request_duration_seconds_count"
        assert sample(registry, count, verb=verb) == 0
        for result in Result:
            name = "nodelock_extender_requests_total"
            assert sample(registry, name, verb=verb, result=result) == 0
    for verdict in ("passed", "failed", "unresolvable"):
        assert sample(registry, "nodelock_extender_filter_nodes_total", result=verdict) == 0
    for resource in ("nodes", "pods"):
        assert sample(registry, "nodelock_extender_cache_relists_total", resource=resource) == 0


def test_device_plugin_refusals_exist_at_zero_for_every_reason() -> None:
    metrics = PluginMetrics(CollectorRegistry())
    for kind in [*RefusalKind, "allocated"]:
        name = "nodelock_deviceplugin_allocations_total"
        assert sample(metrics.registry, name, result=str(kind)) == 0, kind


def test_request_duration_has_kube_schedulers_timeout_among_its_bounds() -> None:
    """Answers later than kube-scheduler's ``httpTimeout`` are countable whatever the timeout:
    ``_count`` minus the bucket bounded by it."""
    registry = CollectorRegistry()
    metrics = ExtenderMetrics(ClusterCache(), registry=registry, http_timeout_s=14)
    name = "nodelock_extender_request_duration_seconds"
    for seconds in (9.0, 13.0, 15.0):
        metrics.latency.labels(Verb.BIND.value).observe(seconds)
    count = sample(registry, f"{name}_count", verb="bind")
    within = sample(registry, f"{name}_bucket", verb="bind", le="14.0")
    assert (count, within) == (3, 2)
    # the default timeout (10 s) is a bound of the default buckets: nothing added
    assert latency_buckets(DEFAULT_HTTP_TIMEOUT_S) == LATENCY_BUCKETS
    default = CollectorRegistry()
    ExtenderMetrics(ClusterCache(), registry=default)
    assert sample(default, f"{name}_bucket", verb="bind", le="10.0") == 0
    assert sample(default, f"{name}_bucket", verb="bind", le="14.0") is None
