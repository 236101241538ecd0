"""The extender at cluster size: start-to-synced time and memory against a real API server.

One devcluster (real kube-apiserver and etcd) gets ``--nodes`` nodes and ``--pods`` pods through
the API, then the extender is restarted with the chart's flags and measured:

- **nodes**: Node objects with an 8-GPU inventory annotation and ``nvidia.com/gpu`` capacity, a
  Ready condition and no kubelet.  kube-controller-manager runs with its node lifecycle
  controller turned off (``--controllers=*,-node-lifecycle-controller``), so nothing marks them
  NotReady or taints them for a missing heartbeat (kwok instead renews every node's Lease; at
  thousands of nodes on 2 cores that would be most of the bench's CPU).  They carry the taint
  ``nodelock.io/bench-no-kubelet:NoSchedule`` so that kube-scheduler never places a burst pod
  where nothing would run it; the extender still caches each one's full GPU picture.
- **pods**: bound across those nodes with ``spec.nodeName`` in 20 namespaces; ``--gpu-share``
  of them (default 5%) ask for one GPU and carry an assignment and a fencing token, as after a
  handoff; the rest are CPU pods of a Deployment's shape: two containers, 5 labels, 10
  environment variables of 40 characters (``cpu_pod``).  They are Pending (no kubelet writes a
  status), so their objects are smaller than a running pod's.
- **the extender** is started the way ``devcluster.gpunodes.start_extender`` starts it (the
  chart's flags: HTTPS with client certificates, ``--ask-again-turned-away``), once while the
  objects are created (it follows them by watch) and then restarted (it lists them).  Measured
  per restart: seconds from the process's start to ``/readyz`` (both caches listed), peak RSS
  (``VmHWM``), RSS 10 s after, and kube-apiserver's CPU seconds over that window, net of its
  idle rate measured just before.  kube-scheduler's RSS (its informers hold every pod and
  node too) is read once the objects are created.

``--baseline DIR`` (repeatable) restarts, in turn with this tree's, an extender run from another
source tree (e.g. ``git archive`` of an earlier commit unpacked in DIR) against the same objects:
before/after figures of one run, on one cluster.

``--burst N`` runs ``bench.handoff``'s burst of N single-GPU pods through kube-scheduler and the
extender onto ``--sim-nodes`` simulated GPU nodes, once before the objects are created (the small
cluster) and once after: ``burst_vs_small`` is the second's pods/s over the first's.  At each of
the two sizes the same burst then runs through the same kube-scheduler without the extender
(``bench.handoff``'s ``stock-gpu`` phase: kube-scheduler restarted with no extender, each
simulated node's nodelock device plugin swapped for a stock one, nothing coordinating), so that
what grows with the cluster can be told apart: ``burst_vs_small_without_nodelock`` is that path's
ratio, ``nodelock_vs_stock`` (per size) nodelock's pods/s over the stock path's at the same size.
Per burst: pods/s, creation->Running p99, CPU per pod of each component over the burst (/proc),
the extender's filter/prioritize/bind p99 (its ``nodelock_extender_request_duration_seconds``),
kube-scheduler's attempt p99 (``scheduler_scheduling_attempt_duration_seconds``: the scheduling
cycle and the bind), its algorithm p99 (``scheduler_scheduling_algorithm_duration_seconds``: the
cycle alone, every node's filters included) and attempts by result
(``scheduler_schedule_attempts_total``) and its Go collections (``scheduler_gc``), scraped from
its secure port with the admin certificate, and the machine's load average at the start.
``--burst-rounds N`` runs the two paths N times in turn at each size: figures are medians,
ratios each round's own, then the median.

``--churn R``, ``--plugin-watches K`` and ``--replicas 2`` measure the watches at size after the
restarts (``bench/scale_watch.py`` says how): the extender's CPU per pod event and its cache's lag
under pod churn, the device plugins' watches of K nodes as kube-apiserver counts them, two
replicas' initial lists.  Their figures go to the results' ``watches`` rows (one per size, each
measurement with the command that took it); such a run writes its size's row only with
``--burst``.  A size measured again keeps each run's headline figures in ``other_runs``.

    python -m bench.scale [--nodes 50] [--pods 2000]      # quick, a few minutes
    python -m bench.scale --nodes 5000 --pods 100000 --churn 50 --plugin-watches 2000 --replicas 2
    python -m bench.scale --nodes 200 --pods 20000        # the 20,000-pod restart (issue 50)
    python -m bench.scale --nodes 5000 --pods 50000 --burst 64   # the burst at size

Writes ``bench/results/scale.json`` (one row per run, appended to the rows of other sizes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import ssl
import statistics
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench import scale_watch
from bench.procstat import cpu_rate
from bench.procstat import cpu_seconds as _cpu_s
from bench.procstat import load_average as _load
from bench.procstat import status_kib as _status_kib
from devcluster.cluster import Cluster, throwaway_cluster
from devcluster.gpunodes import node_names, nodelock_command, start_extender, up_gpu_cluster
from devcluster.namespaces import create_namespace
from devcluster.pki import ADMIN
from devcluster.stockplugin import use_nodelock_plugins, use_stock_plugins
from handoff.wire import (
    GPU,
    ContainerName,
    DeviceID,
    Keys,
    format_assignment,
    format_inventory,
    format_token,
)
from kube.client import JSON, KubeClient, namespace_path, node_path, pod_path
from lockd.model import FencingToken
from nodelock.measure import Histogram, metric_samples, metric_sum, scrape

Samples = list[tuple[str, dict[str, str], float]]

RESULTS = Path(__file__).resolve().parent / "results" / "scale.json"
VALUES = Path(__file__).resolve().parent.parent / "deploy" / "helm" / "nodelock" / "values.yaml"
GPUS = 8
RESOURCE = "nvidia.com/gpu"
NAMESPACES = 20
FAKE_TAINT = "nodelock.io/bench-no-kubelet"
BYPASS = "nodelock.io/bypass"  # devcluster/admission.py: GPU pods bound by hand, on purpose
STEADY_AFTER_S = 10.0
NO_NODE_LIFECYCLE = "--controllers=*,-node-lifecycle-controller"
NOT_READY = "node.kubernetes.io/not-ready"  # kubelet registers with it; the controller lifts it


# ---- the objects (pure) ---------------------------------------------------------------------


def node_name(index: int) -> str:
    return f"fake-node-{index:05d}"


def fake_node(index: int) -> JSON:
    """A node as a GPU node's kubelet and device plugin leave it, with no kubelet behind it."""
    name = node_name(index)
    inventory = format_inventory(
        [
            GPU(DeviceID(f"GPU-{name}-{i}"), i, "NVIDIA H100 80GB HBM3", 81559, i // 4, True)
            for i in range(GPUS)
        ]
    )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "topology.kubernetes.io/zone": f"zone-{index % 3}",
                "nodelock.io/enabled": "true",
            },
            "annotations": {Keys().gpus: inventory},
        },
        "spec": {"taints": [{"key": FAKE_TAINT, "effect": "NoSchedule"}]},
    }


