"""Finished and rejected GPU pods left on a node whose kubelet lists every pod it holds.

kubelet before 1.34, and 1.34+ with ``KubeletPodResourcesListUseActivePods=false``, answers
PodResources ``List`` with every pod in its pod manager: pods it rejected and pods that
finished stay listed, their GPU containers without devices, until they are deleted from the API
(pkg/kubelet/apis/podresources/server_v1.go, v1.31.9 line 58, v1.37.2 lines 68-72; at 1.31 the
last pod kubelet called Allocate for keeps its devices until its next Allocate for another pod:
``pendingAdmissionPod``, pkg/kubelet/cm/devicemanager/manager.go, v1.31.9 lines 362, 551-554).
The simulated kubelets here list that way (``--pod-resources-list=all``).  A finished 1-GPU Job
pod, a GPU pod kubelet rejected at admission and one it rejected after its Allocate was answered
stay on one node; every GPU pod created after them must still be admitted there.  The fixture
checks S1, S2 and L1 over every pod afterwards, and S3 once the namespace is gone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from devcluster.gpunodes import pod_resources_socket, up_gpu_cluster
from deviceplugin.kubeletview import list_pod_resources
from kube.client import JSON, pod_path
from tests.e2e.kit import (
    BYPASS,
    LEASE_S,
    RESOURCE,
    GPUCluster,
    for_one_test,
    gpu_cluster_of_its_own,
    gpu_pod,
)

NODES = 2
GPUS_PER_NODE = 8
AFTER = 16  # single-GPU pods created after the finished and rejected ones: every GPU, once
RUN_SECONDS = "sim.nodelock.io/run-seconds"
REJECT_AFTER_ALLOCATE = "sim.nodelock.io/reject-after-allocate"


@pytest.fixture(scope="module")
def listing_all_cluster(kubernetes_version: str | None) -> Iterator[GPUCluster]:
    """Two nodes x eight GPUs of ``--kubernetes-version`` whose simulated kubelets list like
    kubelet before 1.34 (on 1.34+ as with the gate off)."""
    with gpu_cluster_of_its_own(
        "nlf-",
        lambda cluster: up_gpu_cluster(
            cluster,
            nodes=NODES,
            gpus_per_node=GPUS_PER_NODE,
            extender_args=[f"--lease-duration={LEASE_S}"],
            pod_resources_list="all",
        ),
        version=kubernetes_version,
    ) as c:
        yield c


@pytest.fixture
async def listing_all(listing_all_cluster: GPUCluster) -> AsyncIterator[GPUCluster]:
    async with for_one_test(listing_all_cluster) as c:
        yield c


async def _finished_job(c: GPUCluster, node: str) -> JSON:
    """A one-GPU Job on ``node`` whose pod succeeds after a second; returns that pod."""
    pod = gpu_pod("finished", [1], node=node, annotations={RUN_SECONDS: "1"})
    pod["spec"]["restartPolicy"] = "Never"
    labels = {"app": "finished"}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "finished"},
        "spec": {
            "completions": 1,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels, "annotations": pod["metadata"]["annotations"]},
                "spec": pod["spec"],
            },
        },
    }
    await c.kube.create(f"/apis/batch/v1/namespaces/{c.namespace}/jobs", job)
    deadline = time.monotonic() + 90
    pods: list[JSON] = []
    while time.monotonic() < deadline:
        pods = (await c.kube.list(pod_path(c.namespace), label_selector="app=finished"))["items"]
        if pods and pods[0].get("status", {}).get("phase") == "Succeeded":
            return pods[0]
        await asyncio.sleep(0.2)
    raise AssertionError(f"the Job's pod did not succeed in 90 s: {pods}")


@pytest.mark.core
async def test_finished_and_rejected_pods_do_not_block_the_node(listing_all: GPUCluster) -> None:
    c = listing_all
    node = c.nodes[0]
    job_pod = await _finished_job(c, node)
    assert job_pod["spec"]["nodeName"] == node

    # kubelet rejects a GPU pod placed by hand: the plugin refuses its Allocate (no lock holder)
    await c.allow_bypass()
    c.expect_unadmitted("by-hand", "rejected-late")
    await c.create_pod("by-hand", [1], node=node, bind_directly=True, labels=BYPASS)
    by_hand = await c.wait_phase("by-hand", ["Failed"])
    # and a pod the extender bound and the plugin served, rejected by a later admit handler
    await c.create_pod("rejected-late", [1], node=node, annotations={REJECT_AFTER_ALLOCATE: ""})
    late = await c.wait_phase("rejected-late", ["Failed"])
    assert by_hand["status"].get("reason") == "UnexpectedAdmissionError", by_hand["status"]
    assert late["status"].get("reason") == "NodeAffinity", late["status"]
    assert late["spec"]["nodeName"] == node

    # kubelet lists all three, their GPU containers without devices (it freed or never gave them)
    socket = pod_resources_socket(c.cluster.state_dir, node)
    listed = {
        p.key: p for p in await asyncio.to_thread(list_pod_resources, socket, resource=RESOURCE)
    }
    for name in ("by-hand", "rejected-late", job_pod["metadata"]["name"]):
        assert c.key(name) in listed, sorted(listed)
        assert listed[c.key(name)].devices == frozenset(), listed[c.key(name)]

    names = [f"after-{i:02d}" for i in range(AFTER)]
    for name in names:
        await c.create_pod(name, [1])
    running = await asyncio.gather(*(c.wait_phase(n, ["Running"], timeout_s=120) for n in names))
    on_node = [p["metadata"]["name"] for p in running if p["spec"]["nodeName"] == node]
    # every GPU of the cluster is in use now, so the node with the leftovers took its share
    assert len(on_node) == GPUS_PER_NODE, on_node
    # the leftovers are still there, as kubelet lists them
    for name in ("by-hand", "rejected-late"):
        assert (await c.pod(name))["status"]["phase"] == "Failed"
    job_pod = await c.pod(job_pod["metadata"]["name"])
    assert job_pod["status"]["phase"] == "Succeeded"
