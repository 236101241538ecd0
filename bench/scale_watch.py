"""The watches at cluster size: ``bench.scale``'s ``--churn``, ``--plugin-watches`` and
``--replicas`` measurements, run on the cluster it populated (``bench/scale.py`` says what that
holds).

- **churn** (``--churn R``): CPU pods of ``bench.scale``'s shape are created and deleted
  (``gracePeriodSeconds=0``: no kubelet would finish a graceful delete) at R operations per second
  in all, half creates, half deletes, ``--churn-live`` of them alive at any time, bound round-robin
  over the N nodes.  Measured: the extender's CPU (/proc) over ``--churn-s`` seconds, net of its
  idle rate just before, per pod watch event; the events are counted by a watch of all pods that
  the bench opens beside the extender's (the same stream).  Then, with the churn going on and
  before it, **how far the extender's cache lags**: a probe GPU pod is created bound to one node,
  taking all but one of its GPUs (its assignment annotation names them, as after a handoff), and
  the extender's own ``/filter`` (HTTPS, kube-scheduler's client certificate, as kube-scheduler
  calls it) is asked every ``POLL_S`` whether a 2-GPU pod fits that node, until it says no: the
  time from the probe's create answered to the first "no" is the lag (its resolution: one filter
  call, a few ms); then the probe is deleted and the time until "fits" again is the delete's lag.
- **plugin watches** (``--plugin-watches K``): for K of the nodes, the two watches each node's
  device plugin opens, opened with the plugin's own code: ``deviceplugin.podwatch.NodePods`` (its
  node's pods, ``fieldSelector=spec.nodeName``) and ``lockd.locks.NodeLocks.watch(node=...)`` (its
  Lease), 16 nodes per client connection pool as each plugin has its own.  Read from
  kube-apiserver's ``/metrics``: the watches open by resource (``apiserver_longrunning_requests``)
  before and after, and the watch events one change sends (``apiserver_watch_events_total`` by
  resource, net of its idle rate just before, over ``FANOUT_WRITES`` label patches of a pod bound
  to a watched node and as many writes of that node's lock through ``NodeLocks``), with and
  without the K watches, and the changes the K plugin watches applied per write (their
  ``on_change`` callbacks, as the plugin's admission is woken); kube-apiserver's RSS and idle CPU
  (/proc) with and without them, once a ``SETTLE_WINDOW_S`` passed with no LIST of pods or
  leases after they synced (their retried lists done; at most ``SETTLE_S``).  Figures per
  watch are those differences over K; 5,000 nodes' worth is that, times 5,000 (linear: said in
  the results).
- **replicas** (``--replicas 2``): the extender and a second one with the same flags on other
  ports started together; each one's start-to-``/readyz`` seconds and peak RSS, and
  kube-apiserver's CPU over the two initial lists, net of its idle rate.

The pure parts (the churn's plan, the summaries, the argv of a second replica) are unit-tested in
``tests/unit/test_bench_scale_watch.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench import apiserver
from bench.procstat import cpu_rate
from bench.procstat import cpu_seconds as _cpu_s
from bench.procstat import load_average as _load
from bench.procstat import rss_mib as _rss_mib
from bench.procstat import status_kib as _status_kib
from devcluster.cluster import Cluster
from devcluster.pki import SCHEDULER
from handoff.wire import (
    DEFAULT_LOCK_NAMESPACE,
    DEFAULT_PREFIX,
    ContainerName,
    DeviceID,
    Keys,
    format_assignment,
    format_token,
)
from kube.client import JSON, KubeClient, namespace_path, pod_path
from kube.errors import Conflict
from lockd.model import FencingToken, HolderKey, NodeName, Outcome

POLL_S = 0.005
FANOUT_WRITES = 100  # label patches of one pod; acquire+release pairs of one lock: half
IDLE_S = 10.0
SETTLE_S = 240.0  # at most, after the watches synced: their retried lists end
SETTLE_WINDOW_S = 10.0
NODES_PER_CLIENT = 16  # two watches each: within a KubeClient's 32 connections
CHURN_BASE = 90_000_000  # churned pods' indexes, apart from the populated ones
PROBE_BASE = 95_000_000


# ---- pure -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One churn operation: at ``at_s`` after the window opens, create or delete pod ``index``."""

    at_s: float
    create: bool
    index: int


