"""Each invariant under the fault that threatens it (docs/design.md, "Invariants"; issue: the
main job).

A crash is a failpoint (``NODELOCK_FAILPOINTS``): the component exits at that exact step, with
no cleanup, like a SIGKILL; the kube-apiserver is SIGKILLed.  Each test first waits for proof that
its fault happened (the failpoint's line in the component's log and the process gone, the
apiserver's new PID, the skewed clock in what the component wrote), then checks from the
simulated kubelets' records that every container got exactly its assignment and that no GPU went
to two live pods (the ``e2e`` fixture checks S1, S2 and L1 over the whole cluster when the test
ends, and S3 once its pods are gone).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from devcluster.processes import alive
from tests.e2e.kit import (
    LEASE_S,
    GPUCluster,
    assignment,
    exited_at,
    extender_metrics_url,
    extender_replicas,
    held_locks,
    kubelet_devices,
    log_count,
    metric_value,
    plugin_registrations,
    replica_binds,
    restart_extenders,
    slow_admission,
    wait_any_log,
    wait_log,
    wait_process_gone,
    wait_registrations,
)

FAIL = "NODELOCK_FAILPOINTS"


async def test_extender_crash_after_acquire_before_binding(e2e: GPUCluster) -> None:
    """The lock is held by a pod that never got bound: it is taken over, and the pod is placed."""
    node = e2e.nodes[0]
    line = exited_at("bind.after-acquire")
    await restart_extenders(e2e.cluster, {FAIL: "bind.after-acquire"})
    replicas = extender_replicas(e2e.cluster)
    logged = {name: log_count(e2e, name, line) for name in replicas}
    try:
        await e2e.create_pod("p", [2], node=node)
        lease = await e2e.wait_holder(node, e2e.key("p"))
        token_at_crash = int(lease["spec"]["leaseTransitions"])
        # proof of the crash: a replica logged the failpoint and its process is gone
        for name in await wait_any_log(e2e, line, logged):
            await wait_process_gone(replicas[name])
        assert not (await e2e.pod("p"))["spec"].get("nodeName")
    finally:
        await restart_extenders(e2e.cluster, {})
    pod = await e2e.wait_phase("p", ["Running"])
    assert kubelet_devices(pod)["c0"] == sorted(assignment(pod)["c0"])
    assert int(pod["metadata"]["annotations"]["nodelock.io/token"]) > token_at_crash
    await e2e.wait_holder(node, None)


async def test_extender_crash_after_binding(e2e: GPUCluster) -> None:
    """The bind happened but the scheduler never heard back: the device plugin still completes
    the handoff and releases the lock."""
    node = e2e.nodes[1]
    line = exited_at("bind.after-binding")
    await restart_extenders(e2e.cluster, {FAIL: "bind.after-binding"})
    replicas = extender_replicas(e2e.cluster)
    logged = {name: log_count(e2e, name, line) for name in replicas}
    try:
        await e2e.create_pod("p", [1, 1], node=node)
        # proof of the crash: a replica logged the failpoint and its process is gone, with the
        # pod bound by the write it made just before
        for name in await wait_any_log(e2e, line, logged):
            await wait_process_gone(replicas[name])
        assert (await e2e.pod("p"))["spec"].get("nodeName") == node
        pod = await e2e.wait_phase("p", ["Running"])
    finally:
        await restart_extenders(e2e.cluster, {})
    want = assignment(pod)
    assert kubelet_devices(pod) == {c: sorted(ids) for c, ids in want.items()}
    lease = await e2e.wait_holder(node, None)
    assert lease["metadata"]["annotations"]["nodelock.io/last-holder"] == e2e.key("p")


@pytest.mark.core
async def test_device_plugin_crash_mid_allocate(e2e: GPUCluster) -> None:
    """The plugin dies after answering nothing for the first of two containers: kubelet rejects
    the pod, no container runs, and the lock becomes takeable for the next pod."""
    node = e2e.nodes[2]
    plugin = f"deviceplugin-{node}"
    line = exited_at("allocate.after-checkpoint")
    seen = plugin_registrations(e2e.cluster, node)
    proc = e2e.cluster.restart_component(plugin, env={FAIL: "allocate.after-checkpoint"})
    await wait_registrations(e2e.cluster, node, seen)
    logged = log_count(e2e, plugin, line)
    e2e.expect_unadmitted("crashed")
    try:
        await e2e.create_pod("crashed", [1, 1], node=node)
        # proof of the crash: the plugin logged the failpoint and its process is gone
        await wait_log(e2e, plugin, line, logged)
        await wait_process_gone(proc)
        pod = await e2e.wait_phase("crashed", ["Failed"])
        assert pod["status"]["reason"] == "UnexpectedAdmissionError"
        assert kubelet_devices(pod) == {}
    finally:
        seen = plugin_registrations(e2e.cluster, node)
        e2e.cluster.restart_component(plugin, env={})
        await wait_registrations(e2e.cluster, node, seen)
    await e2e.create_pod("next", [2], node=node)
    nxt = await e2e.wait_phase("next", ["Running"], timeout_s=LEASE_S + 60)
    assert kubelet_devices(nxt)["c0"] == sorted(assignment(nxt)["c0"])
    await e2e.wait_holder(node, None)


@pytest.mark.core
async def test_burst_with_two_replicas_assigns_no_gpu_twice(e2e: GPUCluster) -> None:
    """Twelve single-GPU pods at once for twelve GPUs, through two extender replicas: both
    replicas serve binds of the burst."""
    names = [f"b{i}" for i in range(12)]
    before = await replica_binds(e2e)
    assert len(before) == 2, before
    await asyncio.gather(*(e2e.create_pod(n, [1]) for n in names))
    pods = [await e2e.wait_phase(n, ["Running"], timeout_s=120) for n in names]
    after = await replica_binds(e2e)
    served = {name: after[name] - before[name] for name in before}
    assert all(n >= 1 for n in served.values()), served
    assert sum(served.values()) >= len(names), served
    used = [(p["spec"]["nodeName"], d) for p in pods for d in kubelet_devices(p)["c0"]]
    assert len(used) == len(set(used)) == 12
    for p in pods:
        assert kubelet_devices(p)["c0"] == sorted(assignment(p)["c0"])
    assert not await held_locks(e2e.kube)


async def test_apiserver_killed_with_handoffs_in_flight(e2e: GPUCluster) -> None:
    """kube-apiserver is SIGKILLed while a pod holds a node's lock, bound and not yet admitted
    (its Allocate is slowed), with more pods of the burst on their way; it starts again (a new
    PID).  The handoff in flight completes across the kill: every pod runs with exactly its
    assignment, no GPU twice, and every lock is released."""
    node = e2e.nodes[2]
    names = [f"r{i}" for i in range(8)]
    # the holder's Allocate stalls past the kill and the restart (kubelet waits on it)
    async with slow_admission(e2e, node, seconds=15):
        await e2e.create_pod(names[0], [1], node=node)
        await asyncio.gather(*(e2e.create_pod(n, [1]) for n in names[1:4]))
        # in flight: the lock held by r0, bound to the node, kubelet inside its Allocate
        await e2e.wait_holder(node, e2e.key(names[0]))
        assert (await e2e.wait_bound(names[0]))["status"]["phase"] == "Pending"
        old = e2e.cluster.state.procs()["kube-apiserver"]
        e2e.cluster.kill_component("kube-apiserver")
        await wait_process_gone(old)
        await asyncio.to_thread(e2e.cluster.restart_apiserver)
        new = e2e.cluster.state.procs()["kube-apiserver"]
        assert new.pid != old.pid, old.pid
        assert alive(new)
        await asyncio.gather(*(e2e.create_pod(n, [1]) for n in names[4:]))
        pods = [await e2e.wait_phase(n, ["Running"], timeout_s=180) for n in names]
    used = [(p["spec"]["nodeName"], d) for p in pods for d in kubelet_devices(p)["c0"]]
    assert len(used) == len(set(used)) == 8
    for p in pods:
        assert kubelet_devices(p)["c0"] == sorted(assignment(p)["c0"])
    for _ in range(100):
        if not await held_locks(e2e.kube):
            break
        await asyncio.sleep(0.2)
    assert not await held_locks(e2e.kube)


FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def skewed(offset: str) -> dict[str, str]:
    """Environment that shifts a process's clocks by ``offset`` (libfaketime, e.g. "+60s")."""
    assert FAKETIME.exists(), f"{FAKETIME} is missing: `make test` installs libfaketime"
    return {"LD_PRELOAD": str(FAKETIME), "FAKETIME": offset}


