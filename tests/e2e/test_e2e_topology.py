"""Topology-aware placement end to end, through the real kube-scheduler and kubelet's own
topology manager (in the simulated kubelets).

A cluster of its own: two ``pcie-2numa`` nodes (two NUMA nodes x two PCIe switches x two GPUs)
whose kubelets run the ``single-numa-node`` policy, and one ``nvlink-pairs`` node of another
model with policy ``none``.  Every test checks S1/S2 over all pods afterwards.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from devcluster.cluster import Cluster
from devcluster.gpunodes import NodeSpec, start_extender, start_node, wait_nodes_ready
from handoff.topology import Link, NumaPolicy, set_link
from handoff.wire import GPU, parse_inventory
from kube.client import node_path, pod_path
from tests.e2e.kit import (
    GPUCluster,
    assignment,
    for_one_test,
    gpu_cluster_of_its_own,
    gpu_pod,
    kubelet_devices,
)

ALIGNED = ["gpu-node-01", "gpu-node-02"]
PAIRS = "gpu-node-03"
PAIRS_MODEL = "NVIDIA A100-SXM4-80GB"


def _start(cluster: Cluster) -> list[NodeSpec]:
    start_extender(cluster)
    specs = [
        NodeSpec(name, 8, layout="pcie-2numa", topology_policy=NumaPolicy.SINGLE_NUMA_NODE)
        for name in ALIGNED
    ]
    specs.append(NodeSpec(PAIRS, 8, model=PAIRS_MODEL, layout="nvlink-pairs"))
    for spec in specs:
        start_node(cluster, spec)
    wait_nodes_ready(cluster, specs)
    return specs


@pytest.fixture(scope="session")
def topo_cluster() -> Iterator[GPUCluster]:
    with gpu_cluster_of_its_own("nlt-", _start) as c:
        yield c


@pytest.fixture
async def topo(topo_cluster: GPUCluster) -> AsyncIterator[GPUCluster]:
    async with for_one_test(topo_cluster) as c:
        yield c


async def inventory(c: GPUCluster, node: str) -> dict[str, GPU]:
    obj = await c.kube.get(node_path(node))
    return {g.id: g for g in parse_inventory(obj["metadata"]["annotations"]["nodelock.io/gpus"])}


def on_nodes(pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}
                        ]
                    }
                ]
            }
        }
    }
    return pod


async def create(
    c: GPUCluster,
    name: str,
    gpus: int,
    *,
    nodes: list[str],
    annotations: dict[str, str] | None = None,
) -> None:
    pod = on_nodes(gpu_pod(name, [gpus], annotations=annotations), nodes)
    await c.kube.create(pod_path(c.namespace), pod)


def scheduling_message(pod: dict[str, Any]) -> str:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled":
            return str(cond.get("message", ""))
    return ""


async def wait_unschedulable(c: GPUCluster, name: str, *, timeout_s: float = 30.0) -> str:
    for _ in range(int(timeout_s / 0.2)):
        pod = await c.pod(name)
        message = scheduling_message(pod)
        if message:
            assert not pod["spec"].get("nodeName"), pod["spec"]
            return message
        await asyncio.sleep(0.2)
    raise AssertionError(f"{name} got no PodScheduled=False message in {timeout_s}s")


async def test_a_burst_of_2_and_4_gpu_pods_fills_two_single_numa_node_kubelets(
    topo: GPUCluster,
) -> None:
    """16 GPUs asked for as 2 x 4 + 4 x 2 on two 8-GPU nodes: kubelet's topology manager
    (single-numa-node) admits every pod, each pod's GPUs lie on one NUMA node, and kubelet
    allocated exactly the extender's assignment."""
    # first one 2-GPU pod per node, on its lowest GPUs; then a burst of 4, 4, 2, 2: lowest-index
    # devices for a 4-GPU pod (2-5) would span both NUMA nodes, and kubelet would allocate 4-7
    for i, node in enumerate(ALIGNED):
        await create(topo, f"first-{i}", 2, nodes=[node])
        await topo.wait_phase(f"first-{i}", ["Running"])
    sizes = [4, 4, 2, 2]
    names = [f"b{i}-{g}gpu" for i, g in enumerate(sizes)]
    for n, g in zip(names, sizes, strict=True):  # back to back, in the scheduler's queue order
        await create(topo, n, g, nodes=ALIGNED)
    names += ["first-0", "first-1"]
    pods = [await topo.wait_phase(n, ["Running"], timeout_s=120) for n in names]
    inventories = {n: await inventory(topo, n) for n in ALIGNED}
    for pod in pods:
        got = assignment(pod)
        assert kubelet_devices(pod) == {k: sorted(v) for k, v in got.items()}
        devices = [inventories[pod["spec"]["nodeName"]][d] for d in got["c0"]]
        assert len({g.numa for g in devices}) == 1, (pod["metadata"]["name"], got)
        # a 2-GPU pod on a PCIe pair when one was free: the 2-GPU pods fill NUMA nodes in pairs
        if len(devices) == 2:
            assert set_link(devices) is Link.PCIE, got


