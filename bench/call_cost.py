"""What the device plugin's own calls cost the process that makes or serves them, back to back
and spaced out as a handoff spaces them.

    .venv/bin/python -m bench.call_cost [--calls 2000] [--writes 400] [--blocks 3]
                                          [--gaps-ms 0,10,100]

A floor under the plugin's CPU per handoff (``bench.handoff``'s ``deviceplugin`` figure): each
kind of call a handoff makes the plugin serve or send, alone, as CPU time per call of the
process doing it, read around blocks of calls (the median block):

- **gRPC served**: a ``grpc.aio`` server in a child process with the device plugin API's
  ``Allocate`` answering at once, called over a unix socket by this process; the child's CPU
  per call.  kubelet makes three such calls per handoff (GetPreferredAllocation, Allocate and
  PreStartContainer, which the plugin requires).
- **gRPC made**: the same calls, this process's own CPU per call (a ``grpc.aio`` client, as the
  plugin calls kubelet's PodResources ``List`` once per handoff).
- **checkpoint save**: ``deviceplugin.checkpoint.save`` of a checkpoint with a pending release,
  not durable (as a one-container handoff's one save is) and durable.
- **Lease PUT**: ``KubeClient.replace`` of a node lock's Lease as lockd writes it (the release),
  conditional on its resourceVersion, against a throwaway devcluster's kube-apiserver; this
  process's CPU per PUT.
- **watch event**: the same PUTs while this process follows the Lease's namespace through
  ``KubeClient.watch``: the extra CPU per event taken in.
- **nothing**: a call that does nothing: with a gap, what the event loop's waking from its
  idle time costs alone (every other row includes one such wake per call).

Each gap of ``--gaps-ms`` measures every kind again with that much idle time after each call
(gap 0: back to back).  A handoff's calls come milliseconds apart, and on a busy node the next
handoff's a few hundred milliseconds later; a call made after an idle gap costs more CPU than one
of a back-to-back run (caches cold, threads to wake), and that difference is what this
measures.  With a gap, the CPU the processes use idle over the same time (read just before each
block, for as long as the block sleeps) is taken off; CPU is read from the scheduler's
accounting (``/proc/<pid>/task/*/schedstat``, nanoseconds), not from clock ticks.

The last lines add one handoff's calls up per gap (3 served, 1 made, 1 plain save, 1 PUT, and
the watch events the plugin receives per pod: its node's Lease twice, its node's pods about
three times, each counted at a Lease event's cost).  Everything runs in asyncio as the plugin
does; what is not in the sum is the plugin's own decision code and the event loop's work
between.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from bench.protobuf_cost import ANNOTATIONS, LABELS, NAME
from devcluster.cluster import Cluster, throwaway_cluster
from devcluster.namespaces import create_namespace
from deviceplugin import checkpoint
from kube.client import KubeClient, lease_path
from lockd.model import FencingToken, Holder, HolderKey, NodeName, Outcome
from proto import deviceplugin_v1beta1_pb2 as pb
from proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

NAMESPACE = "bench-call-cost"
HANDOFF = {"served": 3, "made": 1, "save": 1, "put": 1, "event": 5}  # one handoff's calls
GAP_BLOCK_S = 3.0  # with a gap, each block's calls spread over about this long
Call = Callable[[], Awaitable[object]]

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


def cpu_ns(pid: int) -> int:
    """CPU nanoseconds ``pid``'s threads have run so far, from the scheduler's accounting
    (exact, unlike ``/proc/<pid>/stat``'s clock ticks); threads that ended are left out."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return total


def calls_for(calls: int, gap_s: float) -> int:
    """Calls per block: ``calls`` back to back; with a gap, as many as fit ``GAP_BLOCK_S``
    (at least 10)."""
    return calls if gap_s <= 0 else max(10, min(calls, int(GAP_BLOCK_S / gap_s)))


async def per_call(
    call: Call, n: int, gap_s: float, pids: Sequence[int], blocks: int
) -> list[float]:
    """CPU seconds per ``call`` of each process of ``pids``, the median of ``blocks`` blocks of
    ``n`` calls, each call followed by ``gap_s`` of idle time; with a gap, what each process
    uses idle over as long (read just before the block) is taken off."""
    samples: list[list[float]] = [[] for _ in pids]
    for _ in range(blocks):
        idle = [0] * len(pids)
        if gap_s > 0:
            before = [cpu_ns(p) for p in pids]
            await asyncio.sleep(n * gap_s)
            idle = [cpu_ns(p) - b for p, b in zip(pids, before, strict=True)]
        before = [cpu_ns(p) for p in pids]
        for _ in range(n):
            await call()
            if gap_s > 0:
                await asyncio.sleep(gap_s)
        if gap_s <= 0:
            await asyncio.sleep(0.2)  # a server's last callbacks (with a gap: the last sleep)
            idle = [0] * len(pids)
        for i, (p, b) in enumerate(zip(pids, before, strict=True)):
            samples[i].append((cpu_ns(p) - b - idle[i]) / 1e9 / n)
    return [statistics.median(s) for s in samples]


def grpc_costs(calls: int, blocks: int, gaps: Sequence[float]) -> dict[float, dict[str, float]]:
    """Per gap, CPU ms per unary call: the serving child's (``served``) and this process's
    (``made``)."""
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="nlcc-") as tmp:
        sock = str(Path(tmp) / "plugin.sock")
        child = subprocess.Popen(
            [sys.executable, "-c", SERVER, sock], cwd=repo, stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "up"
            return asyncio.run(grpc_calls(sock, child.pid, calls, blocks, gaps))
        finally:
            child.kill()
            child.wait()


async def grpc_calls(
    sock: str, server_pid: int, calls: int, blocks: int, gaps: Sequence[float]
) -> dict[float, dict[str, float]]:
    out: dict[float, dict[str, float]] = {}
    async with grpc.aio.insecure_channel("unix://" + sock) as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-0"])]
        )
        for _ in range(200):  # warm up
            await stub.Allocate(request)

        async def call() -> object:
            return await stub.Allocate(request)

        for gap in gaps:
            n = calls_for(calls, gap)
            made, served = await per_call(call, n, gap, [os.getpid(), server_pid], blocks)
            out[gap] = {"served": served * 1000, "made": made * 1000}
    return out


