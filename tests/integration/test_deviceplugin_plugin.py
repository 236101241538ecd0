"""The device plugin against the real API server, driven over its unix socket by a gRPC client.

Each test plays the extender itself (takes the node lock with lockd, binds the pod with its
assignment on the Binding) and kubelet's part with a grpc.aio client of the plugin's socket, or a
Registration server on a temporary ``kubelet.sock``.  The real kubelet device manager drives the
plugin in the e2e tests (Go harness).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from prometheus_client import CollectorRegistry

from deviceplugin import checkpoint, endpoint
from deviceplugin.answer import DeviceMode
from deviceplugin.checkpoint import Checkpoint, PendingRelease
from deviceplugin.plugin import DevicePlugin, PluginConfig
from deviceplugin.simulated import SimSpec, SimulatedBackend, simulated_id
from handoff.wire import (
    DEFAULT_PREFIX,
    ContainerName,
    DeviceID,
    format_assignment,
    format_inventory,
    parse_inventory,
)
from kube import KubeClient, NotFound
from kube.client import event_path, lease_path, node_path, pod_path
from lockd import (
    HeldLock,
    Holder,
    HolderKey,
    LockMetrics,
    NodeLocks,
    NodeLockView,
    NodeName,
    Outcome,
)
from proto import deviceplugin_v1beta1_pb2 as pb
from proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

T = TypeVar("T")
GPU_COUNT = 8
WAIT_S = 30.0


@dataclass
class Env:
    """One test's node, directories and extender-side lock client."""

    kube: KubeClient
    namespace: str
    node: NodeName
    plugin_dir: Path
    state_dir: Path
    locks: NodeLocks  # the test's stand-in for the extender

    def gpu(self, index: int) -> DeviceID:
        return simulated_id(self.node, index)

    def config(self, **overrides: Any) -> PluginConfig:
        base = PluginConfig(
            node=self.node,
            plugin_dir=self.plugin_dir,
            state_dir=self.state_dir,
            lock_namespace=self.namespace,
        )
        return replace(base, **overrides)


