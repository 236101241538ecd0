"""The nodelock overview dashboard: handoffs, latencies, contention, GPUs, errors, targets.

Queries follow docs/metrics.md: per-node gauges that every extender replica reports are combined
with ``max by (node)``; counters and histograms are summed over processes.
"""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.grafana import (
    JSON,
    NODE_UID,
    OVERVIEW_UID,
    RI,
    Panel,
    Row,
    Target,
    dashboard,
    quantiles,
)

NODE_LINK: JSON = {
    "title": "Open the node's drill-down",
    "url": f"/d/{NODE_UID}/nodelock-node?var-node=${{__field.labels.node}}"
    "&${datasource:queryparam}&${__url_time_range}",
}
BIND_SELECTOR = '{verb="bind"}'
ASSIGNED = "sum(max by (node) (nodelock_extender_gpus_assigned))"
TOTAL = "sum(max by (node) (nodelock_extender_gpus))"


def _stat(
    title: str,
    targets: Sequence[Target],
    description: str,
    *,
    unit: str = "short",
    thresholds: Sequence[tuple[float, str]] = (),
) -> Panel:
    """A stat panel of the top row (4 x 4)."""
    return Panel(
        title,
        targets,
        description,
        kind="stat",
        unit=unit,
        width=4,
        height=4,
        thresholds=thresholds,
    )


