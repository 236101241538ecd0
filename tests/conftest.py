"""Shared fixtures: one real control plane per test session, a fresh namespace per test.

Tests under ``tests/unit`` are marked ``unit`` and need no cluster; ``tests/integration`` and
``tests/e2e`` are marked accordingly and use the session's devcluster (real etcd, kube-apiserver,
kube-controller-manager and kube-scheduler built from the Kubernetes Go modules).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from devcluster.cluster import Cluster, throwaway_cluster
from devcluster.namespaces import create_namespace
from kube.client import KubeClient, namespace_path

_MARKS = {
    "unit": pytest.mark.unit,
    "integration": pytest.mark.integration,
    "e2e": pytest.mark.e2e,
    "shipped": pytest.mark.shipped,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for name, mark in _MARKS.items():
            if name in parts:
                item.add_marker(mark)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kubernetes-version",
        default=None,
        help="the Kubernetes release the session's devclusters run (devcluster.versions; "
        "default: the default release). `make test` runs the tests marked `core` again on the "
        "oldest supported release.",
    )


@pytest.fixture(scope="session")
def kubernetes_version(request: pytest.FixtureRequest) -> str | None:
    """The ``--kubernetes-version`` this session's clusters run (None: the default release)."""
    value = request.config.getoption("--kubernetes-version")
    return str(value) if value else None


@pytest.fixture(scope="session")
def cluster(kubernetes_version: str | None) -> Iterator[Cluster]:
    """A running devcluster control plane for the whole test session, stopped at the end."""
    with throwaway_cluster("nl-", version=kubernetes_version) as c:
        yield c


@pytest.fixture
async def kube(cluster: Cluster) -> AsyncIterator[KubeClient]:
    """An admin client to the session's cluster."""
    async with await KubeClient.connect(str(cluster.kubeconfig)) as client:
        yield client


@pytest.fixture
async def namespace(kube: KubeClient) -> AsyncIterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    name = await create_namespace(kube, f"t-{secrets.token_hex(4)}")
    try:
        yield name
    finally:
        await kube.delete(namespace_path(name))