@pytest.fixture
async def env(kube: KubeClient, namespace: str) -> AsyncIterator[Env]:
    node = NodeName(f"dp-{secrets.token_hex(4)}")
    await kube.create(node_path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    # unix socket paths must stay short (108 bytes), so not under pytest's tmp_path
    root = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    locks = NodeLocks(
        kube,
        namespace=namespace,
        metrics=LockMetrics(registry=CollectorRegistry()),
        prefix=DEFAULT_PREFIX,
    )
    try:
        yield Env(kube, namespace, node, root / "plugins", root / "state", locks)
    finally:
        with contextlib.suppress(NotFound):
            await kube.delete(node_path(node))
        shutil.rmtree(root, ignore_errors=True)


@contextlib.asynccontextmanager
async def running(
    env: Env, *, sim_file: Path | None = None, **overrides: Any
) -> AsyncIterator[DevicePlugin]:
    backend = SimulatedBackend(env.node, SimSpec(count=GPU_COUNT), sim_file=sim_file)
    plugin = DevicePlugin(env.config(**overrides), kube=env.kube, backend=backend)
    await plugin.start()
    try:
        yield plugin
    finally:
        await plugin.stop()


@contextlib.asynccontextmanager
async def dial(plugin: DevicePlugin) -> AsyncIterator[pb_grpc.DevicePluginAsyncStub]:
    async with grpc.aio.insecure_channel(f"unix://{plugin.endpoint.socket}") as channel:
        yield pb_grpc.DevicePluginStub(channel)


async def eventually(probe: Callable[[], Awaitable[T | None]], what: str) -> T:
    """Poll ``probe`` until it returns something other than None (or fail after WAIT_S)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        value = await probe()
        if value is not None:
            return value
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def container(name: str, gpus: int) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "registry.k8s.io/pause:3.10"}
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return c


async def bind(
    env: Env,
    name: str,
    assignment: Mapping[str, Sequence[DeviceID]],
    *,
    containers: Sequence[tuple[str, int]],
    init: Sequence[tuple[str, int]] = (),
) -> tuple[dict[str, Any], HeldLock]:
    """What the extender does: create-time pod, lock for it, Binding with the annotations."""
    spec: dict[str, Any] = {
        "schedulerName": "nodelock-test-nobody",  # no scheduler touches it
        "containers": [container(n, g) for n, g in containers],
    }
    if init:
        spec["initContainers"] = [container(n, g) for n, g in init]
    pod = await env.kube.create(
        pod_path(env.namespace),
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec},
    )
    value = format_assignment({ContainerName(k): list(v) for k, v in assignment.items()})
    holder = Holder(
        HolderKey(f"{env.namespace}/{name}"), pod["metadata"]["uid"], {"assignment": value}
    )
    held = await env.locks.acquire(env.node, holder)
    await env.kube.create(
        pod_path(env.namespace, name, subresource="binding"),
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "annotations": {
                    "nodelock.io/assignment": value,
                    "nodelock.io/token": str(held.token),
                },
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": env.node},
        },
    )
    return await env.kube.get(pod_path(env.namespace, name)), held


async def allocate(stub: pb_grpc.DevicePluginAsyncStub, *ids: str) -> pb.ContainerAllocateResponse:
    resp = await stub.Allocate(
        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
    )
    assert len(resp.container_responses) == 1
    return resp.container_responses[0]


async def refused(call: Awaitable[object], code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    return info.value.details() or ""


async def preferred(
    stub: pb_grpc.DevicePluginAsyncStub,
    available: Sequence[str],
    size: int,
    must: Sequence[str] = (),
) -> list[str]:
    resp = await stub.GetPreferredAllocation(
        pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must,
                    allocation_size=size,
                )
            ]
        )
    )
    return list(resp.container_responses[0].deviceIDs)


async def lease(env: Env) -> NodeLockView:
    view = await env.locks.inspect(env.node)
    assert view is not None
    return view


async def released(env: Env, token: int) -> NodeLockView | None:
    view = await env.locks.inspect(env.node)
    if view is None or view.record.holder is not None or view.record.last is None:
        return None
    return view if view.record.last.token == token else None


def sample(plugin: DevicePlugin, name: str, **labels: str) -> float:
    return plugin.metrics.registry.get_sample_value(name, labels) or 0.0


# -- the happy path ------------------------------------------------------------------------------


async def test_init_and_main_container_then_the_lock_is_released(env: Env) -> None:
    gpus = [env.gpu(i) for i in range(GPU_COUNT)]
    assignment = {"setup": [gpus[2]], "train": [gpus[2], gpus[5]]}
    _, held = await bind(env, "p", assignment, init=[("setup", 1)], containers=[("train", 2)])
    async with running(env) as plugin, dial(plugin) as stub:
        # kubelet: preference, then Allocate, per container (init first)
        assert await preferred(stub, gpus, 1) == [gpus[2]]
        setup = await allocate(stub, gpus[2])
        assert dict(setup.envs) == {"NVIDIA_VISIBLE_DEVICES": gpus[2]}
        assert list(setup.devices) == []  # simulated GPUs have no device nodes
        assert (await lease(env)).record.holder is not None  # one container still to go

        others = [g for g in gpus if g != gpus[2]]
        assert await preferred(stub, others, 2, must=[gpus[2]]) == [gpus[2], gpus[5]]
        train = await allocate(stub, gpus[5], gpus[2])
        assert train.envs["NVIDIA_VISIBLE_DEVICES"] == f"{gpus[2]},{gpus[5]}"

        view = await eventually(lambda: released(env, held.token), "the lock release")
        assert view.record.last is not None
        assert view.record.last.outcome == Outcome.ALLOCATED.value
        assert view.record.last.holder == f"{env.namespace}/p"
        assert view.record.token == held.token  # released, not re-acquired
        assert plugin.admission.progress is None
        assert plugin.admission.pending == ()
        assert sample(plugin, "nodelock_deviceplugin_allocations_total", result="allocated") == 2
        assert (
            sample(plugin, "nodelock_deviceplugin_preferred_allocations_total", result="hit") == 2
        )
        assert sample(plugin, "nodelock_lock_releases_total", outcome="allocated") == 1
        assert sample(plugin, "nodelock_deviceplugin_allocate_seconds_count") == 2


async def test_cdi_mode_names_devices(env: Env) -> None:
    g = env.gpu(1)
    await bind(env, "p", {"main": [g]}, containers=[("main", 1)])
    async with running(env, mode=DeviceMode.CDI) as plugin, dial(plugin) as stub:
        resp = await allocate(stub, g)
    assert [d.name for d in resp.cdi_devices] == [f"nvidia.com/gpu={g}"]


# -- bad input -----------------------------------------------------------------------------------


async def test_bad_grpc_input_never_crashes_the_plugin_or_touches_the_lock(env: Env) -> None:
    g = [env.gpu(i) for i in range(GPU_COUNT)]
    _, held = await bind(env, "p", {"main": [g[0]]}, containers=[("main", 1)])
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    async with running(env) as plugin, dial(plugin) as stub:

        def req(*containers: Sequence[str]) -> pb.AllocateRequest:
            return pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers]
            )

        await refused(stub.Allocate(pb.AllocateRequest()), invalid)
        await refused(stub.Allocate(req([])), invalid)
        await refused(stub.Allocate(req(["GPU-not-here"])), invalid)
        await refused(stub.Allocate(req(["GPU\x00", "\u2603" * 70])), invalid)
        await refused(stub.Allocate(req([g[0], g[0]])), invalid)
        await refused(stub.Allocate(req([f"GPU-{i:060d}" for i in range(20_000)])), invalid)
        await refused(stub.Allocate(req(*([[g[0]]] * 100))), invalid)
        await refused(stub.Allocate(req([g[0]], [g[1]])), invalid)

        empty = await stub.GetPreferredAllocation(pb.PreferredAllocationRequest())
        assert list(empty.container_responses) == []
        many = await stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=g, allocation_size=1)
                ]
                * 50
            )
        )
        assert len(many.container_responses) == 50
        for size in (-5, 0, 2**31 - 1):
            hint = await preferred(stub, ["x" * 200, *g], size)
            assert len(hint) <= max(size, 0)
        assert await preferred(stub, [], 3) == []
        await stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["junk"] * 1000))
        await stub.GetDevicePluginOptions(pb.Empty())

        view = await lease(env)  # nothing above released or changed the lock
        assert view.record.holder is not None
        assert view.record.token == held.token
        assert sample(plugin, "nodelock_deviceplugin_allocations_total", result="bad-request") == 8

        resp = await allocate(stub, g[0])  # and the plugin still serves
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == g[0]
        await eventually(lambda: released(env, held.token), "the lock release")


# -- refusals and the lock -----------------------------------------------------------------------


async def test_no_holder_is_refused_and_nothing_is_written(env: Env) -> None:
    async with running(env) as plugin, dial(plugin) as stub:
        msg = await refused(
            stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=[env.gpu(0)])]
                )
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
        )
        assert env.node in msg
        assert "no pod holds the node lock" in msg
        assert await env.locks.inspect(env.node) is None  # no Lease was created
        assert plugin.admission.pending == ()


async def test_forged_assignment_is_refused_and_the_lock_released_rejected(env: Env) -> None:
    g = [env.gpu(i) for i in range(GPU_COUNT)]
    _, held = await bind(env, "p", {"main": [g[0]]}, containers=[("main", 1)])
    # HAMi #3076: the pod owner rewrites its own annotation to get GPU 7
    forged = format_assignment({ContainerName("main"): [g[7]]})
    await env.kube.patch(
        pod_path(env.namespace, "p"),
        {"metadata": {"annotations": {"nodelock.io/assignment": forged}}},
    )
    async with running(env) as plugin, dial(plugin) as stub:
        assert await preferred(stub, [g[7]], 1) == [g[7]]  # a hint only: a miss
        assert sample(plugin, "nodelock_deviceplugin_preferred_allocations_total", result="miss")
        msg = await refused(
            stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=[g[7]])]
                )
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
        )
        assert f"{env.namespace}/p" in msg
        assert env.node in msg
        assert "differs from the lock's copy" in msg
        view = await eventually(lambda: released(env, held.token), "the rejected release")
        assert view.record.last is not None
        assert view.record.last.outcome == Outcome.REJECTED.value
        assert sample(plugin, "nodelock_deviceplugin_allocations_total", result="forged") == 1


async def test_holder_pod_deleted_releases_rejected(env: Env) -> None:
    _, held = await bind(env, "p", {"main": [env.gpu(0)]}, containers=[("main", 1)])
    await env.kube.delete(pod_path(env.namespace, "p"), grace_period_seconds=0)
    async with running(env) as plugin, dial(plugin) as stub:
        await refused(stub.Allocate(_one(env.gpu(0))), grpc.StatusCode.FAILED_PRECONDITION)
        view = await eventually(lambda: released(env, held.token), "the rejected release")
        assert view.record.last is not None
        assert view.record.last.outcome == Outcome.REJECTED.value
        assert plugin.admission.pending == ()


async def test_a_holder_kubelet_rejected_is_released_at_once_once_the_plugin_serves(
    env: Env,
) -> None:
    """issue 52, decision 0012: kubelet fails the holder without calling the plugin (a restarted
    kubelet admits the pods bound to it before the plugin reported its devices again).  While
    the plugin has sent kubelet no device (no ListAndWatch stream), its lock stays held: kubelet
    would reject the next pod too.  As soon as ListAndWatch has sent the devices, the plugin
    releases it ``rejected``, with an Event naming the cause and what to do."""
    _, held = await bind(env, "p", {"main": [env.gpu(0)]}, containers=[("main", 1)])
    async with running(env) as plugin, dial(plugin) as stub:
        await eventually(lambda: _synced(plugin), "the pod watch")
        await env.kube.patch(
            pod_path(env.namespace, "p", subresource="status"),
            {
                "status": {
                    "phase": "Failed",
                    "reason": "UnexpectedAdmissionError",
                    "message": "Allocate failed due to no healthy devices present; cannot "
                    "allocate unhealthy devices nvidia.com/gpu, which is unexpected",
                }
            },
        )
        await eventually(lambda: _failed(plugin, f"{env.namespace}/p"), "the pod watch")
        assert not plugin.serving()
        assert await plugin.admission.release_ended() is False
        assert (await lease(env)).record.holder is not None
        assert plugin.admission.pending == ()
        # kubelet opens ListAndWatch: the devices are sent, and the lock is released at once
        stream = stub.ListAndWatch(pb.Empty())
        first = await stream.read()
        assert isinstance(first, pb.ListAndWatchResponse)
        assert len(first.devices) == GPU_COUNT
        view = await eventually(lambda: released(env, held.token), "the release")
        assert plugin.serving()
        stream.cancel()
        assert view.record.last is not None
        assert view.record.last.outcome == Outcome.REJECTED.value
        assert view.record.token == held.token
        assert plugin.admission.pending == ()
        assert sample(plugin, "nodelock_lock_releases_total", outcome="rejected") == 1
        labels = {"outcome": "rejected", "result": "released"}
        assert sample(plugin, "nodelock_deviceplugin_lock_releases_total", **labels) == 1
        await plugin.events.recorder.flush()
        selector = "involvedObject.name=p,reason=NodeLockReleased"
        [event] = (await env.kube.list(event_path(env.namespace), field_selector=selector))["items"]
        assert f"held by {env.namespace}/p (token {held.token})" in event["message"]
        assert "before the device plugin had reported its devices" in event["message"]
        assert "must be created again" in event["message"]


async def _failed(plugin: DevicePlugin, key: str) -> bool | None:
    pod = plugin.pods.get(HolderKey(key))
    return True if pod is not None and pod["status"].get("phase") == "Failed" else None


async def test_a_holder_deleted_before_its_allocate_is_released_deleted(env: Env) -> None:
    """The holder is deleted while the plugin watches: its lock is released ``deleted`` at once,
    serving or not (a deleted holder says nothing about kubelet's devices); a stale view of the
    lock writes nothing (the token fences it)."""
    _, held = await bind(env, "p", {"main": [env.gpu(0)]}, containers=[("main", 1)])
    async with running(env) as plugin:
        await eventually(lambda: _synced(plugin), "the pod watch")
        await env.kube.delete(pod_path(env.namespace, "p"), grace_period_seconds=0)
        view = await eventually(lambda: released(env, held.token), "the release")
        assert view.record.last is not None
        assert view.record.last.outcome == Outcome.DELETED.value
        assert plugin.admission.pending == ()
        # the lock moves on; the plugin's view of the old holder changes nothing any more
        assert await plugin.admission.release_ended() is False


async def _synced(plugin: DevicePlugin) -> bool | None:
    return True if plugin.pods.synced else None


def _one(*ids: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])


async def test_refusals_that_may_concern_another_pod_leave_the_lock_to_its_holder(
    env: Env,
) -> None:
    g = [env.gpu(i) for i in range(GPU_COUNT)]
    _, held = await bind(env, "p", {"main": [g[3]]}, containers=[("main", 1)])
    failed = grpc.StatusCode.FAILED_PRECONDITION
    async with running(env) as plugin, dial(plugin) as stub:
        msg = await refused(stub.Allocate(_one(g[3], g[4])), failed)  # count mismatch
        assert "asks for 2 devices" in msg
        msg = await refused(stub.Allocate(_one(g[4])), failed)  # kubelet chose other IDs
        assert "kubelet chose" in msg
        view = await lease(env)
        assert view.record.holder is not None
        assert view.record.token == held.token
        # ... so the holder is still served when kubelet admits it, and then it is released
        resp = await allocate(stub, g[3])
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == g[3]
        await eventually(lambda: released(env, held.token), "the lock release")


async def test_token_mismatch_is_refused_and_the_lock_left_alone(env: Env) -> None:
    _, held = await bind(env, "p", {"main": [env.gpu(0)]}, containers=[("main", 1)])
    await env.kube.patch(
        pod_path(env.namespace, "p"),
        {"metadata": {"annotations": {"nodelock.io/token": str(held.token + 5)}}},
    )
    async with running(env) as plugin, dial(plugin) as stub:
        msg = await refused(stub.Allocate(_one(env.gpu(0))), grpc.StatusCode.FAILED_PRECONDITION)
        assert f"node lock is at token {held.token}" in msg
        view = await lease(env)
        assert view.record.holder is not None
        assert view.record.token == held.token
        assert plugin.admission.pending == ()


async def test_lock_taken_over_mid_handoff_refuses_once_then_serves_the_new_holder(
    env: Env,
) -> None:
    g = [env.gpu(i) for i in range(GPU_COUNT)]
    await bind(env, "p", {"a": [g[0]], "b": [g[1]]}, containers=[("a", 1), ("b", 1)])
    async with running(env) as plugin, dial(plugin) as stub:
        await allocate(stub, g[0])  # p's first container; p's second is still to come
        assert plugin.admission.progress is not None
        await env.locks.break_lock(env.node)  # by hand, as `nodelock locks break` would
        _, q_held = await bind(env, "q", {"main": [g[5]]}, containers=[("main", 1)])
        msg = await refused(stub.Allocate(_one(g[5])), grpc.StatusCode.FAILED_PRECONDITION)
        assert f"{env.namespace}/p" in msg  # names the interrupted handoff ...
        assert f"{env.namespace}/q" in msg  # ... and the new holder
        view = await lease(env)
        assert view.record.holder is not None
        assert view.record.holder.key == f"{env.namespace}/q"  # left alone
        # while p may still be admitted (Pending here, its devices not all recorded by
        # kubelet), the call may be p's next container: refused again, naming p
        msg = await refused(stub.Allocate(_one(g[5])), grpc.StatusCode.FAILED_PRECONDITION)
        assert f"{env.namespace}/p" in msg
        # the refusal made kubelet reject p, as kubelet does when an Allocate fails
        status = {"phase": "Failed", "reason": "UnexpectedAdmissionError"}
        await env.kube.patch(pod_path(env.namespace, "p", subresource="status"), {"status": status})
        resp = await allocate(stub, g[5])
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == g[5]
        await eventually(lambda: released(env, q_held.token), "q's lock release")


async def test_a_gpu_pod_bound_around_the_extender_makes_allocate_refuse(env: Env) -> None:
    """Hole 1(b): kubelet cannot say which pod it admits; while a GPU pod bound by hand is
    Pending here beside the holder, nothing is served, the lock stays, the message names it."""
    g = [env.gpu(i) for i in range(GPU_COUNT)]
    _, held = await bind(env, "p", {"main": [g[2]]}, containers=[("main", 1)])
    await env.kube.create(
        pod_path(env.namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sneaky"},
            "spec": {"nodeName": env.node, "containers": [container("c", 1)]},
        },
    )
    async with running(env) as plugin, dial(plugin) as stub:

        async def synced() -> bool | None:
            return True if plugin.pods.synced else None

        await eventually(synced, "the pod watch to list")
        assert sample(plugin, "nodelock_deviceplugin_pod_watch_synced") == 1

        async def gauged() -> bool | None:  # p holds g[2] whole; sneaky has no assignment
            slices = sample(plugin, "nodelock_deviceplugin_gpu_slices", gpu=g[2])
            return True if slices == 1 else None

        await eventually(gauged, "the per-GPU gauges to count p's GPU")
        assert sample(plugin, "nodelock_deviceplugin_gpu_cores_committed_percent", gpu=g[2]) == 100
        assert (
            sample(plugin, "nodelock_deviceplugin_gpu_memory_committed_mib", gpu=g[2])
            == sample(plugin, "nodelock_deviceplugin_gpu_memory_capacity_mib", gpu=g[2])
            > 0
        )
        assert sample(plugin, "nodelock_deviceplugin_gpu_slices", gpu=g[0]) == 0
        msg = await refused(stub.Allocate(_one(g[2])), grpc.StatusCode.FAILED_PRECONDITION)
        assert f"{env.namespace}/sneaky" in msg
        assert sample(plugin, "nodelock_deviceplugin_allocations_total", result="ambiguous") == 1
        view = await lease(env)
        assert view.record.holder is not None
        assert view.record.token == held.token  # left alone
        # once the other pod is gone, the holder is served as usual
        await env.kube.delete(pod_path(env.namespace, "sneaky"), grace_period_seconds=0)

        async def sneaky_gone() -> bool | None:
            return True if plugin.pods.get(HolderKey(f"{env.namespace}/sneaky")) is None else None

        await eventually(sneaky_gone, "the watch to see the pod deleted")
        resp = await allocate(stub, g[2])
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == g[2]
        await eventually(lambda: released(env, held.token), "the lock release")


async def _running_pod(env: Env, name: str) -> dict[str, Any]:
    """A one-GPU pod bound here that kubelet admitted (Running), as the API server shows it."""
    pod = await env.kube.create(
        pod_path(env.namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"nodeName": env.node, "containers": [container("c", 1)]},
        },
    )
    status = {"phase": "Running", "containerStatuses": [_running_status("c")]}
    await env.kube.patch(pod_path(env.namespace, name, subresource="status"), {"status": status})
    return pod


def _running_status(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": "x",
        "imageID": "",
        "ready": True,
        "restartCount": 0,
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
    }


def _kubelet_checkpoint(env: Env, entries: Sequence[tuple[str, str, str]]) -> None:
    """kubelet's device checkpoint in the plugin directory: (pod UID, container, device)."""
    env.plugin_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "Data": {
            "PodDeviceEntries": [
                {
                    "PodUID": uid,
                    "ContainerName": c,
                    "ResourceName": "nvidia.com/gpu",
                    "DeviceIDs": {"-1": [dev]},
                    "AllocResp": "",
                }
                for uid, c, dev in entries
            ],
            "RegisteredDevices": {},
        },
        "Checksum": 0,
    }
    (env.plugin_dir / "kubelet_internal_checkpoint").write_text(json.dumps(data))


async def test_without_kubelets_list_an_admitted_pod_counts_until_kubelets_checkpoint_has_it(
    env: Env,
) -> None:
    """Issue 31 hole 1 on the fallback: kubelet's PodResources List cannot be read, so Allocate
    decides from the node's pods and kubelet's device checkpoint. A running GPU pod whose
    devices that checkpoint does not record (kubelet restarted without it and will call
    Allocate for it again) makes the call ambiguous; once kubelet records them, the holder is
    served. Each fallback is a metric and a Node Event."""
    g = [env.gpu(i) for i in range(GPU_COUNT)]
    previous = await _running_pod(env, "previous")
    _, held = await bind(env, "p", {"main": [g[2]]}, containers=[("main", 1)])
    missing = env.plugin_dir / "no-kubelet.sock"
    async with running(env, pod_resources_socket=missing) as plugin, dial(plugin) as stub:
        msg = await refused(stub.Allocate(_one(g[2])), grpc.StatusCode.FAILED_PRECONDITION)
        assert f"{env.namespace}/previous (uid {previous['metadata']['uid']})" in msg
        assert sample(plugin, "nodelock_deviceplugin_allocations_total", result="ambiguous") == 1
        assert sample(plugin, "nodelock_deviceplugin_kubelet_view_reads_total", result="error") == 2
        assert (await lease(env)).record.token == held.token  # left alone
        await plugin.events.recorder.flush()
        selector = (
            f"involvedObject.kind=Node,involvedObject.name={env.node},reason=KubeletListUnavailable"
        )
        events = (await env.kube.list(event_path(), field_selector=selector))["items"]
        assert len(events) == 1, events
        assert str(missing) in events[0]["message"]
        assert "kubelet's device checkpoint" in events[0]["message"]
        # kubelet records the running pod's devices again: the holder is served
        _kubelet_checkpoint(env, [(previous["metadata"]["uid"], "c", str(g[5]))])
        resp = await allocate(stub, g[2])
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == g[2]
        await eventually(lambda: released(env, held.token), "the lock release")


# -- restarts ------------------------------------------------------------------------------------


async def test_progress_survives_a_plugin_restart(env: Env) -> None:
    g = [env.gpu(i) for i in range(GPU_COUNT)]
    _, held = await bind(env, "p", {"a": [g[0]], "b": [g[1]]}, containers=[("a", 1), ("b", 1)])
    async with running(env) as plugin, dial(plugin) as stub:
        await allocate(stub, g[0])
    async with running(env) as plugin, dial(plugin) as stub:  # a new process, same state dir
        assert plugin.admission.progress is not None
        assert plugin.admission.progress.served == ("a",)
        # kubelet (restarted too) asks for b only: its checkpoint already has a's devices
        assert await preferred(stub, g, 1) == [g[1]]
        resp = await allocate(stub, g[1])
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == g[1]
        await eventually(lambda: released(env, held.token), "the lock release")


async def test_a_pending_release_is_retried_after_a_restart(env: Env) -> None:
    pod, held = await bind(env, "p", {"main": [env.gpu(0)]}, containers=[("main", 1)])
    # the previous process served the last container and died before its release reached the
    # API server: the checkpoint says so
    cp = Checkpoint(env.node).with_pending(
        PendingRelease.of(held.holder, held.token, Outcome.ALLOCATED)
    )
    checkpoint.save(checkpoint.checkpoint_path(env.state_dir, env.node), cp)
    async with running(env) as plugin:
        view = await eventually(lambda: released(env, held.token), "the pending release")
        assert view.record.last is not None
        assert view.record.last.outcome == Outcome.ALLOCATED.value

        async def drained() -> bool | None:
            return True if plugin.admission.pending == () else None

        await eventually(drained, "the checkpoint to forget the release")
    again = checkpoint.load(checkpoint.checkpoint_path(env.state_dir, env.node), env.node)
    assert again.pending == ()
    del pod


async def test_a_pending_release_on_a_lease_edited_out_of_shape_is_retried_not_fatal(
    env: Env,
) -> None:
    """Issue 51 M2: a pending release meets a Lease someone edited by hand so that it is no node
    lock (its token annotation is not a number).  The plugin keeps running and keeps the release
    pending; once the Lease is mended the release is written."""
    _, held = await bind(env, "p", {"main": [env.gpu(0)]}, containers=[("main", 1)])
    cp = Checkpoint(env.node).with_pending(
        PendingRelease.of(held.holder, held.token, Outcome.ALLOCATED)
    )
    checkpoint.save(checkpoint.checkpoint_path(env.state_dir, env.node), cp)
    path = lease_path(env.namespace, env.node)
    last_token = "nodelock.io/last-token"
    edit = {"nodelock.io/last-holder": "ns/someone", last_token: "not-a-number"}
    await env.kube.patch(path, {"metadata": {"annotations": edit}})
    async with running(env) as plugin:

        async def retried() -> bool | None:
            for task in plugin._tasks:  # the old plugin's release task died here
                assert not task.done(), f"{task.get_name()} ended: {task.exception()!r}"
            retries = sample(
                plugin,
                "nodelock_deviceplugin_lock_releases_total",
                outcome="allocated",
                result="retry",
            )
            return True if retries >= 1 else None

        await eventually(retried, "a release attempt on the malformed Lease")
        await asyncio.sleep(0.5)
        assert not any(t.done() for t in plugin._tasks), "a plugin task ended"
        assert plugin.admission.pending != ()
        await env.kube.patch(path, {"metadata": {"annotations": {last_token: "0"}}})
        await eventually(lambda: released(env, held.token), "the release once mended")


async def test_a_release_the_checkpoint_file_still_names_is_repeated_harmlessly(env: Env) -> None:
    """A finished release reaches the checkpoint file with the plugin's next write, or when it
    stops; a crash before then leaves it pending in the file, and the restarted plugin repeats
    it: the token is stale by then, and the lock's next holder keeps the lock."""
    path = checkpoint.checkpoint_path(env.state_dir, env.node)
    _, first = await bind(env, "p", {"main": [env.gpu(0)]}, containers=[("main", 1)])
    async with running(env) as plugin, dial(plugin) as stub:
        await allocate(stub, env.gpu(0))
        await eventually(lambda: released(env, first.token), "the first release")
        assert plugin.admission.pending == ()
        crashed = checkpoint.load(path, env.node)  # what a crash now would leave
        assert [p.token for p in crashed.pending] == [first.token]
    assert checkpoint.load(path, env.node).pending == ()  # the stop wrote it
    _, second = await bind(env, "q", {"main": [env.gpu(1)]}, containers=[("main", 1)])
    checkpoint.save(path, crashed)
    async with running(env) as plugin:

        async def repeated() -> bool | None:
            done = sample(
                plugin,
                "nodelock_deviceplugin_lock_releases_total",
                outcome="allocated",
                result="already",
            )
            return True if done == 1 and plugin.admission.pending == () else None

        await eventually(repeated, "the repeated release")
        view = await lease(env)
        assert view.record.holder is not None
        assert view.record.holder.key == f"{env.namespace}/q"
        assert view.record.token == second.token


# -- registration --------------------------------------------------------------------------------


class FakeKubelet(pb_grpc.RegistrationServicer):
    """A Registration server on kubelet.sock that, like kubelet, dials the plugin back."""

    def __init__(self, plugin_dir: Path, during_register: Callable[[], None] | None) -> None:
        self.plugin_dir = plugin_dir
        self.during_register = during_register
        self.requests: asyncio.Queue[tuple[pb.RegisterRequest, pb.DevicePluginOptions]] = (
            asyncio.Queue()
        )

    async def Register(
        self,
        request: pb.RegisterRequest,
        context: grpc.aio.ServicerContext[pb.RegisterRequest, pb.Empty],
    ) -> pb.Empty:
        target = f"unix://{self.plugin_dir / request.endpoint}"
        async with grpc.aio.insecure_channel(target) as channel:
            options = await pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                pb.Empty(), timeout=5
            )
        if self.during_register is not None:
            self.during_register()
        await self.requests.put((request, options))
        return pb.Empty()


