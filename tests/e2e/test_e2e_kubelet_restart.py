"""A kubelet that restarts rejects the node lock's holder before the device plugin has reported
its devices again; the node's plugin releases the lock as soon as it serves again, not at the
lock's expiry (issue 52, decision 0012).

On real kubelets (``--kubelet real``), one node, the extender's default lease duration (15 s):
kubelet is killed and stays down ``DOWN_S``; three single-GPU pods are created as it returns and
the first bound takes the node's lock; kubelet, started again, admits that holder before the
re-registered plugin's ListAndWatch reported any device, and rejects it itself
(``UnexpectedAdmissionError``, "Allocate failed due to ...", from ``devicesToAllocate`` in
``pkg/kubelet/cm/devicemanager/manager.go``, v1.31.9 and v1.37.2: a restarted kubelet's device
manager knows the resource from its checkpoint with no healthy device until the plugin's first
ListAndWatch answer).  kubelet never called Allocate, so no handoff ends it.  The extenders
leave a rejected holder's lock alone until it expires (a node whose plugin is down must stay out
of a burst); the plugin releases it once its ListAndWatch has sent kubelet the devices, and the
next pods run within seconds.  The pods are created after kubelet is started again, and bound
before the plugin registers (``REGISTER_DELAY_S``).  Each round measures, from the test's
watches, the time from the holder seen Failed to its lock seen released, and from the plugin's
``/readyz`` first answering 200 again (polled every ``POLL_S``) or the rejection, whichever
came later, to that release; the test prints p50/p99 of both over the rounds (``pytest -s``;
docs/extender.md, "Release latency after a holder kubelet rejected").
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from devcluster.cluster import Cluster
from devcluster.gpunodes import NodeSpec, up_gpu_cluster
from devcluster.realkubelet import KubeletKind
from handoff.wire import DEFAULT_LOCK_NAMESPACE
from kube.client import JSON, event_path, lease_path, pod_path
from kube.errors import ApiUnavailable, NotFound
from tests.e2e.kit import (
    GPUCluster,
    assignment,
    for_one_test,
    gpu_cluster_of_its_own,
    kubelet_findings,
    plugin_registrations,
    real_node,
    restart_plugin,
)
from tests.e2e.test_e2e_real_kubelet import _handed

pytestmark = [pytest.mark.e2e]

GPUS = 4
# each round takes about 15 s: kubelet writes the rejected holder's Failed status about 10 s
# after it starts (measured: at its status manager's first periodic sync, ``syncPeriod`` 10 s,
# ``pkg/kubelet/status/status_manager.go``, v1.31.9 line 159, v1.37.2 line 215), then the
# next pods need about 3 s
ROUNDS = 2
# how long kubelet stays down; the pods are created as it returns.  The issue saw 12 s, but
# nothing in the race depends on it: a restarted kubelet's device manager has no healthy device
# until the plugin's first ListAndWatch answer, however short the outage
DOWN_S = 0.5
# the plugin registers again this long after kubelet's socket appears (failpoint
# ``register.start``): kubelet admits the holder first, every round
REGISTER_DELAY_S = 2.0
# the release, after the later of the holder seen Failed and the plugin's /readyz answering 200
# again (it serves kubelet): the plugin's next step.  On the lock's expiry alone (15 s from the
# bind, kubelet showing the holder Failed about 10 s after it starts) this fails by seconds.
RELEASED_WITHIN_S = 1.0
# the next two pods, one handoff after the other, after the rejection: the plugin's delayed
# registration, kubelet's node status (every 2 s) showing the GPUs again, two handoffs
RUNNING_WITHIN_S = 10.0
POLL_S = 0.05


@pytest.fixture(scope="module")
def restart_cluster(kubernetes_version: str | None) -> Iterator[GPUCluster]:
    """One real-kubelet node x four GPUs, two extender replicas, the default lease duration."""

    def start(cluster: Cluster) -> list[NodeSpec]:
        return up_gpu_cluster(
            cluster, nodes=1, gpus_per_node=GPUS, extender_replicas=2, kubelet=KubeletKind.REAL
        )

    with gpu_cluster_of_its_own("nlk-", start, version=kubernetes_version) as c:
        yield c


@pytest.fixture
async def real(restart_cluster: GPUCluster) -> AsyncIterator[GPUCluster]:
    async with for_one_test(restart_cluster, judge=False) as c:
        try:
            yield c
        finally:
            await c.cleanup()


async def _holder(c: GPUCluster, node: str, keys: set[str], *, timeout_s: float) -> JSON:
    """The node's Lease once one of ``keys`` holds it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            lease = await c.lease(node)
        except NotFound:  # no bind has taken this node's lock yet
            lease = {"spec": {}}
        if lease["spec"].get("holderIdentity") in keys:
            return lease
        assert time.monotonic() < deadline, f"none of {sorted(keys)} took the lock: {lease}"
        await asyncio.sleep(POLL_S)


