"""Test support for the extender's integration tests: GPU Node objects, pods, in-process replicas.

Nodes here are plain Node objects made by the test (inventory annotation, allocatable, Ready),
labelled with the test's namespace so that pods select only them; no kubelet runs, so bound pods
stay Pending, which is all a scheduling test needs.  ``Releaser`` plays the device plugin's part
of the handoff (release the lock once its holder is bound, outcome ``allocated``) through the real
``lockd.NodeLocks``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from handoff.wire import DEFAULT_PREFIX, GPU, DeviceID, format_inventory, parse_assignment
from kube.client import JSON, Body, KubeClient, Query, node_path, pod_path
from kube.errors import NotFound
from lockd.errors import LockError
from lockd.locks import NodeLocks
from lockd.metrics import LockMetrics
from lockd.model import HeldLock, NodeName, Outcome
from scheduler_ext.service import Extender, Settings

RES = "nvidia.com/gpu"
TEST_LABEL = "nodelock.io/test"
NO_SCHEDULER = "nodelock-test-nobody"  # pods with this schedulerName are bound only by the test
TOLERATE_UNHEALTHY_NODES = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoSchedule"},
]


def device_ids(node: str, n: int) -> list[str]:
    return [f"GPU-{node}-{i}" for i in range(n)]


async def create_gpu_node(
    kube: KubeClient,
    name: str,
    *,
    test: str,
    gpus: int,
    unhealthy: tuple[int, ...] = (),
    allocatable: int | None = None,
    inventory: bool = True,
) -> None:
    """A Ready Node with ``gpus`` devices in its inventory annotation and allocatable."""
    annotations = {}
    if inventory:
        annotations["nodelock.io/gpus"] = format_inventory(
            [
                GPU(DeviceID(d), i, "NVIDIA H100 80GB HBM3", 81559, i // 4, i not in unhealthy)
                for i, d in enumerate(device_ids(name, gpus))
            ]
        )
    await kube.create(
        node_path(),
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {TEST_LABEL: test}, "annotations": annotations},
        },
    )
    count = str(gpus if allocatable is None else allocatable)
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", RES: count}
    await kube.patch(
        node_path(name, subresource="status"),
        {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "made by the test",
                    }
                ],
            }
        },
    )


async def delete_nodes(kube: KubeClient, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(NotFound):
            await kube.delete(node_path(name))


def pod_body(
    name: str,
    *,
    test: str,
    gpus: int = 1,
    init_gpus: int = 0,
    scheduler: str = NO_SCHEDULER,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/none"}
    if gpus:
        container["resources"] = {"limits": {RES: str(gpus)}}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "nodeSelector": {TEST_LABEL: test},
        "tolerations": TOLERATE_UNHEALTHY_NODES,
        "containers": [container],
        "terminationGracePeriodSeconds": 0,
    }
    if init_gpus:
        spec["initContainers"] = [
            {
                "name": "setup",
                "image": "registry.invalid/none",
                "resources": {"limits": {RES: str(init_gpus)}},
            }
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def create_pod(kube: KubeClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    return await kube.create(pod_path(namespace), body)


def binding_args(pod: Mapping[str, Any], node: str) -> dict[str, str]:
    """The ExtenderBindingArgs kube-scheduler would send for ``pod`` on ``node``."""
    meta = pod["metadata"]
    return {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": node,
    }


def assignment_of(pod: Mapping[str, Any]) -> dict[str, list[str]]:
    raw = (pod["metadata"].get("annotations") or {}).get("nodelock.io/assignment")
    return {str(k): [str(d) for d in v] for k, v in parse_assignment(raw).items()}


def devices_in(pod: Mapping[str, Any]) -> set[str]:
    return {d for ids in assignment_of(pod).values() for d in ids}


async def bound(kube: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod, once bound to a node (None before)."""
    pod = await kube.get(pod_path(namespace, name))
    return pod if pod["spec"].get("nodeName") else None


async def unschedulable_message(kube: KubeClient, namespace: str, name: str) -> str | None:
    """kube-scheduler's message on the pod's ``PodScheduled=False, Unschedulable`` condition."""
    pod = await kube.get(pod_path(namespace, name))
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message", ""))
    return None


