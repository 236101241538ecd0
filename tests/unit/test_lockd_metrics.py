"""Lock metrics: names, bounded labels, wait from first contention, scrape-time gauges."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX
from lockd.lease import LeaseFormat
from lockd.metrics import LockMetrics, Operation
from lockd.model import Holder, HolderKey, NodeLockView, NodeName, Outcome

NODE = NodeName("gpu-1")


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_wait_runs_from_the_first_contention_to_the_acquisition() -> None:
    registry = CollectorRegistry()
    metrics = LockMetrics(registry=registry)
    metrics.contended(NODE, "uid-a", 10.0)
    metrics.contended(NODE, "uid-a", 12.0)  # a retry does not restart the wait
    metrics.acquired(NODE, "uid-a", 13.5, takeover=False)
    metrics.acquired(NODE, "uid-b", 20.0, takeover=True)  # never contended: waited 0
    assert value(registry, "nodelock_lock_wait_seconds_count") == 2
    assert value(registry, "nodelock_lock_wait_seconds_sum") == 3.5
    assert value(registry, "nodelock_lock_wait_seconds_bucket", le="0.0") == 1
    acquisitions = "nodelock_lock_acquisitions_total"
    assert value(registry, acquisitions, node=NODE, result="contended") == 2
    assert value(registry, acquisitions, node=NODE, result="acquired") == 1
    assert value(registry, acquisitions, node=NODE, result="takeover") == 1


def test_hold_releases_expiry_and_stale_tokens() -> None:
    registry = CollectorRegistry()
    metrics = LockMetrics(registry=registry)
    metrics.released(Outcome.ALLOCATED, 2.0)
    metrics.expired(NODE)
    metrics.stale(Operation.RELEASE)
    metrics.failed(NODE)
    assert value(registry, "nodelock_lock_hold_seconds_sum", outcome="allocated") == 2.0
    assert value(registry, "nodelock_lock_releases_total", outcome="allocated") == 1
    assert value(registry, "nodelock_lock_expired_seen_total", node=NODE) == 1
    assert value(registry, "nodelock_lock_stale_token_rejections_total", operation="release") == 1
    assert value(registry, "nodelock_lock_acquisitions_total", node=NODE, result="error") == 1


class Views:
    def __init__(self, views: list[NodeLockView]) -> None:
        self.items = views

    def views(self) -> list[NodeLockView]:
        return self.items


def test_observed_gauges_are_computed_at_scrape_time_and_dropped_with_their_source() -> None:
    fmt = LeaseFormat(namespace=DEFAULT_LOCK_NAMESPACE, prefix=DEFAULT_PREFIX)
    body = fmt.new_lease(NODE, Holder(HolderKey("ns/a"), "u"), duration_s=15, now="x")
    held = NodeLockView(fmt.parse(body), 20.0, True)
    free_body = fmt.released(body, outcome=Outcome.ALLOCATED, now="x")
    free = NodeLockView(fmt.parse(free_body), 1.0, False)
    registry = CollectorRegistry()
    metrics = LockMetrics(registry=registry)
    source = Views([held, free])
    metrics.add_view_source(source.views)
    assert value(registry, "nodelock_locks_observed", state="expired") == 1
    assert value(registry, "nodelock_locks_observed", state="free") == 1
    assert value(registry, "nodelock_locks_observed", state="held") == 0
    assert value(registry, "nodelock_lock_unchanged_seconds", node=NODE) == 20.0
    del source
    assert value(registry, "nodelock_locks_observed", state="expired") == 0


def test_two_instances_in_separate_registries_do_not_collide() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    LockMetrics(registry=first).failed(NODE)
    LockMetrics(registry=second)
    assert value(first, "nodelock_lock_acquisitions_total", node=NODE, result="error") == 1
    assert value(second, "nodelock_lock_acquisitions_total", node=NODE, result="error") is None
    assert LockMetrics.default() is LockMetrics.default()


def test_every_name_is_prefixed_and_in_base_units() -> None:
    registry = CollectorRegistry()
    LockMetrics(registry=registry)
    text = generate_latest(registry).decode()
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert names
    for name in names:
        assert name.startswith("nodelock_")
    kinds = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE"))
    for name, kind in kinds.items():
        if kind == "counter":
            assert name.endswith("_total")
        if kind == "histogram":
            assert name.endswith("_seconds")
