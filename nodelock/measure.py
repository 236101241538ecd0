"""What a run of the cluster did, as the demo and the handoff benchmark measure it.

``Timeline`` records, on the observer's clock, when each pod was first seen, bound and running and
who held each node's lock when (``watch_pods``, ``watch_leases``); the metric helpers read
Prometheus text (``metric_samples``, ``metric_sum``, ``histogram``) and the API server's request
counts (``api_requests``, net of the idle cluster's ``background_requests``).  ``nodelock demo``
and ``bench/handoff.py`` both use it, so their figures are computed the same way.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devcluster.invariants import Findings
from handoff.wire import DEFAULT_LOCK_NAMESPACE
from kube.client import JSON, KubeClient, lease_path, pod_path
from kube.reflector import Reflector


@dataclass
class Timeline:
    """What the demo saw, on its own clock."""

    start: float = field(default_factory=time.monotonic)
    first_seen: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    lock_since: dict[str, tuple[str, float]] = field(default_factory=dict)  # node -> holder, t
    holds: list[tuple[str, str, float, float]] = field(default_factory=list)  # node, holder, t0, t1
    pods: dict[str, JSON] = field(default_factory=dict)
    leases: dict[str, JSON] = field(default_factory=dict)
    contention: list[tuple[str, str, float]] = field(default_factory=list)  # node, pod, t
    # nodelock's own Events on pods: Event name -> (pod key, occurrences it counts)
    nodelock_events: dict[str, tuple[str, int]] = field(default_factory=dict)
    violations: Findings = field(default_factory=Findings)

    def now(self) -> float:
        return time.monotonic() - self.start


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of ``values`` (nearest rank); NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[idx]


async def watch_pods(kube: KubeClient, tl: Timeline, namespace: str) -> None:
    """Follow the pods of ``namespace`` into ``tl`` until cancelled (``kube.reflector``)."""

    def apply(kind: str, p: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            tl.pods.pop(pod_key(p), None)
        else:
            _on_pod(tl, dict(p))

    await follow(kube, pod_path(namespace), "demo pods", lambda p: _on_pod(tl, p), apply)


async def follow(
    kube: KubeClient,
    path: str,
    name: str,
    listed: Callable[[JSON], None],
    apply: Callable[[str, Mapping[str, Any]], None],
) -> None:
    """Run the list-then-watch loop on ``path``: ``listed`` for each object of every (re)list,
    ``apply`` for each event; retries within half a second, as an observer should."""

    def replace(items: list[JSON]) -> None:
        for item in items:
            listed(item)

    reflector = Reflector(
        kube, path, name=name, replace=replace, apply=apply, alive=lambda: None, max_backoff_s=0.5
    )
    await reflector.run()


def pod_key(p: Mapping[str, Any]) -> str:
    """``namespace/name``."""
    return f"{p['metadata']['namespace']}/{p['metadata']['name']}"


def _on_pod(tl: Timeline, p: JSON) -> None:
    key = pod_key(p)
    t = tl.now()
    tl.pods[key] = p
    tl.first_seen.setdefault(key, t)
    if p.get("spec", {}).get("nodeName"):
        tl.bound.setdefault(key, t)
    if p.get("status", {}).get("phase") in ("Running", "Succeeded"):
        tl.running.setdefault(key, t)


async def watch_leases(
    kube: KubeClient, tl: Timeline, namespace: str = DEFAULT_LOCK_NAMESPACE
) -> None:
    """Follow the node locks into ``tl`` (who held which node when) until cancelled."""

    def apply(kind: str, lease: Mapping[str, Any]) -> None:
        if kind in ("ADDED", "MODIFIED"):
            _on_lease(tl, dict(lease))

    await follow(kube, lease_path(namespace), "node locks", lambda x: _on_lease(tl, x), apply)


def _on_lease(tl: Timeline, lease: JSON) -> None:
    node = lease["metadata"]["name"]
    tl.leases[node] = lease
    holder = lease.get("spec", {}).get("holderIdentity") or ""
    t = tl.now()
    prev = tl.lock_since.get(node)
    if prev and prev[0] != holder:
        if prev[0]:
            tl.holds.append((node, prev[0], prev[1], t))
        tl.lock_since[node] = (holder, t)
    elif not prev:
        tl.lock_since[node] = (holder, t)


def scrape(url: str) -> str:
    """The text of a metrics endpoint; empty when it cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text: str = resp.read().decode()
            return text
    except OSError:
        return ""


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Parse Prometheus text exposition into (name, labels, value) samples."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        try:
            out.append((m.group(1), labels, float(m.group(3))))
        except ValueError:
            continue
    return out


def metric_sum(
    samples: Sequence[tuple[str, dict[str, str], float]], name: str, **match: str
) -> float:
    return sum(
        v
        for n, labels, v in samples
        if n == name and all(labels.get(k) == w for k, w in match.items())
    )


BACKGROUND_S = 5.0  # seconds of idle traffic measured before a run, to subtract it


@dataclass(frozen=True)
class Histogram:
    """One Prometheus histogram's cumulative buckets (upper bound -> count) and total count."""

    buckets: tuple[tuple[float, float], ...]
    count: float

    def at_most(self, bound: float) -> float:
        """Observations <= ``bound`` (``bound`` must be a bucket edge)."""
        return next((c for le, c in self.buckets if le == bound), 0.0)

    def quantile(self, q: float) -> float:
        """``histogram_quantile``: linear within the bucket holding the q-th observation."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(le):
                    return lower
                if cumulative == below:
                    return le
                return lower + (le - lower) * (rank - below) / (cumulative - below)
            lower, below = le, cumulative
        return lower


def histogram(samples: Sequence[tuple[str, dict[str, str], float]], name: str) -> Histogram:
    """Sum ``name`` over every series of the scrape(s) in ``samples``."""
    buckets: dict[float, float] = {}
    for metric, labels, value in samples:
        if metric == f"{name}_bucket" and "le" in labels:
            le = float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + value
    return Histogram(tuple(sorted(buckets.items())), metric_sum(samples, f"{name}_count"))


HANDOFF_WRITES = (("POST", "leases"), ("PUT", "leases"), ("POST", "pods/binding"))


async def background_requests(kube: KubeClient, *, seconds: float) -> Counter[tuple[str, str]]:
    """What the idle cluster sends in ``seconds`` (node heartbeats renew their Leases too)."""
    first = await api_requests(kube)
    await asyncio.sleep(seconds)
    return await api_requests(kube) - first


def net_of_background(
    counts: Counter[tuple[str, str]], background: Counter[tuple[str, str]], periods: float
) -> Counter[tuple[str, str]]:
    """``counts`` less the idle background over the same time (never below zero)."""
    out: Counter[tuple[str, str]] = Counter()
    for key, value in counts.items():
        out[key] = max(0, round(value - background.get(key, 0) * periods))
    return +out


async def api_requests(kube: KubeClient) -> Counter[tuple[str, str]]:
    """The API server's request counts so far, by (verb, resource[/subresource])."""
    text = await kube.request_text("GET", "/metrics")
    counts: Counter[tuple[str, str]] = Counter()
    for name, labels, v in metric_samples(text):
        if name == "apiserver_request_total":
            res = labels.get("resource", "")
            if labels.get("subresource"):
                res += "/" + labels["subresource"]
            counts[(labels.get("verb", ""), res)] += int(v)
    return counts
