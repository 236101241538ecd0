"""End-to-end fixtures: a GPU devcluster of its own for the e2e session.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler; two extender replicas
behind one address, wired into kube-scheduler; three simulated GPU nodes (kubelet's own device
manager in the Go harness) with four GPUs each, each with its own device plugin process.  Node
locks last ``LEASE_S`` seconds so that expiry paths are exercised quickly.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from devcluster.binaries import ensure_control_plane
from devcluster.cluster import Cluster
from devcluster.gpunodes import up_gpu_cluster
from kube.client import KubeClient
from tests.e2e.kit import LEASE_S, GPUCluster, assert_no_violations


@pytest.fixture(scope="session")
def gpu_cluster() -> Iterator[GPUCluster]:
    state = Path(tempfile.mkdtemp(prefix="nle-", dir="/tmp"))
    cluster = Cluster(state, binaries=ensure_control_plane())
    cluster.up()
    try:
        specs = up_gpu_cluster(
            cluster,
            nodes=3,
            gpus_per_node=4,
            extender_replicas=2,
            extender_args=[f"--lease-duration={LEASE_S}"],
        )
        yield GPUCluster(cluster, [s.name for s in specs])
    finally:
        cluster.down()
        if not os.environ.get("NODELOCK_KEEP_STATE"):  # keep the logs to debug a failure
            shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
async def e2e(gpu_cluster: GPUCluster) -> AsyncIterator[GPUCluster]:
    """The e2e cluster with a fresh namespace and a client; checks S1/S2 over all pods after."""
    gpu_cluster.kube = await KubeClient.connect(str(gpu_cluster.cluster.kubeconfig))
    await gpu_cluster.new_namespace()
    try:
        yield gpu_cluster
        await assert_no_violations(gpu_cluster.kube)
    finally:
        await gpu_cluster.cleanup()
        await gpu_cluster.kube.close()


SHARING_SPLIT = 4
SHARING_GPU_MIB = 81920  # 80 GiB


@pytest.fixture(scope="session")
def sharing_cluster() -> Iterator[GPUCluster]:
    """A small devcluster of its own: one node x two simulated 80 GiB GPUs, each shared as
    ``SHARING_SPLIT`` virtual devices (``--gpu-split``)."""
    state = Path(tempfile.mkdtemp(prefix="nls-", dir="/tmp"))
    cluster = Cluster(state, binaries=ensure_control_plane())
    cluster.up()
    try:
        specs = up_gpu_cluster(
            cluster,
            nodes=1,
            gpus_per_node=2,
            gpu_split=SHARING_SPLIT,
            gpu_memory_mib=SHARING_GPU_MIB,
            extender_args=[f"--lease-duration={LEASE_S}"],
        )
        yield GPUCluster(cluster, [s.name for s in specs])
    finally:
        cluster.down()
        if not os.environ.get("NODELOCK_KEEP_STATE"):
            shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
async def sharing(sharing_cluster: GPUCluster) -> AsyncIterator[GPUCluster]:
    """The sharing cluster with a fresh namespace and a client; checks S1/S2 after."""
    sharing_cluster.kube = await KubeClient.connect(str(sharing_cluster.cluster.kubeconfig))
    await sharing_cluster.new_namespace()
    try:
        yield sharing_cluster
        await assert_no_violations(sharing_cluster.kube)
    finally:
        await sharing_cluster.cleanup()
        await sharing_cluster.kube.close()


MIG_LAYOUT = "3g.40gb+4x1g.10gb"  # GPU 0 of the MIG node; GPU 1 stays a whole GPU


@pytest.fixture(scope="session")
def mig_cluster() -> Iterator[GPUCluster]:
    """A small devcluster of its own: one node x two simulated 80 GiB GPUs, GPU 0 in MIG mode
    with ``MIG_LAYOUT`` (``--mig``), GPU 1 whole."""
    state = Path(tempfile.mkdtemp(prefix="nlm-", dir="/tmp"))
    cluster = Cluster(state, binaries=ensure_control_plane())
    cluster.up()
    try:
        specs = up_gpu_cluster(
            cluster,
            nodes=1,
            gpus_per_node=2,
            gpu_memory_mib=SHARING_GPU_MIB,
            mig=((0, MIG_LAYOUT),),
            extender_args=[f"--lease-duration={LEASE_S}"],
        )
        yield GPUCluster(cluster, [s.name for s in specs])
    finally:
        cluster.down()
        if not os.environ.get("NODELOCK_KEEP_STATE"):
            shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
async def mig(mig_cluster: GPUCluster) -> AsyncIterator[GPUCluster]:
    """The MIG cluster with a fresh namespace and a client; checks S1/S2 after."""
    mig_cluster.kube = await KubeClient.connect(str(mig_cluster.cluster.kubeconfig))
    await mig_cluster.new_namespace()
    try:
        yield mig_cluster
        await assert_no_violations(mig_cluster.kube)
    finally:
        await mig_cluster.cleanup()
        await mig_cluster.kube.close()
