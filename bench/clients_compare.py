"""Which Kubernetes client should ``kube.client`` use?  Measured on the real API server.

Compares, each used the way its documentation shows (typed models):
- ``kubernetes`` (the official client; synchronous, so called through ``asyncio.to_thread`` as an
  asyncio program has to),
- ``kubernetes_asyncio`` (async, the same generated models),
- ``lightkube`` (async, its own models decoded with msgspec),
- ``KubeClient`` raw JSON (``kube.client``: kubernetes_asyncio's transport and credentials, plain
  dicts in and out, no models).

Measures Lease create and conditional update round trips (latency and client CPU per call),
a LIST of 2,000 pods end to end (latency and client CPU), decoding the stored body of that LIST
alone, and whether each client can send a MicroTime whose microsecond is 0.

    .venv/bin/python -m bench.clients_compare [--kubeconfig PATH] [--pods 2000] [--rounds 5]

Without ``--kubeconfig`` it starts a throwaway devcluster.  The pods use a scheduler name no
scheduler serves, so they stay Pending and cost nothing but storage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from bench.lockd_common import (
    add_cluster_args,
    fresh_namespace,
    median,
    percentile,
    run_and_report,
    table,
)
from kube.client import KubeClient, lease_path, namespace_path, pod_path
from kube.errors import ApiError
from lockd.microtime import format_microtime

JSON = dict[str, Any]


def now_dt() -> datetime:
    return datetime.now(UTC)


class Client:
    """One way of talking to the API server, driven identically by the benchmark."""

    name = ""

    async def create_lease(self, ns: str, name: str, when: datetime) -> Any: ...
    async def update_lease(self, obj: Any, transitions: int) -> Any: ...
    async def list_pods(self, ns: str) -> int: ...
    def decode_pods(self, body: bytes) -> int: ...
    async def close(self) -> None: ...


def _official_lease(models: Any, name: str, when: datetime) -> Any:
    """The Lease every client creates, as the official clients' models (``kubernetes.client`` or
    ``kubernetes_asyncio.client``: the same classes) spell it."""
    return models.V1Lease(
        metadata=models.V1ObjectMeta(name=name),
        spec=models.V1LeaseSpec(
            holder_identity="bench/holder",
            lease_duration_seconds=15,
            acquire_time=when,
            renew_time=when,
            lease_transitions=1,
        ),
    )


class Official(Client):
    name = "kubernetes (sync, in a thread)"

    def __init__(self, kubeconfig: str) -> None:
        import kubernetes

        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.k = kubernetes
        self.api = kubernetes.client.ApiClient(cfg)
        self.coord = kubernetes.client.CoordinationV1Api(self.api)
        self.core = kubernetes.client.CoreV1Api(self.api)

    async def create_lease(self, ns: str, name: str, when: datetime) -> Any:
        body = _official_lease(self.k.client, name, when)
        return await asyncio.to_thread(self.coord.create_namespaced_lease, ns, body)

    async def update_lease(self, obj: Any, transitions: int) -> Any:
        obj.spec.renew_time = now_dt()
        obj.spec.lease_transitions = transitions
        return await asyncio.to_thread(
            self.coord.replace_namespaced_lease, obj.metadata.name, obj.metadata.namespace, obj
        )

    async def list_pods(self, ns: str) -> int:
        answer = await asyncio.to_thread(self.core.list_namespaced_pod, ns)
        return len(answer.items)

    def decode_pods(self, body: bytes) -> int:
        answer = self.api.deserialize(body.decode(), "V1PodList", "application/json")
        return len(answer.items)

    async def close(self) -> None:
        self.api.close()


class _Resp:
    def __init__(self, data: bytes) -> None:
        self.data = data


class AsyncOfficial(Client):
    name = "kubernetes_asyncio"

    def __init__(self) -> None:
        self.api: Any = None

    async def open(self, kubeconfig: str) -> None:
        from kubernetes_asyncio import client, config

        cfg = client.Configuration()
        await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.c = client
        self.api = client.ApiClient(cfg)
        self.coord = client.CoordinationV1Api(self.api)
        self.core = client.CoreV1Api(self.api)

    async def create_lease(self, ns: str, name: str, when: datetime) -> Any:
        return await self.coord.create_namespaced_lease(ns, _official_lease(self.c, name, when))

    async def update_lease(self, obj: Any, transitions: int) -> Any:
        obj.spec.renew_time = now_dt()
        obj.spec.lease_transitions = transitions
        return await self.coord.replace_namespaced_lease(
            obj.metadata.name, obj.metadata.namespace, obj
        )

    async def list_pods(self, ns: str) -> int:
        answer = await self.core.list_namespaced_pod(ns)
        return len(answer.items)

    def decode_pods(self, body: bytes) -> int:
        return len(self.api.deserialize(_Resp(body), "V1PodList").items)

    async def close(self) -> None:
        await self.api.close()


class Lightkube(Client):
    name = "lightkube"

    def __init__(self, kubeconfig: str) -> None:
        from lightkube import AsyncClient
        from lightkube.config.kubeconfig import KubeConfig
        from lightkube.core import decoders
        from lightkube.models.coordination_v1 import LeaseSpec
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.coordination_v1 import Lease
        from lightkube.resources.core_v1 import Pod

        self.client = AsyncClient(config=KubeConfig.from_file(kubeconfig))
        self.decoders, self.LeaseSpec, self.ObjectMeta = decoders, LeaseSpec, ObjectMeta
        self.Lease, self.Pod = Lease, Pod

    async def create_lease(self, ns: str, name: str, when: datetime) -> Any:
        body = self.Lease(
            metadata=self.ObjectMeta(name=name),
            spec=self.LeaseSpec(
                holderIdentity="bench/holder",
                leaseDurationSeconds=15,
                acquireTime=when,
                renewTime=when,
                leaseTransitions=1,
            ),
        )
        return await self.client.create(body, namespace=ns)

    async def update_lease(self, obj: Any, transitions: int) -> Any:
        obj.spec.renewTime = now_dt()
        obj.spec.leaseTransitions = transitions
        return await self.client.replace(obj)

    async def list_pods(self, ns: str) -> int:
        return len([p async for p in self.client.list(self.Pod, namespace=ns)])

    def decode_pods(self, body: bytes) -> int:
        _cont, _rv, items = self.decoders.decode_list(body, self.Pod)
        return len(items)

    async def close(self) -> None:
        await self.client.close()


class Raw(Client):
    name = "KubeClient raw JSON (kube.client)"

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube

    async def create_lease(self, ns: str, name: str, when: datetime) -> Any:
        stamp = format_microtime(when)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "holderIdentity": "bench/holder",
                "leaseDurationSeconds": 15,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 1,
            },
        }
        return await self.kube.create(lease_path(ns), body)

    async def update_lease(self, obj: Any, transitions: int) -> Any:
        obj["spec"]["renewTime"] = format_microtime(now_dt())
        obj["spec"]["leaseTransitions"] = transitions
        meta = obj["metadata"]
        return await self.kube.replace(lease_path(meta["namespace"], meta["name"]), obj)

    async def list_pods(self, ns: str) -> int:
        return len((await self.kube.list(pod_path(ns)))["items"])

    def decode_pods(self, body: bytes) -> int:
        return len(json.loads(body)["items"])

    async def close(self) -> None:
        pass


async def timed(call: Callable[[], Awaitable[Any]]) -> tuple[Any, float, float]:
    """(result, wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = await call()
    return result, time.perf_counter() - wall, time.process_time() - cpu


async def create_pods(kube: KubeClient, ns: str, count: int) -> None:
    sem = asyncio.Semaphore(24)

    async def one(i: int) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p-{i:05d}", "labels": {"app": "bench", "idx": str(i)}},
            "spec": {
                "schedulerName": "nodelock-bench-no-scheduler",
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                    }
                ],
            },
        }
        async with sem:
            await kube.create(pod_path(ns), body)

    await asyncio.gather(*(one(i) for i in range(count)))


