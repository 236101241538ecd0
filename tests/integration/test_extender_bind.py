"""The extender's bind against the real kube-apiserver: one annotated binding under a node lock.

kube-scheduler is not involved here: the tests send the ``ExtenderBindingArgs`` it would send, to
the extender's HTTP endpoint (or to a replica's binder), and check what landed in the API server.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client import CollectorRegistry

from devcluster.cluster import Cluster
from kube.client import KubeClient, event_path, node_path, pod_path
from lockd.metrics import LockMetrics
from lockd.model import Holder, HolderKey, NodeName
from scheduler_ext.binder import Binder
from scheduler_ext.cache import ClusterCache
from scheduler_ext.events import NOTICE_AFTER_S
from scheduler_ext.metrics import ExtenderMetrics
from scheduler_ext.protocol import BindingArgs
from scheduler_ext.service import Extender, Settings
from tests.integration.extender_kit import (
    binding_args,
    create_gpu_node,
    create_pod,
    delete_nodes,
    device_ids,
    devices_in,
    lease,
    lease_annotations,
    new_locks,
    pod_body,
    release_as_device_plugin,
    running_extender,
    wait_for,
)


@pytest.fixture
async def nodes(kube: KubeClient, namespace: str) -> AsyncIterator[list[str]]:
    """Names of the Node objects a test creates (deleted afterwards)."""
    made: list[str] = []
    yield made
    await delete_nodes(kube, made)


async def gpu_node(kube: KubeClient, nodes: list[str], test: str, gpus: int, **kw: Any) -> str:
    name = f"{test}-gpu-{len(nodes)}"
    nodes.append(name)
    await create_gpu_node(kube, name, test=test, gpus=gpus, **kw)
    return name


@pytest.fixture
async def extender(kube: KubeClient, namespace: str) -> AsyncIterator[Extender]:
    async with running_extender(kube, namespace) as ext:
        yield ext


async def post_bind(ext: Extender, args: dict[str, str]) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{ext.url}/bind", json=args) as resp,
    ):
        assert resp.status == 200
        body = await resp.json()
    assert set(body) == {"Error"}
    return str(body["Error"])


async def get_pod(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    return await kube.get(pod_path(namespace, name))


async def test_bind_writes_assignment_token_and_binding_in_one_write(
    kube: KubeClient, namespace: str, nodes: list[str], extender: Extender
) -> None:
    node = await gpu_node(kube, nodes, namespace, 4)
    pod = await create_pod(kube, namespace, pod_body("train", test=namespace, gpus=2, init_gpus=1))
    await wait_for(lambda: _known(extender, node))
    assert await post_bind(extender, binding_args(pod, node)) == ""

    bound = await get_pod(kube, namespace, "train")
    assert bound["spec"]["nodeName"] == node
    ann = bound["metadata"]["annotations"]
    ids = device_ids(node, 4)
    # init container first, a subset of the app container's devices; lowest indices first
    expected = f'{{"setup":["{ids[0]}"],"main":["{ids[0]}","{ids[1]}"]}}'
    assert ann["nodelock.io/assignment"] == expected
    assert len(ann["nodelock.io/bound-at"]) == len("2026-07-01T12:00:00.000000Z")
    lock = await lease(kube, namespace, node)
    assert lock["spec"]["holderIdentity"] == f"{namespace}/train"
    assert ann["nodelock.io/token"] == str(lock["spec"]["leaseTransitions"])
    lock_ann = lease_annotations(lock)
    assert lock_ann["nodelock.io/holder-uid"] == pod["metadata"]["uid"]
    assert lock_ann["nodelock.io/assignment"] == ann["nodelock.io/assignment"]


async def _known(ext: Extender, node: str) -> bool:
    return ext.cache.node(NodeName(node)) is not None


async def test_two_binds_to_one_node_at_once_one_wins_the_other_names_the_holder(
    kube: KubeClient, namespace: str, nodes: list[str], extender: Extender
) -> None:
    node = await gpu_node(kube, nodes, namespace, 8)
    a = await create_pod(kube, namespace, pod_body("a", test=namespace, gpus=2))
    b = await create_pod(kube, namespace, pod_body("b", test=namespace, gpus=2))
    await wait_for(lambda: _known(extender, node))
    errors = await asyncio.gather(
        post_bind(extender, binding_args(a, node)), post_bind(extender, binding_args(b, node))
    )
    assert sorted(e == "" for e in errors) == [False, True]
    winner, loser = ("a", "b") if errors[0] == "" else ("b", "a")
    message = errors[1] if errors[0] == "" else errors[0]
    assert f"lock held by {namespace}/{winner}" in message
    assert "fencing token" in message
    assert "the scheduler will retry" in message
    lost = await get_pod(kube, namespace, loser)
    assert not lost["spec"].get("nodeName")
    assert "nodelock.io/assignment" not in (lost["metadata"].get("annotations") or {})
    # the loser changed nothing: the lock is still the winner's
    lock = await lease(kube, namespace, node)
    assert lock["spec"]["holderIdentity"] == f"{namespace}/{winner}"
    assert extender.metrics.contention._value.get() == 1.0


async def test_pod_without_gpus_is_bound_without_lock_or_annotations(
    kube: KubeClient, namespace: str, nodes: list[str], extender: Extender
) -> None:
    node = await gpu_node(kube, nodes, namespace, 2)
    pod = await create_pod(kube, namespace, pod_body("web", test=namespace, gpus=0))
    await wait_for(lambda: _known(extender, node))
    assert await post_bind(extender, binding_args(pod, node)) == ""
    bound = await get_pod(kube, namespace, "web")
    assert bound["spec"]["nodeName"] == node
    assert "nodelock.io/assignment" not in (bound["metadata"].get("annotations") or {})
    assert extender.locks.view(NodeName(node)) is None


async def test_bind_refusals_name_the_reason_and_take_no_lock(
    kube: KubeClient, namespace: str, nodes: list[str], extender: Extender
) -> None:
    node = await gpu_node(kube, nodes, namespace, 2)
    pod = await create_pod(kube, namespace, pod_body("big", test=namespace, gpus=3))
    small = await create_pod(kube, namespace, pod_body("small", test=namespace, gpus=1))
    await wait_for(lambda: _known(extender, node))
    assert "pod needs 3" in await post_bind(extender, binding_args(pod, node))
    assert "not in the GPU extender's cache" in await post_bind(
        extender, binding_args(small, "no-such-node")
    )
    wrong_uid = binding_args(small, node) | {"PodUID": "00000000-0000-0000-0000-000000000000"}
    assert "has UID" in await post_bind(extender, wrong_uid)
    gone = binding_args(small, node) | {"PodName": "nobody"}
    assert "not found" in await post_bind(extender, gone)
    assert extender.locks.view(NodeName(node)) is None
    assert await post_bind(extender, binding_args(small, node)) == ""
    assert "already bound" in await post_bind(extender, binding_args(small, node))


async def _restricted_kubeconfig(cluster: Cluster, kube: KubeClient, namespace: str) -> Path:
    """A kubeconfig for a service account that may do everything bind needs but the binding."""
    sa = "no-binding"
    await kube.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}},
    )
    name = f"nodelock-test-{namespace}"
    await kube.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods", "nodes"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "verbs": ["get", "list", "watch", "create", "update"],
                },
            ],
        },
    )
    await kube.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
        },
    )
    token = await kube.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    admin["users"] = [{"name": sa, "user": {"token": token["status"]["token"]}}]
    for ctx in admin["contexts"]:
        ctx["context"]["user"] = sa
    path = cluster.state_dir / f"{namespace}-{secrets.token_hex(3)}.kubeconfig"
    path.write_text(yaml.safe_dump(admin))
    return path


async def _delete_rbac(kube: KubeClient, namespace: str) -> None:
    name = f"nodelock-test-{namespace}"
    await kube.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}")
    await kube.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}")


async def test_a_bind_that_fails_after_taking_the_lock_releases_it(
    cluster: Cluster, kube: KubeClient, namespace: str, nodes: list[str]
) -> None:
    node = await gpu_node(kube, nodes, namespace, 2)
    pod = await create_pod(kube, namespace, pod_body("denied", test=namespace, gpus=1))
    path = await _restricted_kubeconfig(cluster, kube, namespace)
    try:
        async with (
            await KubeClient.connect(str(path)) as restricted,
            running_extender(restricted, namespace) as ext,
        ):
            await wait_for(lambda: _known(ext, node))
            error = await post_bind(ext, binding_args(pod, node))
            assert "forbidden" in error.lower()
    finally:
        await _delete_rbac(kube, namespace)
    lock = await lease(kube, namespace, node)
    assert "holderIdentity" not in lock["spec"]
    ann = lease_annotations(lock)
    assert ann["nodelock.io/last-holder"] == f"{namespace}/denied"
    assert ann["nodelock.io/last-outcome"] == "bind-failed"
    assert not (await get_pod(kube, namespace, "denied"))["spec"].get("nodeName")


def _lagging_binder(kube: KubeClient, namespace: str, cache: ClusterCache) -> Binder:
    locks = new_locks(kube, namespace)
    metrics = ExtenderMetrics(cache, registry=CollectorRegistry())
    return Binder(kube, cache, locks, metrics, duration_s=15, confirm_wait_s=0.5)


async def _frozen_cache(kube: KubeClient) -> ClusterCache:
    """A replica's cache listed once and never watched: the worst case of watch lag."""
    cache = ClusterCache()
    cache.replace_nodes((await kube.list(node_path()))["items"])
    cache.replace_pods((await kube.list(pod_path()))["items"])
    return cache


