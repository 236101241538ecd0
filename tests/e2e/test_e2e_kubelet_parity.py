"""The simulated kubelet against kubelet itself: each scenario runs on a node whose kubelet is
``nodelock-simkubelet`` and on one whose kubelet is the real ``kubelet`` of the cluster's release
(``--kubelet real``, only containers faked), and asserts the same observable outcome on both:
what PodResources ``List`` returns, the Allocate calls the device plugin received (its
``nodelock_deviceplugin_allocations_total``), the pod's phase and kubelet's events.

Where the two disagree the simulation is wrong (docs/simkubelet.md). The kubelet behaviour each
scenario pins, with its source (the same in v1.31.9 and v1.37.2):

- a restart: kubelet admits every pod again (``HandlePodAdditions``, ``pkg/kubelet/kubelet.go``);
  with its device checkpoint a running pod keeps its devices; without it, a container the
  runtime reports running while kubelet's sources are not ready gets none (``devicesToAllocate``,
  ``pkg/kubelet/cm/devicemanager/manager.go``), so ``List`` names the pod with none; when the
  container is created again, ``GetDeviceRunContainerOptions`` (same file) fails it for want of
  a device record, since the plugin requires PreStartContainer, before it would call Allocate
  again (``needsReAllocate``);
- a restart with the checkpoint publishes 0 of its resources until the plugin registers again
  (``readCheckpoint``, ``pkg/kubelet/cm/devicemanager/manager.go``); re-admission checks a pod
  against the Node as last published, raised to what the device manager holds for pods
  (``lifecycle/predicate.go`` ``Admit``; ``UpdatePluginResources``, same manager.go), so a
  running pod whose record was lost with the checkpoint is rejected while the Node shows 0;
- a plugin that stops leaves its resource's devices unhealthy (``PluginDisconnected``,
  ``markResourceUnhealthy``): the Node keeps the capacity and shows 0 allocatable, and a pod
  admitted then fails before any Allocate ("no healthy devices present", ``devicesToAllocate``,
  all in ``pkg/kubelet/cm/devicemanager/manager.go``); the restarted plugin's first ListAndWatch
  answer makes them healthy again (``PluginListAndWatchReceiver``);
- a pod being deleted keeps its devices until its containers have stopped (its preStop hooks
  first: ``killContainer``, ``pkg/kubelet/kuberuntime/kuberuntime_container.go``; a pod counts
  as active until known terminated: ``isPodInactive``, ``pkg/kubelet/kubelet_pods.go``);
- a pod already being deleted when kubelet first sees it still goes through admission
  (``HandlePodAdditions``, ``pkg/kubelet/kubelet.go``: only a pod whose termination its pod
  worker already requested skips it).

- admission order: kubelet admits the pods of one config-source update sorted by creation,
  updates in arrival order (``HandlePodAdditions``, ``pkg/kubelet/kubelet.go``; the apiserver
  source sends one update per watch event, ``pkg/kubelet/config/apiserver.go``,
  ``pkg/kubelet/config/config.go``).

One cluster per kubelet kind for the module: one node with four GPUs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from devcluster.gpunodes import (
    kubelet_checkpoint,
    listing_of,
    pod_resources_socket,
    up_gpu_cluster,
)
from devcluster.realkubelet import KubeletKind
from deviceplugin.kubeletview import KubeletViewError, list_pod_resources
from kube.client import JSON, node_path, pod_path
from tests.e2e.kit import (
    BYPASS,
    LEASE_S,
    RESOURCE,
    GPUCluster,
    assignment,
    for_one_test,
    gpu_cluster_of_its_own,
    gpu_pod,
    log_count,
    metric_value,
    plugin_registrations,
    sleeping_at,
    slow_admission,
    wait_allocatable,
    wait_devices_back,
    wait_log,
    wait_registrations,
)

# every scenario is `core`: each pins kubelet behaviour cited above at v1.31.9 and v1.37.2, so
# `make test` runs it on the oldest supported release too
pytestmark = [pytest.mark.e2e, pytest.mark.core]

RUN_SECONDS = "sim.nodelock.io/run-seconds"
ALLOCATIONS = "nodelock_deviceplugin_allocations_total"
# how long the restarted pod's container runs: longer than two kubelet restarts take
KEEP_RUN_S = 45


@pytest.fixture(scope="module", params=[KubeletKind.SIM, KubeletKind.REAL], ids=["sim", "real"])
def parity_cluster(
    request: pytest.FixtureRequest, kubernetes_version: str | None
) -> Iterator[GPUCluster]:
    """A devcluster of its own on ``--kubernetes-version``: one GPU node x four GPUs whose
    kubelet is the simulated or the real one."""
    kind: KubeletKind = request.param

    def start(cluster: Any) -> Any:
        return up_gpu_cluster(
            cluster,
            nodes=1,
            gpus_per_node=4,
            extender_args=[f"--lease-duration={LEASE_S}"],
            kubelet=kind,
        )

    with gpu_cluster_of_its_own(f"nlp{kind.value[0]}-", start, version=kubernetes_version) as c:
        yield c


@pytest.fixture
async def parity(parity_cluster: GPUCluster) -> AsyncIterator[GPUCluster]:
    """The cluster with a client and a fresh namespace; the namespace is deleted after and every
    lock must end free."""
    async with for_one_test(parity_cluster, judge=False) as c:
        try:
            yield c
        finally:
            await c.cleanup(timeout_s=90)


def _listed(c: GPUCluster) -> dict[tuple[str, str], frozenset[str]]:
    """kubelet's PodResources List on the node, the test's pods only: (pod, container) -> GPU IDs
    (empty: listed without devices)."""
    socket = pod_resources_socket(c.cluster.state_dir, c.nodes[0])
    return {
        (pod.name, container): frozenset(ids)
        for pod in list_pod_resources(socket, resource=RESOURCE)
        if pod.namespace == c.namespace
        for container, ids in pod.containers.items()
    }


async def _allocations(c: GPUCluster) -> float:
    """Allocate calls the node's device plugin received, whatever it answered."""
    port = c.cluster.settings()["metrics"][f"deviceplugin-{c.nodes[0]}"]
    return await metric_value(f"http://127.0.0.1:{port}/metrics", ALLOCATIONS)


