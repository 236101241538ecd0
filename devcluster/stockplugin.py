"""A stock device plugin for the simulated nodes: kubelet picks the devices, the plugin answers
with exactly those, and nothing coordinates with the scheduler.

This is what a GPU node runs without nodelock (the plain vendor plugin's behaviour). The handoff
benchmark's ``stock-gpu`` phase swaps it in on every node to measure what a burst of GPU pods
costs under kube-scheduler's own binder with no coordination at all: the device side (kubelet's
device manager, the plugin's gRPC calls, the checkpoint, the harness's allocation record) without
the lock. nodelock's handoff is added to exactly that. It is a measuring tool: under it the
node cannot learn which devices the scheduler meant for a pod, the problem nodelock solves.

    python -m devcluster.stockplugin --node-name N --plugin-dir DIR --gpus 8 --ready-file F

``use_stock_plugins`` and ``use_nodelock_plugins`` swap a running devcluster's nodes between the
two.  Guarantees: each returns only once kubelet accepted every node's plugin (stock: the ready
file the plugin writes after Register; nodelock: its ``/readyz``), and raises
``DevclusterError`` with the plugin's log tail if one exits first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry

from devcluster.cluster import Cluster
from devcluster.gpunodes import node_dir, wait_ok, wait_ready
from deviceplugin.answer import DeviceMode, container_answer
from deviceplugin.endpoint import Endpoint
from deviceplugin.metrics import PluginMetrics
from deviceplugin.servicer import container_response, device_message, options
from deviceplugin.simulated import SimSpec, inventory
from handoff.wire import DEFAULT_RESOURCE, GPU, DeviceID
from proto import deviceplugin_v1beta1_pb2 as pb
from proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

SOCKET_NAME = "stock-gpu.sock"
READY_FILE = "stock-plugin.ready"


def preferred(must_include: Sequence[str], available: Sequence[str], size: int) -> list[str]:
    """A stock plugin's preference: the devices kubelet must include, then the available ones
    in kubelet's order, ``size`` in all (fewer only if kubelet offered fewer)."""
    out = list(dict.fromkeys(must_include))[:size]
    for device in available:
        if len(out) >= size:
            break
        if device not in out:
            out.append(device)
    return out


class StockServicer(pb_grpc.DevicePluginServicer):
    """Advertises ``gpus`` and allocates whatever kubelet asks for."""

    def __init__(self, gpus: Sequence[GPU]) -> None:
        self._devices = [device_message(g) for g in gpus]

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.DevicePluginOptions]
    ) -> pb.DevicePluginOptions:
        return options()  # nodelock's own: GetPreferredAllocation yes, PreStartContainer no

    async def ListAndWatch(
        self,
        request: pb.Empty,
        context: grpc.aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse],
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        yield pb.ListAndWatchResponse(devices=self._devices)
        await asyncio.Event().wait()  # the simulated devices never change

    async def GetPreferredAllocation(
        self,
        request: pb.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[
            pb.PreferredAllocationRequest, pb.PreferredAllocationResponse
        ],
    ) -> pb.PreferredAllocationResponse:
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=preferred(
                        r.must_include_deviceIDs, r.available_deviceIDs, r.allocation_size
                    )
                )
                for r in request.container_requests
            ]
        )

    async def Allocate(
        self,
        request: pb.AllocateRequest,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        return pb.AllocateResponse(
            container_responses=[
                container_response(
                    container_answer([DeviceID(d) for d in r.devices_ids], mode=DeviceMode.CDI)
                )
                for r in request.container_requests
            ]
        )

    async def PreStartContainer(
        self,
        request: pb.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[
            pb.PreStartContainerRequest, pb.PreStartContainerResponse
        ],
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


async def serve(
    node: str, plugin_dir: Path, gpus: int, resource: str, ready_file: Path | None
) -> None:
    """Serve the stock plugin until cancelled; touch ``ready_file`` once kubelet accepted it."""
    servicer = StockServicer(inventory(node, SimSpec(count=gpus)))
    endpoint = Endpoint(
        plugin_dir=plugin_dir,
        socket_name=SOCKET_NAME,
        resource=resource,
        servicer=servicer,
        metrics=PluginMetrics(CollectorRegistry()),
    )
    running = asyncio.create_task(endpoint.run())
    registered = asyncio.create_task(endpoint.registered.wait())
    await asyncio.wait([running, registered], return_when=asyncio.FIRST_COMPLETED)
    if running.done():
        registered.cancel()
        running.result()  # raises what ended it
        raise RuntimeError("the stock plugin's endpoint ended")
    if ready_file is not None:
        await asyncio.to_thread(ready_file.write_text, "registered\n", encoding="utf-8")
    await running


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--plugin-dir", required=True, type=Path)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--resource-name", default=DEFAULT_RESOURCE)
    parser.add_argument("--ready-file", type=Path, default=None)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            serve(args.node_name, args.plugin_dir, args.gpus, args.resource_name, args.ready_file)
        )
    return 0


# ---- swapping a devcluster's nodes ----------------------------------------------------------


def use_stock_plugins(
    cluster: Cluster, nodes: Sequence[str], *, gpus: int, timeout_s: float = 60.0
) -> None:
    """Stop each node's nodelock device plugin (kept on record for ``use_nodelock_plugins``) and
    serve the stock plugin in its place; returns once kubelet registered every stock plugin."""
    ready: dict[str, Path] = {}
    for node in nodes:
        cluster.stop_component(f"deviceplugin-{node}", forget=False)
        here = node_dir(cluster.state_dir, node)
        name, ready_file = f"stockplugin-{node}", here / READY_FILE
        ready_file.unlink(missing_ok=True)
        cluster.start_component(
            name,
            [
                sys.executable,
                "-m",
                "devcluster.stockplugin",
                f"--node-name={node}",
                f"--plugin-dir={here / 'device-plugins'}",
                f"--gpus={gpus}",
                f"--ready-file={ready_file}",
            ],
        )
        ready[name] = ready_file
    deadline = time.monotonic() + timeout_s
    for name, ready_file in ready.items():  # they start side by side; one deadline for all
        left = max(deadline - time.monotonic(), 0.1)
        wait_ready(cluster, name, ready_file.exists, "registered with kubelet", left)


def use_nodelock_plugins(
    cluster: Cluster, nodes: Sequence[str], *, timeout_s: float = 60.0
) -> None:
    """Stop the stock plugins and start each node's nodelock device plugin again, with the
    command line it had; returns once every one is ready (registered with kubelet)."""
    ports = cluster.settings().get("metrics", {})
    for node in nodes:
        cluster.stop_component(f"stockplugin-{node}")
        cluster.restart_component(f"deviceplugin-{node}")
    for node in nodes:
        name = f"deviceplugin-{node}"
        wait_ok(cluster, name, f"http://127.0.0.1:{ports[name]}/readyz", timeout_s)


if __name__ == "__main__":
    raise SystemExit(main())