def node_status(now: str) -> JSON:
    """The status a Ready 8-GPU node reports (written with ``nodes/status``)."""
    capacity = {"cpu": "192", "memory": "2063937564Ki", "pods": "110", RESOURCE: str(GPUS)}
    return {
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        }
    }


def namespace_of(index: int) -> str:
    return f"team-{index % NAMESPACES:02d}"


def is_gpu_pod(index: int, gpu_share: float) -> bool:
    """Whether pod ``index`` is a GPU pod: evenly spread, ``gpu_share`` of them."""
    if gpu_share <= 0:
        return False
    every = max(1, round(1 / gpu_share))
    return index % every == every - 1


def env_value(index: int, var: int) -> str:
    """A 40-character value, different per pod and variable."""
    return f"{index:08d}-{var:02d}-" + "x" * 28


def cpu_pod(index: int, node: str) -> JSON:
    """A CPU pod as a Deployment makes it: two containers, env, labels; bound to ``node``."""
    app = f"svc-{index // 50:04d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{app}-{index:07d}",
            "namespace": namespace_of(index),
            "labels": {
                "app.kubernetes.io/name": app,
                "app.kubernetes.io/part-of": f"product-{index // 1000:03d}",
                "pod-template-hash": f"{index // 50:010x}",
                "team": namespace_of(index),
                "tier": "backend",
            },
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "bench-bound-by-hand",
            "terminationGracePeriodSeconds": 30,
            "containers": [
                {
                    "name": "app",
                    "image": f"registry.invalid/{app}:1.{index % 7}",
                    "ports": [{"containerPort": 8080, "name": "http"}],
                    "env": [
                        {"name": f"SETTING_{v}", "value": env_value(index, v)} for v in range(10)
                    ],
                    "resources": {
                        "requests": {"cpu": "250m", "memory": "512Mi"},
                        "limits": {"memory": "1Gi"},
                    },
                },
                {
                    "name": "proxy",
                    "image": "registry.invalid/proxy:2.3",
                    "args": ["--listen=:15001", "--upstream=127.0.0.1:8080"],
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                },
            ],
        },
    }


def gpu_pod(index: int, node: str, device: int) -> JSON:
    """A single-GPU pod bound to ``node`` with its assignment and fencing token annotations (as
    the extender leaves a pod it bound), labelled to pass the devcluster's admission policy."""
    keys = Keys()
    pod = cpu_pod(index, node)
    pod["metadata"]["name"] = f"train-{index:07d}"
    pod["metadata"]["labels"][BYPASS] = "true"
    pod["metadata"]["annotations"] = {
        keys.assignment: format_assignment(
            {ContainerName("app"): [DeviceID(f"GPU-{node}-{device}")]}
        ),
        keys.token: format_token(FencingToken(index + 1)),
    }
    pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE] = "1"
    return pod


def pods(count: int, nodes: int, *, gpu_share: float) -> Iterator[JSON]:
    """``count`` pods spread round-robin over ``nodes`` nodes (the GPU pods and the others each
    going round on their own); a node's GPU pods take its devices in turn (at most ``GPUS``;
    past that a would-be GPU pod is a CPU pod)."""
    used = [0] * nodes
    gpu_pods = 0
    for i in range(count):
        n = gpu_pods % nodes  # GPU pods go round the nodes on their own
        if is_gpu_pod(i, gpu_share) and used[n] < GPUS:
            gpu_pods += 1
            used[n] += 1
            yield gpu_pod(i, node_name(n), used[n] - 1)
        else:
            yield cpu_pod(i, node_name(i % nodes))


