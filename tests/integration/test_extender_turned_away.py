"""A pod filter turned away on a stale picture is asked for again once the picture has the room.

The REAL kube-scheduler of devcluster, with one extender replica in this process whose pod watch
the test holds back: kube-scheduler sees a bound pod deleted and retries the pending pod at once,
the extender still counts the deleted pod's GPU and turns the pending pod away again, and nothing
else happens on the cluster.  kube-scheduler would then leave the pod in its unschedulable queue
for five minutes (``DefaultPodMaxInUnschedulablePodsDuration``); the extender updates the pod
when its watch delivers the deletion (``scheduler_ext/retries.py``), and kube-scheduler binds it.

`core`: kube-scheduler's requeue of an updated unschedulable pod is its own behaviour, so
`make test` holds it to the oldest supported release too.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from devcluster.cluster import Cluster
from kube.client import KubeClient, namespace_path, pod_path
from kube.errors import NotFound
from lockd.metrics import LockMetrics
from scheduler_ext.config import extender_entry
from scheduler_ext.metrics import Verb
from scheduler_ext.service import Extender, Settings
from tests.integration.extender_kit import (
    Releaser,
    bound,
    create_gpu_node,
    create_pod,
    delete_nodes,
    pod_body,
    unschedulable_message,
    wait_for,
)

pytestmark = [pytest.mark.core]


class HeldPodEvents:
    """Wraps the extender cache's ``apply_pod``: while ``held``, pod watch events are kept back
    (in order) instead of applied; ``let_go`` applies them.  A watch that lags, on purpose."""

    def __init__(self, apply: Callable[[str, Mapping[str, Any]], None]) -> None:
        self._apply = apply
        self.held = False
        self.kept: list[tuple[str, Mapping[str, Any]]] = []

    def __call__(self, kind: str, obj: Mapping[str, Any]) -> None:
        if self.held:
            self.kept.append((kind, obj))
        else:
            self._apply(kind, obj)

    def let_go(self) -> None:
        self.held = False
        kept, self.kept = self.kept, []
        for kind, obj in kept:
            self._apply(kind, obj)


@pytest.fixture
async def lagging(
    cluster: Cluster, kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Extender, HeldPodEvents, str]]:
    """One extender whose pod events the test can hold back, behind kube-scheduler."""
    lock_ns = f"locks-{secrets.token_hex(4)}"
    await kube.create(
        namespace_path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": lock_ns}}
    )
    ext = Extender(
        kube,
        Settings(port=0, lock_namespace=lock_ns, ask_again=True),
        registry=CollectorRegistry(),
        lock_metrics=LockMetrics(registry=CollectorRegistry()),
    )
    held = HeldPodEvents(ext.cache.apply_pod)
    monkeypatch.setattr(ext.cache, "apply_pod", held)  # before start: its reflector calls this
    await ext.start()
    try:
        entry = extender_entry(ext.url, node_cache_capable=True)
        await asyncio.to_thread(cluster.restart_scheduler, {"extenders": [entry]})
        try:
            yield ext, held, lock_ns
        finally:
            await asyncio.to_thread(cluster.restart_scheduler, {})
    finally:
        await ext.stop()
        with contextlib.suppress(NotFound):
            await kube.delete(namespace_path(lock_ns))


def _filters(ext: Extender) -> float:
    return sum(
        sample.value
        for metric in ext.metrics.requests.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels["verb"] == Verb.FILTER.value
    )


def _asked(ext: Extender) -> float:
    return sum(
        sample.value
        for metric in ext.metrics.asked_again.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels["result"] == "asked"
    )


async def test_a_pod_turned_away_on_a_stale_picture_is_asked_for_again_when_room_appears(
    lagging: tuple[Extender, HeldPodEvents, str], kube: KubeClient, namespace: str
) -> None:
    ext, held, lock_ns = lagging
    node = f"{namespace}-n0"
    # kube-scheduler counts 2 GPUs here, the extender 1 healthy one: only the extender turns
    # the second pod away
    await create_gpu_node(kube, node, test=namespace, gpus=2, unhealthy=(1,))
    try:
        async with Releaser(kube, lock_ns):
            first = pod_body("first", test=namespace, gpus=1, scheduler="default-scheduler")
            await create_pod(kube, namespace, first)
            first_pod = await wait_for(lambda: bound(kube, namespace, "first"))
            assert first_pod["spec"]["nodeName"] == node
            second = pod_body("second", test=namespace, gpus=1, scheduler="default-scheduler")
            await create_pod(kube, namespace, second)
            message = await wait_for(lambda: unschedulable_message(kube, namespace, "second"))
            assert "node has 0 free GPUs of 1" in message, message
            await asyncio.sleep(3)  # past the pod's back-off: the deletion retries it at once
            assert await bound(kube, namespace, "second") is None
            filters = _filters(ext)
            held.held = True
            await kube.delete(pod_path(namespace, "first"), grace_period_seconds=0)
            # kube-scheduler retried the pod; the extender, not yet told of the deletion,
            # turned it away again
            await wait_for(lambda: _later(filters, ext), timeout_s=30)
            await asyncio.sleep(1)
            assert await bound(kube, namespace, "second") is None
            assert any(kind == "DELETED" for kind, _ in held.kept), held.kept
            held.let_go()
            placed = await wait_for(lambda: bound(kube, namespace, "second"), timeout_s=30)
            assert placed["spec"]["nodeName"] == node
            assert _asked(ext) >= 1
            annotations = placed["metadata"].get("annotations") or {}
            assert annotations.get("nodelock.io/room-seen", "").startswith(f"{node} ")
    finally:
        await delete_nodes(kube, [node])


async def _later(filters: float, ext: Extender) -> bool:
    return _filters(ext) > filters
