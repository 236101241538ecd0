"""The per-node drill-down: the node's lock over time, hold durations, Allocate, devices.

Device plugin series carry ``node`` as a scrape target label (docs/metrics.md, "Scrape setup").
"""

from __future__ import annotations

from dashboards.grafana import (
    JSON,
    NODE_UID,
    RI,
    Panel,
    Row,
    Target,
    dashboard,
    node_variable,
    quantiles,
)

N = '{node="$node"}'


def model() -> JSON:
    """The dashboard's JSON model."""
    lock = Row(
        "Lock of $node",
        [
            Panel(
                "Lock held",
                [Target(f"max(max_over_time(nodelock_lock_held{N}[$__interval]))", "$node")],
                "Held (a pod between Bind and Allocate) or free, as the extenders and the "
                "node's device plugin see the Lease. Who holds it: `nodelock locks show $node`"
                " (pod names are never metric labels).",
                kind="state-timeline",
                width=24,
                height=5,
                mappings=[(0, "free", "green"), (1, "held", "orange")],
            ),
            Panel(
                "Fencing token",
                [Target(f"max(nodelock_lock_fencing_token{N})", "token")],
                "The Lease's leaseTransitions: one step per handoff on this node.",
            ),
            Panel(
                "Acquisitions by result",
                [
                    Target(
                        f"sum by (result) (rate(nodelock_lock_acquisitions_total{N}[{RI}]))",
                        "{{result}}",
                    )
                ],
                "Extender lock acquisitions on this node: acquired (a handoff starts), "
                "contended (a bind met the held lock), takeover, error.",
                unit="ops",
                stack=True,
            ),
            Panel(
                "Current holder unchanged for",
                [
                    Target(
                        f"max(max_over_time(nodelock_lock_unchanged_seconds{N}[{RI}]))",
                        "unchanged",
                    ),
                    Target(f"max(increase(nodelock_lock_expired_seen_total{N}[{RI}]))", "expired"),
                ],
                "How long the held lock has stood unchanged, and expiries seen. Past the lease "
                "duration: the holder is stuck; `nodelock locks show $node` says why.",
                unit="s",
                thresholds=[(300, "red")],
            ),
        ],
    )
    holds = Row(
        "Handoffs on $node",
        [
            Panel(
                "Hold duration",
                quantiles("nodelock_lock_hold_seconds", '{node="$node",outcome="allocated"}'),
                "From the acquisition, as this node's device plugin saw it, to its release.",
                unit="s",
            ),
            Panel(
                "Hold durations (heatmap)",
                [
                    Target(
                        "sum by (le) (increase(nodelock_lock_hold_seconds_bucket"
                        f'{{node="$node",outcome="allocated"}}[{RI}]))',
                        heatmap=True,
                    )
                ],
                "How many handoffs held the lock how long, per time bucket.",
                kind="heatmap",
                unit="s",
            ),
            Panel(
                "Allocate latency",
                quantiles("nodelock_deviceplugin_allocate_seconds", N),
                "This node's device plugin answering kubelet's Allocate.",
                unit="s",
            ),
            Panel(
                "Allocate results",
                [
                    Target(
                        f"sum by (result) (rate(nodelock_deviceplugin_allocations_total{N}[{RI}]))",
                        "{{result}}",
                    )
                ],
                "allocated, or why kubelet's Allocate was refused (docs/deviceplugin.md).",
                unit="ops",
            ),
            Panel(
                "Preferred allocations",
                [
                    Target(
                        "sum by (result) (rate("
                        f"nodelock_deviceplugin_preferred_allocations_total{N}[{RI}]))",
                        "{{result}}",
                    )
                ],
                "hit: kubelet was steered to the assignment; miss: a plain hint.",
                unit="ops",
            ),
            Panel(
                "Lock releases",
                [
                    Target(
                        "sum by (outcome, result) (rate("
                        f"nodelock_deviceplugin_lock_releases_total{N}[{RI}]))",
                        "{{outcome}} {{result}}",
                    ),
                    Target(f"max(nodelock_deviceplugin_pending_releases{N})", "pending"),
                ],
                "Release writes by outcome and result; pending: decided, not yet written.",
            ),
        ],
    )
    devices = Row(
        "Devices of $node",
        [
            Panel(
                "GPUs",
                [
                    Target(f"max(nodelock_extender_gpus{N})", "in inventory"),
                    Target(f"max(nodelock_extender_gpus_assigned{N})", "assigned"),
                ],
                "GPUs in the node's published inventory and those held by live pods.",
            ),
            Panel(
                "Device health",
                [
                    Target(
                        f"sum by (health) (nodelock_deviceplugin_devices{N})",
                        "{{health}}",
                    )
                ],
                "Devices the plugin advertises to kubelet, by health (NVML XID/ECC events).",
                stack=True,
            ),
            Panel(
                "Device plugin",
                [
                    Target('max(up{job=~".*device-plugin.*",node="$node"})', "up"),
                    Target(
                        "sum by (result) (increase("
                        f"nodelock_deviceplugin_registrations_total{N}[{RI}]))",
                        "register {{result}}",
                    ),
                    Target(
                        "sum by (result) (increase("
                        f"nodelock_deviceplugin_inventory_writes_total{N}[{RI}]))",
                        "inventory write {{result}}",
                    ),
                ],
                "Scrape target up, Register calls to kubelet and inventory writes. A plugin "
                "that stops registering: NodelockDevicePluginNotRegistered.",
            ),
        ],
    )
    shared = Row(
        "GPUs of $node: committed against capacity",
        [
            Panel(
                "GPU memory committed",
                [
                    Target(
                        f"max by (gpu) (nodelock_deviceplugin_gpu_memory_committed_mib{N})",
                        "{{gpu}} committed",
                    ),
                    Target(
                        f"max by (gpu) (nodelock_deviceplugin_gpu_memory_capacity_mib{N})",
                        "{{gpu}} capacity",
                    ),
                ],
                "Per GPU, the memory the pods holding it commit (their gpumem slices; a pod "
                "holding it whole commits all of it) against its capacity. Which pods: "
                "`nodelock locks show $node`.",
                unit="mbytes",
                width=12,
                minimum=0,
            ),
            Panel(
                "GPU cores committed",
                [
                    Target(
                        f"max by (gpu) (nodelock_deviceplugin_gpu_cores_committed_percent{N})",
                        "{{gpu}} cores %",
                    ),
                    Target(
                        f"max by (gpu) (nodelock_deviceplugin_gpu_slices{N})",
                        "{{gpu}} slices",
                    ),
                ],
                "Per GPU, the compute (percent; capacity 100) the pods holding it commit, and "
                "how many pods hold it (at most the node's --gpu-split).",
                width=12,
                minimum=0,
                thresholds=[(100.5, "red")],
            ),
        ],
    )
    return dashboard(
        uid=NODE_UID,
        title="nodelock node",
        description="One GPU node: its lock over time, hold durations, Allocate, device "
        "health, the device plugin and each GPU's committed memory and cores (docs/metrics.md).",
        rows=[lock, holds, devices, shared],
        variables=[node_variable()],
    )
