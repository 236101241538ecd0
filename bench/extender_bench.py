"""Filter and prioritize latency of the extender for a large cluster, against an empty handler.

The extender's real endpoints (``scheduler_ext.server``) are served on loopback with a cache of
``--nodes`` nodes x ``--gpus`` GPUs (deterministic: a seeded share of the GPUs assigned to bound
pods, a share of the nodes locked by a holder whose assignment is in the Lease), and are sent
what kube-scheduler sends with ``nodeCacheCapable: true``: the pod and every node name.  The
baseline, served in the same process in the same run, is an empty aiohttp handler (it reads the
body and answers ``{}``), so the figure that matters is the ratio; a second handler that also
decodes the JSON body (``decode``) shows how much of the time is only the request's size.
``filter`` and ``prioritize`` are sent every node name, the worst case (kube-scheduler sends that
many only with ``percentageOfNodesToScore: 100``); ``prioritize-passed`` only the names that
passed filter, which is what kube-scheduler sends an extender's prioritize (the nodes every
filter, the extender's included, kept).  ``filter-sent`` and ``prioritize-sent`` are what
kube-scheduler sends with its default ``percentageOfNodesToScore``: its filters stop once they have
found ``kube_scheduler_feasible`` nodes (500 of 5,000), counted from a start that rotates from one
pod to the next, and only those go to the extender's filter; prioritize gets the ones it passed.

Server-side time is measured by the same middleware on both apps: from the handler's start to
the response being ready (body read, JSON decoded, nodes judged, answer encoded).  The middleware
also records the serving thread's CPU time over the same span: on a machine shared with other
busy processes, a wall-clock p99 mostly measures how long the process waited for a CPU (a
scheduler tick is 4 ms), and the CPU time shows what the handler itself cost.  The client's
round trip is reported too.

Before the requests, the bench times one full garbage-collector pass over the cache, then does
what the extender process does once its caches are listed (``kube.process.freeze_long_lived``)
and times a full pass again: what a full collection would block the event loop for, without and
with that step.  The requests run after it, as in the extender.

    .venv/bin/python -m bench.extender_bench [--nodes 5000] [--gpus 8] [--requests 200]

Writes ``bench/results/extender_bench.json``.  No cluster needed: filter and prioritize never call
the API server (the API client given to the extender is an unconnected one).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX, GPU, DeviceID, format_inventory
from kube.client import KubeClient
from kube.process import freeze_long_lived
from lockd.lease import LeaseFormat
from lockd.locks import NodeLocks
from lockd.metrics import LockMetrics
from lockd.model import Holder, HolderKey, NodeName
from scheduler_ext.binder import Binder
from scheduler_ext.cache import ClusterCache
from scheduler_ext.choose import Policy
from scheduler_ext.metrics import ExtenderMetrics
from scheduler_ext.server import Endpoints, ServerOptions, make_app

RESULTS = Path(__file__).parent / "results" / "extender_bench.json"
VERBS = (
    "filter",
    "prioritize",
    "prioritize-passed",
    "filter-sent",
    "prioritize-sent",
    "empty",
    "decode",
)
RES = "nvidia.com/gpu"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


class Timings:
    """Server-side handler time per path, recorded by a middleware: wall time, and the CPU time
    of the serving thread over the same span (what the handler itself cost, without the time
    the process waited while other processes had the CPU)."""

    def __init__(self) -> None:
        self.by_path: dict[str, list[float]] = {}
        self.cpu_by_path: dict[str, list[float]] = {}
        self.recording = False

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        cpu_started = time.thread_time()
        response = await handler(request)
        if self.recording:
            self.by_path.setdefault(request.path, []).append(time.perf_counter() - started)
            self.cpu_by_path.setdefault(request.path, []).append(time.thread_time() - cpu_started)
        return response


def kube_scheduler_feasible(nodes: int) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering, with its
    default ``percentageOfNodesToScore`` (kube-scheduler's rule: 50% less one point per 125
    nodes, at least 5%, at least 100 nodes)."""
    if nodes < 100:
        return nodes
    percentage = max(50 - nodes // 125, 5)
    return max(nodes * percentage // 100, 100)


def names_sent(names: list[str], free: dict[str, int], need: int, start: int) -> list[str]:
    """The names kube-scheduler sends the extender's filter: the first
    ``kube_scheduler_feasible`` nodes, from ``start`` on (wrapping), whose free GPUs by its own
    count fit ``need`` (its resource fit filter)."""
    want = kube_scheduler_feasible(len(names))
    out: list[str] = []
    for i in range(len(names)):
        name = names[(start + i) % len(names)]
        if free[name] >= need:
            out.append(name)
            if len(out) == want:
                break
    return out


def build_cache(nodes: int, gpus: int, seed: int) -> tuple[ClusterCache, list[str], dict[str, int]]:
    """The cache, the node names, and each node's free GPUs as kube-scheduler counts them."""
    rng = random.Random(seed)
    cache = ClusterCache(resource=RES)
    names = [f"gpu-node-{i:05d}" for i in range(nodes)]
    free: dict[str, int] = {}
    node_objs = []
    pods = []
    for name in names:
        ids = [f"GPU-{name}-{i}" for i in range(gpus)]
        unhealthy = {rng.randrange(gpus)} if rng.random() < 0.02 else set()
        inventory = format_inventory(
            [
                GPU(DeviceID(d), i, "NVIDIA H100 80GB HBM3", 81559, i // 4, i not in unhealthy)
                for i, d in enumerate(ids)
            ]
        )
        node_objs.append(
            {
                "metadata": {"name": name, "annotations": {"nodelock.io/gpus": inventory}},
                "status": {"allocatable": {RES: str(gpus), "cpu": "128", "pods": "110"}},
            }
        )
        used = rng.randrange(gpus + 1)
        free[name] = gpus - used
        start = 0
        while start < used:  # pods of 1, 2 or 4 GPUs filling the first `used` devices
            size = min(rng.choice((1, 2, 4)), used - start)
            pod_name = f"{name}-p{start}"
            pods.append(
                {
                    "metadata": {
                        "name": pod_name,
                        "namespace": "ml",
                        "uid": f"uid-{pod_name}",
                        "annotations": {
                            "nodelock.io/assignment": json.dumps(
                                {"main": ids[start : start + size]}, separators=(",", ":")
                            )
                        },
                    },
                    "spec": {
                        "nodeName": name,
                        "containers": [
                            {"name": "main", "resources": {"requests": {RES: str(size)}}}
                        ],
                    },
                    "status": {"phase": "Running"},
                }
            )
            start += size
    cache.replace_nodes(node_objs)
    cache.replace_pods(pods)
    return cache, names, free


def lock_some(locks: NodeLocks, names: list[str], share: float, seed: int) -> int:
    rng = random.Random(seed + 1)
    fmt = LeaseFormat(namespace=DEFAULT_LOCK_NAMESPACE, prefix=DEFAULT_PREFIX)
    locked = 0
    for name in names:
        if rng.random() >= share:
            continue
        holder = Holder(
            HolderKey(f"ml/{name}-inflight"),
            f"uid-{name}-inflight",
            {"assignment": json.dumps({"main": [f"GPU-{name}-7"]}, separators=(",", ":"))},
        )
        lease = fmt.new_lease(
            NodeName(name), holder, duration_s=15, now="2026-07-01T12:00:00.000000Z"
        )
        lease["metadata"]["resourceVersion"] = "1"
        locks.observe(lease)
        locked += 1
    return locked


POD_GPUS = 2  # what the benchmark's pod asks for


def request_body(names: list[str]) -> bytes:
    pod = {
        "metadata": {"name": "train-0", "namespace": "ml", "uid": "uid-train-0"},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "resources": {
                        "limits": {RES: str(POD_GPUS)},
                        "requests": {RES: str(POD_GPUS)},
                    },
                }
            ]
        },
        "status": {"phase": "Pending"},
    }
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    built = time.perf_counter()
    cache, names, free = build_cache(args.nodes, args.gpus, args.seed)
    offline = KubeClient(api_client=None)
    locks = NodeLocks(
        offline,
        metrics=LockMetrics(registry=CollectorRegistry()),
        namespace=DEFAULT_LOCK_NAMESPACE,
        prefix=DEFAULT_PREFIX,
    )
    locked = lock_some(locks, names, args.locked_share, args.seed)
    metrics = ExtenderMetrics(cache, registry=CollectorRegistry())
    endpoints = Endpoints(
        cache,
        locks,
        Binder(offline, cache, locks, metrics, duration_s=15),
        metrics,
        ServerOptions(policy=Policy(args.policy), lock_aware=True),
    )
    build_s = time.perf_counter() - built
    # what a full garbage-collector pass costs over this cache, then the extender process's
    # own step after its first listing (``Extender.serve_forever``); requests run frozen too
    started = time.perf_counter()
    gc.collect()
    full_pass_s = time.perf_counter() - started
    freeze_long_lived()
    started = time.perf_counter()
    gc.collect()
    frozen_pass_s = time.perf_counter() - started

    timings = Timings()
    ext_app = make_app(endpoints)
    ext_app.middlewares.insert(0, timings.middleware)
    # the same prioritize handler under a second path, timed apart: sent only the nodes that
    # passed filter, as kube-scheduler sends an extender's prioritize
    prioritize = next(
        r.handler
        for r in ext_app.router.routes()
        if r.method == "POST" and r.resource is not None and r.resource.canonical == "/prioritize"
    )
    ext_app.router.add_post("/prioritize-passed", prioritize)
    ext_app.router.add_post("/prioritize-sent", prioritize)
    filter_ = next(
        r.handler
        for r in ext_app.router.routes()
        if r.method == "POST" and r.resource is not None and r.resource.canonical == "/filter"
    )
    ext_app.router.add_post("/filter-sent", filter_)

    async def empty(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({})

    async def decode(request: web.Request) -> web.Response:
        json.loads(await request.read())
        return web.json_response({})

    base_app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[timings.middleware])
    base_app.router.add_post("/empty", empty)
    base_app.router.add_post("/decode", decode)
    ext_runner, ext_url = await serve(ext_app)
    base_runner, base_url = await serve(base_app)
    body = request_body(names)
    round_trips: dict[str, list[float]] = {}
    answer_sizes: dict[str, int] = {}
    try:
        async with aiohttp.ClientSession() as session:

            async def call(url: str, data: bytes = body) -> bytes:
                headers = {"Content-Type": "application/json"}
                async with session.post(url, data=data, headers=headers) as resp:
                    answer = await resp.read()
                    assert resp.status == 200, (url, resp.status, answer[:200])
                    return answer

            filtered = json.loads(await call(f"{ext_url}/filter"))
            passed_body = request_body(filtered["NodeNames"])
            # as kube-scheduler sends them: a few start points, as its rotation gives
            rng = random.Random(args.seed + 2)
            sent = [names_sent(names, free, POD_GPUS, rng.randrange(len(names))) for _ in range(8)]
            sent_bodies = [request_body(s) for s in sent]
            sent_passed = [json.loads(await call(f"{ext_url}/filter", b)) for b in sent_bodies]
            sent_passed_bodies = [request_body(f["NodeNames"]) for f in sent_passed]
            fixed = [
                ("filter", f"{ext_url}/filter", body),
                ("prioritize", f"{ext_url}/prioritize", body),
                ("prioritize-passed", f"{ext_url}/prioritize-passed", passed_body),
                ("empty", f"{base_url}/empty", body),
                ("decode", f"{base_url}/decode", body),
            ]

            def targets(i: int) -> list[tuple[str, str, bytes]]:
                """Round ``i``: the fixed requests and one of the start points'."""
                j = i % len(sent_bodies)
                return [
                    *fixed,
                    ("filter-sent", f"{ext_url}/filter-sent", sent_bodies[j]),
                    ("prioritize-sent", f"{ext_url}/prioritize-sent", sent_passed_bodies[j]),
                ]

            for i in range(len(sent_bodies)):  # warm up
                for _, url, data in targets(i):
                    await call(url, data)
            timings.recording = True
            for i in range(args.requests):  # interleaved, so drift hits all of them alike
                for label, url, data in targets(i):
                    started = time.perf_counter()
                    answer = await call(url, data)
                    round_trips.setdefault(label, []).append(time.perf_counter() - started)
                    answer_sizes[label] = len(answer)
            timings.recording = False
    finally:
        await ext_runner.cleanup()
        await base_runner.cleanup()

    verbs = VERBS
    server = {verb: timings.by_path[f"/{verb}"] for verb in verbs}
    server_cpu = {verb: timings.cpu_by_path[f"/{verb}"] for verb in verbs}

    def summary(values: list[float]) -> dict[str, float]:
        return {
            "p50_ms": round(statistics.median(values) * 1000, 3),
            "p99_ms": round(percentile(values, 99) * 1000, 3),
        }

    base = summary(server["empty"])
    out: dict[str, Any] = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "requests_each": args.requests,
        "request_bytes": len(body),
        "answer_bytes": answer_sizes,
        "nodes_locked": locked,
        "nodes_passing_filter": len(filtered["NodeNames"]),
        "names_sent_by_kube_scheduler": len(sent[0]),
        "sent_passing_filter": [len(f["NodeNames"]) for f in sent_passed],
        "cache_build_s": round(build_s, 2),
        "full_gc_pass_ms": round(full_pass_s * 1000, 1),
        "full_gc_pass_after_freeze_ms": round(frozen_pass_s * 1000, 1),
        "policy": args.policy,
        "server_side": {k: summary(v) for k, v in server.items()},
        "server_side_cpu": {k: summary(v) for k, v in server_cpu.items()},
        "round_trip": {k: summary(v) for k, v in round_trips.items()},
        "ratio_to_empty_handler": {
            verb: {
                "p50": round(summary(server[verb])["p50_ms"] / base["p50_ms"], 1),
                "p99": round(summary(server[verb])["p99_ms"] / base["p99_ms"], 1),
            }
            for verb in VERBS
            if verb != "empty"
        },
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--policy", choices=[p.value for p in Policy], default="binpack")
    parser.add_argument("--locked-share", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(
        f"{args.nodes} nodes x {args.gpus} GPUs, {args.requests} requests each, "
        f"{result['nodes_locked']} nodes locked, {result['nodes_passing_filter']} pass filter"
    )
    print(
        f"a full garbage-collector pass over the cache: {result['full_gc_pass_ms']:.1f} ms; "
        f"after freeze_long_lived (as the extender process does once listed): "
        f"{result['full_gc_pass_after_freeze_ms']:.1f} ms"
    )
    print(
        f"-sent: as kube-scheduler sends them with its default percentageOfNodesToScore: "
        f"filter {result['names_sent_by_kube_scheduler']} names, prioritize those passing "
        f"({min(result['sent_passing_filter'])}-{max(result['sent_passing_filter'])})"
    )
    print(
        f"{'':<18}{'server p50 ms':>15}{'server p99 ms':>15}{'x empty p50':>13}{'x empty p99':>13}"
        f"{'cpu p50 ms':>12}{'cpu p99 ms':>12}"
    )
    for verb in VERBS:
        s = result["server_side"][verb]
        c = result["server_side_cpu"][verb]
        r = result["ratio_to_empty_handler"].get(verb, {"p50": 1.0, "p99": 1.0})
        print(
            f"{verb:<18}{s['p50_ms']:>15.3f}{s['p99_ms']:>15.3f}{r['p50']:>13.1f}{r['p99']:>13.1f}"
            f"{c['p50_ms']:>12.3f}{c['p99_ms']:>12.3f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