# ---- the curve (pure) -----------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """RSS (MiB) = ``base_mib`` + ``mib_per_10k_pods`` x pods / 10,000 (least squares)."""

    base_mib: float
    mib_per_10k_pods: float

    def rss_mib(self, pods: int) -> float:
        return self.base_mib + self.mib_per_10k_pods * pods / 10_000

    def pods_within(self, limit_mib: float, *, headroom: float) -> int:
        """The most pods whose peak stays ``headroom`` (0.25: 25%) below ``limit_mib``."""
        room = limit_mib * (1 - headroom) - self.base_mib
        if self.mib_per_10k_pods <= 0:
            return sys.maxsize
        return max(0, int(room / self.mib_per_10k_pods * 10_000))


def fit(points: Sequence[tuple[int, float]]) -> Fit:
    """Least-squares line through (pods, peak MiB) points; one point: no slope."""
    if not points:
        raise ValueError("no points to fit")
    if len({p for p, _ in points}) < 2:
        return Fit(base_mib=max(m for _, m in points), mib_per_10k_pods=0.0)
    xs = [p / 10_000 for p, _ in points]
    ys = [m for _, m in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return Fit(base_mib=my - slope * mx, mib_per_10k_pods=slope)


def memory_mib(quantity: str) -> float:
    """A Kubernetes memory quantity (``512Mi``, ``1Gi``, ``600M``) in MiB."""
    units = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0, "K": 1e3 / 2**20, "M": 1e6 / 2**20}
    units["G"] = 1e9 / 2**20
    for suffix in sorted(units, key=len, reverse=True):
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * units[suffix]
    return float(quantity) / 2**20


def chart_memory_limit_mib(values_text: str) -> float:
    """``extender.resources.limits.memory`` of the chart's values, in MiB."""
    values = yaml.safe_load(values_text)
    return memory_mib(str(values["extender"]["resources"]["limits"]["memory"]))


def merge_rows(old: Sequence[Mapping[str, Any]], new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The results' rows with ``new`` in place of the row of the same size, sorted by size."""
    key = (new["nodes"], new["pods"])
    rows = [dict(r) for r in old if (r.get("nodes"), r.get("pods")) != key] + [dict(new)]
    return sorted(rows, key=lambda r: (r["pods"], r["nodes"]))


RUN_KEYS = (
    "extender_sync_s",
    "extender_peak_rss_mib",
    "extender_steady_rss_mib",
    "apiserver_list_cpu_s",
    "burst_vs_small",
    "burst_vs_small_without_nodelock",
    "baselines",
    "load_avg",
)


def keeping_other_runs(old: Sequence[Mapping[str, Any]], new: Mapping[str, Any]) -> JSON:
    """``new`` with the headline figures of the row of the same size it replaces (and of the runs
    that row kept) in ``other_runs``: a size measured again keeps each run's figures."""
    key = (new["nodes"], new["pods"])
    row = dict(new)
    for r in old:
        if (r.get("nodes"), r.get("pods")) == key:
            runs = [*r.get("other_runs", []), {k: r[k] for k in RUN_KEYS if k in r}]
            row["other_runs"] = runs
    return row


def with_measurements(
    rows: Sequence[Mapping[str, Any]],
    args: argparse.Namespace,
    measured: Mapping[str, Mapping[str, Any]],
    run_of: Mapping[str, Any],
) -> JSON:
    """The watches row of ``args``' size: the one in ``rows`` with each measurement of this
    run in place of its namesake (each with ``run_of``: the command, restart, load that
    measured it), the others kept."""
    key = (args.nodes, args.pods)
    row: JSON = {"nodes": args.nodes, "pods": args.pods}
    for r in rows:
        if (r.get("nodes"), r.get("pods")) == key:
            row = dict(r)
    for name, figures in measured.items():
        row[name] = {**figures, "run": dict(run_of)}
    return row


def histogram_delta(before: Samples, after: Samples, name: str, **match: str) -> Histogram:
    """The observations of histogram ``name`` (series matching ``match``, summed) made between
    two scrapes of the same process."""

    def buckets(samples: Samples) -> dict[float, float]:
        out: dict[float, float] = {}
        for metric, labels, value in samples:
            if metric != f"{name}_bucket" or "le" not in labels:
                continue
            if all(labels.get(k) == v for k, v in match.items()):
                le = float(labels["le"])
                out[le] = out.get(le, 0.0) + value
        return out

    b0, b1 = buckets(before), buckets(after)
    count = metric_sum(after, f"{name}_count", **match) - metric_sum(
        before, f"{name}_count", **match
    )
    return Histogram(tuple(sorted((le, c - b0.get(le, 0.0)) for le, c in b1.items())), count)


def p99(h: Histogram) -> float | None:
    """The histogram's p99 (None when it observed nothing)."""
    return h.quantile(0.99) if h.count > 0 else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# ---- the process's side (thin) --------------------------------------------------------------


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def restart_measured(cluster: Cluster, *, source: Path | None, timeout_s: float) -> JSON:
    """Restart the extender (from ``source``'s tree when given) with the flags it ran with; its
    start-to-ready seconds, peak and steady RSS, kube-apiserver's CPU over the listing."""
    proc = cluster.state.procs()["extender"]
    metrics = cluster.settings()["extender"]["metrics"][0]
    apiserver = cluster.running()["kube-apiserver"].pid
    cluster.stop_component("extender")
    idle_rate = cpu_rate(apiserver, 3.0)
    env = {"PYTHONPATH": str(source)} if source is not None else None
    args = proc.argv[proc.argv.index("extender") :]  # the flags, after whichever command ran
    argv = [*nodelock_command(), *args]
    if source is not None:  # the other tree's code (-P: not the working directory first)
        argv = [sys.executable, "-P", "-m", "nodelock.cli", *args]
    api0 = _cpu_s(apiserver)
    started = time.monotonic()
    new = cluster.start_component("extender", argv, env=env)
    while not _ready(f"{metrics}/readyz"):
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"extender not ready after {timeout_s:.0f}s; see {new.log}")
        time.sleep(0.05)
    synced_s = time.monotonic() - started
    api_cpu = _cpu_s(apiserver) - api0 - idle_rate * synced_s
    peak_kib = _status_kib(new.pid, "VmHWM")
    time.sleep(STEADY_AFTER_S)
    return {
        "tree": str(source) if source is not None else "this",
        "sync_s": synced_s,
        "peak_rss_mib": max(peak_kib, _status_kib(new.pid, "VmHWM")) / 1024,
        "steady_rss_mib": _status_kib(new.pid, "VmRSS") / 1024,
        "apiserver_cpu_s": api_cpu,
    }