async def test_clock_skew_of_sixty_seconds_changes_nothing(e2e: GPUCluster) -> None:
    """The extender (both replicas: either may get any bind) runs 60 s ahead, one device plugin
    60 s behind: no lock is judged expired early or late, no takeover happens, every pod gets its
    assignment.  Three pods are pinned to the skewed plugin's node, and the skew is shown in
    what each component wrote with its own clock."""
    replicas = sorted(extender_replicas(e2e.cluster))
    plugin_node = e2e.nodes[0]
    await restart_extenders(e2e.cluster, skewed("+60s"))
    seen = plugin_registrations(e2e.cluster, plugin_node)
    e2e.cluster.restart_component(f"deviceplugin-{plugin_node}", env=skewed("-60s"))
    await wait_registrations(e2e.cluster, plugin_node, seen)
    try:
        names = [f"s{i}" for i in range(8)]
        pinned = names[:3]
        # the pinned pods are bound first: binpacking would otherwise fill their node with
        # unpinned pods created at the same moment, and a pinned pod could fit nowhere
        await asyncio.gather(*(e2e.create_pod(n, [1], node=plugin_node) for n in pinned))
        await asyncio.gather(*(e2e.wait_bound(n) for n in pinned))
        await asyncio.gather(*(e2e.create_pod(n, [1]) for n in names if n not in pinned))
        pods = [await e2e.wait_phase(n, ["Running"], timeout_s=120) for n in names]
        for p in pods:
            assert kubelet_devices(p)["c0"] == sorted(assignment(p)["c0"])
        assert [p["spec"]["nodeName"] for p in pods[:3]] == [plugin_node] * 3
        # the skewed plugin served the pods on its node: it released each one's lock, writing
        # its own clock (60 s behind) into the Lease's renewTime
        lease = await e2e.wait_holder(plugin_node, None)
        notes = lease["metadata"]["annotations"]
        assert notes["nodelock.io/last-outcome"] == "allocated", notes
        on_node = {
            e2e.key(n)
            for n, p in zip(names, pods, strict=True)
            if p["spec"]["nodeName"] == plugin_node
        }
        assert notes["nodelock.io/last-holder"] in on_node, notes
        released = datetime.strptime(lease["spec"]["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
            tzinfo=UTC
        )
        assert (datetime.now(UTC) - released).total_seconds() > 30, lease["spec"]
        # the skew was real: the extender writes its own clock into every binding
        now = datetime.now(UTC)
        bound_at = [
            datetime.strptime(
                p["metadata"]["annotations"]["nodelock.io/bound-at"], "%Y-%m-%dT%H:%M:%S.%fZ"
            ).replace(tzinfo=UTC)
            for p in pods
        ]
        assert all((b - now).total_seconds() > 30 for b in bound_at), bound_at
        takeovers = 0.0
        for name in replicas:
            takeovers += await metric_value(
                f"{extender_metrics_url(e2e.cluster.state.procs()[name].argv)}/metrics",
                "nodelock_lock_acquisitions_total",
                result="takeover",
            )
        assert takeovers == 0
        assert not await held_locks(e2e.kube)
    finally:
        await restart_extenders(e2e.cluster, {})
        seen = plugin_registrations(e2e.cluster, plugin_node)
        e2e.cluster.restart_component(f"deviceplugin-{plugin_node}", env={})
        await wait_registrations(e2e.cluster, plugin_node, seen)
