"""API requests per lock operation and acquire+release round trips: lockd against client-go's way.

Requests are counted by the API server itself (``apiserver_request_total`` for
``coordination.k8s.io`` leases, scraped from kube-apiserver's ``/metrics`` before and after each
phase), so nothing the client might forget to count is missed.  The baseline, in the same run, is
client-go's ``tryAcquireOrRenew``: GET the Lease, decide, then create or update it; release is
GET then update.

    .venv/bin/python -m bench.lockd_requests [--kubeconfig PATH] [--nodes 200] [--rounds 300]

Without ``--kubeconfig`` it starts a throwaway devcluster.  Other Lease traffic on the server
(e.g. kube-apiserver's own identity Lease) is measured over an idle window and reported; phases
are short enough that it rounds away.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry

from bench.lockd_common import (
    add_cluster_args,
    delta,
    fresh_namespace,
    lease_requests,
    median,
    percentile,
    run_and_report,
    table,
)
from handoff.wire import DEFAULT_PREFIX
from kube.client import KubeClient, lease_path, namespace_path
from kube.errors import ApiError, NotFound
from lockd import (
    FencingToken,
    HeldLock,
    Holder,
    HolderKey,
    LockHeld,
    LockMetrics,
    NodeLocks,
    NodeName,
    Outcome,
)
from lockd.lease import LeaseFormat
from lockd.microtime import now_microtime

JSON = dict[str, Any]
SETTLE_S = 0.3  # the server counts a request just after answering it


class GetThenUpdate:
    """client-go's leader-election lock, reduced to a node lock: read, decide, write."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.kube = kube
        self.fmt = LeaseFormat(namespace=namespace, prefix=DEFAULT_PREFIX)

    async def acquire(self, node: NodeName, holder: Holder) -> JSON:
        path = lease_path(self.fmt.namespace, node)
        try:
            lease = await self.kube.get(path)
        except NotFound:
            body = self.fmt.new_lease(node, holder, duration_s=15, now=now_microtime())
            return await self.kube.create(lease_path(self.fmt.namespace), body)
        record = self.fmt.parse(lease)
        if record.holder is not None and record.holder.uid != holder.uid:
            raise RuntimeError(f"{node} is held by {record.holder.key}")
        body = self.fmt.acquired(
            lease, holder, token=FencingToken(record.token + 1), duration_s=15, now=now_microtime()
        )
        return await self.kube.replace(path, body)

    async def release(self, node: NodeName) -> JSON:
        path = lease_path(self.fmt.namespace, node)
        lease = await self.kube.get(path)
        body = self.fmt.released(lease, outcome=Outcome.ALLOCATED, now=now_microtime())
        return await self.kube.replace(path, body)


async def counted(kube: KubeClient, phase: Callable[[], Awaitable[None]]) -> dict[str, float]:
    before = await lease_requests(kube)
    await phase()
    await asyncio.sleep(SETTLE_S)
    after = await lease_requests(kube)
    return delta(after, before)


def holder(i: int) -> Holder:
    return Holder(HolderKey(f"bench/pod-{i}"), f"uid-{i}", {"assignment": '{"c":["GPU-0"]}'})


async def wait_seen(locks: NodeLocks, nodes: list[NodeName]) -> None:
    while any(locks.view(n) is None for n in nodes):  # noqa: ASYNC110 - polls the watch's view
        await asyncio.sleep(0.02)