EXTENDER_LATENCY = "nodelock_extender_request_duration_seconds"
SCHEDULER_ATTEMPT = "scheduler_scheduling_attempt_duration_seconds"
SCHEDULER_ATTEMPTS = "scheduler_schedule_attempts_total"
# the scheduling cycle alone (filter over every node, the extender's filter and prioritize,
# scoring), without the bind that the attempt's duration includes (v1.37.2
# pkg/scheduler/schedule_one.go: schedulingAlgorithm, and PodScheduled after sched.bind)
SCHEDULER_ALGORITHM = "scheduler_scheduling_algorithm_duration_seconds"
ATTEMPT_RESULTS = ("scheduled", "unschedulable", "error")


def _extender_samples(cluster: Cluster) -> Samples:
    """Every extender replica's metrics (the plain-HTTP metrics ports), as one scrape."""
    out: Samples = []
    for url in cluster.settings()["extender"]["metrics"]:
        out.extend(metric_samples(scrape(f"{url}/metrics")))
    return out


def _scheduler_ssl(cluster: Cluster) -> ssl.SSLContext:
    """kube-scheduler's secure port: a self-signed serving certificate (its --cert-dir), and the
    admin client certificate (system:masters) for its delegated authorization of /metrics."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(cluster.pki.client_cert(ADMIN)), str(cluster.pki.client_key(ADMIN)))
    return ctx


def _scheduler_samples(cluster: Cluster) -> Samples:
    """kube-scheduler's /metrics; empty when it cannot be read."""
    port = cluster.settings()["ports"]["kube-scheduler"]
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/metrics", timeout=10, context=_scheduler_ssl(cluster)
        ) as resp:
            return metric_samples(resp.read().decode())
    except OSError:
        return []


def restart_scheduler_ready(
    cluster: Cluster, extra: Mapping[str, Any], *, timeout_s: float = 300.0
) -> float:
    """Restart kube-scheduler with ``extra`` and wait for its ``/readyz`` (its informers synced
    and its handlers too: at size it lists every pod and node first); seconds it took."""
    started = time.monotonic()
    cluster.restart_scheduler(extra, timeout_s=timeout_s)
    port = cluster.settings()["ports"]["kube-scheduler"]
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    while True:
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{port}/readyz", timeout=2, context=ctx
            ) as resp:
                if resp.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"kube-scheduler not ready after {timeout_s:.0f}s")
        time.sleep(0.2)


