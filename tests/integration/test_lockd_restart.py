"""The API server crashes and comes back while a lock is held: the lock and its token survive
(they live in etcd), calls during the outage fail as ``ApiUnavailable``, and clients and watches
recover without being recreated."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import pytest
from prometheus_client import CollectorRegistry

from devcluster.cluster import Cluster
from handoff.wire import DEFAULT_PREFIX
from kube import ApiUnavailable, KubeClient
from lockd import Holder, HolderKey, LockMetrics, NodeLocks, NodeLockView, NodeName, Outcome

NODE = NodeName("restart-node")
A = Holder(HolderKey("team/a"), "uid-a", {"assignment": '{"c":["GPU-0"]}'})
B = Holder(HolderKey("team/b"), "uid-b")
T = TypeVar("T")


async def test_lock_and_token_survive_an_apiserver_crash(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    metrics = LockMetrics(registry=CollectorRegistry())
    other = await KubeClient.connect(str(cluster.kubeconfig), timeout_s=3.0)
    holder_side = NodeLocks(kube, namespace=namespace, metrics=metrics, prefix=DEFAULT_PREFIX)
    watcher = NodeLocks(other, namespace=namespace, metrics=metrics, prefix=DEFAULT_PREFIX)
    seen: list[NodeLockView | None] = []
    watching = asyncio.create_task(watcher.watch(node=NODE, on_change=lambda v, _: seen.append(v)))
    try:
        first = await holder_side.acquire(NODE, A)
        await holder_side.release(first, outcome=Outcome.ALLOCATED)
        lock = await holder_side.acquire(NODE, A)
        assert lock.token == 2

        await asyncio.to_thread(cluster.kill_component, "kube-apiserver")
        with pytest.raises(ApiUnavailable) as caught:
            await watcher.inspect(NODE)
        assert caught.value.__cause__ is not None
        await asyncio.to_thread(cluster.restart_apiserver)

        view = await watcher.inspect(NODE)  # the same client, reconnected
        assert view is not None
        assert view.record.holder == A
        assert view.record.token == lock.token
        renewed = await holder_side.renew(lock)  # its resourceVersion is still current
        await holder_side.release(renewed, outcome=Outcome.ALLOCATED)

        # the watch came back by itself and sees the release
        await wait_until(
            lambda: watcher.view(NODE), lambda v: v is not None and not v.record.holder
        )
        assert any(v is not None and v.record.holder is None and v.record.token == 2 for v in seen)
        after = await watcher.acquire(NODE, B)
        assert after.token == lock.token + 1
    finally:
        watching.cancel()
        await other.close()


async def wait_until(
    get: Callable[[], T], ok: Callable[[T], bool], *, timeout_s: float = 60.0
) -> T:
    """Poll ``get()`` until ``ok`` holds (``timeout_s`` is a bound, not a measurement)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not ok(value := get()):
        if loop.time() > deadline:
            raise AssertionError(f"not reached within {timeout_s}s: {value!r}")
        await asyncio.sleep(0.05)
    return value