async def test_second_replica_whose_cache_missed_a_handoff_does_not_reuse_its_gpu(
    kube: KubeClient, namespace: str, nodes: list[str], extender: Extender
) -> None:
    node = await gpu_node(kube, nodes, namespace, 2)
    a = await create_pod(kube, namespace, pod_body("a", test=namespace, gpus=1))
    b = await create_pod(kube, namespace, pod_body("b", test=namespace, gpus=1))
    lagging = await _frozen_cache(kube)  # sees node and both pods, unbound
    binder = _lagging_binder(kube, namespace, lagging)

    await wait_for(lambda: _known(extender, node))
    assert await post_bind(extender, binding_args(a, node)) == ""
    a_bound = await get_pod(kube, namespace, "a")
    assert devices_in(a_bound) == {device_ids(node, 2)[0]}
    # the device plugin serves a and releases the lock (outcome allocated)
    assert await release_as_device_plugin(new_locks(kube, namespace), node) == f"{namespace}/a"

    # the lagging replica still thinks GPU 0 is free; bind must prove otherwise and choose GPU 1
    assert lagging.node_gpus(NodeName(node)) is not None
    outcome = await binder.bind(
        BindingArgs(b["metadata"]["name"], namespace, b["metadata"]["uid"], NodeName(node))
    )
    assert outcome.error == ""
    b_bound = await get_pod(kube, namespace, "b")
    assert devices_in(b_bound) == {device_ids(node, 2)[1]}
    lock = await lease(kube, namespace, node)
    assert (
        lease_annotations(lock)["nodelock.io/assignment"]
        == (b_bound["metadata"]["annotations"]["nodelock.io/assignment"])
    )
    assert b_bound["metadata"]["annotations"]["nodelock.io/token"] == str(
        lock["spec"]["leaseTransitions"]
    )
    assert binder._metrics.confirm_fallbacks._value.get() == 1.0


