"""What the demo and the handoff benchmark measure (``nodelock.measure``), against the real API
server: the pod and node-lock watchers fill the timeline as things happen."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from prometheus_client import CollectorRegistry

from handoff.wire import DEFAULT_PREFIX
from kube.client import KubeClient, pod_path
from lockd.locks import NodeLocks
from lockd.metrics import LockMetrics
from lockd.model import Holder, HolderKey, NodeName, Outcome
from nodelock.measure import Timeline, watch_leases, watch_pods
from tests.integration.extender_kit import pod_body, wait_for

pytestmark = pytest.mark.integration


async def _true(value: bool) -> bool:
    return value


async def test_watchers_record_pods_and_lock_holds(kube: KubeClient, namespace: str) -> None:
    tl = Timeline()
    tasks = [
        asyncio.create_task(watch_pods(kube, tl, namespace)),
        asyncio.create_task(watch_leases(kube, tl, namespace)),
    ]
    locks = NodeLocks(
        kube,
        namespace=namespace,
        prefix=DEFAULT_PREFIX,
        metrics=LockMetrics(registry=CollectorRegistry()),
    )
    try:
        await kube.create(pod_path(namespace), pod_body("p", test=namespace))
        key = f"{namespace}/p"
        await wait_for(lambda: _true(key in tl.first_seen and key in tl.pods), timeout_s=30)
        held = await locks.acquire(NodeName("n1"), Holder(HolderKey(key), "uid-p"))
        await wait_for(lambda: _true(tl.lock_since.get("n1", ("", 0.0))[0] == key), timeout_s=30)
        await locks.release(held, outcome=Outcome.ALLOCATED)
        await wait_for(lambda: _true(len(tl.holds) == 1), timeout_s=30)
        node, holder, t0, t1 = tl.holds[0]
        assert (node, holder) == ("n1", key)
        assert 0 <= t0 <= t1
        await kube.delete(pod_path(namespace, "p"))
        await wait_for(lambda: _true(key not in tl.pods), timeout_s=60)
        assert key in tl.first_seen  # the timeline keeps what it saw
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
