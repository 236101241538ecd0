"""The devcluster's extender over HTTPS (``start_extender(tls=True)``), as the shipped
configuration serves it: kube-scheduler shows its client certificate and verifies the
extender's, and the handoff runs through it unchanged.

A cluster of its own: one node x two GPUs.  S1/S2 are checked over all pods afterwards.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator

import pytest
import yaml

from devcluster.cluster import Cluster
from devcluster.gpunodes import NodeSpec, up_gpu_cluster
from tests.e2e.kit import (
    GPUCluster,
    assignment,
    for_one_test,
    gpu_cluster_of_its_own,
    kubelet_devices,
)


def _start(cluster: Cluster) -> list[NodeSpec]:
    return up_gpu_cluster(cluster, nodes=1, gpus_per_node=2, extender_tls=True)


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[GPUCluster]:
    with gpu_cluster_of_its_own("nlx-", _start) as c:
        yield c


@pytest.fixture
async def tls(tls_cluster: GPUCluster) -> AsyncIterator[GPUCluster]:
    async with for_one_test(tls_cluster) as c:
        yield c


def _plain_http(url: str) -> str:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as resp:
            return f"answered {resp.status}"
    except (urllib.error.URLError, OSError) as exc:
        return f"refused: {exc}"


async def test_kube_scheduler_binds_through_the_https_extender(tls: GPUCluster) -> None:
    url = tls.cluster.settings()["extender"]["url"]
    assert url.startswith("https://127.0.0.1:")
    entry = yaml.safe_load(tls.cluster.scheduler_config.read_text())["extenders"][0]
    assert entry["enableHTTPS"] is True
    assert set(entry["tlsConfig"]) == {"caFile", "certFile", "keyFile"}
    # the extender's port speaks TLS only: plain HTTP gets no answer
    assert (await asyncio.to_thread(_plain_http, url.replace("https://", "http://"))).startswith(
        "refused"
    )

    await tls.create_pod("a", [1])
    await tls.create_pod("b", [1])
    for name in ("a", "b"):
        pod = await tls.wait_phase(name, ["Running"])
        assert kubelet_devices(pod)["c0"] == sorted(assignment(pod)["c0"])