async def run(args: argparse.Namespace, kubeconfig: str) -> JSON:
    kube = await KubeClient.connect(kubeconfig)  # scrapes /metrics; sends no Lease request
    ns = await fresh_namespace(kube, "bench-lockd")
    metrics = LockMetrics(registry=CollectorRegistry())
    clients = [await KubeClient.connect(kubeconfig) for _ in range(4)]
    nodes = [NodeName(f"node-{i:04d}") for i in range(args.nodes)]
    n = len(nodes)
    out: JSON = {"nodes": n, "rounds": args.rounds, "load_average": os.getloadavg(), "modes": {}}
    tasks: list[asyncio.Task[None]] = []
    try:
        idle = await counted(kube, lambda: asyncio.sleep(args.idle_s))
        out["background_per_s"] = {v: c / args.idle_s for v, c in idle.items()}

        # first acquisition ever of each node: no Lease exists yet
        setup = NodeLocks(clients[0], namespace=ns, metrics=metrics, prefix=DEFAULT_PREFIX)
        held: list[HeldLock] = []

        async def first() -> None:
            for i, node in enumerate(nodes):
                held.append(await setup.acquire(node, holder(i)))

        out["modes"]["lockd, first acquisition (no Lease yet)"] = {
            "acquire": await counted(kube, first)
        }

        async def release_held() -> None:
            for lock in held:
                await setup.release(lock, outcome=Outcome.ALLOCATED)
            held.clear()

        out["modes"]["lockd, first acquisition (no Lease yet)"]["release"] = await counted(
            kube, release_held
        )

        # steady state: watch-fed observations, extender acquires, device plugin releases
        extender = NodeLocks(clients[1], namespace=ns, metrics=metrics, prefix=DEFAULT_PREFIX)
        plugin = NodeLocks(clients[2], namespace=ns, metrics=metrics, prefix=DEFAULT_PREFIX)
        tasks = [asyncio.create_task(extender.watch()), asyncio.create_task(plugin.watch())]
        await wait_seen(extender, nodes)
        await wait_seen(plugin, nodes)
        await asyncio.sleep(SETTLE_S)

        async def extender_acquires() -> None:
            for i, node in enumerate(nodes):
                held.append(await extender.acquire(node, holder(i)))

        async def plugin_releases() -> None:
            for lock in held:
                view = plugin.view(lock.node)
                while view is None or view.record.token != lock.token:  # its watch catches up
                    await asyncio.sleep(0.005)
                    view = plugin.view(lock.node)
                record = view.record
                assert record.holder is not None
                seen = HeldLock(lock.node, record.holder, record.token, record.resource_version)
                await plugin.release(seen, outcome=Outcome.ALLOCATED)
            held.clear()

        async def extender_refused() -> None:
            for node in nodes:
                try:
                    await extender.acquire(node, holder(n + 1))
                except LockHeld:
                    continue
                raise AssertionError(f"{node} was not held")

        mode = "lockd, watch-fed (extender acquires, device plugin releases)"
        out["modes"][mode] = {"acquire": await counted(kube, extender_acquires)}
        out["modes"][mode]["refused"] = await counted(kube, extender_refused)
        out["modes"][mode]["release"] = await counted(kube, plugin_releases)
        for task in tasks:
            task.cancel()
        await asyncio.sleep(SETTLE_S)

        # a process that has never seen the Leases and runs no watch
        cold = NodeLocks(clients[3], namespace=ns, metrics=metrics, prefix=DEFAULT_PREFIX)

        async def cold_acquires() -> None:
            for i, node in enumerate(nodes):
                held.append(await cold.acquire(node, holder(i)))

        async def cold_releases() -> None:
            for lock in held:
                await cold.release(lock, outcome=Outcome.ALLOCATED)
            held.clear()

        mode = "lockd, no watch, first contact (create → 409 → GET → PUT)"
        out["modes"][mode] = {"acquire": await counted(kube, cold_acquires)}
        out["modes"][mode]["release"] = await counted(kube, cold_releases)

        async def again_acquires() -> None:
            for i, node in enumerate(nodes):
                held.append(await cold.acquire(node, holder(i)))

        mode = "lockd, no watch, seen before (observation from the last response)"
        out["modes"][mode] = {"acquire": await counted(kube, again_acquires)}
        out["modes"][mode]["release"] = await counted(kube, cold_releases)

        base = GetThenUpdate(clients[0], ns)

        async def base_acquires() -> None:
            for i, node in enumerate(nodes):
                await base.acquire(node, holder(i))

        async def base_releases() -> None:
            for node in nodes:
                await base.release(node)

        async def base_refused() -> None:
            for node in nodes:
                try:
                    await base.acquire(node, holder(n + 1))
                except RuntimeError:
                    continue
                raise AssertionError(f"{node} was not held")

        mode = "baseline: client-go get-then-update"
        out["modes"][mode] = {"acquire": await counted(kube, base_acquires)}
        out["modes"][mode]["refused"] = await counted(kube, base_refused)
        out["modes"][mode]["release"] = await counted(kube, base_releases)

        # round trips on one node: acquire + release, back to back
        one = NodeLocks(clients[1], namespace=ns, metrics=metrics, prefix=DEFAULT_PREFIX)
        watch_one = asyncio.create_task(one.watch(node=nodes[0]))
        tasks = [watch_one]
        await wait_seen(one, nodes[:1])
        trips: dict[str, list[float]] = {"lockd (watch-fed)": [], "baseline": []}
        for r in range(args.rounds):
            for name in (
                ("lockd (watch-fed)", "baseline") if r % 2 else ("baseline", "lockd (watch-fed)")
            ):
                started = time.perf_counter()
                if name == "baseline":
                    await base.acquire(nodes[0], holder(0))
                    await base.release(nodes[0])
                else:
                    lock = await one.acquire(nodes[0], holder(0))
                    await one.release(lock, outcome=Outcome.ALLOCATED)
                trips[name].append(time.perf_counter() - started)
        out["round_trip_ms"] = {
            name: {
                "p50": 1e3 * median(values),
                "p90": 1e3 * percentile(values, 90),
                "p99": 1e3 * percentile(values, 99),
            }
            for name, values in trips.items()
        }
    finally:
        for task in tasks:
            task.cancel()
        for client in clients:
            await client.close()
        with contextlib.suppress(ApiError):
            await kube.delete(namespace_path(ns))
        await kube.close()
    return out


