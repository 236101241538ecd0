"""Each invariant under the fault that threatens it (docs/design.md, "Invariants"; issue: the
main job).

A crash is a failpoint (``NODELOCK_FAILPOINTS``): the component exits at that exact step, with
no cleanup, like a SIGKILL.  After each fault the test checks, from the simulated kubelets'
records, that every container got exactly its assignment and that no GPU went to two live pods
(the ``e2e`` fixture checks S1/S2 over the whole cluster when the test ends).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from tests.e2e.kit import (
    LEASE_S,
    GPUCluster,
    assignment,
    extender_metrics_url,
    held_locks,
    kubelet_devices,
    metric_value,
    plugin_registrations,
    restart_extenders,
    wait_registrations,
)

FAIL = "NODELOCK_FAILPOINTS"


async def test_extender_crash_after_acquire_before_binding(e2e: GPUCluster) -> None:
    """The lock is held by a pod that never got bound: it is taken over, and the pod is placed."""
    node = e2e.nodes[0]
    await restart_extenders(e2e.cluster, {FAIL: "bind.after-acquire"})
    try:
        await e2e.create_pod("p", [2], node=node)
        lease = await e2e.wait_holder(node, e2e.key("p"))
        token_at_crash = int(lease["spec"]["leaseTransitions"])
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
    await restart_extenders(e2e.cluster, {FAIL: "bind.after-binding"})
    try:
        await e2e.create_pod("p", [1, 1], node=node)
        pod = await e2e.wait_phase("p", ["Running"])
    finally:
        await restart_extenders(e2e.cluster, {})
    want = assignment(pod)
    assert kubelet_devices(pod) == {c: sorted(ids) for c, ids in want.items()}
    lease = await e2e.wait_holder(node, None)
    assert lease["metadata"]["annotations"]["nodelock.io/last-holder"] == e2e.key("p")


async def test_device_plugin_crash_mid_allocate(e2e: GPUCluster) -> None:
    """The plugin dies after answering nothing for the first of two containers: kubelet rejects
    the pod, no container runs, and the lock becomes takeable for the next pod."""
    node = e2e.nodes[2]
    plugin = f"deviceplugin-{node}"
    seen = plugin_registrations(e2e.cluster, node)
    e2e.cluster.restart_component(plugin, env={FAIL: "allocate.after-checkpoint"})
    await wait_registrations(e2e.cluster, node, seen)
    try:
        await e2e.create_pod("crashed", [1, 1], node=node)
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


async def test_burst_with_two_replicas_assigns_no_gpu_twice(e2e: GPUCluster) -> None:
    """Twelve single-GPU pods at once for twelve GPUs, through two extender replicas."""
    names = [f"b{i}" for i in range(12)]
    await asyncio.gather(*(e2e.create_pod(n, [1]) for n in names))
    pods = [await e2e.wait_phase(n, ["Running"], timeout_s=120) for n in names]
    used = [(p["spec"]["nodeName"], d) for p in pods for d in kubelet_devices(p)["c0"]]
    assert len(used) == len(set(used)) == 12
    for p in pods:
        assert kubelet_devices(p)["c0"] == sorted(assignment(p)["c0"])
    assert not await held_locks(e2e.kube)


async def test_apiserver_restart_during_burst(e2e: GPUCluster) -> None:
    names = [f"r{i}" for i in range(8)]
    await asyncio.gather(*(e2e.create_pod(n, [1]) for n in names[:4]))
    await asyncio.to_thread(e2e.cluster.restart_apiserver)
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
    """The extender (both replicas: kube-scheduler keeps one connection, so either may get every
    bind) runs 60 s ahead, one device plugin 60 s behind: no lock is judged expired early or
    late, no takeover happens, every pod gets its assignment."""
    replicas = sorted(
        n for n in e2e.cluster.state.procs() if n.startswith("extender-") and n != "extender-lb"
    )
    plugin_node = e2e.nodes[0]
    await restart_extenders(e2e.cluster, skewed("+60s"))
    seen = plugin_registrations(e2e.cluster, plugin_node)
    e2e.cluster.restart_component(f"deviceplugin-{plugin_node}", env=skewed("-60s"))
    await wait_registrations(e2e.cluster, plugin_node, seen)
    try:
        names = [f"s{i}" for i in range(8)]
        await asyncio.gather(*(e2e.create_pod(n, [1]) for n in names))
        pods = [await e2e.wait_phase(n, ["Running"], timeout_s=120) for n in names]
        for p in pods:
            assert kubelet_devices(p)["c0"] == sorted(assignment(p)["c0"])
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