def model() -> JSON:
    """The dashboard's JSON model."""
    handoffs = Row(
        "Handoffs",
        [
            _stat(
                "Handoffs/s",
                [Target(f'sum(rate(nodelock_lock_releases_total{{outcome="allocated"}}[{RI}]))')],
                "Locks released by the device plugins after serving a pod: completed handoffs.",
                unit="ops",
            ),
            _stat(
                "GPU use",
                [Target(f"{ASSIGNED} / {TOTAL}")],
                "GPUs assigned to live pods over GPUs in the published inventories.",
                unit="percentunit",
                thresholds=[(0.9, "orange"), (0.98, "red")],
            ),
            _stat(
                "Locks held now",
                [Target("sum(max by (node) (nodelock_lock_held))")],
                "Nodes whose lock is held at the last scrape (a pod between Bind and Allocate).",
            ),
            _stat(
                "Expired locks",
                [Target('max(nodelock_locks_observed{state="expired"})')],
                "Held locks unchanged for longer than their duration. Above 0 for minutes: a "
                "stuck handoff; `nodelock locks` says which pod and why.",
                thresholds=[(1, "red")],
            ),
            _stat(
                "Bind p99",
                [quantiles("nodelock_extender_request_duration_seconds", BIND_SELECTOR)[1]],
                "99th percentile of the extender's bind (choose, lock, confirm, binding write).",
                unit="s",
                thresholds=[(0.25, "orange"), (1, "red")],
            ),
            _stat(
                "Allocate p99",
                [quantiles("nodelock_deviceplugin_allocate_seconds")[1]],
                "99th percentile of the device plugins' Allocate (lookup, checkpoint, release).",
                unit="s",
                thresholds=[(0.25, "orange"), (1, "red")],
            ),
            Panel(
                "Handoffs and binds per second",
                [
                    Target(
                        f"sum by (outcome) (rate(nodelock_lock_releases_total[{RI}]))",
                        "released {{outcome}}",
                    ),
                    Target(
                        f"sum by (result) (rate(nodelock_extender_requests_total"
                        f"{BIND_SELECTOR}[{RI}]))",
                        "bind {{result}}",
                    ),
                ],
                "Lock releases by handoff outcome (device plugins: allocated, rejected; "
                "extender: bind-failed, expired) and bind calls by result.",
                unit="ops",
            ),
            Panel(
                "Bind latency",
                quantiles("nodelock_extender_request_duration_seconds", BIND_SELECTOR),
                "Extender bind, server side. Tens of ms is normal; slow binds point at the API "
                "server (Lease and binding writes) or at confirm waits.",
                unit="s",
            ),
            Panel(
                "Allocate latency",
                quantiles("nodelock_deviceplugin_allocate_seconds"),
                "Device plugin Allocate, all nodes. Per node: the node drill-down.",
                unit="s",
            ),
        ],
    )
    contention = Row(
        "Lock contention",
        [
            Panel(
                "Lock acquisitions by result",
                [
                    Target(
                        f"sum by (result) (rate(nodelock_lock_acquisitions_total[{RI}]))",
                        "{{result}}",
                    )
                ],
                "acquired: handoffs starting; contended: a bind met a held lock and fails, "
                "kube-scheduler retries; takeover: an expired lock whose holder left handoff; "
                "error: API trouble.",
                unit="ops",
                stack=True,
            ),
            Panel(
                "Bind contention share",
                [
                    Target(
                        "sum(rate(nodelock_extender_requests_total"
                        f'{{verb="bind",result="contended"}}[{RI}])) / '
                        f"sum(rate(nodelock_extender_requests_total{BIND_SELECTOR}[{RI}]))",
                        "contended binds",
                    )
                ],
                "Share of bind calls that could not get their turn at the node's lock within "
                "the wait budget (kube-scheduler retries them). Above one half for long: more "
                "pods per node than the budget can serve (alert NodelockLockContentionHigh).",
                unit="percentunit",
                minimum=0,
            ),
            Panel(
                "Bind queue wait",
                quantiles("nodelock_extender_bind_queue_wait_seconds"),
                "Per bind that took its node's lock: joining the node's queue to acquiring. "
                "Near the wait budget (4 s by default): bursts larger than the nodes can serve, "
                "or long holds.",
                unit="s",
            ),
            Panel(
                "Binds queued per node",
                [
                    Target(
                        "topk(10, sum by (node) (nodelock_extender_bind_queue_depth))",
                        "{{node}}",
                    )
                ],
                "Binds waiting their turn (or being carried out), summed over the extender "
                "replicas (each has its own queues), the ten busiest nodes. High "
                "on a few nodes while others are idle: prioritize is not spreading.",
                minimum=0,
            ),
            Panel(
                "Binds that gave up waiting, by reason",
                [
                    Target(
                        f"sum by (reason) (rate(nodelock_extender_bind_wait_refusals_total[{RI}]))",
                        "{{reason}}",
                    )
                ],
                "budget: waited the whole budget (a stuck holder?); fail_fast: the expected "
                "wait did not fit; abandoned: kube-scheduler stopped waiting (httpTimeout "
                "shorter than the extender was told); duplicate: the same pod twice.",
                unit="ops",
                stack=True,
            ),
            Panel(
                "Lock wait per pod across retries",
                quantiles("nodelock_extender_lock_wait_seconds"),
                "Pods whose bind was refused at least once: from that refusal to the successful "
                "bind (includes kube-scheduler's backoff).",
                unit="s",
            ),
            Panel(
                "Lock hold (bind to release)",
                quantiles("nodelock_lock_hold_seconds", '{outcome="allocated"}'),
                "From the acquisition, as the device plugin saw it, to its release after the "
                "pod's last GPU container was served.",
                unit="s",
            ),
            Panel(
                "Bind calls per pod",
                quantiles("nodelock_extender_bind_attempts"),
                "Bind calls a pod needed until bound; 1 means no contention.",
            ),
            Panel(
                "Longest held lock per node",
                [
                    Target(
                        f"max by (node) (max_over_time(nodelock_lock_unchanged_seconds[{RI}]))",
                        "{{node}}",
                    )
                ],
                "How long each held lock has stood unchanged. Growing past the lease duration: "
                "the holder is not progressing (alert NodelockLockStuck).",
                unit="s",
                thresholds=[(300, "red")],
            ),
        ],
    )
    gpus = Row(
        "GPUs",
        [
            Panel(
                "GPUs assigned vs free",
                [
                    Target(ASSIGNED, "assigned"),
                    Target(f"{TOTAL} - {ASSIGNED}", "free"),
                    Target('sum(nodelock_deviceplugin_devices{health="unhealthy"})', "unhealthy"),
                ],
                "From the extender's cache (assigned: held by live pods) and the device "
                "plugins (unhealthy devices).",
                stack=True,
                width=12,
            ),
            Panel(
                "GPUs assigned per node",
                [
                    Target(
                        "max by (node) (nodelock_extender_gpus_assigned) / "
                        "max by (node) (nodelock_extender_gpus)",
                        "{{node}}",
                    )
                ],
                "Share of each node's GPUs held by live pods. Click a node for its drill-down.",
                kind="bargauge",
                unit="percentunit",
                width=12,
                thresholds=[(0.9, "orange"), (1, "red")],
                links=[NODE_LINK],
                minimum=0,
            ),
        ],
    )
    errors = Row(
        "Errors",
        [
            Panel(
                "Errors per second",
                [
                    Target(
                        "sum by (verb, result) (rate(nodelock_extender_requests_total"
                        f'{{result=~"bad_request|no_fit|conflict|error"}}[{RI}]))',
                        "extender {{verb}} {{result}}",
                    ),
                    Target(
                        "sum(rate(nodelock_deviceplugin_allocations_total"
                        f'{{result!="allocated"}}[{RI}]))',
                        "Allocate refused",
                    ),
                    Target(
                        "sum by (result) (rate(nodelock_lock_acquisitions_total"
                        f'{{result=~"error|takeover"}}[{RI}]))',
                        "lock {{result}}",
                    ),
                    Target(
                        "sum by (operation) "
                        f"(rate(nodelock_lock_stale_token_rejections_total[{RI}]))",
                        "stale token {{operation}}",
                    ),
                    Target(
                        "sum(rate(nodelock_deviceplugin_registrations_total"
                        f'{{result="error"}}[{RI}]))',
                        "kubelet registration errors",
                    ),
                    Target(
                        "sum(rate(nodelock_deviceplugin_inventory_writes_total"
                        f'{{result="error"}}[{RI}]))',
                        "inventory write errors",
                    ),
                    Target(
                        "sum(rate(nodelock_deviceplugin_lock_releases_total"
                        f'{{result="retry"}}[{RI}]))',
                        "release retries",
                    ),
                ],
                "Everything that went wrong, per part. All 0 on a healthy cluster; "
                "docs/metrics.md says what to do for each.",
                unit="ops",
                width=12,
            ),
            Panel(
                "Allocate refusals by reason",
                [
                    Target(
                        "sum by (result) (rate(nodelock_deviceplugin_allocations_total"
                        f'{{result!="allocated"}}[{RI}]))',
                        "{{result}}",
                    )
                ],
                "Why device plugins refused kubelet's Allocate (docs/deviceplugin.md, "
                "'Lock paths'). Each refusal fails a pod's admission.",
                unit="ops",
                width=12,
            ),
            Panel(
                "Lock expiries seen per node",
                [
                    Target(
                        f"max by (node) (rate(nodelock_lock_expired_seen_total[{RI}]))",
                        "{{node}}",
                    )
                ],
                "Held locks that outlived their duration (each process counts what it sees; "
                "max over processes).",
                unit="ops",
                width=12,
            ),
            Panel(
                "Releases pending per node",
                [Target("max by (node) (nodelock_deviceplugin_pending_releases)", "{{node}}")],
                "Releases a device plugin decided but could not write yet (API server "
                "unreachable from the node). Above 0 for minutes: NodelockReleasesPending.",
                width=12,
            ),
        ],
    )
    extender = Row(
        "Extender and scrape targets",
        [
            Panel(
                "Extender calls per second",
                [
                    Target(
                        f"sum by (verb) (rate(nodelock_extender_requests_total[{RI}]))",
                        "{{verb}}",
                    )
                ],
                "Filter, prioritize and bind calls from kube-scheduler, all replicas.",
                unit="reqps",
                width=6,
            ),
            Panel(
                "Filter and prioritize p99",
                [
                    Target(
                        "histogram_quantile(0.99, sum by (le, verb) (rate("
                        "nodelock_extender_request_duration_seconds_bucket"
                        f'{{verb!="bind"}}[{RI}])))',
                        "{{verb}}",
                    )
                ],
                "Answered from the cache: a few ms at most.",
                unit="s",
                width=6,
            ),
            Panel(
                "Cache staleness",
                [
                    Target(
                        "max by (resource) (nodelock_extender_cache_staleness_seconds)",
                        "{{resource}}",
                    ),
                    Target(
                        f"sum by (resource) (increase(nodelock_extender_cache_relists_total"
                        f"[{RI}]))",
                        "relists {{resource}}",
                    ),
                ],
                "Seconds since the extenders' caches last heard from the API server; above 600 "
                "s the watch is broken (NodelockExtenderCacheStale).",
                unit="s",
                width=6,
            ),
            Panel(
                "Scrape targets up",
                [Target('sum by (job) (up{job=~".*(nodelock|device-plugin).*"})', "{{job}}")],
                "Extender replicas and device plugins Prometheus can scrape.",
                width=6,
                minimum=0,
            ),
        ],
    )
    return dashboard(
        uid=OVERVIEW_UID,
        title="nodelock overview",
        description="GPU handoffs between the scheduler extender and the device plugins: "
        "rates, latencies, lock contention, GPUs and errors (docs/metrics.md).",
        rows=[handoffs, contention, gpus, errors, extender],
        variables=[],
    )
