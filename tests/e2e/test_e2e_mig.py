"""MIG instances end to end: one node x two simulated 80 GiB GPUs, GPU 0 in MIG mode as
3g.40gb + 4 x 1g.10gb, through the real kube-scheduler (extender wired in) and kubelet's own
device manager (the simulated kubelet), judged from kubelet's records: its PodResources API and
the answers it keeps (``sim.nodelock.io/allocated``)."""

from __future__ import annotations

import asyncio
from typing import Any

from devcluster.gpunodes import pod_resources_socket
from devcluster.invariants import allocated
from deviceplugin.kubeletview import list_pod_resources
from deviceplugin.simulated import simulated_id
from handoff.wire import parse_inventory
from kube.client import node_path, pod_path
from nodelock.audit import audit, devcluster_sources
from tests.e2e.kit import GPUCluster, assignment
from tests.e2e.test_e2e_sharing import stays_pending

MIG1 = "nvidia.com/mig-1g.10gb"
MIG3 = "nvidia.com/mig-3g.40gb"


def pod(name: str, *containers: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": f"c{i}",
                    "image": "registry.invalid/sim:never-pulled",
                    "resources": {"limits": {k: str(v) for k, v in limits.items()}},
                }
                for i, limits in enumerate(containers)
            ],
        },
    }


async def kubelet_ids(c: GPUCluster, resource: str) -> dict[tuple[str, str], frozenset[str]]:
    """kubelet's PodResources of the test's namespace: (pod, container) -> device IDs."""
    socket = pod_resources_socket(c.cluster.state_dir, c.nodes[0])
    pods = await asyncio.to_thread(list_pod_resources, socket, resource=resource)
    return {
        (p.name, name): ids
        for p in pods
        if p.namespace == c.namespace
        for name, ids in p.containers.items()
        if ids
    }


async def test_gpu_in_mig_mode_is_advertised_only_as_its_instances(mig: GPUCluster) -> None:
    c = mig
    node = await c.kube.get(node_path(c.nodes[0]))
    for _ in range(100):  # the MIG endpoints register next to the whole-GPU one
        if MIG3 in node["status"].get("allocatable", {}):
            break
        await asyncio.sleep(0.2)
        node = await c.kube.get(node_path(c.nodes[0]))
    allocatable = node["status"]["allocatable"]
    assert allocatable["nvidia.com/gpu"] == "1"  # GPU 0 is in MIG mode: not a whole GPU
    assert allocatable[MIG1] == "4"
    assert allocatable[MIG3] == "1"
    rows = parse_inventory(node["metadata"]["annotations"]["nodelock.io/gpus"])
    parent = simulated_id(c.nodes[0], 0)
    assert parent not in {g.id for g in rows}
    assert [g.id for g in rows if not g.profile] == [simulated_id(c.nodes[0], 1)]
    assert sorted(g.profile for g in rows if g.profile) == ["1g.10gb"] * 4 + ["3g.40gb"]
    assert {g.parent for g in rows if g.profile} == {parent}


async def test_instances_of_two_profiles_each_pod_its_own_then_pending(mig: GPUCluster) -> None:
    c = mig
    small = [f"small-{i}" for i in range(4)]
    for name in small:
        await c.kube.create(pod_path(c.namespace), pod(name, {MIG1: 1}))
    # one pod, one assignment: a whole GPU in one container, the 3g instance in the other
    await c.kube.create(pod_path(c.namespace), pod("mixed", {"nvidia.com/gpu": 1}, {MIG3: 1}))
    pods = {n: await c.wait_phase(n, ["Running"], timeout_s=120) for n in [*small, "mixed"]}

    by_kubelet = await kubelet_ids(c, MIG1)
    instances = [by_kubelet[(n, "c0")] for n in small]
    assert all(len(ids) == 1 for ids in instances), instances
    assert len(frozenset().union(*instances)) == 4, instances  # four distinct instances
    rows = {
        str(g.id): g
        for g in parse_inventory(
            (await c.kube.get(node_path(c.nodes[0])))["metadata"]["annotations"]["nodelock.io/gpus"]
        )
    }
    for name, ids in zip(small, instances, strict=True):
        (dev,) = ids
        assert rows[dev].profile == "1g.10gb"
        assert assignment(pods[name]) == {"c0": [dev]}
        record = allocated(pods[name])["c0"]
        assert record["otherResources"] == {MIG1: [dev]}
        assert record["envs"]["NVIDIA_VISIBLE_DEVICES"] == dev
        assert record["cdiDevices"] == [f"nvidia.com/gpu={dev}"]

    mixed = pods["mixed"]
    (big,) = (await kubelet_ids(c, MIG3))[("mixed", "c1")]
    (whole,) = (await kubelet_ids(c, "nvidia.com/gpu"))[("mixed", "c0")]
    assert rows[big].profile == "3g.40gb"
    assert whole == simulated_id(c.nodes[0], 1)
    assert assignment(mixed) == {"c0": [whole], "c1": [big]}
    assert allocated(mixed)["c1"]["envs"]["NVIDIA_VISIBLE_DEVICES"] == big
    assert allocated(mixed)["c0"]["envs"]["NVIDIA_VISIBLE_DEVICES"] == whole
    # nodelock audit: assignments, kubelet's PodResources and the plugin's answers agree, for
    # the whole GPU and for the instances of each profile
    result = await audit(c.kube, devcluster_sources(c.cluster.state_dir), second_look_s=0)
    assert result.disagreements == [], result.disagreements

    # every instance of the profile is taken: a fifth stays Pending, with a reason (kube-scheduler
    # counts the resource against kubelet's allocatable before asking the extender)
    c.expect_unadmitted("fifth", "greedy")
    await c.kube.create(pod_path(c.namespace), pod("fifth", {MIG1: 1}))
    message = await stays_pending(c, "fifth")
    assert f"Insufficient {MIG1}" in message, message
    # more instances than the node has: Pending too
    await c.kube.create(pod_path(c.namespace), pod("greedy", {MIG1: 5}))
    message = await stays_pending(c, "greedy")
    assert f"Insufficient {MIG1}" in message, message
