"""What the device plugin's own calls cost the process that makes or serves them.

    .venv/bin/python -m bench.call_cost [--calls 2000] [--writes 400] [--blocks 3]

A floor under the plugin's CPU per handoff (``bench.handoff``'s ``deviceplugin`` figure): each
kind of call a handoff makes the plugin serve or send, alone, as CPU time per call of the
process doing it, read around blocks of calls (the median block):

- **gRPC served**: a ``grpc.aio`` server in a child process with the device plugin API's
  ``Allocate`` answering at once, called over a unix socket by this process; the child's CPU
  (from /proc) per call.  kubelet makes two such calls per handoff (GetPreferredAllocation and
  Allocate).
- **gRPC made**: the same calls, this process's own CPU per call (a ``grpc.aio`` client, as the
  plugin calls kubelet's PodResources ``List`` once per handoff).
- **checkpoint save**: ``deviceplugin.checkpoint.save`` of a checkpoint with a pending release,
  not durable (as both of a one-container handoff's saves are) and durable.
- **Lease PUT**: ``KubeClient.replace`` of a node lock's Lease as lockd writes it (the release),
  conditional on its resourceVersion, against a throwaway devcluster's kube-apiserver; this
  process's CPU per PUT.
- **watch event**: the same PUTs while this process follows the Lease's namespace through
  ``KubeClient.watch``: the extra CPU per event taken in.

The last line adds one handoff's calls up (2 served, 1 made, 2 plain saves, 1 PUT, and the
watch events the plugin receives per pod: its node's Lease twice, its node's pods about three
times, each counted at a Lease event's cost).  Everything runs in asyncio as the plugin does;
what is not in the sum is the plugin's own decision code and the event loop's work between.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench.protobuf_cost import ANNOTATIONS, LABELS, NAME, cpu_s
from devcluster.cluster import Cluster, throwaway_cluster
from devcluster.namespaces import create_namespace
from deviceplugin import checkpoint
from kube.client import KubeClient, lease_path
from lockd.model import FencingToken, Holder, HolderKey, NodeName, Outcome
from proto import deviceplugin_v1beta1_pb2 as pb
from proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

NAMESPACE = "bench-call-cost"
HANDOFF = {"served": 2, "made": 1, "save": 2, "put": 1, "event": 5}  # one handoff's calls

SERVER = """
import asyncio, sys
import grpc
from proto import deviceplugin_v1beta1_pb2 as pb, deviceplugin_v1beta1_pb2_grpc as pb_grpc

class Plugin(pb_grpc.DevicePluginServicer):
    async def Allocate(self, request, context):
        env = {"NVIDIA_VISIBLE_DEVICES": "GPU-0"}
        return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse(envs=env)])

async def main():
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(Plugin(), server)
    server.add_insecure_port("unix://" + sys.argv[1])
    await server.start()
    print("up", flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def grpc_costs(calls: int, blocks: int) -> dict[str, float]:
    """CPU per unary call: the serving child's (``served``) and this process's (``made``)."""
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="nlcc-") as tmp:
        sock = str(Path(tmp) / "plugin.sock")
        child = subprocess.Popen(
            [sys.executable, "-c", SERVER, sock], cwd=repo, stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "up"
            return asyncio.run(grpc_calls(sock, child.pid, calls, blocks))
        finally:
            child.kill()
            child.wait()


async def grpc_calls(sock: str, server_pid: int, calls: int, blocks: int) -> dict[str, float]:
    async with grpc.aio.insecure_channel("unix://" + sock) as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-0"])]
        )
        for _ in range(200):  # warm up
            await stub.Allocate(request)
        served: list[float] = []
        made: list[float] = []
        for _ in range(blocks):
            server_before, own_before = cpu_s(server_pid), time.process_time()
            for _ in range(calls):
                await stub.Allocate(request)
            made.append((time.process_time() - own_before) / calls)
            await asyncio.sleep(0.2)  # the server's last callbacks
            served.append((cpu_s(server_pid) - server_before) / calls)
    return {"served": _median_ms(served), "made": _median_ms(made)}


