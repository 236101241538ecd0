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
# Each API request a bind sends outside its binding window is allowed this long in the worst-case
# path; the bind's deadline (``scheduler_ext.deadline``) cuts a slower one, failing the bind.
REQUEST_ALLOWANCE_S = 0.1
ANSWER_SLACK_S = 0.25  # between the bind's deadline and kube-scheduler's httpTimeout
# The requests outside the binding window, in the order a bind may send them.
BIND_REQUESTS = (
    "the pod GET (a pod the cache does not have yet)",
    "the GET when the pod already holds the lock",
    "the takeover GET of an expired lock's holder",
    "the Lease write",
    "its re-read after a 409",
    "the second Lease write",
    "the GET after a binding whose answer was lost",
)
REQUESTS_BEFORE_WAIT = 1  # the pod GET; the others come after the wait


def go_duration(seconds: float) -> str:
    """``seconds`` as a Go duration string (``10s``, ``12.5s``), as kube-scheduler reads it."""
    return f"{seconds:g}s"


@dataclass(frozen=True)
class BindPath:
    """The longest path a bind may take, step by step: the pod GET, the wait budget, the
    requests before and while taking the lock, the binding window (``lease_duration / 3``: the
    confirm step and the binding are sent within it, or the bind fails), the GET after a lost
    answer; each request outside the window allowed ``REQUEST_ALLOWANCE_S``; then
    ``ANSWER_SLACK_S`` for the answer to reach kube-scheduler."""

    wait_budget_s: float
    lease_duration_s: int
    request_allowance_s: float = REQUEST_ALLOWANCE_S
    slack_s: float = ANSWER_SLACK_S

    @property
    def binding_window_s(self) -> float:
        return self.lease_duration_s / 3

    @property
    def requests_s(self) -> float:
        return len(BIND_REQUESTS) * self.request_allowance_s

    @property
    def after_wait_s(self) -> float:
        """What the steps after the wait need in the worst case (slack excluded)."""
        after = len(BIND_REQUESTS) - REQUESTS_BEFORE_WAIT
        return self.binding_window_s + after * self.request_allowance_s

    @property
    def total_s(self) -> float:
        return self.wait_budget_s + self.binding_window_s + self.requests_s + self.slack_s

    def arithmetic(self) -> str:
        """The sum, written out."""
        return (
            f"wait budget {self.wait_budget_s:g}s + lease duration {self.lease_duration_s}s / 3 "
            f"= {self.binding_window_s:g}s holding the lock before the binding + "
            f"{len(BIND_REQUESTS)} API requests outside that window x "
            f"{self.request_allowance_s:g}s + {self.slack_s:g}s for the answer = "
            f"{self.total_s:g}s"
        )


def check_bind_timing(
    *, wait_budget_s: float, lease_duration_s: int, http_timeout_s: float
) -> None:
    """Raise ``ValueError`` unless the whole worst-case path of a bind (``BindPath``) ends before
    kube-scheduler's ``httpTimeout``: a bind that waits its whole budget must still have time for
    every request after it, its binding window and the answer's way back.  A bind answered after
    kube-scheduler stopped listening could bind a pod the scheduler already gave up on; at run
    time each bind's deadline cuts a slower path, this check keeps the configured one inside."""
    if wait_budget_s < 0:
        raise ValueError(f"the bind wait budget cannot be negative ({wait_budget_s:g}s)")
    if http_timeout_s <= 0:
        raise ValueError(f"kube-scheduler's httpTimeout must be positive ({http_timeout_s:g}s)")
    path = BindPath(wait_budget_s, lease_duration_s)
    if path.total_s > http_timeout_s:
        fits = http_timeout_s - (path.total_s - wait_budget_s)
        raise ValueError(
            f"a bind may take up to {path.total_s:g}s ({path.arithmetic()}), longer than "
            f"kube-scheduler's extender httpTimeout of {http_timeout_s:g}s: "
            + (
                f"use a wait budget of at most {fits:.2f}s, or raise httpTimeout to at least "
                f"{path.total_s:g}s"
                if fits >= 0
                else f"raise httpTimeout to at least {path.total_s:g}s or shorten the lease "
                "duration"
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
