"""A bind within kube-scheduler's timeout against the real kube-apiserver: one deadline from the
request's arrival, a caller that left, a pod bound elsewhere while its bind waited.

The Lease writes go to the API server as sent; ``LeaseWriteHook`` only moves the extender's
injected clock while one is in flight, or holds one in flight until the test lets it go.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from kube.client import KubeClient, pod_path
from kube.errors import NotFound
from lockd.metrics import LockMetrics
from lockd.model import Holder, HolderKey, NodeLockView, NodeName
from scheduler_ext.service import Extender, Settings
from tests.integration.extender_kit import (
    FakeClock,
    LeaseWriteHook,
    bind_directly,
    binding_args,
    create_gpu_node,
    create_pod,
    delete_nodes,
    lease,
    lease_annotations,
    new_locks,
    pod_body,
    release_as_device_plugin,
    running_extender,
    wait_for,
)

HTTP_TIMEOUT_S = 10.0


@pytest.fixture
async def nodes(kube: KubeClient, namespace: str) -> AsyncIterator[list[str]]:
    made: list[str] = []
    yield made
    await delete_nodes(kube, made)


async def gpu_node(kube: KubeClient, nodes: list[str], test: str, gpus: int) -> str:
    name = f"{test}-gpu-{len(nodes)}"
    nodes.append(name)
    await create_gpu_node(kube, name, test=test, gpus=gpus)
    return name


@contextlib.asynccontextmanager
async def extender_on(
    client: KubeClient, namespace: str, clock: FakeClock | None = None
) -> AsyncIterator[Extender]:
    kw: dict[str, Any] = {} if clock is None else {"clock": clock}
    ext = Extender(
        client,
        Settings(port=0, lock_namespace=namespace, scheduler_http_timeout_s=HTTP_TIMEOUT_S),
        registry=CollectorRegistry(),
        lock_metrics=LockMetrics(registry=CollectorRegistry()),
        **kw,
    )
    await ext.start()
    try:
        yield ext
    finally:
        await ext.stop()


async def post_bind(ext: Extender, args: dict[str, str]) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{ext.url}/bind", json=args) as resp,
    ):
        assert resp.status == 200
        return str((await resp.json())["Error"])


async def node_known(ext: Extender, node: str) -> bool:
    return ext.cache.node(NodeName(node)) is not None


async def bound_to(kube: KubeClient, namespace: str, name: str) -> str | None:
    node = (await kube.get(pod_path(namespace, name)))["spec"].get("nodeName")
    return str(node) if node else None


async def test_a_slow_lease_write_ends_the_bind_before_kube_schedulers_timeout(
    kube: KubeClient, namespace: str, nodes: list[str]
) -> None:
    """The acquire's Lease write answers 9.9 s (on the extender's clock) after the request
    arrived: the bind is past its deadline (10 s less the slack) once it holds the lock, so it
    releases the lock and sends no binding, answering before kube-scheduler gives up."""
    node = await gpu_node(kube, nodes, namespace, 2)
    pod = await create_pod(kube, namespace, pod_body("slow", test=namespace, gpus=1))
    clock = FakeClock()
    arrived = clock.now

    def slow_first_write(n: int) -> None:
        if n == 1:
            clock.now += 9.9

    async with extender_on(LeaseWriteHook(kube, after=slow_first_write), namespace, clock) as ext:
        await wait_for(lambda: node_known(ext, node))
        error = await post_bind(ext, binding_args(pod, node))
        answered_after = clock.now - arrived
    assert "past its deadline" in error, error
    assert "httpTimeout of 10s" in error, error
    assert "released the lock" in error, error
    assert answered_after < HTTP_TIMEOUT_S
    assert await bound_to(kube, namespace, "slow") is None
    ann = lease_annotations(await lease(kube, namespace, node))
    assert ann["nodelock.io/last-holder"] == f"{namespace}/slow"
    assert ann["nodelock.io/last-outcome"] == "bind-failed"
    assert not (await lease(kube, namespace, node))["spec"].get("holderIdentity")


async def test_a_caller_that_leaves_while_the_acquire_is_in_flight_gets_no_binding(
    kube: KubeClient, namespace: str, nodes: list[str]
) -> None:
    """kube-scheduler disconnects while the bind's Lease write is on its way.  The write lands
    (it was sent), but nothing after it is sent for that caller: no binding; the lock goes back."""
    node = await gpu_node(kube, nodes, namespace, 2)
    pod = await create_pod(kube, namespace, pod_body("gone", test=namespace, gpus=1))
    in_flight, let_go = asyncio.Event(), asyncio.Event()

    async def hold_first_write(n: int) -> None:
        if n == 1:
            in_flight.set()
            await let_go.wait()

    async with extender_on(LeaseWriteHook(kube, before=hold_first_write), namespace) as ext:
        await wait_for(lambda: node_known(ext, node))
        caller = asyncio.create_task(post_bind(ext, binding_args(pod, node)))

        async def writing() -> bool:
            return in_flight.is_set()

        await wait_for(writing)
        caller.cancel()  # kube-scheduler's httpTimeout: the connection is closed
        with contextlib.suppress(asyncio.CancelledError):
            await caller
        errors = ext.metrics.requests.labels("bind", "error")

        async def seen_gone() -> bool:
            return bool(errors._value.get() == 1.0)

        await wait_for(seen_gone)  # the server saw its caller leave
        let_go.set()

        async def released() -> bool:
            try:
                ann = lease_annotations(await lease(kube, namespace, node))
            except NotFound:  # the held write has not landed yet
                return False
            return ann.get("nodelock.io/last-outcome") == "bind-failed"

        await wait_for(released)
        # the extender's own view: the lock is free again
        await wait_for(lambda: _free(ext.locks.view(NodeName(node))))
    assert await bound_to(kube, namespace, "gone") is None
    ann = lease_annotations(await lease(kube, namespace, node))
    assert ann["nodelock.io/last-holder"] == f"{namespace}/gone"


async def _free(view: NodeLockView | None) -> bool:
    return view is not None and view.record.holder is None


async def test_a_pod_bound_elsewhere_while_its_bind_waited_takes_no_lease_write(
    kube: KubeClient, namespace: str, nodes: list[str]
) -> None:
    """A retry of the pod was bound to node A while its bind to node B waited its turn there:
    once B's lock is free the bind fails from the cache, without taking B's lock (a token for a
    bound pod would end in a 409 and a bind-failed release, forcing the next bind on B to list
    the node's pods)."""
    a = await gpu_node(kube, nodes, namespace, 2)
    b = await gpu_node(kube, nodes, namespace, 2)
    pod = await create_pod(kube, namespace, pod_body("retried", test=namespace, gpus=1))
    other = await create_pod(kube, namespace, pod_body("holder", test=namespace, gpus=1))
    locks = new_locks(kube, namespace)
    holder = Holder(HolderKey(f"{namespace}/holder"), other["metadata"]["uid"], {})
    held = await locks.acquire(NodeName(b), holder)
    async with running_extender(kube, namespace) as ext:
        await wait_for(lambda: node_known(ext, b))

        async def holder_seen() -> bool:
            view = ext.locks.view(NodeName(b))
            return view is not None and view.record.holder is not None

        await wait_for(holder_seen)
        waiting = asyncio.create_task(post_bind(ext, binding_args(pod, b)))

        async def queued() -> bool:
            return ext.binder.queues.depth(NodeName(b)) == 1

        await wait_for(queued)
        await bind_directly(kube, pod, a)  # the retry, bound by another replica

        async def seen_bound() -> bool:
            state = ext.cache.pod(pod["metadata"]["uid"])
            return state is not None and state.node == a

        await wait_for(seen_bound)
        await release_as_device_plugin(locks, b)
        error = await asyncio.wait_for(waiting, 30)
    assert f"was bound to {a} while this bind waited its turn on {b}" in error, error
    after = await lease(kube, namespace, b)
    assert after["spec"]["leaseTransitions"] == held.token  # no new token was taken
    ann = lease_annotations(after)
    assert ann["nodelock.io/last-holder"] == f"{namespace}/holder"
    assert ann["nodelock.io/last-outcome"] == "allocated"
    assert await bound_to(kube, namespace, "retried") == a
