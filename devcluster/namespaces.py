"""Namespaces for tests, benchmarks and the demo, ready for pods when returned."""

from __future__ import annotations

import asyncio
import time

from devcluster.errors import DevclusterError
from kube.client import KubeClient, namespace_path
from kube.errors import NotFound


async def create_namespace(kube: KubeClient, name: str, *, timeout_s: float = 30.0) -> str:
    """Create namespace ``name`` and wait for its default ServiceAccount, without which the API
    server refuses pods (kube-controller-manager creates it a moment after the namespace)."""
    await kube.create(
        namespace_path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await kube.get(f"{namespace_path(name)}/serviceaccounts/default")
            return name
        except NotFound:
            if time.monotonic() > deadline:
                raise DevclusterError(
                    f"namespace {name} got no default ServiceAccount in {timeout_s:.0f}s; "
                    "is kube-controller-manager running?"
                ) from None
            await asyncio.sleep(0.1)