async def test_live_replica_confirms_from_its_cache_without_listing(
    kube: KubeClient, namespace: str, nodes: list[str]
) -> None:
    node = await gpu_node(kube, nodes, namespace, 2)
    a = await create_pod(kube, namespace, pod_body("a", test=namespace, gpus=1))
    b = await create_pod(kube, namespace, pod_body("b", test=namespace, gpus=1))
    async with running_extender(kube, namespace) as one, running_extender(kube, namespace) as two:
        await wait_for(lambda: _known(one, node))
        await wait_for(lambda: _known(two, node))
        assert await post_bind(one, binding_args(a, node)) == ""
        assert await release_as_device_plugin(one.locks, node) == f"{namespace}/a"
        # replica two refuses from its Lease watch without asking; let it see the release
        await wait_for(lambda: _lock_free(two, node))
        assert await post_bind(two, binding_args(b, node)) == ""
        assert two.metrics.confirm_fallbacks._value.get() == 0.0
    a_devices = devices_in(await get_pod(kube, namespace, "a"))
    b_devices = devices_in(await get_pod(kube, namespace, "b"))
    assert a_devices | b_devices == set(device_ids(node, 2))
    assert not a_devices & b_devices


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_expired_lock_moves_on_only_once_its_holder_left_handoff(
    kube: KubeClient, namespace: str, nodes: list[str]
) -> None:
    node = await gpu_node(kube, nodes, namespace, 4)
    stuck = await create_pod(kube, namespace, pod_body("stuck", test=namespace, gpus=1))
    y = await create_pod(kube, namespace, pod_body("y", test=namespace, gpus=1))
    z = await create_pod(kube, namespace, pod_body("z", test=namespace, gpus=1))
    clock = FakeClock()
    ext = Extender(
        kube,
        Settings(
            port=0, lock_namespace=namespace, lease_duration_s=15, apiserver_request_timeout_s=10
        ),
        registry=CollectorRegistry(),
        lock_metrics=LockMetrics(registry=CollectorRegistry()),
        clock=clock,
    )
    await ext.start()
    try:
        await wait_for(lambda: _known(ext, node))
        # "stuck" took the lock and its bind landed, but kubelet never admitted it
        assert await post_bind(ext, binding_args(stuck, node)) == ""
        clock.now += 60  # far past the lease duration on this process's clock
        error = await post_bind(ext, binding_args(y, node))
        assert f"lock held by {namespace}/stuck" in error
        # kubelet rejects it (Failed): the holder left handoff, the lock may move on
        await kube.patch(
            pod_path(namespace, "stuck", subresource="status"),
            {"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError"}},
        )
        await wait_for(lambda: _phase(ext, stuck, "Failed"))
        assert await post_bind(ext, binding_args(y, node)) == ""
        lock = await lease(kube, namespace, node)
        ann = lease_annotations(lock)
        assert ann["nodelock.io/last-holder"] == f"{namespace}/stuck"
        assert ann["nodelock.io/last-outcome"] == "taken-over"
        assert lock["spec"]["holderIdentity"] == f"{namespace}/y"
        # y's GPU is the one the failed pod had: it is free again
        assert devices_in(await get_pod(kube, namespace, "y")) == {device_ids(node, 4)[0]}
        # where admins look: y's refusal named the holder, the takeover is on the old holder
        await ext.events.recorder.flush()
        [refused] = await events_on(kube, namespace, "y", "BindRefused")
        assert f"lock held by {namespace}/stuck" in refused["message"]
        [taken] = await events_on(kube, namespace, "stuck", "NodeLockTakenOver")
        assert taken["type"] == "Warning"
        assert taken["involvedObject"]["uid"] == stuck["metadata"]["uid"]
        assert f"{node}'s GPU lock held by {namespace}/stuck" in taken["message"]
        [on_node] = await events_on(kube, "default", node, "NodeLockTakenOver")
        assert on_node["involvedObject"]["kind"] == "Node"
        # a holder that was never bound (its extender died before binding) is taken over too
        # ... but only once a binding its bind sent can no longer be applied: a third of the
        # lease duration plus the API server's request timeout plus a margin (5 + 10 + 5 s)
        await _take_lock_for(kube, namespace, node, z)
        await wait_for(lambda: _holder_is(ext, node, f"{namespace}/z"))
        late = await create_pod(kube, namespace, pod_body("late", test=namespace, gpus=1))
        clock.now += 16  # expired, not bound, but within the window
        error = await post_bind(ext, binding_args(late, node))
        assert f"lock held by {namespace}/z" in error
        clock.now += 5
        assert await post_bind(ext, binding_args(late, node)) == ""
    finally:
        await ext.stop()