@contextlib.asynccontextmanager
async def kubelet(
    plugin_dir: Path, *, during_register: Callable[[], None] | None = None
) -> AsyncIterator[FakeKubelet]:
    await asyncio.to_thread(plugin_dir.mkdir, parents=True, exist_ok=True)
    fake = FakeKubelet(plugin_dir, during_register)
    server = grpc.aio.server()
    pb_grpc.add_RegistrationServicer_to_server(fake, server)
    server.add_insecure_port(f"unix://{plugin_dir / 'kubelet.sock'}")
    await server.start()
    try:
        yield fake
    finally:
        await server.stop(None)


async def registrations(plugin: DevicePlugin, count: int) -> None:
    async def reached() -> bool | None:
        return True if plugin.endpoint.registrations >= count else None

    await eventually(reached, f"{count} registrations")
    assert plugin.endpoint.registrations == count


async def test_registers_after_serving_and_again_after_a_kubelet_restart(env: Env) -> None:
    async with kubelet(env.plugin_dir) as first, running(env) as plugin:
        request, options = await asyncio.wait_for(first.requests.get(), WAIT_S)
        assert request.version == "v1beta1"
        assert request.endpoint == "nodelock-gpu.sock"
        assert request.resource_name == "nvidia.com/gpu"
        assert request.options.get_preferred_allocation_available
        assert options.get_preferred_allocation_available  # it was serving during Register
        await registrations(plugin, 1)
    # kubelet restarts: it goes away and wipes the plugin directory, then comes back
    for entry in env.plugin_dir.iterdir():
        entry.unlink()
    # (the plugin above was stopped with its kubelet; run a new one through the restart)
    async with running(env) as plugin:
        async with kubelet(env.plugin_dir) as k1:
            await asyncio.wait_for(k1.requests.get(), WAIT_S)
        for entry in env.plugin_dir.iterdir():
            entry.unlink()  # kubelet's cleanup deletes the plugin's socket
        async with kubelet(env.plugin_dir) as k2:
            request, options = await asyncio.wait_for(k2.requests.get(), WAIT_S)
            assert request.endpoint == "nodelock-gpu.sock"
            assert options.get_preferred_allocation_available
            assert plugin.endpoint.restarts == 1
            await registrations(plugin, 2)
            async with dial(plugin) as stub:  # the new socket serves the devices
                stream = stub.ListAndWatch(pb.Empty())
                first_list = await asyncio.wait_for(stream.read(), WAIT_S)
                assert isinstance(first_list, pb.ListAndWatchResponse)
                assert len(first_list.devices) == GPU_COUNT
                stream.cancel()
        assert sample(plugin, "nodelock_deviceplugin_registrations_total", result="ok") == 2