async def test_two_gpu_pods_land_on_nvlink_pairs_and_required_waits_for_one(
    topo: GPUCluster,
) -> None:
    pairs = await inventory(topo, PAIRS)
    by_index = {g.index: g.id for g in pairs.values()}
    # a GPU of the first pair is taken (by UUID, through the real scheduler): the lowest free
    # indexes (0, 2) are not bridged; the extender takes the whole pair 2-3
    await create(topo, "one", 1, nodes=[PAIRS], annotations={"nodelock.io/gpu-uuid": by_index[1]})
    one = await topo.wait_phase("one", ["Running"])
    assert assignment(one) == {"c0": [by_index[1]]}
    await create(topo, "pair", 2, nodes=[PAIRS])
    pair = await topo.wait_phase("pair", ["Running"])
    assert set_link([pairs[d] for d in assignment(pair)["c0"]]) is Link.NVLINK
    assert sorted(pairs[d].index for d in assignment(pair)["c0"]) == [2, 3]
    # one GPU of each remaining pair taken (HAMi's alias for the UUID list)
    await create(
        topo,
        "split",
        2,
        nodes=[PAIRS],
        annotations={"nvidia.com/use-gpuuuid": f"{by_index[4]},{by_index[6]}"},
    )
    split = await topo.wait_phase("split", ["Running"])
    assert sorted(pairs[d].index for d in assignment(split)["c0"]) == [4, 6]
    # free now: 0, 5, 7 -- no NVLink pair; `required` stays Pending and says why
    await create(
        topo, "needs-pair", 2, nodes=[PAIRS], annotations={"nodelock.io/topology": "required"}
    )
    message = await wait_unschedulable(topo, "needs-pair")
    assert "requires its 2 GPUs connected by NVLink" in message, message
    # once the first pair is whole again, the pod is scheduled onto it.  kube-scheduler retries
    # it on the deletion too, but that retry can reach the extender before the extender saw the
    # deletion (docs/sharing.md, "How a slice is chosen and handed off"); a label change once
    # the pod is gone retries it again, as any change to the node would
    await topo.kube.delete(pod_path(topo.namespace, "one"))
    for _ in range(600):
        names = {
            p["metadata"]["name"] for p in (await topo.kube.list(pod_path(topo.namespace)))["items"]
        }
        if "one" not in names:
            break
        await asyncio.sleep(0.1)
    await topo.kube.patch(
        node_path(PAIRS), {"metadata": {"labels": {"nodelock.io/e2e-nudge": "pair-freed"}}}
    )
    needs_pair = await topo.wait_phase("needs-pair", ["Running"], timeout_s=120)
    assert sorted(pairs[d].index for d in assignment(needs_pair)["c0"]) == [0, 1]


async def test_selection_by_model_through_the_scheduler(topo: GPUCluster) -> None:
    topo.expect_unadmitted("b200")  # no node has a B200: it stays Pending, saying why
    await create(
        topo, "a100", 1, nodes=[*ALIGNED, PAIRS], annotations={"nvidia.com/use-gputype": "a100"}
    )
    await create(
        topo,
        "not-h100",
        2,
        nodes=[*ALIGNED, PAIRS],
        annotations={"nodelock.io/gpu-model-exclude": "H100"},
    )
    await create(
        topo, "b200", 1, nodes=[*ALIGNED, PAIRS], annotations={"nodelock.io/gpu-model": "B200"}
    )
    for name in ("a100", "not-h100"):
        pod = await topo.wait_phase(name, ["Running"])
        assert pod["spec"]["nodeName"] == PAIRS
    message = await wait_unschedulable(topo, "b200")
    assert "matching model B200" in message, message
    assert json.dumps(message).count("node has 0 healthy GPUs matching model B200") >= 1
