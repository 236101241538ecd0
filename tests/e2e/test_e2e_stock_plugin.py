"""The handoff benchmark's stock device plugin (``devcluster.stockplugin``) on a simulated node:
it serves kubelet's own device choice, and the node goes back to nodelock's plugin after.

A cluster of its own with no extender: kube-scheduler binds alone, as in the benchmark's
``stock-gpu`` phase.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from devcluster.cluster import Cluster
from devcluster.gpunodes import NodeSpec, start_node, wait_nodes_ready
from devcluster.invariants import allocated
from devcluster.stockplugin import use_nodelock_plugins, use_stock_plugins
from deviceplugin.simulated import simulated_id
from kube.client import pod_path
from tests.e2e.kit import (
    GPUCluster,
    for_one_test,
    gpu_cluster_of_its_own,
    kubelet_devices,
    plugin_registrations,
)

NODE = "gpu-node-01"
GPUS = 2


def _start(cluster: Cluster) -> list[NodeSpec]:
    spec = NodeSpec(NODE, GPUS)
    start_node(cluster, spec)
    wait_nodes_ready(cluster, [spec])
    return [spec]


@pytest.fixture(scope="module")
def stock_cluster() -> Iterator[GPUCluster]:
    with gpu_cluster_of_its_own("nlk-", _start) as c:
        yield c


async def test_the_stock_plugin_serves_kubelets_choice_then_nodelocks_plugin_is_back(
    stock_cluster: GPUCluster,
) -> None:
    async with for_one_test(stock_cluster, judge=False) as c:
        await asyncio.to_thread(use_stock_plugins, c.cluster, c.nodes, gpus=GPUS)
        await c.create_pod("one", [1])
        await c.create_pod("two", [1])
        pods = [await c.wait_phase(name, ["Running"]) for name in ("one", "two")]
        chosen = [kubelet_devices(p)["c0"] for p in pods]
        # kubelet chose one GPU each, the node's two between them, and the plugin answered
        # exactly kubelet's choice (no lock, no annotation: the pods carry no assignment)
        assert sorted(d for ids in chosen for d in ids) == sorted(
            simulated_id(NODE, i) for i in range(GPUS)
        )
        for pod, ids in zip(pods, chosen, strict=True):
            assert allocated(pod)["c0"]["envs"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
            assert "nodelock.io/assignment" not in pod["metadata"].get("annotations", {})

        before = plugin_registrations(c.cluster, NODE)
        await asyncio.to_thread(use_nodelock_plugins, c.cluster, c.nodes)
        assert plugin_registrations(c.cluster, NODE) > before
        # without the extender no lock names a pod, so nodelock's plugin refuses a GPU pod:
        # kubelet asks it, not the stock plugin, and the pod fails admission instead of running
        for name in ("one", "two"):
            await c.kube.delete(pod_path(c.namespace, name))
            await c.wait_gone(name)
        await c.create_pod("three", [1])
        failed = await c.wait_phase("three", ["Failed", "Running"])
        assert failed["status"]["phase"] == "Failed"
        assert failed["status"]["reason"] == "UnexpectedAdmissionError"
        assert kubelet_devices(failed) == {}
        await c.cleanup()  # S3: no lock held once the pods are gone (none took one)
