"""The handoff through real kube-scheduler, the extender and kubelet's own device manager.

Each test checks from the simulated kubelet's record (what kubelet's device manager allocated and
what our plugin answered) that every container got exactly its assignment, and the fixture
checks S1/S2 over every pod of the cluster afterwards.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from kube.client import pod_path
from kube.errors import Forbidden, NotFound
from tests.e2e.kit import (
    BYPASS,
    LEASE_S,
    GPUCluster,
    assert_no_violations,
    assignment,
    gpu_pod,
    kubelet_devices,
    log_count,
    sleeping_at,
    slow_admission,
    wait_log,
)

SHAPES = {
    "one-gpu": ([1], []),
    "four-gpus": ([4], []),
    "two-containers": ([1, 2], []),
    "init-then-container": ([2], [1]),
}


@pytest.mark.core
@pytest.mark.parametrize("shape", list(SHAPES))
async def test_each_container_gets_exactly_its_assignment(e2e: GPUCluster, shape: str) -> None:
    containers, init = SHAPES[shape]
    await e2e.create_pod("p", containers, init=init)
    pod = await e2e.wait_phase("p", ["Running"])
    node = pod["spec"]["nodeName"]
    want = assignment(pod)
    gpu_containers = [f"init{i}" for i, g in enumerate(init) if g]
    gpu_containers += [f"c{i}" for i, g in enumerate(containers) if g]
    assert list(want) == gpu_containers  # init containers first, spec order
    for name, ids in want.items():
        count = dict(zip(gpu_containers, [*init, *containers], strict=True))[name]
        assert len(ids) == count
    assert kubelet_devices(pod) == {c: sorted(ids) for c, ids in want.items()}
    if init:
        # kubelet reuses init-container devices for app containers; the choice allows it
        assert set(want["init0"]) <= {d for c, ids in want.items() if c != "init0" for d in ids}
    lease = await e2e.wait_holder(node, None)
    ann = lease["metadata"]["annotations"]
    assert ann["nodelock.io/last-holder"] == e2e.key("p")
    assert ann["nodelock.io/last-outcome"] == "allocated"
    assert ann["nodelock.io/last-token"] == pod["metadata"]["annotations"]["nodelock.io/token"]


REUSE_SHAPES = {"i2-1-1": (2, [1, 1]), "i4-2-2": (4, [2, 2]), "i4-1-1-1-1": (4, [1, 1, 1, 1])}
REUSE_ROUNDS = 3  # kubelet picks from the init container's devices in Go map order: repeat


@pytest.mark.core
async def test_app_containers_reuse_init_container_devices_in_kubelets_order(
    e2e: GPUCluster,
) -> None:
    """kubelet gives app containers devices of the init container's in its own (map) order and
    without GetPreferredAllocation; every pod must still run, each container within its pod's
    assignment, app containers disjoint (the fixture checks S1/S2 over all pods afterwards)."""
    for round_ in range(REUSE_ROUNDS):
        names = {f"reuse-{shape}-{round_}": shape for shape in REUSE_SHAPES}
        for name, shape in names.items():
            init, apps = REUSE_SHAPES[shape]
            await e2e.create_pod(name, apps, init=[init])
        for name, shape in names.items():
            init, apps = REUSE_SHAPES[shape]
            pod = await e2e.wait_phase(name, ["Running"])
            pods_devices = {d for ids in assignment(pod).values() for d in ids}
            seen = kubelet_devices(pod)
            assert sorted(seen) == sorted(["init0", *(f"c{i}" for i in range(len(apps)))])
            assert len(seen["init0"]) == init
            kept: set[str] = set()
            for i, count in enumerate(apps):
                ids = seen[f"c{i}"]
                assert len(ids) == count
                assert set(ids) <= pods_devices, (name, seen, assignment(pod))
                assert not kept & set(ids), (name, seen)
                kept |= set(ids)
            assert set(seen["init0"]) <= pods_devices
        await assert_no_violations(e2e)  # S1 across the round's pods, S2 from the records
        for name in names:
            await e2e.kube.delete(pod_path(e2e.namespace, name), grace_period_seconds=0)
        for name in names:
            await e2e.wait_gone(name)


async def test_non_gpu_pod_runs_without_a_lock(e2e: GPUCluster) -> None:
    before = await lock_tokens(e2e)
    await e2e.create_pod("plain", [0])
    pod = await e2e.wait_phase("plain", ["Running"])
    assert "nodelock.io/assignment" not in pod["metadata"].get("annotations", {})
    assert await lock_tokens(e2e) == before


async def lock_tokens(e2e: GPUCluster) -> dict[str, object]:
    """Each node's fencing token (None where no GPU pod has taken its lock yet)."""
    tokens: dict[str, object] = {}
    for n in e2e.nodes:
        try:
            tokens[n] = (await e2e.lease(n))["spec"].get("leaseTransitions")
        except NotFound:
            tokens[n] = None
    return tokens