def measured_burst(cluster: Cluster, label: str, pods_n: int) -> JSON:
    """``bench.handoff.burst`` of ``pods_n`` single-GPU pods, with the extender's and
    kube-scheduler's latency histograms over it and the load average at its start."""
    from bench.handoff import burst

    load = _load()
    ext0, sch0 = _extender_samples(cluster), _scheduler_samples(cluster)
    row = asyncio.run(burst(cluster, label, [1] * pods_n))
    ext1, sch1 = _extender_samples(cluster), _scheduler_samples(cluster)
    row["load_avg"] = load
    row["extender_p99_s"] = {
        verb: p99(histogram_delta(ext0, ext1, EXTENDER_LATENCY, verb=verb))
        for verb in ("filter", "prioritize", "bind")
    }
    row["scheduler_metrics_read"] = bool(sch0 and sch1)
    row["scheduler_attempt_p99_s"] = p99(
        histogram_delta(sch0, sch1, SCHEDULER_ATTEMPT, result="scheduled")
    )
    row["scheduler_algorithm_p99_s"] = p99(histogram_delta(sch0, sch1, SCHEDULER_ALGORITHM))
    # its Go runtime's collections over the burst: a heap of every pod and node is rescanned
    # by each one
    row["scheduler_gc"] = {
        "cycles": metric_sum(sch1, "go_gc_duration_seconds_count")
        - metric_sum(sch0, "go_gc_duration_seconds_count"),
        "heap_mib": metric_sum(sch1, "go_memstats_heap_alloc_bytes") / 2**20,
    }
    row["scheduler_attempts"] = {
        result: metric_sum(sch1, SCHEDULER_ATTEMPTS, result=result)
        - metric_sum(sch0, SCHEDULER_ATTEMPTS, result=result)
        for result in ATTEMPT_RESULTS
    }
    return row


def both_paths(cluster: Cluster, label: str, *, pods_n: int, sim_nodes: int, rounds: int) -> JSON:
    """``rounds`` times in turn: the burst through kube-scheduler and the extender (after
    ``bench.handoff.warm_up``), then the same burst through the same kube-scheduler without the
    extender, onto stock device plugins (``bench.handoff``'s ``stock-gpu`` phase);
    kube-scheduler and the plugins are put back as they were after each."""
    from bench.handoff import warm_up

    config = yaml.safe_load(cluster.scheduler_config.read_text())
    with_extender: JSON = {"extenders": config["extenders"]}
    nodes = node_names(sim_nodes)
    out: list[JSON] = []
    for round_ in range(1, rounds + 1):
        asyncio.run(warm_up(cluster, sim_nodes))
        nodelock = measured_burst(cluster, f"{label}-{round_}", pods_n)
        print(f"  {label} {round_}, nodelock: {_line(nodelock)}", flush=True)
        without_s = restart_scheduler_ready(cluster, {})
        use_stock_plugins(cluster, nodes, gpus=GPUS)
        try:
            stock = measured_burst(cluster, f"{label}-{round_}-stock", pods_n)
        finally:
            use_nodelock_plugins(cluster, nodes)
            with_s = restart_scheduler_ready(cluster, with_extender)
        print(f"  {label} {round_}, kube-scheduler alone: {_line(stock)}", flush=True)
        out.append(
            {
                "nodelock": nodelock,
                "stock": stock,
                "scheduler_ready_s": {"without": without_s, "with": with_s},
            }
        )
    return {"rounds": out}


def _line(row: Mapping[str, Any]) -> str:
    cpu = row.get("cpu_ms_per_pod_burst") or {}
    parts = ", ".join(
        f"{k} {cpu[k]:.1f}" for k in ("kube-scheduler", "kube-apiserver", "extender") if k in cpu
    )
    ext = row.get("extender_p99_s") or {}
    ext_s = ", ".join(f"{k} {v * 1000:.1f}" for k, v in ext.items() if v is not None)
    sch = row.get("scheduler_attempt_p99_s")
    alg = row.get("scheduler_algorithm_p99_s")
    return (
        f"{row['pods_per_s']:.1f} pods/s, p99 {row['to_running_p99_s']:.2f} s; CPU ms/pod "
        f"{parts}; extender p99 ms {ext_s or '-'}; kube-scheduler attempt p99 "
        f"{'-' if sch is None else f'{sch * 1000:.0f} ms'} (algorithm "
        f"{'-' if alg is None else f'{alg * 1000:.0f} ms'}), attempts {row['scheduler_attempts']}, "
        f"GC {row['scheduler_gc']}; "
        f"load {row['load_avg']}"
    )


async def _bounded(jobs: Iterator[Any], parallel: int) -> int:
    """Await the coroutines ``jobs`` yields, ``parallel`` at a time; how many ran."""
    done = 0
    pending: set[asyncio.Future[Any]] = set()
    for job in jobs:
        pending.add(asyncio.ensure_future(job))
        if len(pending) >= parallel:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for f in finished:
                f.result()
                done += 1
    for f in asyncio.as_completed(pending):
        await f
        done += 1
    return done


async def populate(cluster: Cluster, *, nodes: int, pods_n: int, gpu_share: float) -> JSON:
    """Create the nodes and pods; seconds each took."""
    async with await KubeClient.connect(str(cluster.kubeconfig), timeout_s=60) as kube:
        for i in range(NAMESPACES):
            ns = namespace_of(i)
            await create_namespace(kube, ns)
            await kube.patch(namespace_path(ns), {"metadata": {"labels": {BYPASS: "true"}}})
        t0 = time.monotonic()
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

        async def one_node(i: int) -> None:
            await kube.create(node_path(), fake_node(i))
            await kube.patch(node_path(node_name(i), subresource="status"), node_status(now))

        await _bounded((one_node(i) for i in range(nodes)), 16)
        t1 = time.monotonic()
        made = await _bounded(
            (
                kube.create(pod_path(p["metadata"]["namespace"]), p)
                for p in pods(pods_n, nodes, gpu_share=gpu_share)
            ),
            16,
        )
        t2 = time.monotonic()
    print(f"  created {nodes} nodes in {t1 - t0:.0f}s, {made} pods in {t2 - t1:.0f}s", flush=True)
    return {"nodes_s": t1 - t0, "pods_s": t2 - t1}


