"""NodeLocks against the real kube-apiserver: the Lease it writes, fencing, expiry and takeover."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from devcluster.cluster import Cluster
from handoff.wire import DEFAULT_PREFIX
from kube import KubeClient, NotFound
from kube.client import lease_path, pod_path
from lockd import (
    HeldLock,
    Holder,
    HolderKey,
    LockHeld,
    LockLost,
    LockMetrics,
    LockRecord,
    NodeLocks,
    NodeName,
    Outcome,
    StaleToken,
)

NODE = NodeName("gpu-node-1")
A = Holder(HolderKey("team/train-0"), "uid-a", {"assignment": '{"main":["GPU-0"]}'})
B = Holder(HolderKey("team/train-1"), "uid-b", {"assignment": '{"main":["GPU-1"]}'})


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


LocksFactory = Callable[..., NodeLocks]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def make_locks(kube: KubeClient, namespace: str, registry: CollectorRegistry) -> LocksFactory:
    metrics = LockMetrics(registry=registry)

    def make(**kw: Any) -> NodeLocks:
        kw.setdefault("namespace", namespace)
        kw.setdefault("prefix", DEFAULT_PREFIX)
        kw.setdefault("metrics", metrics)
        return NodeLocks(kw.pop("client", kube), **kw)

    return make


@pytest.fixture
async def other_client(cluster: Cluster) -> AsyncIterator[KubeClient]:
    """A second client: another process, as far as the API server can tell."""
    async with await KubeClient.connect(str(cluster.kubeconfig)) as client:
        yield client


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_acquire_release_cycle_writes_the_documented_lease(
    make_locks: LocksFactory, kube: KubeClient, namespace: str
) -> None:
    locks = make_locks(wall_clock=lambda: 1_714_564_800.0)  # a whole second: microsecond 0
    lock = await locks.acquire(NODE, A)
    assert lock.token == 1
    lease = await kube.get(lease_path(namespace, NODE))
    assert lease["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "nodelock"}
    assert lease["metadata"]["annotations"] == {
        "nodelock.io/holder-uid": "uid-a",
        "nodelock.io/assignment": '{"main":["GPU-0"]}',
    }
    assert lease["spec"]["holderIdentity"] == "team/train-0"
    assert lease["spec"]["leaseTransitions"] == 1
    assert lease["spec"]["acquireTime"] == "2024-05-01T12:00:00.000000Z"

    await locks.release(lock, outcome=Outcome.ALLOCATED)
    lease = await kube.get(lease_path(namespace, NODE))
    assert "holderIdentity" not in lease["spec"]
    assert lease["spec"]["leaseTransitions"] == 1
    assert lease["metadata"]["annotations"] == {
        "nodelock.io/last-holder": "team/train-0",
        "nodelock.io/last-holder-uid": "uid-a",
        "nodelock.io/last-token": "1",
        "nodelock.io/last-outcome": "allocated",
    }

    again = await locks.acquire(NODE, B)
    assert again.token == 2
    view = await locks.inspect(NODE)
    assert view is not None
    assert view.record.holder == B
    assert view.record.last is not None
    assert view.record.last.holder == "team/train-0"


async def test_contention_names_the_holder_and_token(
    make_locks: LocksFactory, other_client: KubeClient, registry: CollectorRegistry
) -> None:
    mine = make_locks()
    theirs = make_locks(client=other_client)
    await mine.acquire(NODE, A)
    with pytest.raises(LockHeld) as caught:
        await theirs.acquire(NODE, B)  # no observation: create → 409 → GET → refuse
    assert (caught.value.holder, caught.value.token) == ("team/train-0", 1)
    assert isinstance(caught.value.__cause__, Exception)
    assert sample(registry, "nodelock_lock_acquisitions_total", node=NODE, result="contended") == 1


async def test_a_stale_holder_cannot_release_or_renew_the_new_lock(
    make_locks: LocksFactory, other_client: KubeClient, registry: CollectorRegistry
) -> None:
    """A's lock expires and is taken over by B: A's writes change nothing (fencing)."""
    clock = FakeClock()
    a_side = make_locks(duration_s=5, clock=clock)
    b_side = make_locks(client=other_client, duration_s=5, clock=clock)
    old = await a_side.acquire(NODE, A)
    assert await b_side.inspect(NODE) is not None
    clock.now += 5.0

    async def gone(record: LockRecord) -> bool:
        return True

    new = await b_side.acquire(NODE, B, may_take_over=gone)
    assert new.token == old.token + 1
    assert sample(registry, "nodelock_lock_acquisitions_total", node=NODE, result="takeover") == 1

    with pytest.raises(StaleToken) as caught:
        await a_side.renew(old)
    assert (caught.value.token, caught.value.current) == (old.token, new.token)
    with pytest.raises(StaleToken):
        await a_side.release(old, outcome=Outcome.ALLOCATED)
    assert sample(registry, "nodelock_lock_stale_token_rejections_total", operation="renew") == 1

    view = await b_side.inspect(NODE)
    assert view is not None
    assert view.record.holder == B
    assert view.record.token == new.token
    assert view.record.last is not None
    assert view.record.last.outcome == "taken-over"
    await b_side.release(new, outcome=Outcome.ALLOCATED)  # the real holder still can


async def test_release_of_an_already_released_lock_is_lost(make_locks: LocksFactory) -> None:
    locks = make_locks()
    lock = await locks.acquire(NODE, A)
    await locks.release(lock, outcome=Outcome.ALLOCATED)
    with pytest.raises(LockLost):
        await locks.release(lock, outcome=Outcome.ALLOCATED)


async def test_renew_rewrites_holder_data_and_keeps_the_token(
    make_locks: LocksFactory, kube: KubeClient, namespace: str
) -> None:
    locks = make_locks()
    lock = await locks.acquire(NODE, A)
    changed = HeldLock(
        lock.node,
        Holder(A.key, A.uid, {"assignment": '{"main":["GPU-7"]}'}),
        lock.token,
        lock.resource_version,
    )
    renewed = await locks.renew(changed)
    assert renewed.resource_version != lock.resource_version
    lease = await kube.get(lease_path(namespace, NODE))
    assert lease["metadata"]["annotations"]["nodelock.io/assignment"] == '{"main":["GPU-7"]}'
    assert lease["spec"]["leaseTransitions"] == lock.token
    await locks.release(renewed, outcome=Outcome.ALLOCATED)


async def test_a_release_by_another_process_from_its_watch(
    make_locks: LocksFactory, other_client: KubeClient
) -> None:
    """The device plugin's way: release the lock it observes, built from its own view."""
    extender = make_locks()
    plugin = make_locks(client=other_client)
    watching = asyncio.create_task(plugin.watch(node=NODE))
    try:
        lock = await extender.acquire(NODE, A)
        view = await wait_for(lambda: plugin.view(NODE), lambda v: v is not None)
        assert view is not None
        seen = view.record
        assert seen.holder is not None
        await plugin.release(
            HeldLock(NODE, seen.holder, seen.token, seen.resource_version),
            outcome=Outcome.ALLOCATED,
        )
        with pytest.raises(LockLost):
            await extender.release(lock, outcome=Outcome.BIND_FAILED)
    finally:
        watching.cancel()


