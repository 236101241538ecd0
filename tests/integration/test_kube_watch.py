"""The list-then-watch loop (``kube.reflector``) and the watch stream (``KubeClient.watch``)
against the real API server, with an object near the server's size limit.

A watch event is one line of JSON; an object as large as the API server stores (about 1.5 MB,
etcd's request limit) makes a line far longer than aiohttp's ``readline`` buffer.  Reading it must
neither fail nor turn into a relist that the next event makes fail again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest

from devcluster.cluster import Cluster
from kube.client import KubeClient, pod_path
from kube.errors import ApiUnavailable
from kube.reflector import Reflector
from tests.integration.extender_kit import wait_for

pytestmark = pytest.mark.integration

# Near the limit: the JSON of the whole Pod must stay under etcd's 1.5 MiB request limit.
BIG_BYTES = 1_400_000


def big_pod(name: str, size: int = BIG_BYTES) -> dict[str, Any]:
    """A Pod whose spec carries ``size`` bytes in one environment value (annotations are capped
    at 256 KiB, a container's env is not); never scheduled (no such scheduler)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "nobody",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/none",
                    "env": [{"name": "BIG", "value": "x" * size}],
                }
            ],
        },
    }


def _env(pod: Mapping[str, Any]) -> int:
    return len(pod["spec"]["containers"][0]["env"][0]["value"])


async def _true(value: bool) -> bool:
    return value


async def test_the_api_server_refuses_a_pod_over_its_size_limit(
    kube: KubeClient, namespace: str
) -> None:
    # the object under test is near the limit, not past it: 200 kB more is refused (etcd's
    # request limit, 1.5 MiB; the API server answers 500)
    with pytest.raises(ApiUnavailable, match=r"too large|larger than max"):
        await kube.create(pod_path(namespace), big_pod("too-big", BIG_BYTES + 200_000))


async def test_watch_delivers_an_object_near_the_size_limit(
    kube: KubeClient, namespace: str
) -> None:
    listing = await kube.list(pod_path(namespace))
    version = str(listing["metadata"]["resourceVersion"])
    created = await kube.create(pod_path(namespace), big_pod("big"))
    seen: list[tuple[str, int]] = []
    path = pod_path(namespace)
    async for event in kube.watch(path, resource_version=version, timeout_seconds=10):
        if event.type == "ADDED":
            seen.append((event.object["metadata"]["uid"], _env(event.object)))
            break
    assert seen == [(created["metadata"]["uid"], BIG_BYTES)]


@pytest.fixture
async def small_buffer_kube(cluster: Cluster) -> AsyncIterator[KubeClient]:
    """A client whose HTTP session has aiohttp's default read buffer (64 KiB, so a line limit of
    128 KiB) instead of the 2 MiB kubernetes_asyncio sets: the watch must not depend on it."""
    client = await KubeClient.connect(str(cluster.kubeconfig))
    rest = client._api.rest_client
    own = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=own.connector, connector_owner=False, trust_env=True
    )
    try:
        yield client
    finally:
        await rest.pool_manager.close()
        rest.pool_manager = own
        await client.close()


async def test_watch_does_not_depend_on_the_transports_buffer_size(
    kube: KubeClient, small_buffer_kube: KubeClient, namespace: str
) -> None:
    listing = await kube.list(pod_path(namespace))
    version = str(listing["metadata"]["resourceVersion"])
    await kube.create(pod_path(namespace), big_pod("big"))
    sizes: list[int] = []
    path = pod_path(namespace)
    async for event in small_buffer_kube.watch(path, resource_version=version, timeout_seconds=10):
        if event.type == "ADDED":
            sizes.append(_env(event.object))
            break
    assert sizes == [BIG_BYTES]


async def test_reflector_takes_a_large_object_from_the_watch_without_relisting(
    kube: KubeClient, namespace: str
) -> None:
    pods: dict[str, int] = {}
    events: list[str] = []
    relists: list[int] = []

    def replace(items: list[dict[str, Any]]) -> None:
        pods.clear()
        pods.update({p["metadata"]["name"]: _env(p) for p in items})

    def apply(kind: str, pod: Mapping[str, Any]) -> None:
        events.append(f"{kind} {pod['metadata']['name']}")
        if kind == "DELETED":
            pods.pop(pod["metadata"]["name"], None)
        else:
            pods[pod["metadata"]["name"]] = _env(pod)

    reflector = Reflector(
        kube,
        pod_path(namespace),
        name="big pods",
        replace=replace,
        apply=apply,
        alive=lambda: None,
        on_relist=lambda: relists.append(1),
        max_backoff_s=0.5,
    )
    task = asyncio.create_task(reflector.run())
    try:
        await wait_for(lambda: _true(bool(relists)), timeout_s=30)
        await kube.create(pod_path(namespace), big_pod("big"))
        await wait_for(lambda: _true("ADDED big" in events), timeout_s=30)
        await kube.patch(pod_path(namespace, "big"), {"metadata": {"labels": {"seen": "twice"}}})
        await wait_for(lambda: _true("MODIFIED big" in events), timeout_s=30)
        await kube.create(pod_path(namespace), big_pod("small", 10))
        await wait_for(lambda: _true("ADDED small" in events), timeout_s=30)
        assert pods == {"big": BIG_BYTES, "small": 10}
        assert len(relists) == 1, "the large object made the loop list again"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_reflector_keeps_what_keep_makes_of_each_page(
    kube: KubeClient, namespace: str
) -> None:
    """A list of several pages reaches ``replace`` as ``keep``'s records of every object, in the
    list's order (the extender keeps a small record per pod, never the pages' JSON)."""
    names = [f"p{i}" for i in range(5)]
    for name in names:
        await kube.create(pod_path(namespace), big_pod(name, 10))
    pages: list[int] = []
    real_list = kube.list

    async def counted_list(path: str, **kwargs: Any) -> dict[str, Any]:
        page = await real_list(path, **kwargs)
        pages.append(len(page.get("items") or []))
        return page

    kept: list[list[tuple[str, int]]] = []
    reflector = Reflector(
        kube,
        pod_path(namespace),
        name="pages",
        keep=lambda pod: (pod["metadata"]["name"], _env(pod)),
        replace=kept.append,
        apply=lambda kind, pod: None,
        alive=lambda: None,
        page_size=2,
    )
    kube.list = counted_list  # type: ignore[method-assign]
    try:
        await reflector.relist()
    finally:
        del kube.list
    assert pages == [2, 2, 1]
    assert kept == [[(name, 10) for name in names]]
    assert reflector.resource_version