async def test_a_rejected_holder_keeps_its_lock_until_expiry_an_ended_one_frees_it_at_once(
    kube: KubeClient, namespace: str, nodes: list[str]
) -> None:
    """Decision 0012, the extender's part: a holder kubelet rejected (Failed) keeps its lock
    until expiry — only the node's serving device plugin may release it sooner, and this
    cluster has none: a node whose plugin is down stays out of a burst.  A holder deleted, or
    one that Succeeded, has its lock released at once (``deleted``, ``finished``), counted, with
    the Event ``NodeLockReleased`` on it."""
    node = await gpu_node(kube, nodes, namespace, 4)
    rejected = await create_pod(kube, namespace, pod_body("rejected", test=namespace, gpus=1))
    deleted = await create_pod(kube, namespace, pod_body("deleted", test=namespace, gpus=1))
    done = await create_pod(kube, namespace, pod_body("done", test=namespace, gpus=1))
    clock = FakeClock()
    lock_registry = CollectorRegistry()
    ext = Extender(
        kube,
        Settings(
            port=0, lock_namespace=namespace, lease_duration_s=15, apiserver_request_timeout_s=10
        ),
        registry=CollectorRegistry(),
        lock_metrics=LockMetrics(registry=lock_registry),
        clock=clock,
    )

    def released(outcome: str) -> float | None:
        return lock_registry.get_sample_value("nodelock_lock_releases_total", {"outcome": outcome})

    await ext.start()
    try:
        await wait_for(lambda: _known(ext, node))
        assert await post_bind(ext, binding_args(rejected, node)) == ""
        await kube.patch(
            pod_path(namespace, "rejected", subresource="status"),
            {"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError"}},
        )
        await wait_for(lambda: _phase(ext, rejected, "Failed"))
        # the extender's own passes, as its sweep makes them: nothing to release before expiry
        assert await ext.binder.release_ended() == 0
        assert await ext.binder.release_expired_left() == 0
        assert await _holder_is(ext, node, f"{namespace}/rejected")
        error = await post_bind(ext, binding_args(deleted, node))
        assert f"lock held by {namespace}/rejected" in error
        clock.now += 16  # expired on this process's clock: the sweep releases it
        assert await ext.binder.release_expired_left() == 1
        ann = lease_annotations(await lease(kube, namespace, node))
        assert ann["nodelock.io/last-outcome"] == "expired", ann
        assert released("rejected") in (None, 0.0)

        # deleted while it holds the lock: released at once by the sweep, woken by the watch
        assert await post_bind(ext, binding_args(deleted, node)) == ""
        await kube.delete(pod_path(namespace, "deleted"), grace_period_seconds=0)
        await wait_for(lambda: _holder_is_none(ext, node), timeout_s=10)
        ann = lease_annotations(await lease(kube, namespace, node))
        assert (ann["nodelock.io/last-holder"], ann["nodelock.io/last-outcome"]) == (
            f"{namespace}/deleted",
            "deleted",
        )
        assert released("deleted") == 1

        # Succeeded while it holds the lock: released at once, ``finished``
        assert await post_bind(ext, binding_args(done, node)) == ""
        await kube.patch(
            pod_path(namespace, "done", subresource="status"), {"status": {"phase": "Succeeded"}}
        )
        await wait_for(lambda: _holder_is_none(ext, node), timeout_s=10)
        ann = lease_annotations(await lease(kube, namespace, node))
        assert (ann["nodelock.io/last-holder"], ann["nodelock.io/last-outcome"]) == (
            f"{namespace}/done",
            "finished",
        )
        assert released("finished") == 1
        await ext.events.recorder.flush()
        [on_pod] = await events_on(kube, namespace, "done", "NodeLockReleased")
        assert on_pod["involvedObject"]["uid"] == done["metadata"]["uid"]
        assert "(finished)" in on_pod["message"]
        assert await events_on(kube, namespace, "rejected", "NodeLockReleased") == []
    finally:
        await ext.stop()


