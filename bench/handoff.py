"""The handoff benchmark: pods/s through the extender against the default binder, API requests per
pod, the lock hold's stages, and the peers' semantics — all on one devcluster in one run.

    .venv/bin/python -m bench.handoff [--nodes 8] [--gpus 8] [--pods 64] [--mix 1]

Phases, each a burst created at once and waited to Running:

1. ``nodelock``: kube-scheduler with the extender as shipped (binds wait their turn per node,
   prioritize by expected wait);
2. ``peers``: the same parts with the peers' semantics: a bind fails at once on a held lock
   (``--bind-wait-budget=0``) and prioritize is lock-blind (``--no-lock-aware``), so
   kube-scheduler's backoff (1 s doubling to 10 s) paces the retries;
3. ``stock-gpu``: kube-scheduler alone binding the same GPU pods, each node's nodelock plugin
   swapped for a stock one (``devcluster.stockplugin``: kubelet picks the devices, nothing
   coordinates): what the GPU pods cost with no coordination at all, so ``vs stock`` is what the
   handoff itself costs (the device side is in both);
4. ``default-binder``: kube-scheduler alone binding as many pods that ask for no GPU — no
   extender, no lock, no device plugin in the path: the limit the handoff can approach, and the
   base of every ``vs base`` ratio.

``--mix 1`` bursts ``--pods`` single-GPU pods; ``--mix 8,4,2,1`` fills the cluster with equal GPU
shares of 8-, 4-, 2- and 1-GPU pods (``--pods`` is then ignored).  ``--extender-tls`` serves the
extender over HTTPS with a client certificate, as shipped (the devcluster's default is plain
HTTP).

Per phase: pods/s (first create to last Running), creation->Running p50/p99, binds refused for a
held lock (the extender's ``contended`` binds), API requests per pod by verb and resource from
kube-apiserver's ``apiserver_request_total`` (all clients, less the idle cluster's own rate
measured for 5 s before the burst: node heartbeats renew Leases too), and the lock hold
(acquire -> release, seen on a Lease watch) split into stages: acquire -> pod seen bound (confirm
and the binding write), bound -> released (kubelet admission, GetPreferredAllocation, Allocate,
the release write), released -> Running (the simulated kubelet's status write; not in the hold).
CPU per pod by component is read from /proc twice: during the burst (first create to last
Running: what the burst's rate is made of) and to a second after it (work the components leave
for later, such as Events and controllers, counts there only).
Prints a table, writes ``bench/results/handoff[-SCENARIO].json``.

``--rounds N`` runs the phases N times in turn on the same cluster and adds each phase's median
over the rounds; the ratios (to the default binder, to the stock GPU phase) are taken within
each round, then the median of those.  On a small shared machine one run's ratio moves with
whatever else the machine does; the median of interleaved rounds moves less.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from bench import apiserver, profiles
from devcluster import processes
from devcluster.binaries import ensure_simkubelet
from devcluster.cluster import Cluster, throwaway_cluster
from devcluster.gpunodes import node_names, up_gpu_cluster
from devcluster.namespaces import create_namespace
from devcluster.processes import PROFILE_DIR_ENV
from devcluster.realkubelet import KubeletKind
from devcluster.stockplugin import use_nodelock_plugins, use_stock_plugins
from kube.client import JSON, KubeClient, namespace_path, pod_path
from kube.errors import NotFound
from nodelock.measure import (
    BACKGROUND_S,
    HANDOFF_WRITES,
    Timeline,
    metric_samples,
    metric_sum,
    quantile,
    scrape,
    watch_leases,
    watch_pods,
)

RESULTS = Path(__file__).resolve().parent / "results"


PHASE_ARGS = {
    "nodelock": ["--lock-aware"],
    "peers": ["--bind-wait-budget=0", "--no-lock-aware"],
}
PHASES = (*PHASE_ARGS, "stock-gpu", "default-binder")  # the order they run in


def pod(name: str, gpus: int) -> JSON:
    container: JSON = {"name": "c", "image": "registry.invalid/sim:never-pulled"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 0},
    }


EXTENDER_SERIES = {
    "contended": ("nodelock_extender_requests_total", {"verb": "bind", "result": "contended"}),
    "filter_s": ("nodelock_extender_request_duration_seconds_sum", {"verb": "filter"}),
    "filter_n": ("nodelock_extender_request_duration_seconds_count", {"verb": "filter"}),
    "prioritize_s": ("nodelock_extender_request_duration_seconds_sum", {"verb": "prioritize"}),
    "prioritize_n": ("nodelock_extender_request_duration_seconds_count", {"verb": "prioritize"}),
    "bind_s": ("nodelock_extender_request_duration_seconds_sum", {"verb": "bind"}),
    "bind_n": ("nodelock_extender_request_duration_seconds_count", {"verb": "bind"}),
    "queue_s": ("nodelock_extender_bind_queue_wait_seconds_sum", {}),
    "queue_n": ("nodelock_extender_bind_queue_wait_seconds_count", {}),
}


def extender_counts(cluster: Cluster) -> dict[str, float]:
    """The extender series the benchmark reads, summed over the replicas."""
    out = dict.fromkeys(EXTENDER_SERIES, 0.0)
    for url in cluster.settings()["extender"]["metrics"]:  # the plain-HTTP metrics ports
        samples = metric_samples(scrape(f"{url}/metrics"))
        for key, (name, labels) in EXTENDER_SERIES.items():
            out[key] += metric_sum(samples, name, **labels)
    return out


def extender_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean server-side time per call of each verb, and mean queue wait per bind, in seconds."""
    d = {k: after[k] - before[k] for k in before}
    return {
        what: d[f"{what}_s"] / d[f"{what}_n"]
        for what in ("filter", "prioritize", "bind", "queue")
        if d[f"{what}_n"] > 0
    }