@pytest.mark.parametrize(
    "renew_time",
    ["2000-01-01T00:00:00.000000Z", "2999-01-01T00:00:00.000000Z"],
    ids=["renewTime-far-past", "renewTime-far-future"],
)
async def test_clock_skew_only_observed_time_counts(
    make_locks: LocksFactory, kube: KubeClient, namespace: str, renew_time: str
) -> None:
    """A Lease written by a holder with a wildly wrong clock is judged by observed time only."""
    skewed = NodeLocks(kube, namespace=namespace, wall_clock=lambda: 0.0, prefix=DEFAULT_PREFIX)
    body = skewed.format.new_lease(NODE, A, duration_s=10, now=renew_time)
    await kube.create(lease_path(namespace), body)
    clock = FakeClock()
    locks = make_locks(clock=clock)
    calls: list[LockRecord] = []

    async def check(record: LockRecord) -> bool:
        calls.append(record)
        return True

    with pytest.raises(LockHeld):
        await locks.acquire(NODE, B, may_take_over=check)
    assert calls == []  # not even asked: not expired on this process's clock
    clock.now += 9.9
    with pytest.raises(LockHeld):
        await locks.acquire(NODE, B, may_take_over=check)
    clock.now += 0.1
    taken = await locks.acquire(NODE, B, may_take_over=check)
    assert taken.token == 2
    assert [c.holder for c in calls] == [A]


async def test_expiry_under_a_real_short_duration(
    make_locks: LocksFactory, other_client: KubeClient
) -> None:
    holder_side = make_locks(duration_s=1)
    lock = await holder_side.acquire(NODE, A)
    taker = make_locks(client=other_client, duration_s=1)
    watching = asyncio.create_task(taker.watch(node=NODE))
    try:
        await wait_for(lambda: taker.view(NODE), lambda v: v is not None and v.expired)
        with pytest.raises(LockHeld):
            await taker.acquire(NODE, B)  # expired, but no check given: never handed on

        async def yes(record: LockRecord) -> bool:
            return True

        taken = await taker.acquire(NODE, B, may_take_over=yes)
        assert taken.token == lock.token + 1
    finally:
        watching.cancel()