async def _holder_is_none(ext: Extender, node: str) -> bool:
    view = ext.locks.view(NodeName(node))
    return view is not None and view.record.holder is None


async def events_on(kube: KubeClient, namespace: str, name: str, reason: str) -> list[Any]:
    """The Events about the object ``name`` with ``reason`` (what ``kubectl describe`` shows)."""
    selector = f"involvedObject.name={name},reason={reason}"
    items: list[Any] = (await kube.list(event_path(namespace), field_selector=selector))["items"]
    return items


async def _phase(ext: Extender, pod: dict[str, Any], phase: str) -> bool:
    state = ext.cache.pod(pod["metadata"]["uid"])
    return state is not None and state.phase.value == phase


async def _holder_is(ext: Extender, node: str, key: str) -> bool:
    view = ext.locks.view(NodeName(node))
    return view is not None and view.record.holder is not None and view.record.holder.key == key


async def _take_lock_for(kube: KubeClient, namespace: str, node: str, pod: dict[str, Any]) -> None:
    """Take ``node``'s lock for ``pod`` over (as a crashed extender would have left it)."""
    locks = new_locks(kube, namespace)
    await release_as_device_plugin(locks, node)
    holder = Holder(HolderKey(f"{namespace}/{pod['metadata']['name']}"), pod["metadata"]["uid"], {})
    await locks.acquire(NodeName(node), holder)


