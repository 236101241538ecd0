"""End-to-end fixtures: a GPU devcluster of its own for the e2e session.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler; two extender replicas
behind one address, wired into kube-scheduler; three simulated GPU nodes (kubelet's own device
manager in the Go harness) with four GPUs each, each with its own device plugin process.  Node
locks last ``LEASE_S`` seconds so that expiry paths are exercised quickly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from devcluster.cluster import Cluster
from devcluster.gpunodes import NodeSpec, up_gpu_cluster
from tests.e2e.kit import LEASE_S, GPUCluster, for_one_test, gpu_cluster_of_its_own

SHARING_SPLIT = 4
SHARING_GPU_MIB = 81920  # 80 GiB


def short_locks(**shape: Any) -> Callable[[Cluster], list[NodeSpec]]:
    """Start the extender and GPU nodes of ``shape`` (``up_gpu_cluster``'s arguments), with node
    locks of ``LEASE_S`` seconds."""
    return lambda cluster: up_gpu_cluster(
        cluster, extender_args=[f"--lease-duration={LEASE_S}"], **shape
    )


@pytest.fixture(scope="session")
def gpu_cluster(kubernetes_version: str | None) -> Iterator[GPUCluster]:
    """Three GPU nodes x four GPUs, two extender replicas, on ``--kubernetes-version``."""
    shape = short_locks(nodes=3, gpus_per_node=4, extender_replicas=2)
    with gpu_cluster_of_its_own("nle-", shape, version=kubernetes_version) as c:
        yield c


@pytest.fixture
async def e2e(gpu_cluster: GPUCluster) -> AsyncIterator[GPUCluster]:
    """The e2e cluster with a fresh namespace and a client; checks S1/S2 over all pods after."""
    async with for_one_test(gpu_cluster) as c:
        yield c


@pytest.fixture(scope="session")
def sharing_cluster() -> Iterator[GPUCluster]:
    """A small devcluster of its own: one node x two simulated 80 GiB GPUs, each shared as
    ``SHARING_SPLIT`` virtual devices (``--gpu-split``)."""
    shape = short_locks(
        nodes=1, gpus_per_node=2, gpu_split=SHARING_SPLIT, gpu_memory_mib=SHARING_GPU_MIB
    )
    with gpu_cluster_of_its_own("nls-", shape) as c:
        yield c


@pytest.fixture
async def sharing(sharing_cluster: GPUCluster) -> AsyncIterator[GPUCluster]:
    """The sharing cluster with a fresh namespace and a client; checks S1/S2 after."""
    async with for_one_test(sharing_cluster) as c:
        yield c


MIG_LAYOUT = "3g.40gb+4x1g.10gb"  # GPU 0 of the MIG node; GPU 1 stays a whole GPU


@pytest.fixture(scope="session")
def mig_cluster() -> Iterator[GPUCluster]:
    """A small devcluster of its own: one node x two simulated 80 GiB GPUs, GPU 0 in MIG mode
    with ``MIG_LAYOUT`` (``--mig``), GPU 1 whole."""
    shape = short_locks(
        nodes=1, gpus_per_node=2, gpu_memory_mib=SHARING_GPU_MIB, mig=((0, MIG_LAYOUT),)
    )
    with gpu_cluster_of_its_own("nlm-", shape) as c:
        yield c


@pytest.fixture
async def mig(mig_cluster: GPUCluster) -> AsyncIterator[GPUCluster]:
    """The MIG cluster with a fresh namespace and a client; checks S1/S2 after."""
    async with for_one_test(mig_cluster) as c:
        yield c