async def wait_for(predicate: Any, *, timeout_s: float = 60.0, every_s: float = 0.1) -> Any:
    """Poll ``await predicate()`` until it returns something truthy; fail after the timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = await predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s: {predicate}")
        await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def running_extender(
    kube: KubeClient, lock_namespace: str, **settings: Any
) -> AsyncIterator[Extender]:
    """An extender replica in this process, on a free loopback port, its caches listed."""
    ext = Extender(
        kube,
        Settings(port=0, lock_namespace=lock_namespace, **settings),
        registry=CollectorRegistry(),
        lock_metrics=LockMetrics(registry=CollectorRegistry()),
    )
    await ext.start()
    try:
        yield ext
    finally:
        await ext.stop()


def new_locks(kube: KubeClient, namespace: str, **kw: Any) -> NodeLocks:
    """A ``NodeLocks`` of its own (another process, as far as lock state goes)."""
    kw.setdefault("prefix", DEFAULT_PREFIX)
    return NodeLocks(
        kube, namespace=namespace, metrics=LockMetrics(registry=CollectorRegistry()), **kw
    )


async def release_as_device_plugin(locks: NodeLocks, node: str) -> str | None:
    """Release ``node``'s lock with outcome ``allocated``, as the device plugin does after the
    holder's last container; returns the holder released (None when the lock was free)."""
    view = await locks.inspect(NodeName(node))
    if view is None or view.record.holder is None:
        return None
    holder = view.record.holder
    held = HeldLock(view.node, holder, view.record.token, view.record.resource_version)
    await locks.release(held, outcome=Outcome.ALLOCATED)
    return str(holder.key)


class Releaser:
    """Plays the device plugin's part: releases each lock whose holder pod is bound to the node."""

    def __init__(self, kube: KubeClient, lock_namespace: str) -> None:
        self.kube = kube
        self.locks = new_locks(kube, lock_namespace)
        self.released: list[tuple[str, int]] = []  # (holder, token)
        self._task: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            for view in self.locks.views():
                holder = view.record.holder
                if holder is None:
                    continue
                ns, _, name = holder.key.partition("/")
                try:
                    pod = await self.kube.get(pod_path(ns, name))
                except NotFound:
                    continue
                if pod["spec"].get("nodeName") != view.node:
                    continue
                lock = HeldLock(view.node, holder, view.record.token, view.record.resource_version)
                with contextlib.suppress(LockError):
                    await self.locks.release(lock, outcome=Outcome.ALLOCATED)
                    self.released.append((holder.key, view.record.token))
            await asyncio.sleep(0.05)

    async def __aenter__(self) -> Releaser:
        self._watch = asyncio.create_task(self.locks.watch())
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in (self._task, self._watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


async def lease(kube: KubeClient, namespace: str, node: str) -> dict[str, Any]:
    return await kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{node}")


def lease_annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def node_of(name: str) -> NodeName:
    return NodeName(name)


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


class FakeClock:
    """A monotonic clock the test moves by hand (the extender's ``clock``)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class LeaseWriteHook(KubeClient):
    """The real client to the real API server, with a hook around each Lease write (create or
    update): ``before`` runs before it is sent, ``after`` once the API server answered — a test
    makes a write slow on an injected clock, or holds it in flight.  Nothing is faked: every
    request reaches the API server as sent."""

    def __init__(
        self,
        inner: KubeClient,
        *,
        before: Callable[[int], Awaitable[None]] | None = None,
        after: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(inner._api, timeout_s=inner._timeout_s)
        self._before = before
        self._after = after
        self.lease_writes = 0

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Body | None = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
    ) -> JSON:
        write = method in ("POST", "PUT") and "/leases" in path
        if write:
            self.lease_writes += 1
            if self._before is not None:
                await self._before(self.lease_writes)
        answer = await super().request(
            method, path, query=query, body=body, content_type=content_type, timeout_s=timeout_s
        )
        if write and self._after is not None:
            self._after(self.lease_writes)
        return answer


async def bind_directly(kube: KubeClient, pod: Mapping[str, Any], node: str) -> None:
    """Bind ``pod`` to ``node`` with a plain ``pods/binding`` (another scheduler's retry)."""
    meta = pod["metadata"]
    await kube.create(
        pod_path(meta["namespace"], meta["name"], subresource="binding"),
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
    )