async def test_repeated_bind_of_a_bound_pod_keeps_its_lock_and_token(
    kube: KubeClient, namespace: str, nodes: list[str]
) -> None:
    # kube-scheduler gave up waiting on a bind that then succeeded, and asks again; the replica's
    # cache has not seen the binding yet
    node = await gpu_node(kube, nodes, namespace, 2)
    pod = await create_pod(kube, namespace, pod_body("again", test=namespace, gpus=1))
    binder = _lagging_binder(kube, namespace, await _frozen_cache(kube))
    args = BindingArgs("again", namespace, pod["metadata"]["uid"], NodeName(node))
    assert (await binder.bind(args)).error == ""
    before = await lease(kube, namespace, node)
    again = await binder.bind(args)
    assert f"already bound to {node}" in again.error
    after = await lease(kube, namespace, node)
    assert after["spec"]["leaseTransitions"] == before["spec"]["leaseTransitions"]
    assert after["spec"]["holderIdentity"] == f"{namespace}/again"
    bound = await get_pod(kube, namespace, "again")
    assert bound["metadata"]["annotations"]["nodelock.io/token"] == str(
        after["spec"]["leaseTransitions"]
    )


async def _lock_free(ext: Extender, node: str) -> bool:
    view = ext.locks.view(NodeName(node))
    return view is not None and view.record.holder is None