async def _first_failed(c: GPUCluster, names: set[str]) -> tuple[float, str]:
    """When (``time.monotonic``) this process's watch of the test's pods delivered the first of
    ``names`` Failed, and its name.  This watch and ``_holders``'s, of one API server, time two
    writes with the same delivery delay, to the millisecond."""
    while True:
        try:
            async for event in c.kube.watch(pod_path(c.namespace)):
                pod = event.object
                name = (pod.get("metadata") or {}).get("name")
                failed = (pod.get("status") or {}).get("phase") == "Failed"
                if event.type != "BOOKMARK" and name in names and failed:
                    return time.monotonic(), str(name)
        except ApiUnavailable:
            await asyncio.sleep(POLL_S)


async def _holders(c: GPUCluster, node: str, seen: list[tuple[float, str | None, JSON]]) -> None:
    """Append (``time.monotonic``, holder, Lease) for every event of ``node``'s Lease that this
    process's watch delivers, until cancelled."""
    while True:
        try:
            path = lease_path(DEFAULT_LOCK_NAMESPACE)
            async for event in c.kube.watch(path, field_selector=f"metadata.name={node}"):
                if event.type != "BOOKMARK":
                    holder = (event.object.get("spec") or {}).get("holderIdentity")
                    seen.append((time.monotonic(), holder, event.object))
        except ApiUnavailable:
            await asyncio.sleep(POLL_S)


async def _released(seen: list[tuple[float, str | None, JSON]], key: str) -> tuple[float, JSON]:
    """When the Lease events in ``seen`` first showed the lock held by ``key`` no longer held
    by it, and that Lease (waits until they do)."""
    while True:
        held = False
        for at, holder, lease in list(seen):
            if holder == key:
                held = True
            elif held:
                return at, lease
        await asyncio.sleep(POLL_S)


async def _phase(c: GPUCluster, name: str) -> str:
    return str(((await c.pod(name)).get("status") or {}).get("phase") or "Pending")


async def _reason_events(c: GPUCluster, name: str, reason: str) -> list[JSON]:
    items = (await c.kube.list(event_path(c.namespace)))["items"]
    return [
        e
        for e in items
        if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == name
    ]


async def _ready_again(c: GPUCluster, node: str) -> float:
    """When (``time.monotonic``) the node's device plugin's ``/readyz`` answered 200 after
    having answered otherwise since this call: it serves kubelet again (registered, and its
    ListAndWatch has sent the devices)."""
    port = c.cluster.settings()["metrics"][f"deviceplugin-{node}"]
    url = f"http://127.0.0.1:{port}/readyz"
    down = False
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while True:
            try:
                async with session.get(url) as resp:
                    ok = resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if ok and down:
                return time.monotonic()
            down = down or not ok
            await asyncio.sleep(POLL_S)