async def untaint_ready(cluster: Cluster) -> None:
    """Take kubelet's ``node.kubernetes.io/not-ready`` taint off the Ready simulated nodes:
    the node lifecycle controller, turned off here, is what removes it."""
    async with await KubeClient.connect(str(cluster.kubeconfig)) as kube:
        for node in (await kube.list(node_path()))["items"]:
            taints = node["spec"].get("taints") or []
            kept = [t for t in taints if t.get("key") != NOT_READY]
            if kept != taints:
                await kube.patch(node_path(node["metadata"]["name"]), {"spec": {"taints": kept}})


def no_node_lifecycle(cluster: Cluster) -> None:
    """Restart kube-controller-manager without its node lifecycle controller."""
    proc = cluster.state.procs()["kube-controller-manager"]
    cluster.stop_component("kube-controller-manager")
    cluster.start_component("kube-controller-manager", [*proc.argv, NO_NODE_LIFECYCLE])


def measure_watches(cluster: Cluster, args: argparse.Namespace) -> JSON:
    """``bench.scale_watch``'s measurements that ``args`` asks for; one that fails is recorded
    with its error and the run goes on (the burst after them is measured still)."""
    steps: dict[str, Any] = {}
    if args.replicas > 1:
        steps["replicas"] = lambda: scale_watch.replicas(cluster, timeout_s=args.sync_timeout)
    if args.churn:
        steps["churn"] = lambda: asyncio.run(
            scale_watch.churn(
                cluster, nodes=args.nodes, rate=args.churn, seconds=args.churn_s,
                live=args.churn_live,
            )
        )  # fmt: skip
    if args.plugin_watches:
        steps["plugin_watches"] = lambda: asyncio.run(
            scale_watch.plugin_watches(cluster, k=args.plugin_watches, at=args.nodes)
        )
    extras: JSON = {}
    for name, step in steps.items():
        try:
            extras[name] = step()
        except Exception as exc:  # recorded, and the run goes on
            extras[name] = {"error": f"{type(exc).__name__}: {exc}", "load_avg": _load()}
        print(f"  {name}: {extras[name]}", flush=True)
    return extras


def run(args: argparse.Namespace) -> JSON:
    load_start = _load()
    with throwaway_cluster("nls-", version=args.kubernetes_version) as cluster:
        no_node_lifecycle(cluster)
        small: JSON | None = None
        if args.burst:
            up_gpu_cluster(cluster, nodes=args.sim_nodes, gpus_per_node=GPUS, extender_tls=True)
            asyncio.run(untaint_ready(cluster))
            small = both_paths(
                cluster,
                "small",
                pods_n=args.burst,
                sim_nodes=args.sim_nodes,
                rounds=args.burst_rounds,
            )
        else:
            start_extender(cluster, tls=True)
        follower = cluster.state.procs()["extender"].pid
        made = asyncio.run(
            populate(cluster, nodes=args.nodes, pods_n=args.pods, gpu_share=args.gpu_share)
        )
        followed = {
            "peak_rss_mib": _status_kib(follower, "VmHWM") / 1024,
            "rss_mib": _status_kib(follower, "VmRSS") / 1024,
        }
        scheduler = cluster.running()["kube-scheduler"].pid  # its informers hold every pod
        followed["scheduler_rss_mib"] = _status_kib(scheduler, "VmRSS") / 1024
        followed["scheduler_peak_rss_mib"] = _status_kib(scheduler, "VmHWM") / 1024
        print(f"  extender following by watch: {followed}", flush=True)
        restarts: list[JSON] = []
        trees: list[Path | None] = [*args.baseline, None]
        for _ in range(args.restarts):
            for tree in trees:
                row = restart_measured(cluster, source=tree, timeout_s=args.sync_timeout)
                print(
                    f"  restart ({row['tree']}): synced in {row['sync_s']:.1f}s, peak "
                    f"{row['peak_rss_mib']:.0f} MiB, steady {row['steady_rss_mib']:.0f} MiB, "
                    f"kube-apiserver {row['apiserver_cpu_s']:.1f} CPU-s",
                    flush=True,
                )
                restarts.append(row)
        extras = measure_watches(cluster, args)
        big: JSON | None = None
        if args.burst:  # the warm-up: the restarted extender's first handoffs
            big = both_paths(
                cluster,
                "big",
                pods_n=args.burst,
                sim_nodes=args.sim_nodes,
                rounds=args.burst_rounds,
            )
    return {
        "load_avg": {"start": load_start, "end": _load()},
        "populate": made,
        "followed": followed,
        "restarts": restarts,
        "small": small,
        "big": big,
        "extras": extras,
    }