async def test_takeover_refused_while_the_holder_is_in_handoff(
    make_locks: LocksFactory, kube: KubeClient, namespace: str, registry: CollectorRegistry
) -> None:
    """The check reads the holder pod: Pending and not admitted keeps the lock; deleted frees it."""
    pod = await kube.create(
        pod_path(namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "holder"},
            "spec": {
                "nodeName": NODE,  # bound to a node that never admits it: stuck in handoff
                "containers": [{"name": "main", "image": "example.invalid/none"}],
            },
        },
    )
    holder = Holder(HolderKey(f"{namespace}/holder"), pod["metadata"]["uid"])
    clock = FakeClock()
    locks = make_locks(duration_s=5, clock=clock)
    lock = await locks.acquire(NODE, holder)

    async def holder_left_handoff(record: LockRecord) -> bool:
        assert record.holder is not None
        ns, name = record.holder.key.split("/", 1)
        try:
            current = await kube.get(pod_path(ns, name))
        except NotFound:
            return True
        status = current.get("status") or {}
        admitted = bool(status.get("containerStatuses"))
        return (
            current["metadata"]["uid"] != record.holder.uid
            or status.get("phase") in ("Running", "Succeeded", "Failed")
            or admitted
        )

    clock.now += 60.0
    for _ in range(3):
        with pytest.raises(LockHeld) as caught:
            await locks.acquire(NODE, B, may_take_over=holder_left_handoff)
        assert caught.value.token == lock.token
    assert sample(registry, "nodelock_lock_expired_seen_total", node=NODE) == 1

    await kube.delete(pod_path(namespace, "holder"), grace_period_seconds=0)
    taken = await locks.acquire(NODE, B, may_take_over=holder_left_handoff)
    assert taken.token == lock.token + 1


async def test_list_and_break(make_locks: LocksFactory, other_client: KubeClient) -> None:
    locks = make_locks()
    held = await locks.acquire(NodeName("n-1"), A)
    lock2 = await locks.acquire(NodeName("n-2"), B)
    await locks.release(lock2, outcome=Outcome.REJECTED)
    admin = make_locks(client=other_client)
    views = await admin.list()
    assert [(v.node, v.record.holder) for v in views] == [("n-1", A), ("n-2", None)]
    broken = await admin.break_lock(NodeName("n-1"))
    assert broken is not None
    assert broken.holder == A
    assert await admin.break_lock(NodeName("n-1")) is None
    assert await admin.break_lock(NodeName("no-such-node")) is None
    view = await admin.inspect(NodeName("n-1"))
    assert view is not None
    assert view.record.last is not None
    assert view.record.last.outcome == "broken"
    with pytest.raises(LockLost):
        await locks.renew(held)


async def test_watch_reports_changes_and_deletions(
    make_locks: LocksFactory, kube: KubeClient, namespace: str
) -> None:
    locks = make_locks()
    watcher = make_locks()
    changes: list[tuple[str, str | None]] = []

    def on_change(view: Any, node: NodeName) -> None:
        holder = view.record.holder.key if view is not None and view.record.holder else None
        changes.append((node, holder if view is not None else "deleted"))

    watching = asyncio.create_task(watcher.watch(on_change=on_change))
    try:
        lock = await locks.acquire(NODE, A)
        await wait_for(lambda: changes, lambda c: (NODE, "team/train-0") in c)
        await locks.release(lock, outcome=Outcome.ALLOCATED)
        await wait_for(lambda: changes, lambda c: c[-1] == (NODE, None))
        await kube.delete(lease_path(namespace, NODE))
        await wait_for(lambda: changes, lambda c: c[-1] == (NODE, "deleted"))
        assert watcher.view(NODE) is None
    finally:
        watching.cancel()


async def test_holder_data_that_cannot_be_an_annotation_is_refused_before_any_write(
    make_locks: LocksFactory,
) -> None:
    locks = make_locks()
    with pytest.raises(ValueError, match="holder data key"):
        await locks.acquire(NODE, Holder(A.key, A.uid, {"bad key": "x"}))
    assert await locks.inspect(NODE) is None


async def wait_for(
    get: Callable[[], Any], ok: Callable[[Any], bool], *, timeout_s: float = 30.0
) -> Any:
    """Poll ``get()`` until ``ok`` holds; fail after ``timeout_s`` (a bound, not a measurement)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = get()
        if ok(value):
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached in {timeout_s}s; last value {value!r}")
        await asyncio.sleep(0.02)