def cpu_seconds(cluster: Cluster) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each kind of component of the cluster: its
    processes and their process groups, read from /proc; the benchmark itself as ``bench``."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}

    def used(pid: int) -> float:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return 0.0
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / tick

    for name, proc in cluster.state.procs().items():
        kind = re.sub(r"-(gpu-node-\d+|\d+)$", "", name)
        pids = set(processes.group_members(proc.pid)) | {proc.pid}
        out[kind] = out.get(kind, 0.0) + sum(used(pid) for pid in pids)
    out["bench"] = used(os.getpid())
    return out


def cpu_ms_per_pod(
    before: Mapping[str, float], after: Mapping[str, float], pods: int
) -> dict[str, float]:
    """Milliseconds of CPU per pod that each component used between two ``cpu_seconds``
    readings (the components that used none are left out)."""
    return {
        k: (after.get(k, 0.0) - v) * 1000 / pods for k, v in before.items() if after.get(k, 0.0) > v
    }


def burst_sizes(mix: list[int], *, nodes: int, gpus: int, pods: int) -> list[int]:
    """GPUs per pod of the burst: ``pods`` of one size, or equal GPU shares of several sizes
    that fill the cluster exactly."""
    if len(mix) == 1:
        return [mix[0]] * pods
    share = nodes * gpus // len(mix)
    sizes = [size for size in mix for _ in range(share // size)]
    return sorted(sizes, reverse=True)


def stages(tl: Timeline, ns: str) -> dict[str, list[float]]:
    """Per pod of ``ns``: the lock hold and its stages, from the Lease and pod watches; and per
    node, the handover: a release to the next acquire of the burst on that node (the time the
    node's lock sat free while the next bind of the burst was queued or on its way)."""
    out: dict[str, list[float]] = {
        "hold": [],
        "bind": [],
        "admit": [],
        "status": [],
        "handover": [],
    }
    last_release: dict[str, float] = {}
    for node, holder, t0, t1 in sorted(tl.holds, key=lambda h: h[2]):
        if not holder.startswith(ns + "/") or holder not in tl.bound:
            continue
        if node in last_release:
            out["handover"].append(t0 - last_release[node])
        last_release[node] = t1
        bound = tl.bound[holder]
        out["hold"].append(t1 - t0)
        out["bind"].append(bound - t0)
        out["admit"].append(t1 - bound)
        if holder in tl.running:
            out["status"].append(tl.running[holder] - t1)
    return out


async def api_snapshot(kube: KubeClient) -> apiserver.Snapshot:
    """The API server's counters now (``bench.apiserver``)."""
    return apiserver.parse(await kube.request_text("GET", "/metrics"))


async def burst(
    cluster: Cluster, label: str, sizes: list[int], *, profile_to: Path | None = None
) -> dict[str, Any]:
    """One phase's burst, measured; with ``profile_to``, the hooked components' profiles of
    the burst (and the second after it) go there (``bench.profiles``)."""
    ns = f"bench-{label}"
    async with await KubeClient.connect(str(cluster.kubeconfig)) as kube:
        await create_namespace(kube, ns)
        tl = Timeline()
        tasks = [
            asyncio.create_task(watch_pods(kube, tl, ns)),
            asyncio.create_task(watch_leases(kube, tl)),
        ]
        idle_first = await api_snapshot(kube)
        idle_cpu0, idle_t0 = cpu_seconds(cluster), time.monotonic()
        await asyncio.sleep(BACKGROUND_S)
        idle_cpu1, idle_s = cpu_seconds(cluster), time.monotonic() - idle_t0
        background = await api_snapshot(kube) - idle_first
        before_api = await api_snapshot(kube)
        started = time.monotonic()
        gpus = max(sizes)
        n = len(sizes)
        ext_before = extender_counts(cluster) if gpus else {}
        if profile_to is not None:
            profiles.start(cluster)
        cpu_before = cpu_seconds(cluster)
        t0 = tl.now()
        await asyncio.gather(
            *(kube.create(pod_path(ns), pod(f"p{i}", size)) for i, size in enumerate(sizes))
        )
        while sum(1 for k in tl.running if k.startswith(ns + "/")) < n:
            await asyncio.sleep(0.05)
            if tl.now() - t0 > 600:
                raise RuntimeError(f"{label}: pods not Running after 600 s")
        cpu_burst = cpu_seconds(cluster)  # within a poll (50 ms) of the last Running
        t_end = max(v for k, v in tl.running.items() if k.startswith(ns + "/"))
        await asyncio.sleep(1.0)  # the last releases
        # the CPU before the scrape: serving and parsing /metrics is the benchmark's work
        cpu_after = cpu_seconds(cluster)
        cpu_window_s = tl.now() - t0
        after_api = await api_snapshot(kube)
        elapsed = time.monotonic() - started
        if profile_to is not None:
            profiles.collect(cluster, profile_to)
        ext_after = extender_counts(cluster) if gpus else {}
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await delete_namespace(kube, ns)
    api = (after_api - before_api).net_of(background, elapsed / BACKGROUND_S)
    req = api.requests
    to_running = [tl.running[k] - tl.first_seen[k] for k in tl.running if k in tl.first_seen]
    parts = stages(tl, ns)
    holds = parts["hold"]
    return {
        "phase": label,
        "pods": n,
        "seconds": t_end - t0,
        "pods_per_s": n / (t_end - t0),
        "to_running_p50_s": quantile(to_running, 0.5),
        "to_running_p99_s": quantile(to_running, 0.99),
        "contended_binds": ext_after.get("contended", 0.0) - ext_before.get("contended", 0.0),
        "extender_mean_s": extender_means(ext_before, ext_after) if gpus else {},
        "handoff_p50_s": quantile(holds, 0.5) if holds else math.nan,
        "handoff_p99_s": quantile(holds, 0.99) if holds else math.nan,
        "cpu_ms_per_pod": cpu_ms_per_pod(cpu_before, cpu_after, n),
        "cpu_ms_per_pod_burst": cpu_ms_per_pod(cpu_before, cpu_burst, n),
        # what each component uses idle, per second (the 5 s before the burst): a cost of time,
        # not of pods, which a slower burst spreads over fewer pods
        "idle_cpu_ms_per_s": {
            k: (idle_cpu1.get(k, 0.0) - v) * 1000 / idle_s
            for k, v in idle_cpu0.items()
            if idle_cpu1.get(k, 0.0) > v
        },
        "cpu_window_s": cpu_window_s,
        "stages_p50_s": {k: quantile(v, 0.5) for k, v in parts.items() if v},
        "stages_p99_s": {k: quantile(v, 0.99) for k, v in parts.items() if v},
        "requests_per_pod": {f"{v} {r}": c / n for (v, r), c in sorted(req.items())},
        "handoff_writes_per_pod": sum(req.get(k, 0) for k in HANDOFF_WRITES) / n,
        "lists_per_pod": sum(c for (v, _), c in req.items() if v == "LIST") / n,
        "all_requests_per_pod": sum(req.values()) / n,
        "apiserver": apiserver.per_pod(api, n),
    }


def vs_phase(rows: Sequence[Mapping[str, Any]], base_phase: str) -> list[float | None]:
    """Each row's pods/s as a share of ``base_phase``'s in the same round (None: that round ran
    no such phase); rows without a ``round`` are round 1."""
    base = {r.get("round", 1): r["pods_per_s"] for r in rows if r["phase"] == base_phase}
    return [
        r["pods_per_s"] / base[r.get("round", 1)] if r.get("round", 1) in base else None
        for r in rows
    ]


def vs_default_binder(rows: Sequence[Mapping[str, Any]]) -> list[float | None]:
    """``vs_phase`` against the default binder: the issue's ratio."""
    return vs_phase(rows, "default-binder")


NODELOCK_PARTS = ("extender", "deviceplugin")  # the product's own processes in a burst


def cores_busy(row: Mapping[str, Any]) -> float | None:
    """Cores the whole machine kept busy during the burst: its CPU per pod times pods/s (None
    without the CPU reading)."""
    burst = row.get("cpu_ms_per_pod_burst") or {}
    if not burst:
        return None
    return float(sum(burst.values()) * row["pods_per_s"] / 1000)


def ceiling(
    row: Mapping[str, Any], cores: int, *, without: Sequence[str] = NODELOCK_PARTS
) -> float | None:
    """The most pods/s ``cores`` allow at the burst's CPU per pod less ``without``'s: the rate
    the burst could reach if those processes cost nothing, when it is CPU-bound (``cores_busy``
    near ``cores``).  None without the CPU reading, or when the rest used nothing."""
    burst = row.get("cpu_ms_per_pod_burst") or {}
    rest = sum(v for k, v in burst.items() if k not in without)
    return cores * 1000 / rest if rest > 0 else None


def medians(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per phase, in first-seen order: the median over its rounds of pods/s, creation->Running
    p99, binds refused, and the ratios to the default binder (``vs_default_binder``) and to the
    stock GPU phase (``vs_stock_gpu``), each with its lowest and highest; a ratio is left out
    when no round has its base."""
    out: dict[str, dict[str, float]] = {}
    ratios = {
        "vs_default_binder": vs_default_binder(rows),
        "vs_stock_gpu": vs_phase(rows, "stock-gpu"),
    }
    for phase in dict.fromkeys(r["phase"] for r in rows):
        mine = [r for r in rows if r["phase"] == phase]
        summary = {
            "rounds": float(len(mine)),
            "pods_per_s": statistics.median(r["pods_per_s"] for r in mine),
            "to_running_p99_s": statistics.median(r["to_running_p99_s"] for r in mine),
            "contended_binds": statistics.median(r["contended_binds"] for r in mine),
        }
        for key, shares in ratios.items():
            known = [
                q
                for r, q in zip(rows, shares, strict=True)
                if r["phase"] == phase and q is not None
            ]
            if known:
                summary[key] = statistics.median(known)
                summary[f"{key}_min"] = min(known)
                summary[f"{key}_max"] = max(known)
        out[phase] = summary
    return out


# the targets for the nodelock phase: figure -> (bound, whether higher is better)
TARGETS: dict[str, tuple[float, bool]] = {
    "nodelock_vs_stock": (0.8, True),
    "own_cpu_ms_per_pod": (6.0, False),
    "apiserver_extra_cpu_ms_per_pod": (4.0, False),
    "to_running_p99_s": (1.5, False),
    "contended_binds": (0.0, False),
    "handoff_writes_per_pod": (3.2, False),
}


def headline(rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """The nodelock phase's figures the targets are set on, over its rounds: the median of each
    round's pods/s against that round's stock GPU phase (``nodelock_vs_stock``); the median CPU
    per pod of the extender plus the device plugins (``own_cpu_ms_per_pod``) and of
    kube-apiserver less the same round's stock GPU phase's (``apiserver_extra_cpu_ms_per_pod``),
    both to a second after the burst; the median creation->Running p99; and the most binds
    refused and handoff writes per pod of any round.  None: no nodelock row, or no stock row
    for the ratios against it."""
    mine = [r for r in rows if r["phase"] == "nodelock"]
    stock = {r.get("round", 1): r for r in rows if r["phase"] == "stock-gpu"}
    if not mine:
        return dict.fromkeys(TARGETS)
    paired = [(r, stock[r.get("round", 1)]) for r in mine if r.get("round", 1) in stock]

    def cpu(r: Mapping[str, Any], *kinds: str) -> float:
        return float(sum((r.get("cpu_ms_per_pod") or {}).get(k, 0.0) for k in kinds))

    return {
        "nodelock_vs_stock": statistics.median(r["pods_per_s"] / s["pods_per_s"] for r, s in paired)
        if paired
        else None,
        "own_cpu_ms_per_pod": statistics.median(cpu(r, *NODELOCK_PARTS) for r in mine),
        "apiserver_extra_cpu_ms_per_pod": statistics.median(
            cpu(r, "kube-apiserver") - cpu(s, "kube-apiserver") for r, s in paired
        )
        if paired
        else None,
        "to_running_p99_s": statistics.median(r["to_running_p99_s"] for r in mine),
        "contended_binds": max(r["contended_binds"] for r in mine),
        "handoff_writes_per_pod": max(r["handoff_writes_per_pod"] for r in mine),
    }


def target_lines(figures: Mapping[str, float | None]) -> list[str]:
    """One line per target: the figure, the bound, met or not."""
    out = []
    for key, (bound, higher) in TARGETS.items():
        value = figures.get(key)
        if value is None:
            out.append(f"  {key:<32}-  (target {'>=' if higher else '<='} {bound:g}: not measured)")
            continue
        met = value >= bound if higher else value <= bound
        out.append(
            f"  {key:<32}{value:.2f}  (target {'>=' if higher else '<='} {bound:g}: "
            f"{'met' if met else 'missed'})"
        )
    return out


def table(rows: list[dict[str, Any]], *, cores: int | None = None) -> str:
    """The report: one line per phase and round, then the hold stages, the extender's times,
    CPU per pod, the ceiling, and (several rounds) the medians; ``cores``: the machine's."""
    cores = cores or os.cpu_count() or 1
    rounds = len({r.get("round", 1) for r in rows})
    head = (
        f"{'phase':<24}{'pods/s':>8}{'vs base':>9}{'vs stock':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'contended':>11}{'hold p50':>10}{'hold p99':>10}{'writes':>8}{'LISTs':>7}{'req':>7}"
    )
    lines = [head, "-" * len(head)]

    def label(r: dict[str, Any]) -> str:
        return r["phase"] if rounds == 1 else f"{r['phase']} #{r.get('round', 1)}"

    def share(q: float | None) -> str:
        return "-" if q is None else f"{q:.2f}"

    def ms(v: float) -> str:
        return "-" if math.isnan(v) else f"{v * 1000:.0f}"

    for r, base, stock in zip(
        rows, vs_default_binder(rows), vs_phase(rows, "stock-gpu"), strict=True
    ):
        lines.append(
            f"{label(r):<24}{r['pods_per_s']:>8.1f}{share(base):>9}{share(stock):>10}"
            f"{ms(r['to_running_p50_s']):>9}{ms(r['to_running_p99_s']):>9}"
            f"{r['contended_binds']:>11.0f}{ms(r['handoff_p50_s']):>10}{ms(r['handoff_p99_s']):>10}"
            f"{r['handoff_writes_per_pod']:>8.2f}{r['lists_per_pod']:>7.2f}"
            f"{r['all_requests_per_pod']:>7.1f}"
        )
    lines.append(
        "vs base = pods/s against the default binder's (pods without GPUs); vs stock = against "
        "the same GPU pods with a stock device plugin and no coordination"
    )
    lines.append(
        "writes = the handoff's own writes per pod (Lease POST/PUT + pods/binding); "
        "LISTs and req = every client's, per pod"
    )
    lines.append("")
    lines.append(
        "hold stages, p50 / p99 ms: bind = acquire -> pod bound; admit = bound -> released "
        "(kubelet, GetPreferredAllocation, Allocate, release); status = released -> Running; "
        "handover = a release -> the next acquire on that node"
    )
    for r in rows:
        p50, p99 = r.get("stages_p50_s") or {}, r.get("stages_p99_s") or {}
        if p50:
            cells = "  ".join(
                f"{k} {p50[k] * 1000:.0f} / {p99[k] * 1000:.0f}"
                for k in ("bind", "admit", "status", "handover")
                if k in p50
            )
            lines.append(f"  {label(r):<22}{cells}")
    lines.append("")
    lines.append("extender, server side, mean ms per call: filter, prioritize, bind (queue wait)")
    for r in rows:
        m = r.get("extender_mean_s") or {}
        if m:
            cells = "  ".join(f"{k} {v * 1000:.1f}" for k, v in m.items())
            lines.append(f"  {label(r):<22}{cells}")
    lines.append("")
    lines.append(
        "CPU per pod, ms, by component: during the burst (first create to last Running), and to "
        "a second after it (work left behind: Events, controllers); idle: what the components "
        "used per second in the 5 s before the burst, times the +1 s window, per pod (a cost of "
        f"time, not of pods); the machine has {cores} cores"
    )
    for r in rows:
        for key, what in (("cpu_ms_per_pod_burst", "burst"), ("cpu_ms_per_pod", "+1 s")):
            cpu = sorted(r.get(key, {}).items(), key=lambda kv: -kv[1])
            total = sum(v for _, v in cpu)
            cells = "  ".join(f"{k} {v:.0f}" for k, v in cpu if v >= 0.5)
            name = label(r) if what == "burst" else ""
            lines.append(f"  {name:<22}{what:<6}total {total:.0f}: {cells}")
        idle = sorted((r.get("idle_cpu_ms_per_s") or {}).items(), key=lambda kv: -kv[1])
        if idle and r.get("cpu_window_s"):
            window = r["cpu_window_s"]
            cells = "  ".join(
                f"{k} {v * window / r['pods']:.1f}" for k, v in idle if v * window >= r["pods"] / 2
            )
            lines.append(f"  {'':<22}idle  the same seconds idle would cost: {cells}")
    if any(r.get("apiserver") for r in rows):
        lines.append("")
        lines.append(
            "kube-apiserver per pod, by request kind: time serving each kind (wall ms in the "
            "server, not CPU), and the watch events it sent per pod by resource (encoded kB, "
            "watches open after the burst, events per write of that resource: the fan-out)"
        )
        for r in rows:
            if r.get("apiserver"):
                lines.extend(apiserver.lines(label(r), r["apiserver"]))
    capped = [
        (r, base, cores_busy(r), ceiling(r, cores))
        for r, base in zip(rows, vs_default_binder(rows), strict=True)
        if r["phase"] in PHASE_ARGS
    ]
    if any(busy is not None and most is not None for _, _, busy, most in capped):
        lines.append("")
        lines.append(
            f"ceiling: the most pods/s {cores} cores allow at the burst's CPU per pod less "
            f"{' and '.join(NODELOCK_PARTS)}'s (as if they cost nothing; holds while the burst "
            "keeps every core busy)"
        )
        for r, base, busy, most in capped:
            if busy is None or most is None:
                continue
            of_base = "" if base is None else f" ({most / r['pods_per_s'] * base:.2f} x base)"
            lines.append(
                f"  {label(r):<22}cores busy {busy:.2f} of {cores}; "
                f"at most {most:.1f} pods/s{of_base}"
            )
    if rounds > 1:
        lines.append("")
        lines.append(f"medians over {rounds} rounds (ratios: each round against its own)")
        for phase, m in medians(rows).items():
            against = "".join(
                f"  {what} {m[key]:.2f} ({m[key + '_min']:.2f}-{m[key + '_max']:.2f})"
                for key, what in (("vs_default_binder", "vs base"), ("vs_stock_gpu", "vs stock"))
                if key in m
            )
            lines.append(
                f"  {phase:<22}{m['pods_per_s']:.1f} pods/s{against}  "
                f"p99 {m['to_running_p99_s'] * 1000:.0f} ms  refused {m['contended_binds']:.0f}"
            )
    if any(r["phase"] == "nodelock" for r in rows):
        lines.append("")
        lines.append(
            f"targets (nodelock; {rounds} round(s); CPU to a second after the burst; own = "
            f"{' + '.join(NODELOCK_PARTS)}; apiserver extra = less the stock GPU phase's)"
        )
        lines.extend(target_lines(headline(rows)))
    return "\n".join(lines)


async def warm_up(cluster: Cluster, nodes: int) -> None:
    """One GPU pod per node through the (just restarted) extender, then deleted: every node then
    has its Lease and a previous handoff this extender saw, as in a cluster that has been running
    a while.  (A node's first handoff on a new Lease, or after an extender restart, lists that
    node's pods once; the phases measure the steady state.)"""
    ns = "bench-warm-up"
    async with await KubeClient.connect(str(cluster.kubeconfig)) as kube:
        await create_namespace(kube, ns)
        for i, node in enumerate(node_names(nodes)):
            body = pod(f"w{i}", 1)
            body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            await kube.create(pod_path(ns), body)
        for _ in range(600):
            items = (await kube.list(pod_path(ns)))["items"]
            if sum(1 for p in items if p.get("status", {}).get("phase") == "Running") == nodes:
                break
            await asyncio.sleep(0.2)
        else:
            raise RuntimeError("warm-up pods not Running after 120 s")
        await delete_namespace(kube, ns)


async def delete_namespace(kube: KubeClient, ns: str) -> None:
    """Delete ``ns`` and wait until it is gone: the namespace controller's cleanup lists every
    kind of object in it, and those LISTs must not count in the next burst."""
    await kube.delete(namespace_path(ns))
    for _ in range(600):
        try:
            await kube.get(namespace_path(ns))
        except NotFound:
            return
        await asyncio.sleep(0.2)


def restart_extenders(cluster: Cluster, phase_args: list[str]) -> None:
    """Restart every extender replica with ``phase_args`` in place of the phase flags."""
    flags = ("--bind-wait-budget", "--lock-aware", "--no-lock-aware")
    for name, proc in cluster.state.procs().items():
        if name != "extender" and not name.startswith("extender-"):
            continue
        if name == "extender-lb":
            continue
        argv = [a for a in proc.argv if not a.startswith(flags)] + phase_args
        cluster.stop_component(name)
        cluster.start_component(name, argv)
    time.sleep(2)  # the replicas list and watch again


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=64)
    parser.add_argument(
        "--mix", default="1", help="GPUs per pod: one size, or a comma list for a mixed burst"
    )
    parser.add_argument(
        "--pod-max-backoff",
        type=int,
        default=None,
        metavar="SECONDS",
        help="kube-scheduler's podMaxBackoffSeconds (its default: 10) for the extender phases",
    )
    parser.add_argument(
        "--extender-tls",
        action="store_true",
        help="serve the extender over HTTPS with kube-scheduler's client certificate, as the "
        "shipped configuration does (default: plain HTTP)",
    )
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma list of {', '.join(PHASES)} (default: all four)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the phases this many times, in turn, and also report each phase's median "
        "(the ratio: the median of each round's ratio to that round's default binder)",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS,
        help="where the results JSON goes (default bench/results)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile the extender and every device plugin (cProfile) in each burst: "
        "<results-dir>/profiles/<kubelet>-<round>-<phase>/<component>.pstats and top.txt; "
        "profiling slows them, so the CPU figures of such a run are not comparable with a "
        "plain run's",
    )
    parser.add_argument(
        "--kubelet",
        choices=("sim", "real", "both"),
        default="sim",
        help="the nodes' kubelets: simulated (nodelock-simkubelet), real (the kubelet binary "
        "against nodelock-cri), or both, one cluster after the other, compared at the end "
        "(default: sim)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    mix = [int(x) for x in args.mix.split(",")]
    sizes = burst_sizes(mix, nodes=args.nodes, gpus=args.gpus, pods=args.pods)
    # the extender's phases first, then those of kube-scheduler alone (as PHASES orders them)
    asked = set(args.phases.split(","))
    unknown = asked - set(PHASES)
    if unknown:
        parser.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
    phases = sorted(asked, key=PHASES.index)
    ensure_simkubelet()
    profile_root = args.results_dir / "profiles"
    if args.profile:  # set before the cluster starts: its Python components start hooked
        raw = profile_root / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        os.environ[PROFILE_DIR_ENV] = str(raw.resolve())
    kinds = (
        [KubeletKind.SIM, KubeletKind.REAL]
        if args.kubelet == "both"
        else [KubeletKind(args.kubelet)]
    )
    results: dict[KubeletKind, list[dict[str, Any]]] = {}
    for kind in kinds:
        rows = run_phases(
            args, sizes, phases, kubelet=kind, profile_root=profile_root if args.profile else None
        )
        results[kind] = rows
        print(
            f"{len(sizes)} pods of {args.mix} GPU(s) on {args.nodes} nodes x {args.gpus} GPUs, "
            f"{KUBELET_WORDS[kind]}"
        )
        print(table(rows))
        write_results(args, mix, sizes, rows, kubelet=kind)
    if len(results) > 1:
        print()
        print(kubelet_comparison(results))
    return 0


KUBELET_WORDS = {
    KubeletKind.SIM: "simulated kubelets (kubelet's device manager in nodelock-simkubelet)",
    KubeletKind.REAL: "real kubelets (the kubelet binary against nodelock-cri, no containers)",
}


def kubelet_comparison(results: Mapping[KubeletKind, Sequence[Mapping[str, Any]]]) -> str:
    """The same bursts on simulated and on real kubelets, side by side: each phase's median
    pods/s, creation->Running p99 and CPU per pod (and the kubelets' share of it), then the
    headline figures; real less simulated where both have a figure."""
    sim, real = results[KubeletKind.SIM], results[KubeletKind.REAL]
    lines = [
        "simulated vs real kubelets (medians over the rounds; CPU to a second after the burst)",
        f"  {'phase':<16}{'pods/s sim':>12}{'real':>8}{'p99 ms sim':>12}{'real':>8}"
        f"{'CPU/pod sim':>13}{'real':>8}{'kubelet sim':>13}{'real':>8}",
    ]

    def cpu(rows: Sequence[Mapping[str, Any]], phase: str, kind: str | None) -> float:
        return float(
            statistics.median(
                sum(v for k, v in (r.get("cpu_ms_per_pod") or {}).items() if kind in (None, k))
                for r in rows
                if r["phase"] == phase
            )
        )

    msim, mreal = medians(sim), medians(real)
    for phase in msim:
        if phase not in mreal:
            continue
        lines.append(
            f"  {phase:<16}{msim[phase]['pods_per_s']:>12.1f}{mreal[phase]['pods_per_s']:>8.1f}"
            f"{msim[phase]['to_running_p99_s'] * 1000:>12.0f}"
            f"{mreal[phase]['to_running_p99_s'] * 1000:>8.0f}"
            f"{cpu(sim, phase, None):>13.1f}{cpu(real, phase, None):>8.1f}"
            f"{cpu(sim, phase, 'kubelet'):>13.1f}{cpu(real, phase, 'kubelet'):>8.1f}"
        )
    hsim, hreal = headline(sim), headline(real)
    lines.append(f"  {'target figure':<32}{'sim':>8}{'real':>8}{'real - sim':>12}")
    for key in TARGETS:
        a, b = hsim.get(key), hreal.get(key)
        cells = [("-" if v is None else f"{v:.2f}") for v in (a, b)]
        diff = "-" if a is None or b is None else f"{b - a:+.2f}"
        lines.append(f"  {key:<32}{cells[0]:>8}{cells[1]:>8}{diff:>12}")
    return "\n".join(lines)


def run_phases(
    args: argparse.Namespace,
    sizes: list[int],
    phases: list[str],
    *,
    kubelet: KubeletKind,
    profile_root: Path | None,
) -> list[dict[str, Any]]:
    """Every round of ``phases`` on a throwaway cluster of ``kubelet`` nodes; the rows."""
    rows: list[dict[str, Any]] = []

    def profile_to(round_: int, phase: str) -> Path | None:
        if profile_root is None:
            return None
        return profile_root / f"{kubelet.value}-{round_}-{phase}"

    # its own cluster, stopped and its state folder removed however the run ends (kept with
    # $NODELOCK_KEEP_STATE, to read the components' logs)
    with throwaway_cluster("nlb-") as cluster:
        up_gpu_cluster(
            cluster,
            nodes=args.nodes,
            gpus_per_node=args.gpus,
            extender_tls=args.extender_tls,
            kubelet=kubelet,
        )
        config = yaml.safe_load(cluster.scheduler_config.read_text())
        with_extender: dict[str, Any] = {"extenders": config["extenders"]}
        if args.pod_max_backoff is not None:
            with_extender["podMaxBackoffSeconds"] = args.pod_max_backoff
            cluster.restart_scheduler(with_extender)
        extender_on = True
        for round_ in range(1, args.rounds + 1):  # each round runs every phase, in turn
            for phase in phases:
                if phase in ("stock-gpu", "default-binder"):
                    if extender_on:
                        cluster.restart_scheduler({})  # no extender: the default binder
                        extender_on = False
                    if phase == "default-binder":
                        row = asyncio.run(burst(cluster, phase, [0] * len(sizes)))
                    else:
                        nodes = node_names(args.nodes)
                        use_stock_plugins(cluster, nodes, gpus=args.gpus)
                        try:
                            row = asyncio.run(
                                burst(cluster, phase, sizes, profile_to=profile_to(round_, phase))
                            )
                        finally:
                            use_nodelock_plugins(cluster, nodes)
                else:
                    if not extender_on:
                        cluster.restart_scheduler(with_extender)
                        extender_on = True
                    restart_extenders(cluster, PHASE_ARGS[phase])
                    asyncio.run(warm_up(cluster, args.nodes))
                    row = asyncio.run(
                        burst(cluster, phase, sizes, profile_to=profile_to(round_, phase))
                    )
                rows.append({**row, "round": round_, "kubelet": kubelet.value})
    return rows


def write_results(
    args: argparse.Namespace,
    mix: list[int],
    sizes: list[int],
    rows: list[dict[str, Any]],
    *,
    kubelet: KubeletKind,
) -> None:
    """The results JSON of one kind of kubelet, named by scenario."""
    out = {
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "mix": mix,
        "pod_max_backoff_s": args.pod_max_backoff,
        "extender_tls": args.extender_tls,
        "kubelet": kubelet.value,
        "pods": len(sizes),
        "rounds": args.rounds,
        "profiled": args.profile,
        **headline(rows),
        "targets": {k: {"bound": b, "higher_is_better": h} for k, (b, h) in TARGETS.items()},
        "rows": rows,
        "medians": medians(rows),
    }
    name = (
        "handoff.json"
        if mix == [1] and args.nodes == 8
        else (f"handoff-{args.nodes}x{args.gpus}-mix{'-'.join(map(str, mix))}.json")
    )
    if args.pod_max_backoff is not None:
        name = name.replace(".json", f"-backoff{args.pod_max_backoff}.json")
    if args.extender_tls:
        name = name.replace(".json", "-tls.json")
    if kubelet is KubeletKind.REAL:
        name = name.replace(".json", "-real.json")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / name).write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.results_dir / name}")


if __name__ == "__main__":
    raise SystemExit(main())