def per_op(counts: dict[str, float], n: int) -> tuple[float, str]:
    writes = {v: c for v, c in counts.items() if v != "WATCH"}
    total = sum(writes.values()) / n
    detail = " + ".join(f"{c / n:.2f} {v}" for v, c in sorted(writes.items())) or "0"
    return total, detail


def report(out: JSON) -> str:
    n = out["nodes"]
    base = out["modes"]["baseline: client-go get-then-update"]
    base_acq, _ = per_op(base["acquire"], n)
    base_rel, _ = per_op(base["release"], n)
    base_ref, _ = per_op(base["refused"], n)
    rows = []
    for mode, counts in out["modes"].items():
        acq, acq_detail = per_op(counts["acquire"], n)
        rel, rel_detail = per_op(counts["release"], n)
        refused = "—"
        if "refused" in counts:
            ref, ref_detail = per_op(counts["refused"], n)
            refused = f"{ref:.2f} ({ref_detail}); {ref / base_ref:.2f}x"
        rows.append(
            [
                mode,
                f"{acq:.2f} ({acq_detail}); {acq / base_acq:.2f}x",
                f"{rel:.2f} ({rel_detail}); {rel / base_rel:.2f}x",
                refused,
            ]
        )
    requests = table(
        [
            "mode",
            "requests / acquire; vs baseline",
            "requests / release; vs baseline",
            "requests / refused acquire (held); vs baseline",
        ],
        rows,
    )
    trips = out["round_trip_ms"]
    b = trips["baseline"]
    trip_rows = [
        [
            name,
            f"{t['p50']:.2f}",
            f"{t['p90']:.2f}",
            f"{t['p99']:.2f}",
            f"{t['p50'] / b['p50']:.2f}",
        ]
        for name, t in trips.items()
    ]
    round_trips = table(
        ["acquire + release on one node", "p50 ms", "p90 ms", "p99 ms", "p50 vs baseline"],
        trip_rows,
    )
    background = ", ".join(f"{v} {r:.2f}/s" for v, r in out["background_per_s"].items()) or "none"
    load = ", ".join(f"{x:.1f}" for x in out["load_average"])
    return (
        "Lease requests counted by kube-apiserver (apiserver_request_total),"
        f" {n} nodes per phase\n\n"
        f"{requests}\n\n{round_trips}\n\n"
        f"{out['rounds']} rounds each, interleaved; other Lease traffic while idle: {background};"
        f" load average at start {load}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cluster_args(parser)
    parser.add_argument("--nodes", type=int, default=200, help="Leases per counting phase")
    parser.add_argument("--rounds", type=int, default=300, help="timed round trips per mode")
    parser.add_argument("--idle-s", type=float, default=3.0, help="idle window for background")
    return run_and_report(parser.parse_args(argv), run, report)


if __name__ == "__main__":
    sys.exit(main())