async def microsecond_zero_ok(client: Client, ns: str, name: str) -> str:
    try:
        await client.create_lease(ns, name, datetime(2024, 5, 1, 12, 0, 0, 0, tzinfo=UTC))
    except Exception as exc:  # each library raises its own error type
        status = getattr(exc, "status", None)
        code = getattr(status, "code", status)  # lightkube carries a Status object
        return f"rejected ({code or type(exc).__name__})"
    return "accepted"


async def run(args: argparse.Namespace, kubeconfig: str) -> JSON:
    kube = await KubeClient.connect(kubeconfig)
    ns = await fresh_namespace(kube, "bench-clients")
    aio = AsyncOfficial()
    await aio.open(kubeconfig)
    clients: list[Client] = [Official(kubeconfig), aio, Lightkube(kubeconfig), Raw(kube)]
    results: JSON = {
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
        "pods": args.pods,
        "clients": {},
    }
    try:
        print(f"creating {args.pods} pods in {ns} ...", flush=True)
        started = time.perf_counter()
        await create_pods(kube, ns, args.pods)
        print(f"  done in {time.perf_counter() - started:.1f}s", flush=True)
        body = (await kube.request_text("GET", pod_path(ns))).encode()
        results["list_body_bytes"] = len(body)

        per: dict[str, dict[str, list[float]]] = {
            c.name: {k: [] for k in ("create", "create_cpu", "update", "update_cpu")}
            for c in clients
        }
        lists: dict[str, dict[str, list[float]]] = {
            c.name: {"wall": [], "cpu": [], "decode": [], "decode_cpu": []} for c in clients
        }
        for index, client in enumerate(clients):  # warm up connections and code paths
            obj = await client.create_lease(ns, f"warm-{index}", now_dt())
            for i in range(3):
                obj = await client.update_lease(obj, i + 2)
            assert await client.list_pods(ns) == args.pods
        rng = random.Random(7)
        for round_no in range(args.rounds):
            order = list(clients)
            rng.shuffle(order)  # no client always runs first or last
            for client in order:
                slot = per[client.name]
                for j in range(args.creates):
                    name = f"l-{clients.index(client)}-{round_no}-{j}"
                    obj, wall, cpu = await timed(
                        lambda c=client, n=name: c.create_lease(ns, n, now_dt())
                    )
                    slot["create"].append(wall)
                    slot["create_cpu"].append(cpu)
                for i in range(args.updates):
                    obj, wall, cpu = await timed(lambda c=client, o=obj, t=i: c.update_lease(o, t))
                    slot["update"].append(wall)
                    slot["update_cpu"].append(cpu)
                count, wall, cpu = await timed(lambda c=client: c.list_pods(ns))
                assert count == args.pods
                lists[client.name]["wall"].append(wall)
                lists[client.name]["cpu"].append(cpu)
                wall0, cpu0 = time.perf_counter(), time.process_time()
                assert client.decode_pods(body) == args.pods
                lists[client.name]["decode"].append(time.perf_counter() - wall0)
                lists[client.name]["decode_cpu"].append(time.process_time() - cpu0)
            print(f"  round {round_no + 1}/{args.rounds} done", flush=True)
        for index, client in enumerate(clients):
            micro0 = await microsecond_zero_ok(client, ns, f"micro0-{index}")
            s, lst = per[client.name], lists[client.name]
            results["clients"][client.name] = {
                "create_ms_p50": 1e3 * median(s["create"]),
                "create_ms_p90": 1e3 * percentile(s["create"], 90),
                "update_ms_p50": 1e3 * median(s["update"]),
                "update_ms_p90": 1e3 * percentile(s["update"], 90),
                "update_cpu_ms_mean": 1e3 * sum(s["update_cpu"]) / len(s["update_cpu"]),
                "list_ms_p50": 1e3 * median(lst["wall"]),
                "list_cpu_ms_p50": 1e3 * median(lst["cpu"]),
                "decode_ms_p50": 1e3 * median(lst["decode"]),
                "decode_cpu_ms_p50": 1e3 * median(lst["decode_cpu"]),
                "microsecond_zero": micro0,
                "n_updates": len(s["update"]),
                "n_lists": len(lst["wall"]),
            }
    finally:
        for client in clients:
            if not isinstance(client, Raw):
                await client.close()
        with contextlib.suppress(ApiError):
            await kube.delete(namespace_path(ns))
        await kube.close()
    return results


