"""Binds that wait their turn (docs/design.md, "Bind"), through the real kube-scheduler and two
extender replicas: a burst larger than the node count, an Allocate stalled past the wait budget,
and the extenders killed with binds queued.  The ``e2e`` fixture checks S1/S2 over all pods
after each.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import pytest

from kube.client import pod_path
from scheduler_ext.binder import DEFAULT_WAIT_BUDGET_S
from tests.e2e.kit import (
    GPUCluster,
    assignment,
    binds_over_timeout,
    extender_replicas,
    extender_sum,
    kubelet_devices,
    restart_extenders,
    slow_admission,
    wait_process_gone,
)


async def queued(e2e: GPUCluster, node: str) -> float:
    return await extender_sum(e2e, "nodelock_extender_bind_queue_depth", node=node)


@pytest.mark.core
async def test_a_burst_larger_than_the_nodes_through_two_replicas(e2e: GPUCluster) -> None:
    """Every GPU of the cluster asked for at once, twice over: all pods run, each container got
    its assignment, and each node's fencing tokens grow strictly in the order of the binds."""
    gpus = 4 * len(e2e.nodes)
    refused_before = await extender_sum(
        e2e, "nodelock_extender_requests_total", verb="bind", result="contended"
    )
    tokens: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for wave in range(2):
        names = [f"w{wave}-{i}" for i in range(gpus)]
        await asyncio.gather(*(e2e.create_pod(n, [1]) for n in names))
        pods = [await e2e.wait_phase(n, ["Running"], timeout_s=120) for n in names]
        for pod in pods:
            assert kubelet_devices(pod) == {c: sorted(i) for c, i in assignment(pod).items()}
            notes = pod["metadata"]["annotations"]
            tokens[pod["spec"]["nodeName"]].append(
                (notes["nodelock.io/bound-at"], int(notes["nodelock.io/token"]))
            )
        await asyncio.gather(*(e2e.kube.delete(pod_path(e2e.namespace, n)) for n in names))
        for _ in range(300):
            if not (await e2e.kube.list(pod_path(e2e.namespace)))["items"]:
                break
            await asyncio.sleep(0.2)
    for node, seen in tokens.items():
        in_bind_order = [token for _, token in sorted(seen)]
        assert in_bind_order == sorted(set(in_bind_order)), (node, seen)
    refused = (
        await extender_sum(e2e, "nodelock_extender_requests_total", verb="bind", result="contended")
        - refused_before
    )
    assert refused <= 2, f"{refused} binds refused for a held lock in a burst the nodes can serve"
    assert await binds_over_timeout(e2e) == 0


async def test_a_stalled_allocate_makes_waiters_fail_at_the_budget_without_touching_the_lease(
    e2e: GPUCluster,
) -> None:
    """The holder's Allocate stalls longer than the wait budget: binds queued behind it fail
    when their budget runs out (kube-scheduler retries them), none is answered after
    kube-scheduler's timeout, and the Lease stays the holder's until it is released."""
    node = e2e.nodes[2]
    stall = DEFAULT_WAIT_BUDGET_S + 4.0
    refusals_before = await extender_sum(e2e, "nodelock_extender_bind_wait_refusals_total")
    async with slow_admission(e2e, node, seconds=stall):
        await e2e.create_pod("holder", [1], node=node)
        lease = await e2e.wait_holder(node, e2e.key("holder"))
        version = lease["metadata"]["resourceVersion"]
        await asyncio.gather(*(e2e.create_pod(f"wait-{i}", [1], node=node) for i in range(2)))
        deadline = time.monotonic() + stall
        refused = 0.0
        while time.monotonic() < deadline and refused < 2:
            await asyncio.sleep(0.2)
            refused = (
                await extender_sum(e2e, "nodelock_extender_bind_wait_refusals_total")
                - refusals_before
            )
        assert refused >= 2, "the waiters never gave up"
        lease = await e2e.lease(node)
        assert lease["metadata"]["resourceVersion"] == version  # no waiter wrote it
        for i in range(2):
            assert not (await e2e.pod(f"wait-{i}"))["spec"].get("nodeName")
        holder = await e2e.wait_phase("holder", ["Running"], timeout_s=stall + 30)
        for i in range(2):
            pod = await e2e.wait_phase(f"wait-{i}", ["Running"], timeout_s=60)
            assert set(kubelet_devices(pod)["c0"]).isdisjoint(kubelet_devices(holder)["c0"])
    assert await binds_over_timeout(e2e) == 0
    abandoned = await extender_sum(
        e2e, "nodelock_extender_bind_wait_refusals_total", reason="abandoned"
    )
    assert abandoned == 0


async def test_extenders_killed_with_binds_queued_change_no_lease(e2e: GPUCluster) -> None:
    """Both replicas die while binds wait behind a stalled holder: the Lease is exactly as the
    holder left it, and after the restart every pod is placed."""
    node = e2e.nodes[1]
    async with slow_admission(e2e, node, seconds=DEFAULT_WAIT_BUDGET_S):
        # The premise: a bind queued behind the stalled holder. A bind whose expected wait (from
        # the holds this cluster saw in earlier tests) exceeds its budget is refused at once
        # instead of queueing; then the pair is deleted and tried again, at most three times.
        for attempt in range(3):
            holder, waiter = f"holder-{attempt}", f"waiter-{attempt}"
            await e2e.create_pod(holder, [1], node=node)
            lease = await e2e.wait_holder(node, e2e.key(holder))
            version = lease["metadata"]["resourceVersion"]
            await e2e.create_pod(waiter, [1], node=node)
            deadline = time.monotonic() + 10
            seen = False
            while not seen and time.monotonic() < deadline:
                seen = await queued(e2e, node) >= 1
                if not seen:
                    await asyncio.sleep(0.05)
            if seen:
                break
            for name in (waiter, holder):
                await e2e.kube.delete(pod_path(e2e.namespace, name))
            for name in (waiter, holder):
                await e2e.wait_gone(name)
        else:
            raise AssertionError("in three attempts no waiter queued behind the stalled holder")
        killed = extender_replicas(e2e.cluster)
        assert len(killed) == 2, sorted(killed)
        for name in killed:
            e2e.cluster.kill_component(name)
        # proof of the kill: every replica's process is gone, with the waiter still queued
        for proc in killed.values():
            await wait_process_gone(proc, timeout_s=10)
        assert (await e2e.lease(node))["metadata"]["resourceVersion"] == version
        assert not (await e2e.pod(waiter))["spec"].get("nodeName")
        await restart_extenders(e2e.cluster, {})
        restarted = extender_replicas(e2e.cluster)
        assert restarted.keys() == killed.keys()
        assert all(restarted[n].pid != killed[n].pid for n in killed), (killed, restarted)
        await e2e.wait_phase(holder, ["Running"], timeout_s=60)
        await e2e.wait_phase(waiter, ["Running"], timeout_s=60)
