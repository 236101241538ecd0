"""The device plugin refuses a node whose GPUs a DRA driver also publishes (real kube-apiserver).

On a devcluster that serves ``resource.k8s.io/v1`` (Kubernetes 1.34 and later; the default
release) each test writes a real DeviceClass with ``spec.extendedResourceName`` and a real
ResourceSlice, and starts the plugin (in-process, or as ``nodelock device-plugin``).  On an older
release (``pytest --kubernetes-version 1.33``) the API is not served and the check says so and
lets the plugin start.  The tests that need the other kind of cluster are skipped, naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import Cluster
from deviceplugin.dra import DEVICE_CLASSES_PATH, RESOURCE_SLICES_PATH, DraConflict, check_node
from deviceplugin.plugin import DevicePlugin, PluginConfig
from deviceplugin.simulated import SimSpec, SimulatedBackend
from handoff.wire import DEFAULT_RESOURCE
from kube import KubeClient, NotFound
from kube.client import node_path
from lockd import NodeName

DRIVER = "gpu.example.com"
NODELOCK = [sys.executable, "-m", "nodelock.cli"]
REPO = str(Path(__file__).resolve().parents[2])


async def serves_resource_v1(kube: KubeClient) -> bool:
    try:
        await kube.list(DEVICE_CLASSES_PATH, limit=1)
    except NotFound:
        return False
    return True


@pytest.fixture
async def dra(kube: KubeClient) -> None:
    if not await serves_resource_v1(kube):
        pytest.skip(
            "the devcluster does not serve resource.k8s.io/v1; run with the default release"
        )


@pytest.fixture
async def no_dra(kube: KubeClient) -> None:
    if await serves_resource_v1(kube):
        pytest.skip("the devcluster serves resource.k8s.io/v1; run with --kubernetes-version 1.33")


@dataclass
class Node:
    name: NodeName
    plugin_dir: Path
    state_dir: Path

    def config(self, **overrides: Any) -> PluginConfig:
        return PluginConfig(
            node=self.name, plugin_dir=self.plugin_dir, state_dir=self.state_dir, **overrides
        )


@pytest.fixture
async def node(kube: KubeClient, namespace: str) -> AsyncIterator[Node]:
    name = NodeName(f"dra-{secrets.token_hex(4)}")
    await kube.create(
        node_path(),
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"gpu.example.com/present": "true"}},
        },
    )
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # short unix socket paths
    try:
        yield Node(name, root / "plugins", root / "state")
    finally:
        with contextlib.suppress(NotFound):
            await kube.delete(node_path(name))
        shutil.rmtree(root, ignore_errors=True)


@contextlib.asynccontextmanager
async def device_class(kube: KubeClient, *, resource: str = DEFAULT_RESOURCE) -> AsyncIterator[str]:
    name = f"gpus-{secrets.token_hex(4)}"
    await kube.create(
        DEVICE_CLASSES_PATH,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {
                "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                "extendedResourceName": resource,
            },
        },
    )
    try:
        yield name
    finally:
        await kube.delete(f"{DEVICE_CLASSES_PATH}/{name}")


@contextlib.asynccontextmanager
async def resource_slice(kube: KubeClient, **placement: Any) -> AsyncIterator[str]:
    name = f"slice-{secrets.token_hex(4)}"
    await kube.create(
        RESOURCE_SLICES_PATH,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}],
                **placement,
            },
        },
    )
    try:
        yield name
    finally:
        await kube.delete(f"{RESOURCE_SLICES_PATH}/{name}")


def plugin(kube: KubeClient, node: Node, **overrides: Any) -> DevicePlugin:
    backend = SimulatedBackend(node.name, SimSpec(count=2))
    return DevicePlugin(node.config(**overrides), kube=kube, backend=backend)


async def test_a_dra_driver_publishing_the_resource_for_the_node_stops_the_plugin_starting(
    kube: KubeClient, node: Node, dra: None
) -> None:
    async with device_class(kube) as cls, resource_slice(kube, nodeName=node.name) as rs:
        p = plugin(kube, node)
        with pytest.raises(DraConflict) as refused:
            await p.start()
        message = str(refused.value)
        for part in (node.name, DEFAULT_RESOURCE, cls, DRIVER, rs, "docs/install.md"):
            assert part in message
        assert not (node.plugin_dir / node.config().socket_name).exists()  # never served


async def test_a_slice_that_selects_the_node_by_label_counts_and_other_nodes_do_not(
    kube: KubeClient, node: Node, dra: None
) -> None:
    by_label = {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": "gpu.example.com/present", "operator": "In", "values": ["true"]}
                ]
            }
        ]
    }
    async with device_class(kube) as cls:
        async with resource_slice(kube, nodeName=f"{node.name}-other"):
            [check] = await check_node(kube, node=node.name, resources=[DEFAULT_RESOURCE])
            assert check.served
            assert not check.conflict
            assert cls in check.classes
        async with resource_slice(kube, nodeSelector=by_label) as rs:
            [check] = await check_node(kube, node=node.name, resources=[DEFAULT_RESOURCE])
            assert [(p.device_class, p.resource_slice) for p in check.publishers] == [(cls, rs)]


async def test_a_dra_driver_appearing_later_stops_the_running_plugin(
    kube: KubeClient, node: Node, dra: None
) -> None:
    async with device_class(kube):
        p = plugin(kube, node, dra_check_s=0.2)
        await p.start()  # a class alone publishes nothing for the node
        try:
            async with resource_slice(kube, nodeName=node.name) as rs:
                with pytest.raises(DraConflict, match=rs):
                    await asyncio.wait_for(p.wait(), timeout=30)
        finally:
            await p.stop()


async def test_the_command_exits_with_the_reason(
    cluster: Cluster, kube: KubeClient, node: Node, dra: None
) -> None:
    argv = [
        *NODELOCK,
        "device-plugin",
        "--backend=simulated",
        "--sim-gpus=2",
        f"--node-name={node.name}",
        f"--plugin-dir={node.plugin_dir}",
        f"--state-dir={node.state_dir}",
        f"--kubeconfig={cluster.kubeconfig}",
        "--pod-resources-socket=",
    ]
    async with device_class(kube) as cls, resource_slice(kube, nodeName=node.name):
        done = await asyncio.to_thread(
            subprocess.run, argv, cwd=REPO, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 2, done.stderr
    assert f"DeviceClass {cls!r}" in done.stderr
    assert "Moving a node between nodelock and DRA" in done.stderr


@pytest.mark.core  # runs where it applies: in `make test`'s second run, on the oldest release
async def test_without_resource_v1_the_check_says_so_and_the_plugin_starts(
    kube: KubeClient, node: Node, no_dra: None
) -> None:
    [check] = await check_node(kube, node=node.name, resources=[DEFAULT_RESOURCE])
    assert not check.served
    assert not check.conflict
    assert "resource.k8s.io/v1 is not served" in check.message()
    p = plugin(kube, node)
    await p.start()
    try:
        assert (node.plugin_dir / node.config().socket_name).exists()
    finally:
        await p.stop()