def summary(args: argparse.Namespace, raw: Mapping[str, Any], limit_mib: float) -> JSON:
    """The results row of one run (medians over the restarts of this tree)."""
    mine = [r for r in raw["restarts"] if r["tree"] == "this"]

    def med(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
        return statistics.median(r[key] for r in rows) if rows else None

    small, big = raw.get("small"), raw.get("big")
    sizes = {k: b["rounds"] for k, b in (("small", small), ("big", big)) if b}
    nl = {k: burst_medians([r["nodelock"] for r in rounds]) for k, rounds in sizes.items()}
    stock = {k: burst_medians([r["stock"] for r in rounds]) for k, rounds in sizes.items()}
    row: JSON = {
        "nodes": args.nodes,
        "pods": args.pods,
        "gpu_share": args.gpu_share,
        "extender_sync_s": med(mine, "sync_s"),
        "extender_peak_rss_mib": med(mine, "peak_rss_mib"),
        "extender_steady_rss_mib": med(mine, "steady_rss_mib"),
        "apiserver_list_cpu_s": med(mine, "apiserver_cpu_s"),
        "chart_memory_limit_mib": limit_mib,
        "burst_vs_small": rate_ratio(nl),
        "burst_vs_small_without_nodelock": rate_ratio(stock),
        "following_rss_mib": raw["followed"]["rss_mib"],
        "scheduler_rss_mib": raw["followed"]["scheduler_rss_mib"],
        "scheduler_peak_rss_mib": raw["followed"]["scheduler_peak_rss_mib"],
        "restarts": raw["restarts"],
        "populate_s": raw["populate"],
        "load_avg": raw["load_avg"],  # 1, 5, 15 min, at the run's start and end
    }
    for tree in args.baseline:
        base = [r for r in raw["restarts"] if r["tree"] == str(tree)]
        row.setdefault("baselines", {})[str(tree)] = {
            "extender_sync_s": med(base, "sync_s"),
            "extender_peak_rss_mib": med(base, "peak_rss_mib"),
            "extender_steady_rss_mib": med(base, "steady_rss_mib"),
            "apiserver_list_cpu_s": med(base, "apiserver_cpu_s"),
        }
    if sizes:
        row["burst"] = {
            size: {
                "nodelock_vs_stock": median_of(
                    [ratio(r["nodelock"]["pods_per_s"], r["stock"]["pods_per_s"]) for r in rounds]
                ),
                "nodelock": nl[size],
                "stock": stock[size],
                "rounds": [
                    {
                        "nodelock": burst_figures(r["nodelock"]),
                        "stock": burst_figures(r["stock"]),
                        "scheduler_ready_s": r["scheduler_ready_s"],
                    }
                    for r in rounds
                ],
            }
            for size, rounds in sizes.items()
        }
    return row


def median_of(values: Sequence[float | None]) -> float | None:
    """The median of the values that are not None (None: none are)."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


MEDIAN_KEYS = (
    "pods_per_s",
    "to_running_p50_s",
    "to_running_p99_s",
    "scheduler_attempt_p99_s",
    "scheduler_algorithm_p99_s",
)
MEDIAN_BY = (
    "extender_p99_s",
    "cpu_ms_per_pod_burst",
    "cpu_ms_per_pod",
    "scheduler_attempts",
    "scheduler_gc",
)


def burst_medians(rows: Sequence[Mapping[str, Any]]) -> JSON:
    """One path's bursts at one size: each figure's median over the rounds (per verb, per
    component, per result for the figures that have parts), and the load averages seen."""
    out: JSON = {"rounds": len(rows), "load_avg": [r.get("load_avg") for r in rows]}
    for key in MEDIAN_KEYS:
        out[key] = median_of([r.get(key) for r in rows])
    for key in MEDIAN_BY:
        parts = sorted({p for r in rows for p in (r.get(key) or {})})
        out[key] = {p: median_of([(r.get(key) or {}).get(p) for r in rows]) for p in parts}
    return out


def _median_line(m: Mapping[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f}"

    cpu = m["cpu_ms_per_pod_burst"]
    return (
        f"{m['pods_per_s']:.1f} pods/s, p99 {ms(m['to_running_p99_s'])} ms; CPU ms/pod "
        + ", ".join(
            f"{k} {cpu[k]:.1f}"
            for k in ("kube-scheduler", "kube-apiserver", "extender")
            if k in cpu
        )
        + "; extender p99 ms "
        + ", ".join(f"{k} {ms(v)}" for k, v in m["extender_p99_s"].items())
        + f"; kube-scheduler attempt p99 {ms(m['scheduler_attempt_p99_s'])} ms"
        + f" (algorithm {ms(m.get('scheduler_algorithm_p99_s'))} ms)"
    )


def rate_ratio(rows: Mapping[str, Mapping[str, Any]]) -> float | None:
    """The burst's pods/s at size over its pods/s on the small cluster (None: not both)."""
    if "small" not in rows or "big" not in rows:
        return None
    return ratio(rows["big"]["pods_per_s"], rows["small"]["pods_per_s"])


BURST_KEYS = (
    "pods_per_s",
    "to_running_p50_s",
    "to_running_p99_s",
    "extender_p99_s",
    "extender_mean_s",
    "scheduler_metrics_read",
    "scheduler_attempt_p99_s",
    "scheduler_algorithm_p99_s",
    "scheduler_attempts",
    "scheduler_gc",
    "cpu_ms_per_pod_burst",  # by component, first create to last Running: where the time went
    "cpu_ms_per_pod",  # and to a second after it
    "idle_cpu_ms_per_s",
    "contended_binds",
    "requests_per_pod",  # by verb and resource, all clients, net of the idle rate
    "lists_per_pod",
    "apiserver",  # kube-apiserver's time per pod by request kind, watch events sent
    "load_avg",
)


def burst_figures(row: Mapping[str, Any]) -> JSON:
    """The figures of one burst that the results keep."""
    return {k: row[k] for k in BURST_KEYS if k in row}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--gpu-share", type=float, default=0.05)
    parser.add_argument("--restarts", type=int, default=1)
    parser.add_argument(
        "--baseline", type=Path, action="append", default=[], help="another source tree"
    )
    parser.add_argument("--burst", type=int, default=0, help="GPU pods per burst (0: none)")
    parser.add_argument(
        "--burst-rounds",
        type=int,
        default=1,
        help="at each size, run the burst this many times through each path, in turn "
        "(figures: medians; ratios: each round against its own, then the median)",
    )
    parser.add_argument("--sim-nodes", type=int, default=8)
    parser.add_argument("--sync-timeout", type=float, default=600.0)
    parser.add_argument(
        "--churn", type=float, default=0.0, help="CPU pod creates+deletes per second (0: none)"
    )
    parser.add_argument("--churn-s", type=float, default=60.0, help="the churn's window")
    parser.add_argument("--churn-live", type=int, default=500, help="churned pods alive at once")
    parser.add_argument(
        "--plugin-watches", type=int, default=0, help="nodes whose plugin watches to open"
    )
    parser.add_argument("--replicas", type=int, default=1, help="2: two extenders started at once")
    parser.add_argument("--kubernetes-version", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    limit = chart_memory_limit_mib(VALUES.read_text(encoding="utf-8"))
    print(f"bench.scale: {args.nodes} nodes, {args.pods} pods; chart limit {limit:.0f} MiB")
    raw = run(args)
    row = summary(args, raw, limit)
    before: JSON = {}
    if args.out.exists():
        before = json.loads(args.out.read_text(encoding="utf-8"))
    old: list[Any] = before.get("sizes", [])
    watches: list[Any] = before.get("watches", [])
    rows = list(old)
    if raw["extras"]:  # the watches' figures: a row of their own (the sizes' rows stay)
        restart = {k: row[k] for k in RUN_KEYS[:4]}
        run_of = {
            "command": " ".join(["python -m bench.scale", *(argv or sys.argv[1:])]),
            "restart": restart,
            "load_avg": raw["load_avg"],
        }
        watches = merge_rows(watches, with_measurements(watches, args, raw["extras"], run_of))
    if not raw["extras"] or args.burst:  # the size's row: its restart and its burst
        rows = merge_rows(old, keeping_other_runs(old, row))
    points = [(r["pods"], r["extender_peak_rss_mib"]) for r in rows if r["extender_peak_rss_mib"]]
    curve = fit(points or [(row["pods"], row["extender_peak_rss_mib"])])
    peak = row["extender_peak_rss_mib"]
    print(
        f"{args.nodes} nodes / {args.pods} pods: synced in {row['extender_sync_s']:.1f}s, peak "
        f"{peak:.0f} MiB ({peak / limit:.2f} of the chart's {limit:.0f} MiB limit)"
    )
    for tree, b in row.get("baselines", {}).items():
        print(
            f"  {tree}: synced in {b['extender_sync_s']:.1f}s, peak "
            f"{b['extender_peak_rss_mib']:.0f} MiB; this / baseline peak "
            f"{peak / b['extender_peak_rss_mib']:.2f}, sync "
            f"{row['extender_sync_s'] / b['extender_sync_s']:.2f}"
        )
    if row["burst_vs_small"] is not None:
        without = row["burst_vs_small_without_nodelock"]
        print(
            f"  burst of {args.burst}: {row['burst_vs_small']:.2f}x its rate at "
            f"{args.sim_nodes} nodes; through kube-scheduler without nodelock "
            + ("-" if without is None else f"{without:.2f}x")
        )
        for size, b in row.get("burst", {}).items():
            for path in ("nodelock", "stock"):
                print(f"  {size}, {path} (medians of {b[path]['rounds']}): {_median_line(b[path])}")
            vs = b["nodelock_vs_stock"]
            print(
                f"  {size}: nodelock / kube-scheduler alone " + ("-" if vs is None else f"{vs:.2f}")
            )
    holds = curve.pods_within(limit, headroom=0.25)
    print(
        f"curve over {len(points)} sizes: {curve.base_mib:.0f} MiB + "
        f"{curve.mib_per_10k_pods:.1f} MiB per 10,000 pods; the chart's limit with 25% headroom "
        + (f"holds {holds} pods" if holds < sys.maxsize else "(one size: no slope yet)")
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": f"{platform.platform()}, {os.cpu_count()} CPUs",
                "command": "python -m bench.scale --nodes N --pods P",
                "fit": {"base_mib": curve.base_mib, "mib_per_10k_pods": curve.mib_per_10k_pods},
                "sizes": rows,
                **({"watches": watches} if watches else {}),
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