def wakes(calls: int, blocks: int, gaps: Sequence[float]) -> dict[float, dict[str, float]]:
    """Per gap, CPU ms per "call" that does nothing: with a gap, what waking from it costs."""

    async def nothing() -> None:
        return None

    out: dict[float, dict[str, float]] = {}
    for gap in gaps:
        (own,) = asyncio.run(per_call(nothing, calls_for(calls, gap), gap, [os.getpid()], blocks))
        out[gap] = {"wake": own * 1000}
    return out


def saves(calls: int, blocks: int, gaps: Sequence[float]) -> dict[float, dict[str, float]]:
    """Per gap, CPU ms per checkpoint save, not durable and durable."""
    holder = Holder(HolderKey("bench/p1"), "6f1c1e8e-5f55-4c1e-9d0e-3a3c7b1d2e4f")
    cp = checkpoint.Checkpoint(NodeName(NAME)).with_pending(
        checkpoint.PendingRelease.of(holder, FencingToken(7), Outcome.ALLOCATED)
    )
    out: dict[float, dict[str, float]] = {gap: {} for gap in gaps}
    with tempfile.TemporaryDirectory(prefix="nlcc-") as tmp:
        path = Path(tmp) / "checkpoint.json"
        for durable in (False, True):

            async def call(durable: bool = durable) -> None:
                checkpoint.save(path, cp, durable=durable)

            for gap in gaps:
                n = calls_for(calls // 4, gap)
                (own,) = asyncio.run(per_call(call, n, gap, [os.getpid()], blocks))
                out[gap]["save durable" if durable else "save"] = own * 1000
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


async def api_calls(
    cluster: Cluster, writes: int, blocks: int, gaps: Sequence[float]
) -> dict[float, dict[str, float]]:
    """Per gap, this process's CPU ms per Lease PUT, and per watch event taken in."""
    out: dict[float, dict[str, float]] = {}
    me = [os.getpid()]
    async with await KubeClient.connect(str(cluster.kubeconfig), timeout_s=30) as kube:
        await create_namespace(kube, NAMESPACE)
        created = await kube.create(lease_path(NAMESPACE), _lease(""))
        rv = [str(created["metadata"]["resourceVersion"])]
        await puts(kube, 50, rv)  # warm up

        async def put() -> None:
            await puts(kube, 1, rv)

        for gap in gaps:
            n = calls_for(writes, gap)
            (plain,) = await per_call(put, n, gap, me, blocks)
            seen = [0]

            async def follow(start: str, seen: list[int] = seen) -> None:
                async for _event in kube.watch(lease_path(NAMESPACE), resource_version=start):
                    seen[0] += 1

            task = asyncio.create_task(follow(rv[0]))
            await asyncio.sleep(0.5)
            (watched,) = await per_call(put, n, gap, me, blocks)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if seen[0] < n * blocks:  # each PUT's event taken in, or the figure means nothing
                raise RuntimeError(f"the watch took in {seen[0]} of {n * blocks} events")
            out[gap] = {"put": plain * 1000, "event": (watched - plain) * 1000}
    return out


ROWS = (
    ("nothing (the wake alone)", "wake"),
    ("gRPC served (the server's CPU)", "served"),
    ("gRPC made (this process's CPU)", "made"),
    ("checkpoint save, not durable", "save"),
    ("checkpoint save, durable", "save durable"),
    ("Lease PUT (this process's CPU)", "put"),
    ("watch event taken in", "event"),
)


def handoff_ms(per_call: dict[str, float]) -> float:
    """One handoff's calls in the device plugin: each call's CPU ms times ``HANDOFF``'s count."""
    return sum(per_call[key] * n for key, n in HANDOFF.items())


def report(results: dict[float, dict[str, float]], args: argparse.Namespace) -> str:
    """A row per kind of call, a column per gap; the handoff's sum last."""
    gaps = sorted(results)
    heads = "".join(f"{f'gap {g * 1000:g} ms':>14}" for g in gaps)
    lines = [f"CPU ms per call, median of {args.blocks} blocks", f"{'':<34}{heads}"]
    for label, key in ROWS:
        lines.append(f"{label:<34}" + "".join(f"{results[g][key]:>14.3f}" for g in gaps))
    parts = " + ".join(f"{n} {key}" for key, n in HANDOFF.items())
    lines.append(f"one handoff's calls in the device plugin ({parts}), ms:")
    lines.append(f"{'':<34}" + "".join(f"{handoff_ms(results[g]):>14.2f}" for g in gaps))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="gRPC calls per block")
    parser.add_argument("--writes", type=int, default=400, help="Lease PUTs per block")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument(
        "--gaps-ms",
        default="0,10,100",
        help="idle time after each call, ms, comma-separated (0: back to back); with a gap, "
        f"a block makes as many calls as fit {GAP_BLOCK_S:g} s",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    gaps = [float(g) / 1000 for g in args.gaps_ms.split(",")]
    results = grpc_costs(args.calls, args.blocks, gaps)
    for measure in (saves, wakes):
        for gap, row in measure(args.calls, args.blocks, gaps).items():
            results[gap].update(row)
    with throwaway_cluster("nlcc-") as cluster:
        for gap, row in asyncio.run(api_calls(cluster, args.writes, args.blocks, gaps)).items():
            results[gap].update(row)
    print(report(results, args))
    if args.json:
        out = {f"{g * 1000:g}": {**row, "handoff": handoff_ms(row)} for g, row in results.items()}
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