def churn_plan(rate: float, seconds: float, live: int) -> Iterator[Op]:
    """The churn's operations over ``seconds`` at ``rate`` operations/s (half creates, half
    deletes, alternating; evenly spaced): the k-th pair creates pod ``live + k`` and deletes pod
    ``k``, so ``live`` pods (indexes 0..live-1, created before the window) stay alive."""
    if rate <= 0 or seconds <= 0:
        return
    step = 1.0 / rate
    pairs = int(rate * seconds) // 2
    for k in range(pairs):
        yield Op(2 * k * step, True, live + k)
        yield Op((2 * k + 1) * step, False, k)


def shifted(ops: Iterator[Op], by: int) -> Iterator[Op]:
    """``ops`` on the pods ``by`` indexes further on."""
    return (Op(o.at_s, o.create, o.index + by) for o in ops)


def quantiles(values: Sequence[float]) -> JSON:
    """count, p50, p99 (nearest rank) and max of ``values``; None figures when empty."""
    if not values:
        return {"count": 0, "p50": None, "p99": None, "max": None}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.999999) - 1))]

    return {"count": len(ordered), "p50": rank(0.5), "p99": rank(0.99), "max": ordered[-1]}


def cpu_ms_per_event(cpu_s: float, idle_cpu_per_s: float, seconds: float, events: int) -> float:
    """CPU milliseconds per event: ``cpu_s`` over a window of ``seconds`` less the idle rate."""
    if events <= 0:
        raise ValueError("no events to divide by")
    return (cpu_s - idle_cpu_per_s * seconds) * 1000 / events


def replica_argv(argv: Sequence[str], *, listen_port: int, metrics_port: int) -> list[str]:
    """``argv`` of an extender with its ``--listen`` and ``--metrics-port`` on other ports (the
    listen address's host kept)."""
    out = []
    for arg in argv:
        if arg.startswith("--listen="):
            host = arg.removeprefix("--listen=").rsplit(":", 1)[0]
            arg = f"--listen={host}:{listen_port}"
        elif arg.startswith("--metrics-port="):
            arg = f"--metrics-port={metrics_port}"
        out.append(arg)
    if out == list(argv):
        raise ValueError("argv has neither --listen= nor --metrics-port=")
    return out


def per_watch(
    without: Mapping[str, float], with_k: Mapping[str, float], k: int, *, at: int
) -> JSON:
    """Each figure's difference with and without ``k`` watched nodes: per node, and ``at``
    nodes' worth, linear in the nodes."""
    if k <= 0:
        raise ValueError("k must be positive")
    out: JSON = {}
    for key in sorted(set(without) | set(with_k)):
        d = with_k.get(key, 0.0) - without.get(key, 0.0)
        out[key] = {"per_node": d / k, f"at_{at}": d / k * at}
    return out


# ---- the process's side (thin) --------------------------------------------------------------


async def _api_snapshot(kube: KubeClient) -> apiserver.Snapshot:
    return apiserver.parse(await kube.request_text("GET", "/metrics"))


def _churn_pod(index: int, nodes: int) -> JSON:
    from bench.scale import cpu_pod, node_name

    return cpu_pod(index, node_name(index % nodes))


async def _paced(kube: KubeClient, ops: Iterator[Op], nodes: int, parallel: int = 32) -> JSON:
    """Carry out ``ops`` on their schedule (as far as the API server keeps up); how it went."""
    from bench.scale import namespace_of

    sem = asyncio.Semaphore(parallel)
    t0 = time.monotonic()
    late: list[float] = []
    tasks: list[asyncio.Task[None]] = []

    async def one(op: Op) -> None:
        async with sem:
            if op.create:
                await kube.create(pod_path(namespace_of(op.index)), _churn_pod(op.index, nodes))
            else:
                name = _churn_pod(op.index, nodes)["metadata"]["name"]
                await kube.delete(pod_path(namespace_of(op.index), name), grace_period_seconds=0)

    for op in ops:
        wait = t0 + op.at_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        else:
            late.append(-wait)
        tasks.append(asyncio.create_task(one(op)))
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - t0
    return {"ops": len(tasks), "seconds": elapsed, "ops_per_s": len(tasks) / elapsed}