def report(results: JSON) -> str:
    rows = []
    for name, r in results["clients"].items():
        rows.append(
            [
                name,
                f"{r['create_ms_p50']:.1f} / {r['create_ms_p90']:.1f}",
                f"{r['update_ms_p50']:.1f} / {r['update_ms_p90']:.1f}",
                f"{r['update_cpu_ms_mean']:.2f}",
                f"{r['list_ms_p50']:.0f}",
                f"{r['list_cpu_ms_p50']:.0f}",
                f"{r['decode_ms_p50']:.0f}",
                r["microsecond_zero"],
            ]
        )
    head = [
        "client",
        "Lease create ms p50/p90",
        "Lease update ms p50/p90",
        "update client CPU ms",
        f"LIST {results['pods']} pods ms p50",
        "LIST client CPU ms",
        "decode stored LIST ms",
        "MicroTime µs=0",
    ]
    load = ", ".join(f"{x:.1f}" for x in results["load_average"])
    return (
        table(head, rows)
        + f"\n\nLIST body {results['list_body_bytes'] / 1e6:.1f} MB; {results['cpus']} CPUs,"
        f" load average at start {load}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cluster_args(parser)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--creates", type=int, default=10, help="Lease creates per round")
    parser.add_argument("--updates", type=int, default=40, help="Lease updates per round")
    return run_and_report(parser.parse_args(argv), run, report)


if __name__ == "__main__":
    sys.exit(main())