async def _settled_allocations(c: GPUCluster) -> float:
    """``_allocations`` once it stopped changing (the counter moves after kubelet got the
    answer, so a pod can be Running a moment before its Allocate is counted)."""
    last = await _allocations(c)
    while True:
        await asyncio.sleep(0.5)
        now = await _allocations(c)
        if now == last:
            return now
        last = now


async def _restart_kubelet(
    c: GPUCluster, *, drop_checkpoint: bool = False, plugin_up: bool = True
) -> None:
    """Stop the node's kubelet (removing its device checkpoint if asked), start it again and,
    with ``plugin_up``, wait until the device plugin registered with it again."""
    node = c.nodes[0]
    seen = plugin_registrations(c.cluster, node)
    c.cluster.stop_component(f"kubelet-{node}", forget=False)
    if drop_checkpoint:
        kubelet_checkpoint(c.cluster.state_dir, node).unlink()
    c.cluster.restart_component(f"kubelet-{node}")
    if plugin_up:
        await wait_registrations(c.cluster, node, seen, timeout_s=60)


async def _wait_listed(
    c: GPUCluster, key: tuple[str, str], *, timeout_s: float = 20.0
) -> frozenset[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            listed = await asyncio.to_thread(_listed, c)
        except KubeletViewError as exc:  # a kubelet just started serves its socket a moment later
            listed, why = {}, str(exc)
        else:
            why = str(listed)
        if key in listed:
            return listed[key]
        if time.monotonic() > deadline:
            raise AssertionError(f"{key} not in kubelet's List after {timeout_s}s: {why}")
        await asyncio.sleep(0.1)


async def test_restarts_with_and_without_checkpoint_then_container_restart(
    parity: GPUCluster,
) -> None:
    """kubelet restarted with its device checkpoint lists the running pod with its devices;
    restarted without it, with no devices; neither restart calls Allocate. When the pod's
    container then exits and kubelet creates it again (restartPolicy Always), kubelet holds no
    devices for it: the plugin registers with PreStartContainer required, so kubelet fails the
    container's creation (``callPreStartContainerIfNeeded`` before ``needsReAllocate``) instead
    of calling Allocate, and the pod stays Running with the container waiting."""
    c = parity
    node = c.nodes[0]
    pod = gpu_pod("keep", [1], node=node, annotations={RUN_SECONDS: str(KEEP_RUN_S)})
    await c.kube.create(pod_path(c.namespace), pod)
    running = await c.wait_phase("keep", ["Running"], timeout_s=90)
    started = time.monotonic()
    devices = frozenset(assignment(running)["c0"])
    assert await _wait_listed(c, ("keep", "c0")) == devices
    before = await _settled_allocations(c)

    await _restart_kubelet(c)
    assert await _wait_listed(c, ("keep", "c0")) == devices
    # premise: the Node shows the GPUs again. kubelet restarted with its checkpoint publishes 0 of
    # the resource until the plugin registers again; the next kubelet, without a checkpoint,
    # admits the running pod against the Node as published and would reject it on a 0
    await wait_allocatable(c, {RESOURCE: "4"})
    await _restart_kubelet(c, drop_checkpoint=True)
    assert await _wait_listed(c, ("keep", "c0")) == frozenset()  # running, no devices
    assert (await c.pod("keep"))["status"]["phase"] == "Running"
    assert await _allocations(c) == before  # admitted again twice without any Allocate
    elapsed = time.monotonic() - started
    assert elapsed < KEEP_RUN_S - 2, f"premise: both restarts took {elapsed:.0f}s, too slow"

    # the container exits KEEP_RUN_S after it started; kubelet creates it again at once (no back-off
    # before a first restart) and fails for want of a device record
    deadline = time.monotonic() + 60
    while True:
        status = (await c.pod("keep"))["status"]
        # a status written while kubelet restarts the container may have no containerStatuses yet
        statuses = status.get("containerStatuses") or [{}]
        waiting = (statuses[0].get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CreateContainerConfigError":
            break
        assert time.monotonic() < deadline, (
            f"phase {status.get('phase')} ({status.get('reason')}: {status.get('message')}), "
            f"containers {[(s.get('name'), s.get('state'), s.get('lastState')) for s in statuses]}"
        )
        await asyncio.sleep(0.2)
    assert waiting["message"].startswith("no devices found allocated in local cache for pod ")
    assert status["phase"] == "Running"
    assert await _allocations(c) == before
    assert (await asyncio.to_thread(_listed, c)).get(("keep", "c0")) == frozenset()


async def test_restart_without_checkpoint_rejects_a_running_pod_the_node_shows_no_gpus_for(
    parity: GPUCluster,
) -> None:
    """With the device plugin down, kubelet restarted with its device checkpoint publishes 0 of
    the resource (the checkpoint's devices count as none until the plugin registers again:
    ``readCheckpoint``) and keeps the running pod: admission raises the Node's allocatable to what
    the device manager holds for pods (``UpdatePluginResources``). Restarted once more, without
    its checkpoint, kubelet holds nothing for the pod, so admission checks it against that 0: the
    running pod is rejected (``OutOfnvidia.com/gpu``), its container stopped, and it leaves
    ``List`` (from 1.34; before, it stays listed without devices). No Allocate is called for it
    once the plugin is back."""
    c = parity
    node = c.nodes[0]
    await c.kube.create(pod_path(c.namespace), gpu_pod("held", [1], node=node))
    running = await c.wait_phase("held", ["Running"], timeout_s=90)
    devices = frozenset(assignment(running)["c0"])
    assert await _wait_listed(c, ("held", "c0")) == devices

    plugin = f"deviceplugin-{node}"
    seen = plugin_registrations(c.cluster, node)
    c.cluster.stop_component(plugin, forget=False)
    try:
        await _restart_kubelet(c, plugin_up=False)
        await wait_allocatable(c, {RESOURCE: "0"})
        assert await _wait_listed(c, ("held", "c0")) == devices
        assert (await c.pod("held"))["status"]["phase"] == "Running"

        await _restart_kubelet(c, drop_checkpoint=True, plugin_up=False)
        failed = (await c.wait_phase("held", ["Failed"], timeout_s=60))["status"]
        assert failed.get("reason") == f"OutOf{RESOURCE}", failed
        assert failed.get("message", "").startswith(
            f"Pod was rejected: Node didn't have enough resource: {RESOURCE}, requested: 1, "
            "used: 0, capacity: 0"
        ), failed
        assert f"OutOf{RESOURCE}" in await _event_reasons(c, "held", want=f"OutOf{RESOURCE}")
        # a rejected pod leaves List where it returns active pods only (from 1.34), else it
        # stays listed, without devices ("kubelet's facts", docs/deviceplugin.md)
        listed = (await asyncio.to_thread(_listed, c)).get(("held", "c0"))
        if listing_of(c.cluster.binaries.kubernetes_version) == "active":
            assert listed is None
        else:
            assert listed == frozenset()
    finally:
        c.cluster.restart_component(plugin)
        await wait_registrations(c.cluster, node, seen, timeout_s=60)
        await wait_allocatable(c, {RESOURCE: "4"})
    assert await _allocations(c) == 0  # the plugin, started again, was asked for nothing


async def test_a_stopped_plugin_leaves_no_healthy_device_until_it_registers_again(
    parity: GPUCluster,
) -> None:
    """While the node's device plugin is down kubelet keeps the resource's capacity, shows 0
    allocatable and fails a GPU pod's admission before calling Allocate; once the plugin is
    back, the Node shows every device again (what ``wait_devices_back`` waits for)."""
    c = parity
    node = c.nodes[0]
    await c.allow_bypass()
    plugin = f"deviceplugin-{node}"
    seen = plugin_registrations(c.cluster, node)
    c.cluster.stop_component(plugin, forget=False)
    try:
        await wait_allocatable(c, {RESOURCE: "0"}, node=node)
        assert (await c.kube.get(node_path(node)))["status"]["capacity"][RESOURCE] == "4"
        await c.create_pod("early", [1], node=node, bind_directly=True, labels=BYPASS)
        status = (await c.wait_phase("early", ["Failed", "Running"], timeout_s=60))["status"]
        assert (status["phase"], status.get("reason")) == ("Failed", "UnexpectedAdmissionError")
        assert (
            f"no healthy devices present; cannot allocate unhealthy devices {RESOURCE}"
            in status.get("message", "")
        ), status
    finally:
        c.cluster.restart_component(plugin)
        await wait_registrations(c.cluster, node, seen, timeout_s=60)
    await wait_devices_back(c, node)
    assert await _allocations(c) == 0  # the plugin, started again, was asked for nothing


async def test_deleted_pod_keeps_devices_until_its_containers_stop(parity: GPUCluster) -> None:
    """A pod deleted with a 4 s preStop sleep hook stays listed with its devices, Running, while
    kubelet runs the hook; it is gone once its containers stopped, not before."""
    c = parity
    pod = gpu_pod("term", [1], node=c.nodes[0])
    pod["spec"]["terminationGracePeriodSeconds"] = 30
    pod["spec"]["containers"][0]["lifecycle"] = {"preStop": {"sleep": {"seconds": 4}}}
    await c.kube.create(pod_path(c.namespace), pod)
    running = await c.wait_phase("term", ["Running"], timeout_s=90)
    devices = frozenset(assignment(running)["c0"])
    assert await _wait_listed(c, ("term", "c0")) == devices

    deleted = time.monotonic()
    await c.kube.delete(pod_path(c.namespace, "term"))
    await asyncio.sleep(1.5)
    terminating = await c.pod("term")
    assert terminating["metadata"].get("deletionTimestamp"), terminating["metadata"]
    assert terminating["status"]["phase"] == "Running"
    assert (await asyncio.to_thread(_listed, c)).get(("term", "c0")) == devices
    await c.wait_gone("term", timeout_s=60)
    assert time.monotonic() - deleted >= 3.5  # the hook ran before the containers stopped


async def test_pod_deleted_before_kubelet_saw_it_is_admitted(parity: GPUCluster) -> None:
    """A GPU pod bound and deleted (gracefully) while kubelet is down reaches kubelet already
    being deleted: kubelet still admits it, so the device manager is asked for its devices and
    the admission failure is kubelet's event on it (no plugin has registered again yet; or the
    plugin refuses a pod without the node lock); then the pod is gone."""
    c = parity
    node = c.nodes[0]
    await c.allow_bypass()
    c.cluster.stop_component(f"kubelet-{node}", forget=False)
    try:
        ghost = gpu_pod("ghost", [1], node=node, bind_directly=True, labels=BYPASS)
        ghost["spec"]["terminationGracePeriodSeconds"] = 30
        await c.kube.create(pod_path(c.namespace), ghost)
        await c.kube.delete(pod_path(c.namespace, "ghost"))
        assert (await c.pod("ghost"))["metadata"].get("deletionTimestamp")
    finally:
        seen = plugin_registrations(c.cluster, node)
        c.cluster.restart_component(f"kubelet-{node}")
        await wait_registrations(c.cluster, node, seen, timeout_s=60)
    await c.wait_gone("ghost", timeout_s=60)
    reasons = await _event_reasons(c, "ghost")
    assert "UnexpectedAdmissionError" in reasons, reasons


async def test_admission_takes_batches_in_arrival_order(parity: GPUCluster) -> None:
    """Two pods bound while kubelet is busy admitting a third arrive as two batches: kubelet
    admits the younger one first because it was bound first (each batch sorted by creation,
    batches in arrival order). Every Allocate takes 3 s here (a slow plugin), so the order shows
    in the seconds of kubelet's rejection events (the pods are placed by hand, without the node
    lock, so the plugin refuses each)."""
    c = parity
    node = c.nodes[0]
    await c.allow_bypass()
    c.expect_unadmitted("busy", "older", "younger")
    for name in ("older", "younger"):  # created a second apart, left unscheduled
        pod = gpu_pod(name, [1], labels=BYPASS)
        pod["spec"]["schedulerName"] = "parity-nobody"
        await c.kube.create(pod_path(c.namespace), pod)
        await asyncio.sleep(1.1)
    async with slow_admission(c, node, seconds=3):
        sleeping = log_count(c, f"deviceplugin-{node}", sleeping_at("allocate.start"))
        busy = gpu_pod("busy", [1], node=node, bind_directly=True, labels=BYPASS)
        await c.kube.create(pod_path(c.namespace), busy)
        await wait_log(c, f"deviceplugin-{node}", sleeping_at("allocate.start"), sleeping)
        for name in ("younger", "older"):  # bound in this order while kubelet admits busy
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
            await c.kube.create(pod_path(c.namespace, name) + "/binding", binding)
        for name in ("busy", "younger", "older"):
            failed = await c.wait_phase(name, ["Failed"], timeout_s=60)
            assert failed["status"]["reason"] == "UnexpectedAdmissionError", failed["status"]
    rejected = {name: await _rejected_at(c, name) for name in ("busy", "younger", "older")}
    assert rejected["busy"] < rejected["younger"] < rejected["older"], rejected


async def _rejected_at(c: GPUCluster, pod: str) -> str:
    """When kubelet recorded its admission failure on ``pod`` (the event's first timestamp)."""
    deadline = time.monotonic() + 10
    while True:
        events: list[JSON] = (await c.kube.list(f"/api/v1/namespaces/{c.namespace}/events"))[
            "items"
        ]
        for e in events:
            if (
                e["involvedObject"].get("name") == pod
                and e.get("reason") == "UnexpectedAdmissionError"
                and e.get("source", {}).get("component") == "kubelet"
            ):
                return str(e.get("firstTimestamp") or e["metadata"]["creationTimestamp"])
        assert time.monotonic() < deadline, f"no admission failure event for {pod}"
        await asyncio.sleep(0.2)


async def _event_reasons(
    c: GPUCluster, pod: str, *, timeout_s: float = 10.0, want: str | None = None
) -> list[str]:
    """Reasons of the events kubelet recorded on the test's pod ``pod`` (events are written
    asynchronously: waits up to ``timeout_s`` for one, or for one with reason ``want``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        events: list[JSON] = (await c.kube.list(f"/api/v1/namespaces/{c.namespace}/events"))[
            "items"
        ]
        reasons = [
            e.get("reason", "")
            for e in events
            if e["involvedObject"].get("name") == pod
            and e.get("source", {}).get("component") == "kubelet"
        ]
        if (reasons if want is None else want in reasons) or time.monotonic() > deadline:
            return reasons
        await asyncio.sleep(0.2)
