"""A container asking for two device resources, on a real kubelet: kubelet holds each
resource's answer from the moment the plugin gave it, and writes its checkpoint only once every
resource of the container is answered.

kubelet's device manager loops over a container's resources, calls Allocate for each, records
the answer in memory (``podDevices.insert``), and writes its checkpoint after the loop
(``pkg/kubelet/cm/devicemanager/manager.go`` ``allocateContainerResources``: the loop, the
insert, ``writeCheckpoint``; v1.31.9 lines 836, 915, 919; v1.37.2 lines 871, 955, 959).
PodResources ``List`` answers from that memory (``pkg/kubelet/apis/podresources/server_v1.go``,
v1.31.9 line 58, v1.37.2 lines 68-72).  The device plugin relies on both: an answer for another
resource of the holder counts as served only while kubelet's ``List`` or checkpoint holds it
(``deviceplugin.decide.kubelet_confirmed``, ``held_other``).

One real-kubelet node, GPU 0 in MIG mode; the plugin takes a few seconds over every Allocate
(failpoint ``allocate.start``), so the window between the two answers can be read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from devcluster.gpunodes import pod_resources_socket
from devcluster.realkubelet import KubeletKind
from deviceplugin.kubeletview import list_pod_resources
from handoff.wire import DEFAULT_RESOURCE
from kube.client import pod_path
from tests.e2e.conftest import MIG_LAYOUT, SHARING_GPU_MIB, short_locks
from tests.e2e.kit import (
    GPUCluster,
    assignment,
    checkpoint_entries,
    for_one_test,
    gpu_cluster_of_its_own,
    kubelet_findings,
    log_count,
    plugin_registrations,
    sleeping_at,
    slow_admission,
    wait_allocatable,
    wait_registrations,
)
from tests.e2e.test_e2e_mig import MIG1, pod

pytestmark = [pytest.mark.e2e, pytest.mark.core]

ALLOCATE_S = 4.0  # the plugin's delay over every Allocate
ENDPOINTS = 3  # the plugin's registrations: whole GPUs, and one per MIG profile of MIG_LAYOUT


@pytest.fixture(scope="module")
def real_mig_cluster(kubernetes_version: str | None) -> Iterator[GPUCluster]:
    """A devcluster of its own on ``--kubernetes-version``: one real-kubelet node x two
    simulated 80 GiB GPUs, GPU 0 in MIG mode with ``MIG_LAYOUT``."""

    start = short_locks(
        nodes=1,
        gpus_per_node=2,
        gpu_memory_mib=SHARING_GPU_MIB,
        mig=((0, MIG_LAYOUT),),
        kubelet=KubeletKind.REAL,
    )
    with gpu_cluster_of_its_own("nlq-", start, version=kubernetes_version) as c:
        yield c


@pytest.fixture
async def real_mig(real_mig_cluster: GPUCluster) -> AsyncIterator[GPUCluster]:
    """The cluster with a client and a fresh namespace; the test judges itself from kubelet's
    records, then the namespace is deleted and every lock must end free."""
    async with for_one_test(real_mig_cluster, judge=False) as c:
        try:
            yield c
        finally:
            await c.cleanup()


def _listed(c: GPUCluster, name: str) -> dict[str, frozenset[str]]:
    """kubelet's PodResources ``List`` for pod ``name``'s container ``c0``: resource -> IDs."""
    socket = pod_resources_socket(c.cluster.state_dir, c.nodes[0])
    out = {}
    for resource in (DEFAULT_RESOURCE, MIG1):
        for listed in list_pod_resources(socket, resource=resource):
            ids = listed.containers.get("c0")
            if (listed.namespace, listed.name) == (c.namespace, name) and ids:
                out[resource] = frozenset(ids)
    return out


def _checkpointed(c: GPUCluster, uid: str) -> dict[str, frozenset[str]]:
    """kubelet's device checkpoint for the pod of ``uid``'s container ``c0``: resource -> IDs."""
    return {
        e.resource: frozenset(e.device_ids)
        for e in checkpoint_entries(c, c.nodes[0], uid)
        if e.container == "c0"
    }


async def test_kubelet_lists_an_answered_resource_before_its_checkpoint_names_it(
    real_mig: GPUCluster,
) -> None:
    c = real_mig
    node = c.nodes[0]
    plugin = f"deviceplugin-{node}"
    sleeping = sleeping_at("allocate.start")
    registered = plugin_registrations(c.cluster, node)
    async with slow_admission(c, node, seconds=ALLOCATE_S):
        # every endpoint of the restarted plugin (whole GPUs, 1g, 3g) registered, and the Node
        # shows their devices again, so the pod is placed and admitted with both resources
        await wait_registrations(c.cluster, node, registered + ENDPOINTS - 1)
        await wait_allocatable(c, {DEFAULT_RESOURCE: "1", MIG1: "4"})
        before = log_count(c, plugin, sleeping)
        created = await c.kube.create(
            pod_path(c.namespace), pod("both", {DEFAULT_RESOURCE: 1, MIG1: 1})
        )
        uid = created["metadata"]["uid"]
        # the second Allocate has started: kubelet answered the first resource (in Go map order,
        # either one) and has not written its checkpoint since
        deadline = asyncio.get_running_loop().time() + 90
        while log_count(c, plugin, sleeping) < before + 2:
            assert asyncio.get_running_loop().time() < deadline, "no second Allocate came"
            await asyncio.sleep(0.1)
        listed = await asyncio.to_thread(_listed, c, "both")
        checkpointed = await asyncio.to_thread(_checkpointed, c, uid)
        assert len(listed) == 1, f"kubelet lists {listed} in the window between its two answers"
        assert checkpointed == {}, f"kubelet checkpointed {checkpointed} before its last answer"

        running = await c.wait_phase("both", ["Running"], timeout_s=60)
    ids = assignment(running)["c0"]  # one whole GPU, one 1g instance (MIG-...)
    given = {
        DEFAULT_RESOURCE: frozenset(d for d in ids if not d.startswith("MIG-")),
        MIG1: frozenset(d for d in ids if d.startswith("MIG-")),
    }
    assert all(len(v) == 1 for v in given.values()), ids
    first = next(iter(listed))
    assert listed[first] == given[first]  # the first answer, as the plugin gave it
    assert await asyncio.to_thread(_listed, c, "both") == given
    assert await asyncio.to_thread(_checkpointed, c, uid) == given
    found = await kubelet_findings(c, expected_pods=1)
    assert found.ok, (found.s1, found.s2, found.l1, found.coverage)