async def test_kubelet_sock_recreated_without_touching_our_socket_reregisters(env: Env) -> None:
    async with running(env) as plugin:
        async with kubelet(env.plugin_dir) as k1:
            await asyncio.wait_for(k1.requests.get(), WAIT_S)
        (env.plugin_dir / "kubelet.sock").unlink(missing_ok=True)  # gRPC may have removed it
        async with kubelet(env.plugin_dir) as k2:
            await asyncio.wait_for(k2.requests.get(), WAIT_S)
            await registrations(plugin, 2)
        assert plugin.endpoint.restarts == 0


async def test_registers_once_with_a_kubelet_whose_socket_changed_during_register(
    env: Env,
) -> None:
    """kubelet.sock's identity changes while Register is in flight (as when a starting kubelet
    replaces a dead one's leftover socket just as the plugin dials): the kubelet that answered
    is the one there now, so the plugin does not register with it a second time (kubelet
    v1.37.2 refuses a second Register on one socket and then never releases the first:
    ``deviceplugin.endpoint.ALREADY_CONNECTED``).  A second Register would follow at once: the
    change wakes the plugin (inotify ``IN_ATTRIB`` on kubelet.sock)."""
    sock = env.plugin_dir / "kubelet.sock"

    def new_identity() -> None:
        os.chmod(sock, 0o700)  # a new st_ctime_ns, the listening socket unchanged

    async with kubelet(env.plugin_dir, during_register=new_identity) as k, running(env) as plugin:
        await asyncio.wait_for(k.requests.get(), WAIT_S)
        await registrations(plugin, 1)
        with pytest.raises(TimeoutError):  # a second Register would come within milliseconds
            await asyncio.wait_for(k.requests.get(), 1.0)
        assert plugin.endpoint.registrations == 1
        assert plugin.endpoint.registered.is_set()


