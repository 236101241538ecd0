"""``nodelock device-plugin`` as a process: it serves, registers, publishes and exits on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from devcluster.cluster import Cluster
from devcluster.processes import free_port
from deviceplugin.simulated import simulated_id
from handoff.wire import parse_inventory
from kube import KubeClient, NotFound
from kube.client import node_path
from proto import deviceplugin_v1beta1_pb2 as pb
from proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

WAIT_S = 60.0
NODELOCK = [sys.executable, "-m", "nodelock.cli"]
REPO = str(Path(__file__).resolve().parents[2])


class Registrations(pb_grpc.RegistrationServicer):
    def __init__(self) -> None:
        self.requests: asyncio.Queue[pb.RegisterRequest] = asyncio.Queue()

    async def Register(
        self,
        request: pb.RegisterRequest,
        context: grpc.aio.ServicerContext[pb.RegisterRequest, pb.Empty],
    ) -> pb.Empty:
        await self.requests.put(request)
        return pb.Empty()


@pytest.fixture
async def node(kube: KubeClient) -> AsyncIterator[str]:
    name = f"dp-cli-{secrets.token_hex(4)}"
    await kube.create(node_path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(NotFound):
            await kube.delete(node_path(name))


async def test_standalone_simulated_plugin(cluster: Cluster, kube: KubeClient, node: str) -> None:
    root = Path(tempfile.mkdtemp(prefix="dpc-", dir="/tmp"))
    plugin_dir, state_dir = root / "plugins", root / "state"
    plugin_dir.mkdir()
    kubelet = Registrations()
    server = grpc.aio.server()
    pb_grpc.add_RegistrationServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{plugin_dir / 'kubelet.sock'}")
    await server.start()
    metrics_port = free_port()
    ops = f"http://127.0.0.1:{metrics_port}"
    argv = [
        *NODELOCK,
        "device-plugin",
        "--backend",
        "simulated",
        "--sim-gpus",
        "8",
        "--node-name",
        node,
        "--plugin-dir",
        str(plugin_dir),
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--state-dir",
        str(state_dir),
        "--metrics-address=127.0.0.1",
        f"--metrics-port={metrics_port}",
    ]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    try:
        request = await asyncio.wait_for(kubelet.requests.get(), WAIT_S)
        assert request.endpoint == "nodelock-gpu.sock"
        assert request.resource_name == "nvidia.com/gpu"
        # registered, but kubelet has no device yet: a pod it admitted now would fail
        async with aiohttp.ClientSession() as http, http.get(f"{ops}/readyz") as resp:
            assert resp.status == 503
            assert "devices listed to kubelet" in await resp.text()
        async with grpc.aio.insecure_channel(f"unix://{plugin_dir / request.endpoint}") as ch:
            stream = pb_grpc.DevicePluginStub(ch).ListAndWatch(pb.Empty())
            devices = await asyncio.wait_for(stream.read(), WAIT_S)
            assert isinstance(devices, pb.ListAndWatchResponse)
            assert [d.ID for d in devices.devices] == [simulated_id(node, i) for i in range(8)]
            async with aiohttp.ClientSession() as http:
                for _ in range(int(WAIT_S * 10)):
                    async with http.get(f"{ops}/readyz") as resp:
                        if resp.status == 200:
                            break
                    await asyncio.sleep(0.1)
                async with http.get(f"{ops}/readyz") as resp:
                    assert (resp.status, await resp.text()) == (200, "ok\n")
            stream.cancel()

        async def published() -> str | None:
            obj = await kube.get(node_path(node))
            value: str | None = (obj["metadata"].get("annotations") or {}).get("nodelock.io/gpus")
            return value

        raw = None
        for _ in range(int(WAIT_S * 10)):
            raw = await published()
            if raw is not None:
                break
            await asyncio.sleep(0.1)
        assert raw is not None
        assert len(parse_inventory(raw)) == 8

        # the plain-HTTP port: metrics and probes without any credential, and nothing else
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{ops}/healthz") as resp:
                assert resp.status == 200
            async with http.get(f"{ops}/metrics") as resp:
                assert resp.status == 200
                assert "nodelock_deviceplugin_" in await resp.text()
            async with http.get(f"{ops}/") as resp:
                assert resp.status == 404  # prometheus-client's own server answered any path
            async with http.post(f"{ops}/metrics") as resp:
                assert resp.status == 405

        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), WAIT_S)
        assert proc.returncode == 0, out.decode(errors="replace")
        assert not (plugin_dir / "nodelock-gpu.sock").exists()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await server.stop(None)
        shutil.rmtree(root, ignore_errors=True)


def test_missing_node_name_is_a_one_line_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    done = subprocess.run(
        [*NODELOCK, "device-plugin", "--backend", "simulated", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": REPO},
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "nodelock: --node-name is required (or set $NODE_NAME)"