async def _one_round(c: GPUCluster, node: str, r: int) -> tuple[float, float, float]:
    """One kubelet restart with the holder rejected; returns the release latency from the
    rejection and from the later of the rejection and the plugin's readiness, and the time
    until the next pods run from the rejection (seconds)."""
    names = [f"r{r}-{x}" for x in "abc"]
    c.expect_unadmitted(*names)  # which one holds the lock is known only once bound
    kubelet = f"kubelet-{node}"
    leases: list[tuple[float, str | None, JSON]] = []
    # timed by watches opened before kubelet returns: the rejection and the release
    tasks = [
        ready := asyncio.create_task(_ready_again(c, node)),
        rejected := asyncio.create_task(_first_failed(c, set(names))),
        asyncio.create_task(_holders(c, node, leases)),
    ]
    try:
        c.cluster.kill_component(kubelet)
        await asyncio.sleep(DOWN_S)
        c.cluster.restart_component(kubelet)
        returned_at = time.monotonic()
        # created as kubelet returns: bound, and seen by kubelet before the plugin registers
        await asyncio.gather(*(c.create_pod(n, [1], node=node) for n in names))
        lease = await _holder(c, node, {c.key(n) for n in names}, timeout_s=30)
        holder = str(lease["spec"]["holderIdentity"]).split("/", 1)[1]
        token = int(lease["spec"]["leaseTransitions"])
        # the holder is rejected by kubelet, then its lock released by the plugin once it serves
        async with asyncio.timeout(60):
            while not rejected.done():
                phase = await _phase(c, holder)
                assert phase != "Running", (
                    f"kubelet admitted the holder {holder} after its restart: the race was not "
                    f"reproduced (plugin registrations {plugin_registrations(c.cluster, node)})"
                )
                await asyncio.sleep(POLL_S)
            failed_at, failed = await rejected
            assert failed == holder, f"{failed} failed, not the lock's holder {holder}"
            released_at, freed = await _released(leases, c.key(holder))
            ready_at = await ready
    finally:
        for task in tasks:
            task.cancel()
    pod = await c.pod(holder)
    assert pod["status"].get("reason") == "UnexpectedAdmissionError", pod["status"]
    # kubelet's device manager refused it ("Allocate failed due to ..."): no healthy device yet
    assert "Allocate failed due to" in pod["status"].get("message", ""), pod["status"]
    latency = released_at - failed_at
    # the plugin releases it once it serves kubelet again: its readiness is polled (seen up to
    # POLL_S late), and /readyz also waits for the Register answer, which may come after the
    # first ListAndWatch answer, so the release may be seen a little before it
    after_ready = released_at - ready_at
    timeline = (
        f"from kubelet's start: plugin ready {ready_at - returned_at:.2f} s, holder Failed "
        f"{failed_at - returned_at:.2f} s, released {released_at - returned_at:.2f} s "
        f"({freed['metadata'].get('annotations', {}).get('nodelock.io/last-outcome')})"
    )
    after_both = released_at - max(failed_at, ready_at)
    assert after_ready > -1.0, f"round {r}: released before the plugin was ready; {timeline}"
    assert after_both <= RELEASED_WITHIN_S, (
        f"round {r}: the lock of {holder}, rejected by kubelet, was released {after_both:.2f} s "
        f"after the later of the holder Failed and the plugin ready (lock duration 15 s); "
        f"{timeline}"
    )

    others = [n for n in names if n != holder]
    running_by = failed_at + RUNNING_WITHIN_S
    for name in others:
        while await _phase(c, name) != "Running":
            assert time.monotonic() < running_by, (
                f"{name} not Running {RUNNING_WITHIN_S} s after the holder {holder} was "
                f"rejected: {(await c.pod(name))['status']}; lock {(await c.lease(node))['spec']}"
            )
            await asyncio.sleep(POLL_S)
    running = time.monotonic() - failed_at
    # the release records how the rejected holder's handoff ended, fenced by its token
    last = freed["metadata"]["annotations"]
    assert "holderIdentity" not in freed["spec"], freed["spec"]
    assert last["nodelock.io/last-holder"] == c.key(holder), last
    assert last["nodelock.io/last-outcome"] == "rejected", last
    assert int(last["nodelock.io/last-token"]) == token, last
    for name in others:
        pod = await c.pod(name)
        assert _handed(c, pod)["c0"] == sorted(assignment(pod)["c0"])
        assert int(pod["metadata"]["annotations"]["nodelock.io/token"]) > token
    # an Event on the holder names the cause a person can act on
    events = await _reason_events(c, holder, "NodeLockReleased")
    assert events, f"no NodeLockReleased Event on {holder}"
    assert "created again" in events[0]["message"], events[0]["message"]

    found = await kubelet_findings(c, expected_pods=len(names))
    assert found.s1 == [], found.s1
    assert found.s2 == [], found.s2

    for name in names:
        await c.kube.delete(pod_path(c.namespace, name))
    for name in names:
        await c.wait_gone(name)
    await c.wait_holder(node, None)
    return latency, after_both, running


@pytest.mark.core
async def test_a_rejected_holder_releases_its_lock_at_once(real: GPUCluster) -> None:
    """``ROUNDS`` kubelet restarts; in each, the holder is rejected by kubelet, its lock is
    released by the node's plugin once it serves again, and the next pods run within seconds,
    where the lock's expiry alone would keep them waiting 15 s."""
    node = real.nodes[0]
    assert real_node(real, node) is not None
    # the race of the issue, made certain: the plugin registers again only REGISTER_DELAY_S
    # after a restarted kubelet listens, so kubelet admits (and rejects) the holder first
    delay = {"NODELOCK_FAILPOINTS": f"register.start=sleep:{REGISTER_DELAY_S}"}
    await restart_plugin(real, node, env=delay)
    # the cluster is this module's alone: its plugin keeps the failpoint to the end
    rounds = [await _one_round(real, node, r) for r in range(ROUNDS)]
    ms = sorted(round(1000 * latency) for latency, _, _ in rounds)
    ready_ms = sorted(round(1000 * after) for _, after, _ in rounds)
    ran = sorted(round(running, 1) for *_, running in rounds)
    print(
        f"\nrelease after a rejected holder over {len(ms)} rounds: "
        f"p50 {statistics.median(ms):.0f} ms, p99 {_p99(ms)} ms, all {ms}; "
        f"after the later of that and the plugin's /readyz: "
        f"p50 {statistics.median(ready_ms):.0f} ms, "
        f"p99 {_p99(ready_ms)} ms, all {ready_ms}; "
        f"next pods Running after the rejection: {ran} s"
    )


def _p99(ms: list[int]) -> int:
    """The 99th percentile of sorted ``ms`` by the nearest rank (the largest of few rounds)."""
    return ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