async def test_a_refused_register_is_tried_again_at_once_on_a_new_kubelet_sock(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead kubelet's kubelet.sock refuses the connection; when a new kubelet replaces it the
    plugin registers at once, not at its next retry (here an hour away)."""
    monkeypatch.setattr(endpoint, "REGISTER_FIRST_RETRY_S", 3600.0)
    monkeypatch.setattr(endpoint, "REGISTER_RETRY_S", 3600.0)
    env.plugin_dir.mkdir(parents=True, exist_ok=True)
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(env.plugin_dir / "kubelet.sock"))
    leftover.close()  # the file stays; nobody listens on it
    async with running(env) as plugin:

        async def refused() -> float | None:
            errors = sample(plugin, "nodelock_deviceplugin_registrations_total", result="error")
            return errors or None

        await eventually(refused, "a refused Register")
        (env.plugin_dir / "kubelet.sock").unlink()
        async with kubelet(env.plugin_dir) as k:
            await asyncio.wait_for(k.requests.get(), WAIT_S)
            await registrations(plugin, 1)


# -- devices and inventory -----------------------------------------------------------------------


async def test_list_and_watch_and_the_inventory_follow_health_changes(env: Env) -> None:
    sim = env.plugin_dir.parent / "gpus.json"
    sim.write_text(json.dumps({"count": 2}))
    async with running(env, sim_file=sim) as plugin, dial(plugin) as stub:
        stream = stub.ListAndWatch(pb.Empty())
        first = await asyncio.wait_for(stream.read(), WAIT_S)
        assert isinstance(first, pb.ListAndWatchResponse)
        assert [d.health for d in first.devices] == ["Healthy", "Healthy"]
        assert [d.ID for d in first.devices] == [env.gpu(0), env.gpu(1)]

        sim.write_text(json.dumps({"count": 2, "unhealthy": [1]}))
        second = await asyncio.wait_for(stream.read(), WAIT_S)
        assert isinstance(second, pb.ListAndWatchResponse)
        assert [d.health for d in second.devices] == ["Healthy", "Unhealthy"]
        stream.cancel()

        async def annotated_unhealthy() -> list[bool] | None:
            node = await env.kube.get(node_path(env.node))
            raw = node["metadata"].get("annotations", {}).get("nodelock.io/gpus")
            gpus = parse_inventory(raw) if raw else []
            health = [x.healthy for x in gpus]
            return health if health == [True, False] else None

        await eventually(annotated_unhealthy, "the inventory annotation to show the change")
        assert sample(plugin, "nodelock_deviceplugin_devices", health="unhealthy") == 1
        assert sample(plugin, "nodelock_deviceplugin_devices", health="healthy") == 1


async def test_inventory_is_written_only_when_it_changes(env: Env) -> None:
    async with running(env) as plugin:

        async def written() -> int | None:
            return plugin.inventory.writes or None

        assert await eventually(written, "the inventory write") == 1
        node = await env.kube.get(node_path(env.node))
        expected = format_inventory(plugin.state.gpus)
        assert node["metadata"]["annotations"]["nodelock.io/gpus"] == expected
    async with running(env) as plugin:  # same devices after a restart: no write

        async def checked() -> str | None:
            return plugin.inventory.written

        assert await eventually(checked, "the inventory check") == expected
        assert plugin.inventory.writes == 0