class _Counter:
    """A watch of all pods from ``version``, counting its events."""

    def __init__(self, kube: KubeClient, version: str) -> None:
        self.events = 0
        self._task = asyncio.create_task(self._run(kube, version))

    async def _run(self, kube: KubeClient, version: str) -> None:
        async for event in kube.watch(pod_path(), resource_version=version, timeout_seconds=3600):
            if event.type != "BOOKMARK":
                self.events += 1

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class _Filter:
    """The extender's ``/filter`` as kube-scheduler calls it (HTTPS, its client certificate)."""

    def __init__(self, cluster: Cluster) -> None:
        ctx = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
        ctx.load_cert_chain(
            str(cluster.pki.client_cert(SCHEDULER)), str(cluster.pki.client_key(SCHEDULER))
        )
        self.url = cluster.settings()["extender"]["url"] + "/filter"
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=1))
        self._uid = str(uuid.uuid4())  # one pod asking throughout: one turned-away entry

    async def fits(self, node: str, gpus: int) -> bool:
        pod = {
            "metadata": {"name": "lag-question", "namespace": "team-00", "uid": self._uid},
            "spec": {
                "containers": [
                    {"name": "app", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
                ]
            },
        }
        body = {"Pod": pod, "NodeNames": [node], "Nodes": None}
        async with self._session.post(self.url, json=body) as resp:
            answer = await resp.json()
        return node in (answer.get("NodeNames") or [])

    async def until(self, node: str, gpus: int, *, fits: bool, timeout_s: float = 60.0) -> float:
        """Seconds until the filter's answer for ``node`` is ``fits``."""
        t0 = time.monotonic()
        while await self.fits(node, gpus) != fits:
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"the extender's cache never showed the probe on {node}")
            await asyncio.sleep(POLL_S)
        return time.monotonic() - t0

    async def close(self) -> None:
        await self._session.close()


def _probe_pod(index: int, node: str, taken: Sequence[int]) -> JSON:
    """A GPU pod bound to ``node`` holding devices ``taken`` (indexes), as after a handoff."""
    from bench.scale import BYPASS, RESOURCE, cpu_pod, namespace_of

    keys = Keys()
    pod = cpu_pod(index, node)
    pod["metadata"]["name"] = f"lag-probe-{index}"
    pod["metadata"]["namespace"] = namespace_of(0)
    pod["metadata"]["labels"][BYPASS] = "true"
    pod["metadata"]["annotations"] = {
        keys.assignment: format_assignment(
            {ContainerName("app"): [DeviceID(f"GPU-{node}-{d}") for d in taken]}
        ),
        keys.token: format_token(FencingToken(index)),
    }
    pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE] = str(len(taken))
    return pod


async def _lag_probes(kube: KubeClient, cluster: Cluster, count: int, *, node: str) -> JSON:
    """``count`` probes on ``node``: seconds from create (and delete) answered to the extender's
    filter showing it."""
    from bench.scale import GPUS, namespace_of

    current = await kube.list(pod_path(), field_selector=f"spec.nodeName={node}")
    used = set()
    for p in current["items"]:
        assigned = ((p["metadata"].get("annotations") or {}).get(Keys().assignment)) or ""
        used |= {i for i in range(GPUS) if f"GPU-{node}-{i}" in assigned}
    taken = [i for i in range(GPUS) if i not in used][: GPUS - len(used) - 1]
    # the node now has one GPU free; a 2-GPU question fits only while the probe is absent
    f = _Filter(cluster)
    added: list[float] = []
    deleted: list[float] = []
    try:
        await f.until(node, 2, fits=True)
        for i in range(count):
            index = PROBE_BASE + i
            pod = _probe_pod(index, node, taken)
            await kube.create(pod_path(namespace_of(0)), pod)
            added.append(await f.until(node, 2, fits=False))
            await kube.delete(
                pod_path(namespace_of(0), pod["metadata"]["name"]), grace_period_seconds=0
            )
            deleted.append(await f.until(node, 2, fits=True))
            await asyncio.sleep(1.0)
    finally:
        await f.close()
    return {"created": quantiles(added), "deleted": quantiles(deleted), "node": node}