@pytest.mark.core
async def test_gpu_pod_bypassing_the_extender_is_denied_at_admission(e2e: GPUCluster) -> None:
    """A GPU pod placed by hand (spec.nodeName at create) or for a scheduler that does not call
    the extender would get no lock of its own, and the devices of whichever pod holds the node's
    lock: the devcluster's admission policy, the chart's, denies it before any kubelet sees it."""
    node = e2e.nodes[0]
    with pytest.raises(Forbidden) as err:
        await e2e.create_pod("by-hand", [1], node=node, bind_directly=True)
    message = str(err.value)
    assert "ValidatingAdmissionPolicy 'nodelock-gpu-pods'" in message
    assert "created with spec.nodeName" in message
    assert "nodelock.io/bypass=true" in message
    other = gpu_pod("other-scheduler", [1])
    other["spec"]["schedulerName"] = "some-other-scheduler"
    with pytest.raises(Forbidden, match=r"may not ask for nvidia\.com/gpu"):
        await e2e.kube.create(pod_path(e2e.namespace), other)
    # the pod label alone is no escape: the namespace must carry it too (an administrator's)
    with pytest.raises(Forbidden, match="nodelock-gpu-pods"):
        await e2e.create_pod("by-hand", [1], node=node, bind_directly=True, labels=BYPASS)
    # a pod without GPUs placed by hand is not judged, and GPU pods the extender binds run
    await e2e.create_pod("plain-by-hand", [0], node=node, bind_directly=True)
    await e2e.create_pod("honest", [1], node=node)
    await e2e.wait_phase("honest", ["Running"])
    await e2e.wait_phase("plain-by-hand", ["Running"])


async def test_forged_pod_bound_directly_is_refused_and_takes_no_lock(e2e: GPUCluster) -> None:
    """HAMi #3076: a pod owner sets nodeName and forges the assignment annotations.

    The admission policy denies such a pod; this one is exempted by an administrator (escape
    label on pod and namespace) to show that the device plugin refuses it all the same."""
    node = e2e.nodes[0]
    await e2e.allow_bypass()
    gpus = json.loads(
        (await e2e.kube.get(f"/api/v1/nodes/{node}"))["metadata"]["annotations"]["nodelock.io/gpus"]
    )
    forged = {
        "nodelock.io/assignment": json.dumps({"c0": [gpus[0]["id"]]}),
        "nodelock.io/token": "1",
    }
    before = await e2e.lease(node)
    e2e.expect_unadmitted("forged")
    await e2e.create_pod(
        "forged", [1], node=node, bind_directly=True, annotations=forged, labels=BYPASS
    )
    pod = await e2e.wait_phase("forged", ["Failed"])
    status = pod["status"]
    assert status["reason"] == "UnexpectedAdmissionError"
    # kubelet's Allocate names no pod: the plugin says which node and why, and what to do
    assert f"node {node}: no pod holds" in status["message"]
    assert "must be bound by the nodelock scheduler extender" in status["message"]
    assert kubelet_devices(pod) == {}
    after = await e2e.lease(node)
    assert after["spec"].get("holderIdentity") == before["spec"].get("holderIdentity")
    assert after["spec"].get("leaseTransitions") == before["spec"].get("leaseTransitions")
    # the node still serves honest pods
    await e2e.create_pod("honest", [1], node=node)
    await e2e.wait_phase("honest", ["Running"])


async def test_bypass_pod_racing_a_handoff_fails_alone_and_the_holder_runs(
    e2e: GPUCluster,
) -> None:
    """Hole 1(b) with the policy lifted: a GPU pod bound by hand reaches kubelet just before a pod
    the extender binds.  kubelet admits the bypass pod while the other holds the node's lock,
    then admits the holder before the bypass pod's rejection reaches the API server.  The plugin
    asks kubelet (PodResources) which pod it admits: the bypass pod is refused without a
    release, the holder runs with its assignment, no device goes to two pods."""
    node = e2e.nodes[-1]
    await e2e.allow_bypass()
    e2e.expect_unadmitted("sneaky")
    plugin = f"deviceplugin-{node}"
    # the holder is scheduled, bound and holds the lock while the bypass pod's Allocate waits
    async with slow_admission(e2e, node, seconds=5):
        sleeping = log_count(e2e, plugin, sleeping_at("allocate.start"))
        await e2e.create_pod("sneaky", [1], node=node, bind_directly=True, labels=BYPASS)
        await wait_log(e2e, plugin, sleeping_at("allocate.start"), sleeping)  # in its Allocate
        await e2e.create_pod("holder", [1], node=node)
        await e2e.wait_holder(node, e2e.key("holder"))
        sneaky = await e2e.wait_phase("sneaky", ["Failed", "Running"], timeout_s=60)
        holder = await e2e.wait_phase("holder", ["Failed", "Running"], timeout_s=60)
    assert holder["status"]["phase"] == "Running", holder["status"]
    assert kubelet_devices(holder)["c0"] == sorted(assignment(holder)["c0"])
    assert sneaky["status"]["phase"] == "Failed"
    assert sneaky["status"]["reason"] == "UnexpectedAdmissionError"
    assert "kubelet is admitting another pod" in sneaky["status"]["message"]
    assert kubelet_devices(sneaky) == {}
    lease = await e2e.wait_holder(node, None)
    assert lease["metadata"]["annotations"]["nodelock.io/last-outcome"] == "allocated"


