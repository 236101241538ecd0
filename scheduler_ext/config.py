"""kube-scheduler's configuration for this extender (``kubescheduler.config.k8s.io/v1``).

``extender_entry`` is the one ``extenders:`` item; ``scheduler_config`` a whole
KubeSchedulerConfiguration around it (leader election off, the given kubeconfig), which devcluster
writes to a file and starts kube-scheduler with.  ``deploy/scheduler/`` holds the same as YAML.

Why ``ignoredByScheduler: false``: the resource stays in the default NodeResourcesFit check, so
kube-scheduler's own accounting (which includes pods it has *assumed* on a node while their bind
is still running) keeps a node's GPU count from being over-committed before the extender's cache
can see those binds, and a node whose kubelet reports fewer allocatable GPUs than its inventory
is never chosen for more.  The extender then picks the exact devices.  docs/extender.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handoff.sharing import SHARING_RESOURCES
from handoff.wire import DEFAULT_RESOURCE, resource_of

JSON = dict[str, Any]

DEFAULT_WEIGHT = 5
DEFAULT_HTTP_TIMEOUT_S = 10.0
BIND_READS_MARGIN_S = 1.0  # a bind's reads outside the wait and the binding window


def go_duration(seconds: float) -> str:
    """``seconds`` as a Go duration string (``10s``, ``12.5s``), as kube-scheduler reads it."""
    return f"{seconds:g}s"


def check_bind_timing(
    *, wait_budget_s: float, lease_duration_s: int, http_timeout_s: float
) -> None:
    """Raise ``ValueError`` unless a bind that waits its whole budget still ends before
    kube-scheduler's ``httpTimeout``: the wait, then at most ``lease_duration / 3`` holding the
    lock before the binding write, plus a margin for the bind's reads.  A bind answered after
    kube-scheduler stopped listening could bind a pod the scheduler already gave up on."""
    if wait_budget_s < 0:
        raise ValueError(f"the bind wait budget cannot be negative ({wait_budget_s:g}s)")
    needed = wait_budget_s + lease_duration_s / 3 + BIND_READS_MARGIN_S
    if needed > http_timeout_s:
        fits = http_timeout_s - lease_duration_s / 3 - BIND_READS_MARGIN_S
        raise ValueError(
            f"a bind may take up to {needed:g}s (wait budget {wait_budget_s:g}s + lease duration "
            f"{lease_duration_s}s / 3 + {BIND_READS_MARGIN_S:g}s of reads), longer than "
            f"kube-scheduler's extender httpTimeout of {http_timeout_s:g}s: "
            + (
                f"use a wait budget of at most {fits:g}s, or raise httpTimeout"
                if fits > 0
                else "raise httpTimeout or shorten the lease duration"
            )
        )


@dataclass(frozen=True)
class ExtenderTLS:
    """kube-scheduler's ``tlsConfig`` for the extender: CA to verify it, client cert to show."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    insecure: bool = False

    def as_config(self) -> JSON:
        out: JSON = {}
        if self.insecure:
            out["insecure"] = True
        if self.server_name:
            out["serverName"] = self.server_name
        if self.cert_file:
            out["certFile"] = self.cert_file
        if self.key_file:
            out["keyFile"] = self.key_file
        if self.ca_file:
            out["caFile"] = self.ca_file
        return out


def extender_entry(
    extender_url: str,
    *,
    node_cache_capable: bool = True,
    tls: ExtenderTLS | None = None,
    resource_name: str = DEFAULT_RESOURCE,
    weight: int = DEFAULT_WEIGHT,
    http_timeout_s: float = DEFAULT_HTTP_TIMEOUT_S,
) -> JSON:
    """One ``extenders:`` item: filter, prioritize and bind, only for pods asking for the GPU."""
    if weight <= 0:
        raise ValueError("weight must be positive (kube-scheduler rejects it otherwise)")
    https = extender_url.startswith("https://")
    if tls is not None and not https:
        raise ValueError("a tlsConfig needs an https:// extender URL")
    entry: JSON = {
        "urlPrefix": extender_url.rstrip("/"),
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "bindVerb": "bind",
        "weight": weight,
        "enableHTTPS": https,
        "httpTimeout": go_duration(http_timeout_s),
        "nodeCacheCapable": node_cache_capable,
        "managedResources": managed_resources(resource_name),
        "ignorable": False,
    }
    if tls is not None:
        entry["tlsConfig"] = tls.as_config()
    return entry


# The MIG profiles whose resources (``nvidia.com/mig-<profile>``) send a pod to the extender.
# kube-scheduler's managedResources are exact names (no prefix or pattern), so this is a fixed
# list: the profiles of the A30 24GB, A100 40GB, A100/H100 80GB, H100 NVL 94GB and
# H200 141GB.  A pod asking only for a profile not listed here never reaches the extender;
# kube-scheduler binds it alone and the device plugin refuses it (no node lock holder).
MIG_PROFILES = (
    "1g.6gb",
    "2g.12gb",
    "4g.24gb",
    "1g.5gb",
    "2g.10gb",
    "3g.20gb",
    "4g.20gb",
    "7g.40gb",
    "1g.10gb",
    "1g.20gb",
    "2g.20gb",
    "3g.40gb",
    "4g.40gb",
    "7g.80gb",
    "1g.12gb",
    "1g.24gb",
    "2g.24gb",
    "3g.47gb",
    "4g.47gb",
    "7g.94gb",
    "1g.18gb",
    "1g.35gb",
    "2g.35gb",
    "3g.71gb",
    "4g.71gb",
    "7g.141gb",
)


def managed_resources(resource_name: str = DEFAULT_RESOURCE) -> list[JSON]:
    """The resources that send a pod to the extender: the GPU, counted by kube-scheduler too,
    the shared-GPU resources (``handoff.sharing``), which no kubelet advertises, so
    kube-scheduler must leave them to the extender (``ignoredByScheduler: true``), and the MIG
    resources of ``MIG_PROFILES``, which kubelet advertises and kube-scheduler counts too."""
    return [
        {"name": resource_name, "ignoredByScheduler": False},
        *({"name": r, "ignoredByScheduler": True} for r in SHARING_RESOURCES),
        *({"name": resource_of(p), "ignoredByScheduler": False} for p in MIG_PROFILES),
    ]


def scheduler_config(
    extender_url: str,
    *,
    kubeconfig: str,
    node_cache_capable: bool = True,
    tls: ExtenderTLS | None = None,
    resource_name: str = DEFAULT_RESOURCE,
    weight: int = DEFAULT_WEIGHT,
    http_timeout_s: float = DEFAULT_HTTP_TIMEOUT_S,
) -> JSON:
    """A whole KubeSchedulerConfiguration using the extender at ``extender_url``."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
        "leaderElection": {"leaderElect": False},
        "extenders": [
            extender_entry(
                extender_url,
                node_cache_capable=node_cache_capable,
                tls=tls,
                resource_name=resource_name,
                weight=weight,
                http_timeout_s=http_timeout_s,
            )
        ],
    }