async def test_a_lease_deleted_mid_handoff_is_confirmed_by_listing_the_node(
    kube: KubeClient, namespace: str, nodes: list[str], extender: Extender
) -> None:
    """The Lease is deleted by hand while its holder is bound and not yet admitted; a replica
    whose cache missed that binding creates the Lease anew (token 1, no last holder).  It must
    not trust its cache then: it lists the node and leaves the holder's GPU alone."""
    node = await gpu_node(kube, nodes, namespace, 2)
    a = await create_pod(kube, namespace, pod_body("a", test=namespace, gpus=1))
    b = await create_pod(kube, namespace, pod_body("b", test=namespace, gpus=1))
    lagging = await _frozen_cache(kube)  # sees both pods unbound
    binder = _lagging_binder(kube, namespace, lagging)
    await wait_for(lambda: _known(extender, node))
    assert await post_bind(extender, binding_args(a, node)) == ""
    a_devices = devices_in(await get_pod(kube, namespace, "a"))
    await kube.delete(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{node}")

    outcome = await binder.bind(
        BindingArgs(b["metadata"]["name"], namespace, b["metadata"]["uid"], NodeName(node))
    )
    assert outcome.error == ""
    assert outcome.token == 1  # a new Lease
    b_devices = devices_in(await get_pod(kube, namespace, "b"))
    assert not a_devices & b_devices, (a_devices, b_devices)
    assert binder._metrics.confirm_fallbacks._value.get() == 1.0


async def test_a_second_bind_of_a_pod_that_holds_the_lock_fails_and_keeps_its_token(
    kube: KubeClient, namespace: str, nodes: list[str]
) -> None:
    """Hole 8: a bind of the pod is under way on one replica (it holds the lock, not yet bound)
    when kube-scheduler asks another replica to bind it again.  Re-acquiring would give the
    lock a new token that the first bind's binding does not carry; the second bind fails."""
    node = await gpu_node(kube, nodes, namespace, 2)
    pod = await create_pod(kube, namespace, pod_body("twice", test=namespace, gpus=1))
    first = new_locks(kube, namespace)
    holder = Holder(HolderKey(f"{namespace}/twice"), pod["metadata"]["uid"], {})
    held = await first.acquire(NodeName(node), holder)
    other = _lagging_binder(kube, namespace, await _frozen_cache(kube))
    await other._locks.inspect(NodeName(node))  # its Lease watch has seen the first bind's lock
    outcome = await other.bind(
        BindingArgs("twice", namespace, pod["metadata"]["uid"], NodeName(node))
    )
    assert "already holds the lock" in outcome.error
    after = await lease(kube, namespace, node)
    assert after["spec"]["leaseTransitions"] == held.token
    assert not (await get_pod(kube, namespace, "twice"))["spec"].get("nodeName")


async def test_a_bind_says_it_waits_only_once_it_has_waited_a_noticeable_while(
    kube: KubeClient, namespace: str, nodes: list[str], extender: Extender
) -> None:
    """WaitingForNodeLock on the pod: written for a bind still waiting after NOTICE_AFTER_S,
    naming the holder and how long it waited; a bind served sooner writes none."""
    node = await gpu_node(kube, nodes, namespace, 8)
    a, b, c = [
        await create_pod(kube, namespace, pod_body(n, test=namespace, gpus=1)) for n in "abc"
    ]
    await wait_for(lambda: _known(extender, node))
    locks = new_locks(kube, namespace)
    assert await post_bind(extender, binding_args(a, node)) == ""  # a holds the lock

    async def release_after(seconds: float) -> None:
        await asyncio.sleep(seconds)
        await release_as_device_plugin(locks, node)

    # b waits half a second past NOTICE_AFTER_S for a's release: long enough to be noticed
    _, error = await asyncio.gather(
        release_after(NOTICE_AFTER_S + 0.5), post_bind(extender, binding_args(b, node))
    )
    assert error == ""
    # c waits a moment for b's release
    started = time.monotonic()
    _, error = await asyncio.gather(release_after(0.2), post_bind(extender, binding_args(c, node)))
    c_waited = time.monotonic() - started
    assert error == ""
    await extender.events.recorder.flush()

    [waiting] = await events_on(kube, namespace, "b", "WaitingForNodeLock")
    assert waiting["involvedObject"]["uid"] == b["metadata"]["uid"]
    assert f"held by {namespace}/a" in waiting["message"], waiting["message"]
    waited = re.search(r"has waited ([0-9.]+)s", waiting["message"])
    assert waited is not None, waiting["message"]
    assert float(waited[1]) >= NOTICE_AFTER_S
    on_c = await events_on(kube, namespace, "c", "WaitingForNodeLock")
    if c_waited < NOTICE_AFTER_S:  # the usual case: nothing to notice, no Event
        assert on_c == [], on_c
    else:  # a machine so loaded that c's bind took a second: then it says so
        assert len(on_c) == 1, on_c