def saves(calls: int, blocks: int) -> dict[str, float]:
    """CPU per checkpoint save, not durable and durable."""
    holder = Holder(HolderKey("bench/p1"), "6f1c1e8e-5f55-4c1e-9d0e-3a3c7b1d2e4f")
    cp = checkpoint.Checkpoint(NodeName(NAME)).with_pending(
        checkpoint.PendingRelease.of(holder, FencingToken(7), Outcome.ALLOCATED)
    )
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="nlcc-") as tmp:
        path = Path(tmp) / "checkpoint.json"
        for durable in (False, True):
            samples = []
            for _ in range(blocks):
                before = time.process_time()
                for _ in range(calls // 4):
                    checkpoint.save(path, cp, durable=durable)
                samples.append((time.process_time() - before) / (calls // 4))
            out["save durable" if durable else "save"] = _median_ms(samples)
    return out


def _lease(rv: str) -> dict[str, Any]:
    t = time.time()  # a new renewTime each write: an unchanged Lease would be a no-op update
    now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": NAME,
            "namespace": NAMESPACE,
            "labels": LABELS,
            "annotations": ANNOTATIONS,
            **({"resourceVersion": rv} if rv else {}),
        },
        "spec": {
            "holderIdentity": "bench/p1",
            "leaseDurationSeconds": 15,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 7,
        },
    }


async def puts(kube: KubeClient, n: int, rv: list[str]) -> None:
    for _ in range(n):
        answer = await kube.replace(lease_path(NAMESPACE, NAME), _lease(rv[0]))
        rv[0] = answer["metadata"]["resourceVersion"]


async def api_calls(cluster: Cluster, writes: int, blocks: int) -> dict[str, float]:
    """This process's CPU per Lease PUT, and per watch event taken in."""
    async with await KubeClient.connect(str(cluster.kubeconfig), timeout_s=30) as kube:
        await create_namespace(kube, NAMESPACE)
        created = await kube.create(lease_path(NAMESPACE), _lease(""))
        rv = [str(created["metadata"]["resourceVersion"])]
        await puts(kube, 50, rv)  # warm up
        plain: list[float] = []
        watched: list[float] = []
        for _ in range(blocks):
            before = time.process_time()
            await puts(kube, writes, rv)
            plain.append((time.process_time() - before) / writes)
            seen = [0]

            async def follow(start: str, seen: list[int] = seen) -> None:
                async for _event in kube.watch(lease_path(NAMESPACE), resource_version=start):
                    seen[0] += 1

            task = asyncio.create_task(follow(rv[0]))
            await asyncio.sleep(0.5)
            before = time.process_time()
            await puts(kube, writes, rv)
            for _ in range(100):  # every event taken in
                if seen[0] >= writes:
                    break
                await asyncio.sleep(0.05)
            used = time.process_time() - before
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            watched.append((used - plain[-1] * writes) / max(seen[0], 1))
    return {"put": _median_ms(plain), "event": _median_ms(watched)}


def report(r: dict[str, float], args: argparse.Namespace) -> str:
    rows = [
        ("gRPC served (child's CPU)", "served", args.calls),
        ("gRPC made (this process's CPU)", "made", args.calls),
        ("checkpoint save, not durable", "save", args.calls // 4),
        ("checkpoint save, durable", "save durable", args.calls // 4),
        ("Lease PUT (this process's CPU)", "put", args.writes),
        ("watch event taken in", "event", args.writes),
    ]
    lines = [f"CPU ms per call, median of {args.blocks} blocks", f"{'':<34}{'ms':>8}{'calls':>8}"]
    lines += [f"{label:<34}{r[key]:>8.3f}{n:>8}" for label, key, n in rows]
    floor = sum(r[key] * n for key, n in HANDOFF.items())
    parts = " + ".join(f"{n} {key}" for key, n in HANDOFF.items())
    lines.append(f"one handoff's calls in the device plugin ({parts}): {floor:.2f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="gRPC calls per block")
    parser.add_argument("--writes", type=int, default=400, help="Lease PUTs per block")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    results = grpc_costs(args.calls, args.blocks)
    results.update(saves(args.calls, args.blocks))
    with throwaway_cluster("nlcc-") as cluster:
        results.update(asyncio.run(api_calls(cluster, args.writes, args.blocks)))
    print(report(results, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
