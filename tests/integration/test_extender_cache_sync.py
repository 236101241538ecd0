"""The extender's watch-fed cache against the real API server: list, watch, relist on 410."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from kube.client import KubeClient, node_path, pod_path
from kube.reflector import Reflector
from lockd.model import NodeName
from scheduler_ext.cache import ClusterCache
from scheduler_ext.service import Extender
from tests.integration.extender_kit import (
    create_gpu_node,
    create_pod,
    delete_nodes,
    pod_body,
    running_extender,
    wait_for,
)


@pytest.fixture
async def extender(kube: KubeClient, namespace: str) -> AsyncIterator[Extender]:
    async with running_extender(kube, namespace) as ext:
        yield ext


async def test_cache_follows_nodes_and_pods(
    kube: KubeClient, namespace: str, extender: Extender
) -> None:
    node = f"{namespace}-sync"
    cache = extender.cache
    try:
        await create_gpu_node(kube, node, test=namespace, gpus=4)
        await wait_for(lambda: _has_devices(cache, node, 4))
        pod = await create_pod(kube, namespace, pod_body("p", test=namespace, gpus=2))
        uid = pod["metadata"]["uid"]
        await wait_for(lambda: _async(cache.pod(uid) is not None))
        # bound with an assignment (as bind writes it): its devices are taken
        assignment = {"main": [f"GPU-{node}-1", f"GPU-{node}-3"]}
        await kube.create(
            pod_path(namespace, "p", subresource="binding"),
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {
                    "name": "p",
                    "annotations": {"nodelock.io/assignment": json.dumps(assignment)},
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            },
        )
        await wait_for(lambda: _taken(cache, node, {f"GPU-{node}-1", f"GPU-{node}-3"}))
        assert cache.seen_bound_or_gone(uid)
        # terminal: freed
        await kube.patch(
            pod_path(namespace, "p", subresource="status"), {"status": {"phase": "Succeeded"}}
        )
        await wait_for(lambda: _taken(cache, node, set()))
        # inventory changes are seen (a device turns unhealthy)
        gpus = json.loads(
            (await kube.get(node_path(node)))["metadata"]["annotations"]["nodelock.io/gpus"]
        )
        gpus[0]["healthy"] = False
        await kube.patch(
            node_path(node), {"metadata": {"annotations": {"nodelock.io/gpus": json.dumps(gpus)}}}
        )
        await wait_for(lambda: _free(cache, node, 3))
        await kube.delete(pod_path(namespace, "p"))
        await wait_for(lambda: _async(cache.is_gone(uid)))
    finally:
        await delete_nodes(kube, [node])
    await wait_for(lambda: _async(cache.node(NodeName(node)) is None))
    assert (cache.staleness_s("pods") or 0.0) < 60


async def _async(value: bool) -> bool:
    return value


async def _has_devices(cache: ClusterCache, node: str, n: int) -> bool:
    state = cache.node(NodeName(node))
    return state is not None and len(state.devices) == n


async def _taken(cache: ClusterCache, node: str, devices: set[str]) -> bool:
    gpus = cache.node_gpus(NodeName(node))
    return gpus is not None and set(gpus.taken) == devices


async def _free(cache: ClusterCache, node: str, n: int) -> bool:
    gpus = cache.node_gpus(NodeName(node))
    return gpus is not None and len(gpus.free) == n


async def test_watch_that_brings_nothing_relists(kube: KubeClient, namespace: str) -> None:
    cache = ClusterCache()
    relists: list[int] = []

    def relisted() -> None:
        relists.append(1)
        if len(relists) == 1:
            # a pod deleted while "the stream was down" must disappear with the next relist
            cache.apply_pod(
                "ADDED", {"metadata": {"name": "ghost", "namespace": namespace, "uid": "g"}}
            )
            # a version the server has not reached: it answers nothing (no error, no bookmark)
            reflector.resource_version = "999999999"

    reflector = Reflector(
        kube,
        pod_path(namespace),
        name="pods",
        replace=cache.replace_pods,
        apply=cache.apply_pod,
        alive=lambda: cache.mark_alive("pods"),
        on_relist=relisted,
        watch_timeout_s=2,
    )
    task = asyncio.create_task(reflector.run())
    try:
        await wait_for(lambda: _async(len(relists) >= 2), timeout_s=30)
        await wait_for(lambda: _async(cache.is_gone("g")), timeout_s=30)
        pod = await create_pod(kube, namespace, pod_body("after", test=namespace, gpus=1))
        await wait_for(lambda: _async(cache.pod(pod["metadata"]["uid"]) is not None))
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