async def churn(cluster: Cluster, *, nodes: int, rate: float, seconds: float, live: int) -> JSON:
    """The churn measurement (module docstring)."""
    extender = cluster.state.procs()["extender"].pid
    probe_node = "fake-node-00001"
    async with await KubeClient.connect(str(cluster.kubeconfig), timeout_s=60) as kube:
        quiet_lag = await _lag_probes(kube, cluster, 5, node=probe_node)
        first = (Op(0.0, True, CHURN_BASE + j) for j in range(live))  # alive before the window
        await _paced(kube, first, nodes)
        c0, t0 = _cpu_s(extender), time.monotonic()
        await asyncio.sleep(10.0)
        idle = (_cpu_s(extender) - c0) / (time.monotonic() - t0)
        version = (await kube.list(pod_path(), limit=1))["metadata"]["resourceVersion"]
        counter = _Counter(kube, version)
        load = _load()
        ops = shifted(churn_plan(rate, seconds, live), CHURN_BASE)
        c0, t0 = _cpu_s(extender), time.monotonic()
        done = await _paced(kube, ops, nodes)
        await asyncio.sleep(1.0)  # the last events reach both watches
        cpu, window = _cpu_s(extender) - c0, time.monotonic() - t0
        events = counter.events
        await counter.stop()
        # the lag while the churn goes on: the same rate again, with probes beside it
        # (the same plan again, moved on by its pairs: it deletes the pods the first left alive)
        more = shifted(churn_plan(rate, seconds, live), CHURN_BASE + int(rate * seconds) // 2)
        busy = asyncio.create_task(_paced(kube, more, nodes))
        await asyncio.sleep(2.0)
        busy_lag = await _lag_probes(kube, cluster, 10, node=probe_node)
        await busy
    return {
        "rate_ops_per_s": rate,
        "live_pods": live,
        "load_avg": load,
        "achieved": done,
        "events": events,
        "seconds": window,
        "extender_cpu_s": cpu,
        "extender_idle_cpu_per_s": idle,
        "extender_cpu_ms_per_event": cpu_ms_per_event(cpu, idle, window, events),
        "extender_cpu_share": (cpu / window),
        "lag_quiet_s": quiet_lag,
        "lag_under_churn_s": busy_lag,
        "lag_resolution_s": POLL_S,
    }


async def _fanout(
    kube: KubeClient, pod: Mapping[str, Any], node: NodeName, seen: Counter[str]
) -> JSON:
    """Watch events (by resource) per label patch of ``pod`` and per write of ``node``'s lock
    (acquires and releases), ``FANOUT_WRITES`` of each: as kube-apiserver counts them, net of
    its idle rate just before, and as the plugin watches saw them (``seen``: changes applied)."""
    from lockd.locks import NodeLocks
    from lockd.model import Holder

    meta = pod["metadata"]
    path = pod_path(meta["namespace"], meta["name"])
    s_idle, t_idle = await _api_snapshot(kube), time.monotonic()
    await asyncio.sleep(IDLE_S)  # the events others' writes send meanwhile (leader leases…)
    s0, t0 = await _api_snapshot(kube), time.monotonic()
    idle, idle_s = s0 - s_idle, t0 - t_idle
    seen.clear()
    for i in range(FANOUT_WRITES):
        await kube.patch(path, {"metadata": {"labels": {"bench-fanout": str(i)}}})
    await asyncio.sleep(2.0)
    s1, t1 = await _api_snapshot(kube), time.monotonic()
    plugin_pods = seen["pods"]
    seen.clear()
    locks = NodeLocks(kube, namespace=DEFAULT_LOCK_NAMESPACE, prefix=DEFAULT_PREFIX)
    for i in range(FANOUT_WRITES // 2):
        held = await locks.acquire(node, Holder(HolderKey(f"team-00/fanout-{i}"), f"uid-{i}"))
        await locks.release(held, outcome=Outcome.ALLOCATED)
    await asyncio.sleep(2.0)
    s2, t2 = await _api_snapshot(kube), time.monotonic()
    pods_d = (s1 - s0).net_of(idle, (t1 - t0) / idle_s)
    leases_d = (s2 - s1).net_of(idle, (t2 - t1) / idle_s)
    return {
        "pod_events_per_write": pods_d.watch_events.get("pods", 0) / FANOUT_WRITES,
        "lease_events_per_write": leases_d.watch_events.get("leases", 0) / FANOUT_WRITES,
        "plugin_pod_changes_per_write": plugin_pods / FANOUT_WRITES,
        "plugin_lease_changes_per_write": seen["leases"] / FANOUT_WRITES,
        "writes": FANOUT_WRITES,
        "idle_events_per_s": {k: v / idle_s for k, v in idle.watch_events.items() if v},
    }


async def _settled(kube: KubeClient) -> tuple[float | None, int]:
    """Wait until a ``SETTLE_WINDOW_S`` window passes with no LIST of pods or leases (the
    watches' retried lists done), at most ``SETTLE_S``; seconds waited (None: never settled)
    and the lists counted meanwhile."""
    t0 = time.monotonic()
    lists = 0
    while time.monotonic() - t0 < SETTLE_S:
        a = await _api_snapshot(kube)
        await asyncio.sleep(SETTLE_WINDOW_S)
        d = (await _api_snapshot(kube)) - a
        n = d.requests.get(("LIST", "pods"), 0) + d.requests.get(("LIST", "leases"), 0)
        lists += n
        if n == 0:
            return time.monotonic() - t0, lists
    return None, lists


async def plugin_watches(cluster: Cluster, *, k: int, at: int) -> JSON:
    """The plugin watches' measurement (module docstring)."""
    from bench.scale import node_name
    from deviceplugin.podwatch import NodePods
    from lockd.locks import NodeLocks

    api = cluster.running()["kube-apiserver"].pid
    node = NodeName(node_name(0))
    async with await KubeClient.connect(str(cluster.kubeconfig), timeout_s=60) as kube:
        with contextlib.suppress(Conflict):  # it exists already
            await kube.create(
                namespace_path(),
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": DEFAULT_LOCK_NAMESPACE},
                },
            )
        pod = (await kube.list(pod_path(), field_selector=f"spec.nodeName={node}", limit=1))[
            "items"
        ][0]

        async def state() -> JSON:
            snap = await _api_snapshot(kube)
            c0, t0 = _cpu_s(api), time.monotonic()
            await asyncio.sleep(10.0)
            return {
                "watchers": dict(snap.watchers),
                "rss_mib": _rss_mib(api),
                "idle_cpu_per_s": (_cpu_s(api) - c0) / (time.monotonic() - t0),
            }

        before = await state()
        seen: Counter[str] = Counter()
        fan_before = await _fanout(kube, pod, node, seen)
        clients = [
            await KubeClient.connect(str(cluster.kubeconfig), timeout_s=60)
            for _ in range((k + NODES_PER_CLIENT - 1) // NODES_PER_CLIENT)
        ]
        tasks: list[asyncio.Task[None]] = []
        watchers: list[NodePods] = []
        c0, t0 = _cpu_s(api), time.monotonic()
        for i in range(k):
            client = clients[i // NODES_PER_CLIENT]
            name = NodeName(node_name(i))
            w = NodePods(client, name)
            w.on_change = lambda: seen.update(["pods"])  # as the plugin wakes its admission
            watchers.append(w)
            locks = NodeLocks(client, namespace=DEFAULT_LOCK_NAMESPACE, prefix=DEFAULT_PREFIX)
            tasks.append(asyncio.create_task(w.run()))
            tasks.append(
                asyncio.create_task(
                    locks.watch(node=name, on_change=lambda view, n: seen.update(["leases"]))
                )
            )
        deadline = time.monotonic() + 600
        while not all(w.synced for w in watchers):
            if time.monotonic() > deadline:
                raise RuntimeError("the plugin watches did not sync in 600 s")
            await asyncio.sleep(0.5)
        open_s, open_cpu = time.monotonic() - t0, _cpu_s(api) - c0
        settled_s, relists = await _settled(kube)
        after = await state()
        fan_after = await _fanout(kube, pod, node, seen)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in clients:
            await c.close()
    keys = ("pods", "leases")
    w0 = {r: float(before["watchers"].get(r, 0)) for r in keys}
    w1 = {r: float(after["watchers"].get(r, 0)) for r in keys}
    return {
        "k": k,
        "load_avg": _load(),
        "open_s": open_s,
        "apiserver_open_cpu_s": open_cpu,
        "settled_after_s": settled_s,
        "lists_while_settling": relists,
        "before": before,
        "after": after,
        "fanout_before": fan_before,
        "fanout_after": fan_after,
        "per_node": per_watch(
            {
                **{f"watches_{r}": v for r, v in w0.items()},
                "apiserver_rss_mib": before["rss_mib"],
                "apiserver_idle_cpu_per_s": before["idle_cpu_per_s"],
                "apiserver_open_cpu_s": 0.0,
            },
            {
                **{f"watches_{r}": v for r, v in w1.items()},
                "apiserver_rss_mib": after["rss_mib"],
                "apiserver_idle_cpu_per_s": after["idle_cpu_per_s"],
                "apiserver_open_cpu_s": open_cpu,
            },
            k,
            at=at,
        ),
        "extrapolation": f"linear in the nodes, from {k} to {at}",
    }


def replicas(cluster: Cluster, *, timeout_s: float) -> JSON:
    """Two extender replicas started together (module docstring)."""
    from bench.scale import _ready
    from devcluster import processes

    proc = cluster.state.procs()["extender"]
    metrics = cluster.settings()["extender"]["metrics"][0]
    api = cluster.running()["kube-apiserver"].pid
    cluster.stop_component("extender")
    idle = cpu_rate(api, 3.0)
    second_metrics = processes.free_port()
    second = replica_argv(proc.argv, listen_port=processes.free_port(), metrics_port=second_metrics)
    load = _load()
    c0 = _cpu_s(api)
    started = time.monotonic()
    a = cluster.start_component("extender", proc.argv)
    b = cluster.start_component("extender-b", second)
    urls = {
        "extender": f"{metrics}/readyz",
        "extender-b": f"http://127.0.0.1:{second_metrics}/readyz",
    }
    synced: dict[str, float] = {}
    while len(synced) < 2:
        for name, url in urls.items():
            if name not in synced and _ready(url):
                synced[name] = time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"replicas not ready after {timeout_s:.0f}s")
        time.sleep(0.05)
    window = max(synced.values())
    api_cpu = _cpu_s(api) - c0 - idle * window
    peaks = {
        "extender": _status_kib(a.pid, "VmHWM") / 1024,
        "extender-b": _status_kib(b.pid, "VmHWM") / 1024,
    }
    time.sleep(10.0)
    steady = {
        "extender": _status_kib(a.pid, "VmRSS") / 1024,
        "extender-b": _status_kib(b.pid, "VmRSS") / 1024,
    }
    cluster.stop_component("extender-b")
    return {
        "replicas": 2,
        "load_avg": load,
        "sync_s": synced,
        "peak_rss_mib": peaks,
        "steady_rss_mib": steady,
        "apiserver_cpu_s": api_cpu,
        "apiserver_idle_cpu_per_s": idle,
    }


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