async def test_owner_editing_assignment_after_binding_gets_nothing(e2e: GPUCluster) -> None:
    """S2: the plugin serves the Lease's copy of the assignment, never the pod owner's edit."""
    node = e2e.nodes[1]
    e2e.expect_unadmitted("victim")
    async with slow_admission(e2e, node, seconds=6):
        await e2e.create_pod("victim", [1], node=node)
        pod = await e2e.wait_bound("victim")
        real = assignment(pod)["c0"]
        gpus = json.loads(
            (await e2e.kube.get(f"/api/v1/nodes/{node}"))["metadata"]["annotations"][
                "nodelock.io/gpus"
            ]
        )
        other = next(g["id"] for g in gpus if g["id"] not in real)
        await e2e.kube.patch(
            pod_path(e2e.namespace, "victim"),
            {"metadata": {"annotations": {"nodelock.io/assignment": json.dumps({"c0": [other]})}}},
        )
        pod = await e2e.wait_phase("victim", ["Failed", "Running"], timeout_s=60)
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    assert "assignment" in pod["status"]["message"]
    assert kubelet_devices(pod) == {}
    lease = await e2e.wait_holder(node, None)
    assert lease["metadata"]["annotations"]["nodelock.io/last-outcome"] == "rejected"


@pytest.mark.core
async def test_expired_lock_of_pending_holder_is_not_handed_on(e2e: GPUCluster) -> None:
    """HAMi #3096: an expired lock whose holder may still be admitted must not go to another pod."""
    node = e2e.nodes[2]
    async with slow_admission(e2e, node, seconds=LEASE_S * 3):
        await e2e.create_pod("first", [2], node=node)
        await e2e.wait_bound("first")
        await e2e.wait_holder(node, e2e.key("first"))
        await asyncio.sleep(LEASE_S + 2)  # the lock is now expired by everyone's clock
        await e2e.create_pod("second", [2], node=node)
        await asyncio.sleep(LEASE_S)  # several bind attempts for "second" come and fail
        assert (await e2e.pod("first"))["status"]["phase"] == "Pending"
        assert not (await e2e.pod("second"))["spec"].get("nodeName")
        assert (await e2e.lease(node))["spec"]["holderIdentity"] == e2e.key("first")
        first = await e2e.wait_phase("first", ["Running"], timeout_s=90)
        second = await e2e.wait_phase("second", ["Running"], timeout_s=90)
    a, b = kubelet_devices(first)["c0"], kubelet_devices(second)["c0"]
    assert a == sorted(assignment(first)["c0"])
    assert b == sorted(assignment(second)["c0"])
    assert not set(a) & set(b)


@pytest.mark.core
async def test_kubelet_restart_deletes_sockets_and_plugin_reregisters(e2e: GPUCluster) -> None:
    node = e2e.nodes[0]
    plugin_dir = e2e.cluster.state_dir / "nodes" / node / "device-plugins"

    def plugin_sockets() -> set[tuple[str, int]]:
        return {
            (p.name, p.stat().st_ctime_ns)
            for p in plugin_dir.glob("*.sock")
            if p.name != "kubelet.sock"
        }

    before = plugin_sockets()
    assert before, "the plugin had no socket before the restart"
    e2e.cluster.restart_component(f"kubelet-{node}")
    # kubelet's device manager deletes every other socket when it starts; the plugin notices
    # and serves a new socket, then registers again
    for _ in range(200):
        if plugin_sockets() - before:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"the device plugin did not re-register: {list(plugin_dir.iterdir())}")
    await e2e.create_pod("after-restart", [2], node=node)
    pod = await e2e.wait_phase("after-restart", ["Running"])
    assert kubelet_devices(pod)["c0"] == sorted(assignment(pod)["c0"])
