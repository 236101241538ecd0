"""The handoff benchmark: pods/s through the extender against the default binder, API requests per
pod, handoff overhead, and lock-aware prioritize on and off — all on one devcluster in one run.

    .venv/bin/python -m bench.handoff [--nodes 8] [--gpus 8] [--pods 64]

Phases, each a burst of ``--pods`` single-GPU pods created at once and waited to Running:

1. ``nodelock``: kube-scheduler with the extender (lock-aware prioritize on);
2. ``nodelock-no-lock-aware``: the same with lock-aware prioritize off (issue: the burst measure);
3. ``default-binder``: kube-scheduler alone binding the same number of pods that ask for no GPU —
   no extender, no lock, no device plugin in the path: the limit the handoff can approach.

Per phase: pods/s (first create to last Running), creation->Running p50/p99, binds that found the
node locked (the extender's own counter), API requests per pod by verb and resource from
kube-apiserver's ``apiserver_request_total`` (all clients, less the idle cluster's own rate
measured for 5 s before the burst: node heartbeats renew Leases too), and the handoff's
overhead: how long each node lock was held (acquire -> release, seen on a Lease watch; the
simulated kubelet starts containers with no delay, so none of it is the kubelet's own time).
Prints a table, writes ``bench/results/handoff.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from devcluster.binaries import ensure_control_plane, ensure_simkubelet
from devcluster.cluster import Cluster
from devcluster.gpunodes import up_gpu_cluster
from devcluster.namespaces import create_namespace
from lockd.kube import JSON, KubeClient, namespace_path, pod_path
from nodelock.demo import (
    BACKGROUND_S,
    HANDOFF_WRITES,
    Timeline,
    _api_requests,
    _quantile,
    _scrape,
    _watch_leases,
    _watch_pods,
    background_requests,
    metric_samples,
    metric_sum,
    net_of_background,
)

RESULTS = Path(__file__).resolve().parent / "results"


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


def contended(cluster: Cluster) -> float:
    total = 0.0
    for url in cluster.settings()["extender"]["replicas"]:
        samples = metric_samples(_scrape(f"{url}/metrics"))
        total += metric_sum(samples, "nodelock_lock_acquisitions_total", result="contended")
    return total


async def burst(cluster: Cluster, label: str, n: int, gpus: int) -> dict[str, Any]:
    ns = f"bench-{label}"
    async with await KubeClient.connect(str(cluster.kubeconfig)) as kube:
        await create_namespace(kube, ns)
        tl = Timeline()
        import nodelock.demo as demo

        demo_ns = demo.NAMESPACE
        demo.NAMESPACE = ns  # the watchers follow the demo's namespace
        tasks = [
            asyncio.create_task(_watch_pods(kube, tl)),
            asyncio.create_task(_watch_leases(kube, tl)),
        ]
        background = await background_requests(kube, seconds=BACKGROUND_S)
        before_req = await _api_requests(kube)
        started = time.monotonic()
        before_cont = contended(cluster) if gpus else 0.0
        t0 = tl.now()
        await asyncio.gather(*(kube.create(pod_path(ns), pod(f"p{i}", gpus)) for i in range(n)))
        while sum(1 for k in tl.running if k.startswith(ns + "/")) < n:
            await asyncio.sleep(0.05)
            if tl.now() - t0 > 600:
                raise RuntimeError(f"{label}: pods not Running after 600 s")
        t_end = max(v for k, v in tl.running.items() if k.startswith(ns + "/"))
        await asyncio.sleep(1.0)  # the last releases
        after_req = await _api_requests(kube)
        elapsed = time.monotonic() - started
        after_cont = contended(cluster) if gpus else 0.0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        demo.NAMESPACE = demo_ns
        await kube.delete(namespace_path(ns))
        for _ in range(600):
            if not (await kube.list(pod_path(ns)))["items"]:
                break
            await asyncio.sleep(0.2)
    req = net_of_background(after_req - before_req, background, elapsed / BACKGROUND_S)
    to_running = [tl.running[k] - tl.first_seen[k] for k in tl.running if k in tl.first_seen]
    holds = [t1 - s for _, h, s, t1 in tl.holds if h.startswith(ns + "/")]
    return {
        "phase": label,
        "pods": n,
        "seconds": t_end - t0,
        "pods_per_s": n / (t_end - t0),
        "to_running_p50_s": _quantile(to_running, 0.5),
        "to_running_p99_s": _quantile(to_running, 0.99),
        "contended_binds": after_cont - before_cont,
        "handoff_p50_s": _quantile(holds, 0.5) if holds else math.nan,
        "handoff_p99_s": _quantile(holds, 0.99) if holds else math.nan,
        "requests_per_pod": {f"{v} {r}": c / n for (v, r), c in sorted(req.items())},
        "handoff_writes_per_pod": sum(req.get(k, 0) for k in HANDOFF_WRITES) / n,
        "lists_per_pod": sum(c for (v, _), c in req.items() if v == "LIST") / n,
        "all_requests_per_pod": sum(req.values()) / n,
    }


def table(rows: list[dict[str, Any]]) -> str:
    base = next(r for r in rows if r["phase"] == "default-binder")
    head = (
        f"{'phase':<24}{'pods/s':>8}{'vs base':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'contended':>11}{'hold p50':>10}{'hold p99':>10}{'writes':>8}{'LISTs':>7}{'req':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:

        def ms(v: float) -> str:
            return "-" if math.isnan(v) else f"{v * 1000:.0f}"

        lines.append(
            f"{r['phase']:<24}{r['pods_per_s']:>8.1f}{r['pods_per_s'] / base['pods_per_s']:>9.2f}"
            f"{ms(r['to_running_p50_s']):>9}{ms(r['to_running_p99_s']):>9}"
            f"{r['contended_binds']:>11.0f}{ms(r['handoff_p50_s']):>10}{ms(r['handoff_p99_s']):>10}"
            f"{r['handoff_writes_per_pod']:>8.2f}{r['lists_per_pod']:>7.2f}"
            f"{r['all_requests_per_pod']:>7.1f}"
        )
    lines.append(
        "writes = the handoff's own writes per pod (Lease POST/PUT + pods/binding); "
        "LISTs and req = every client's, per pod"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=64)
    args = parser.parse_args(argv)
    binaries = ensure_control_plane()
    ensure_simkubelet()
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="nlb-", dir="/tmp")), binaries=binaries)
    cluster.up()
    rows = []
    try:
        up_gpu_cluster(cluster, nodes=args.nodes, gpus_per_node=args.gpus)
        rows.append(asyncio.run(burst(cluster, "nodelock", args.pods, 1)))
        for name in [n for n in cluster.state.procs() if n == "extender"]:
            proc = cluster.state.procs()[name]
            argv2 = ["--no-lock-aware" if a == "--lock-aware" else a for a in proc.argv]
            cluster.stop_component(name)
            cluster.start_component(name, argv2)
        time.sleep(2)
        rows.append(asyncio.run(burst(cluster, "nodelock-no-lock-aware", args.pods, 1)))
        cluster.restart_scheduler({})  # no extender: the default binder
        rows.append(asyncio.run(burst(cluster, "default-binder", args.pods, 0)))
    finally:
        cluster.down()
    print(table(rows))
    RESULTS.mkdir(exist_ok=True)
    out = {
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "rows": rows,
    }
    (RESULTS / "handoff.json").write_text(json.dumps(out, indent=1))
    print(f"\nwrote {RESULTS / 'handoff.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
