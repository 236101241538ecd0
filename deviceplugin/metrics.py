"""Prometheus metrics of the device plugin (names and meaning: docs/metrics.md, ``deviceplugin``).

Every metric lives in the plugin's own registry (several plugins can share a test process) and is
prefixed ``nodelock_deviceplugin_``, besides ``nodelock_build_info`` (``kube.build``). Labels are
bounded enums, never a pod name or UID; the node is the scrape target's own label; the per-GPU
gauges carry ``gpu``, the UUID of one of the node's own GPUs (bounded by its inventory). Every
labelled series exists at 0 from the start (all refusal reasons included; a GPU's series from its
discovery), so queries return data before the first event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from deviceplugin.decide import RefusalKind
from handoff.sharing import FREE, Use
from handoff.wire import GPU, DeviceID
from kube.build import register_build_info
from lockd.model import Outcome

PREFIX = "nodelock_deviceplugin_"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ReleaseResult(StrEnum):
    """How a lock release attempt ended (label ``result``)."""

    RELEASED = "released"
    ALREADY = "already"  # the Lease had moved on (released, newer token): nothing to do
    RETRY = "retry"  # the API server was unreachable: kept in the checkpoint and retried


class PluginMetrics:
    """The device plugin's metrics in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        register_build_info(r)
        self.allocate_seconds = Histogram(
            f"{PREFIX}allocate_seconds",
            "Time to answer kubelet's Allocate, including any API reads and the lock release.",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.handoff_steps = Histogram(
            f"{PREFIX}handoff_step_seconds",
            "From the node lock's acquisition, as this plugin's Lease watch first saw it, to each "
            "step of the handoff: preferred (GetPreferredAllocation called), allocate (Allocate "
            "called), released (the lock released after the last container).",
            ["step"],
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        for step in ("preferred", "allocate", "released"):
            self.handoff_steps.labels(step)
        self.allocations = Counter(
            f"{PREFIX}allocations",
            "Allocate calls by result: allocated, or the refusal reason.",
            ["result"],
            registry=r,
        )
        self.preferred = Counter(
            f"{PREFIX}preferred_allocations",
            "GetPreferredAllocation answers: hit (the holder's assignment) or miss (a hint).",
            ["result"],
            registry=r,
        )
        self.releases = Counter(
            f"{PREFIX}lock_releases",
            "Node lock release attempts by handoff outcome and result.",
            ["outcome", "result"],
            registry=r,
        )
        self.unknown_pods_ignored = Counter(
            f"{PREFIX}unknown_pods_ignored",
            "Pods kubelet's PodResources List named that the API server does not know (a static "
            "pod without a mirror pod), left out of an Allocate decision because they were "
            "listed longer than an admission can take (deviceplugin.decide UNKNOWN_POD_WAIT_S); "
            "one per pod per decision.",
            registry=r,
        )
        self.pending_releases = Gauge(
            f"{PREFIX}pending_releases",
            "Lock releases decided but not yet written (kept in the checkpoint, retried).",
            registry=r,
        )
        self.pod_watch_synced = Gauge(
            f"{PREFIX}pod_watch_synced",
            "1 once the watch of the pods bound to this node has listed them; while 0, Allocate "
            "cannot see a GPU pod bound around the extender (result=ambiguous).",
            registry=r,
        )
        self.kubelet_view = Counter(
            f"{PREFIX}kubelet_view_reads",
            "PodResources List reads on Allocate (who kubelet admits) by result: ok, or error "
            "(the call then decides from a LIST of the node's pods at the API server).",
            ["result"],
            registry=r,
        )
        self.registrations = Counter(
            f"{PREFIX}registrations",
            "Register calls to kubelet by result (ok, error).",
            ["result"],
            registry=r,
        )
        self.devices = Gauge(
            f"{PREFIX}devices",
            "Devices this plugin advertises, by health.",
            ["health"],
            registry=r,
        )
        self.inventory_writes = Counter(
            f"{PREFIX}inventory_writes",
            "Writes of the node's GPU inventory annotation by result (ok, error).",
            ["result"],
            registry=r,
        )
        per_gpu = ["gpu"]
        self.gpu_memory_committed = Gauge(
            f"{PREFIX}gpu_memory_committed_mib",
            "Per GPU of this node, the memory (MiB) committed by the unfinished pods bound here "
            "whose assignment names it: their gpumem (or gpumem-percentage) slices; a pod "
            "holding the GPU whole commits all of it.",
            per_gpu,
            registry=r,
        )
        self.gpu_cores_committed = Gauge(
            f"{PREFIX}gpu_cores_committed_percent",
            "Per GPU, the compute (percent) committed by the pods holding it (gpucores; 100 for "
            "a pod holding it whole).",
            per_gpu,
            registry=r,
        )
        self.gpu_slices = Gauge(
            f"{PREFIX}gpu_slices",
            "Per GPU, the pods holding it (a slice each; a pod holding it whole counts as one).",
            per_gpu,
            registry=r,
        )
        self.gpu_memory_capacity = Gauge(
            f"{PREFIX}gpu_memory_capacity_mib",
            "Per GPU, its memory (MiB) from the node's inventory.",
            per_gpu,
            registry=r,
        )
        self._gpu_series: set[str] = set()
        for result in ("ok", "error"):
            self.registrations.labels(result=result)
            self.inventory_writes.labels(result=result)
            self.kubelet_view.labels(result=result)
        for pref in ("hit", "miss"):
            self.preferred.labels(result=pref)
        for outcome in (Outcome.ALLOCATED, Outcome.REJECTED, Outcome.FINISHED, Outcome.DELETED):
            for rr in ReleaseResult:
                self.releases.labels(outcome=outcome.value, result=rr.value)
        self.allocations.labels(result="allocated")
        for kind in RefusalKind:
            self.allocations.labels(result=kind.value)

    def set_devices(self, gpus: Sequence[GPU]) -> None:
        healthy = sum(1 for g in gpus if g.healthy)
        self.devices.labels(health="healthy").set(healthy)
        self.devices.labels(health="unhealthy").set(len(gpus) - healthy)

    def set_gpu_use(self, gpus: Sequence[GPU], use: Mapping[DeviceID, Use]) -> None:
        """The per-GPU gauges for exactly ``gpus`` (FREE where ``use`` says nothing); series of
        GPUs no longer in the inventory are removed."""
        gauges = (
            self.gpu_memory_committed,
            self.gpu_cores_committed,
            self.gpu_slices,
            self.gpu_memory_capacity,
        )
        now = {str(g.id) for g in gpus}
        for gone in self._gpu_series - now:
            for gauge in gauges:
                gauge.remove(gone)
        self._gpu_series = now
        for g in gpus:
            u = use.get(g.id, FREE)
            self.gpu_memory_committed.labels(gpu=g.id).set(u.memory_mib)
            self.gpu_cores_committed.labels(gpu=g.id).set(u.cores)
            self.gpu_slices.labels(gpu=g.id).set(u.slices)
            self.gpu_memory_capacity.labels(gpu=g.id).set(g.memory_mib)
