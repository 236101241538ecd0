"""Shared GPUs end to end: one node x two simulated 80 GiB GPUs, ``--gpu-split 4``, through the
real kube-scheduler (extender wired in) and kubelet's own device manager (the simulated kubelet),
judged from kubelet's records (``sim.nodelock.io/allocated``)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from devcluster.gpunodes import kubelet_checkpoint, pod_resources_socket
from devcluster.invariants import allocated
from deviceplugin.kubeletview import list_pod_resources, read_checkpoint
from handoff.sharing import FULL_CORES, Slice, Use, commitments, physical_of, pod_slices
from handoff.wire import GPU, DeviceID, parse_inventory
from kube.client import node_path, pod_path
from kube.errors import NotFound
from nodelock.audit import audit, devcluster_sources
from tests.e2e.conftest import SHARING_SPLIT
from tests.e2e.kit import (
    RESOURCE,
    GPUCluster,
    assignment,
    exited_at,
    extender_replicas,
    gpu_pod,
    held_locks,
    log_count,
    plugin_registrations,
    restart_extenders,
    sleeping_at,
    wait_any_log,
    wait_log,
    wait_process_gone,
    wait_registrations,
)

SLICE_MIB = 20000


async def create(c: GPUCluster, name: str, **sharing: str) -> None:
    pod = gpu_pod(name, [1])
    pod["spec"]["containers"][0]["resources"]["limits"].update(
        {f"nvidia.com/{k}": v for k, v in sharing.items()}
    )
    await c.kube.create(pod_path(c.namespace), pod)


def gpus_of(pod: dict[str, Any]) -> list[str]:
    """The physical GPUs kubelet allocated to the pod (its virtual IDs folded)."""
    return sorted({physical_of(d) for r in allocated(pod).values() for d in r["deviceIDs"]})


def envs_of(pod: dict[str, Any]) -> dict[str, str]:
    (record,) = allocated(pod).values()
    return dict(record["envs"])


def scheduling_message(pod: dict[str, Any]) -> str:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message", ""))
    return ""


async def nudge(c: GPUCluster, why: str) -> None:
    """Make kube-scheduler retry its unschedulable pods now, with the deletion already seen by
    the extender: the retry kube-scheduler makes on the deletion itself can reach the extender
    first and be rejected again, leaving the pod to the next event or to five minutes in the
    unschedulable queue (docs/sharing.md, "How a slice is chosen and handed off")."""
    await c.kube.patch(
        node_path(c.nodes[0]), {"metadata": {"labels": {"nodelock.io/e2e-nudge": why}}}
    )


async def stays_pending(c: GPUCluster, name: str, *, seconds: float = 4.0) -> str:
    """Wait for the pod's unschedulable message; it must stay unbound for ``seconds`` more."""
    message = ""
    for _ in range(150):
        pod = await c.pod(name)
        message = scheduling_message(pod)
        if message:
            break
        await asyncio.sleep(0.2)
    assert message, f"{name} got no PodScheduled=False message"
    await asyncio.sleep(seconds)
    pod = await c.pod(name)
    assert not pod["spec"].get("nodeName"), pod["spec"]
    return message


async def test_eight_quarter_slices_then_a_pending_ninth_and_a_whole_gpu_only_on_a_free_gpu(
    sharing: GPUCluster,
) -> None:
    c = sharing
    names = [f"slice-{i}" for i in range(2 * SHARING_SPLIT)]
    await asyncio.gather(*(create(c, n, gpumem=str(SLICE_MIB)) for n in names))
    pods = [await c.wait_phase(n, ["Running"], timeout_s=120) for n in names]

    per_gpu = Counter(g for p in pods for g in gpus_of(p))
    assert sorted(per_gpu.values()) == [SHARING_SPLIT, SHARING_SPLIT], per_gpu
    for p in pods:
        (gpu,) = gpus_of(p)
        envs = envs_of(p)
        assert envs["NVIDIA_VISIBLE_DEVICES"] == gpu
        assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={SLICE_MIB}M"
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{SLICE_MIB}m"
        assert "CUDA_DEVICE_SM_LIMIT" not in envs  # no cores asked for, none limited

    # a ninth slice: every slice of both GPUs is in use
    await create(c, "slice-ninth", gpumem=str(SLICE_MIB), gpucores="10")
    message = await stays_pending(c, "slice-ninth")
    assert "nvidia.com/gpu" in message or "slices in use" in message, message

    # a whole GPU: no GPU has nothing committed
    await create(c, "whole")
    await stays_pending(c, "whole", seconds=1.0)

    # free one GPU (and drop the ninth so that it cannot take it first)
    await c.kube.delete(pod_path(c.namespace, "slice-ninth"))
    freed = sorted(per_gpu)[0]
    on_freed = [n for n, p in zip(names, pods, strict=True) if gpus_of(p) == [freed]]
    await asyncio.gather(*(c.kube.delete(pod_path(c.namespace, n)) for n in on_freed))
    for n in [*on_freed, "slice-ninth"]:
        await c.wait_gone(n)
    await nudge(c, "gpu-freed")

    whole = await c.wait_phase("whole", ["Running"], timeout_s=120)
    assert gpus_of(whole) == [freed]
    envs = envs_of(whole)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == freed
    assert not any(k.startswith(("CUDA_MPS", "CUDA_DEVICE")) for k in envs), envs

    # nothing fits beside the whole GPU, however small: a slice waits for the other GPU
    await create(c, "slice-again", gpumem="1000", gpucores="30")
    message = await stays_pending(c, "slice-again", seconds=0.5)
    assert "held whole by another pod" in message, message
    other = next(n for n, p in zip(names, pods, strict=True) if gpus_of(p) != [freed])
    await c.kube.delete(pod_path(c.namespace, other))
    await c.wait_gone(other)
    await nudge(c, "slice-freed")
    again = await c.wait_phase("slice-again", ["Running"], timeout_s=120)
    assert gpus_of(again) != [freed]
    envs = envs_of(again)
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"


async def test_bad_sharing_requests_stay_pending_with_a_reason(sharing: GPUCluster) -> None:
    sharing.expect_unadmitted("too-big", "too-many-cores")
    await create(sharing, "too-big", gpumem="100000")
    message = await stays_pending(sharing, "too-big", seconds=0.5)
    assert "the largest GPU here has 81920 MiB" in message, message
    await create(sharing, "too-many-cores", gpumem="1000", gpucores="101")
    message = await stays_pending(sharing, "too-many-cores", seconds=0.5)
    assert "over 100" in message, message


async def test_a_mixed_burst_after_an_extender_crash_mid_bind_stays_within_capacity(
    sharing: GPUCluster,
) -> None:
    """The extender dies holding the lock for a slice it never bound; the slice is placed after
    the takeover, then a burst of a whole GPU and slices fills the node exactly: 80000 of 81920
    MiB and four slices on one GPU, the whole GPU alone on the other.  The fixture checks every
    GPU's committed memory and exclusivity from kubelet's records afterwards."""
    c = sharing
    node = c.nodes[0]
    line = exited_at("bind.after-acquire")
    await restart_extenders(c.cluster, {"NODELOCK_FAILPOINTS": "bind.after-acquire"})
    replicas = extender_replicas(c.cluster)
    logged = {name: log_count(c, name, line) for name in replicas}
    try:
        await create(c, "first", gpumem="30000")
        await c.wait_holder(node, c.key("first"))
        # proof of the crash: a replica logged the failpoint and its process is gone
        for name in await wait_any_log(c, line, logged):
            await wait_process_gone(replicas[name])
        assert not (await c.pod("first"))["spec"].get("nodeName")
    finally:
        await restart_extenders(c.cluster, {})
    first = await c.wait_phase("first", ["Running"], timeout_s=120)
    (shared_gpu,) = gpus_of(first)

    await asyncio.gather(
        create(c, "whole"),
        create(c, "s30", gpumem="30000"),
        create(c, "s10a", gpumem="10000", gpucores="50"),
        create(c, "s10b", gpumem="10000", gpucores="50"),
    )
    pods = {
        n: await c.wait_phase(n, ["Running"], timeout_s=120)
        for n in ("whole", "s30", "s10a", "s10b")
    }
    assert gpus_of(pods["whole"]) != [shared_gpu]
    for n in ("s30", "s10a", "s10b"):
        assert gpus_of(pods[n]) == [shared_gpu], n
        assert assignment(pods[n]) == {"c0": [shared_gpu]}
    await c.wait_holder(node, None)


# ---- the device plugin killed mid-handoff under a mixed burst ---------------------------------

# (ReplicaSet, replicas, sharing limits): one GPU whole, the other filled exactly by four slices
# (80000 of 81920 MiB, 100 % of its cores, its four virtual devices)
MIXED: list[tuple[str, int, dict[str, str]]] = [
    ("whole", 1, {}),
    ("s20", 2, {"gpumem": "20000", "gpucores": "25"}),
    ("s30", 1, {"gpumem": "30000", "gpucores": "30"}),
    ("s10", 1, {"gpumem": "10000", "gpucores": "20"}),
]
SLEEPING = sleeping_at("allocate.start")


def replica_set(name: str, replicas: int, limits: dict[str, str]) -> dict[str, Any]:
    """A ReplicaSet of single-container GPU pods with these sharing limits (none: a whole GPU)."""
    pod = gpu_pod(name, [1], labels={"rs": name})
    pod["spec"]["containers"][0]["resources"]["limits"].update(
        {f"nvidia.com/{k}": v for k, v in limits.items()}
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"rs": name}},
            "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
        },
    }


def replica_sets_path(namespace: str, name: str | None = None) -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/replicasets" + (f"/{name}" if name else "")


async def wait_replica_sets_ready(c: GPUCluster, *, timeout_s: float) -> list[dict[str, Any]]:
    """Wait until every ReplicaSet of ``MIXED`` has all its replicas Running; their pods.

    A pod kubelet fails frees room for its replacement the way a deletion does, so each failed
    pod gets a ``nudge`` a second after it is first seen Failed, when the extender's watch has
    seen it too (the replacement's own retry may have reached the extender first: ``nudge``)."""
    deadline = time.monotonic() + timeout_s
    running: list[dict[str, Any]] = []
    failed_at: dict[str, float] = {}
    nudged: set[str] = set()
    while time.monotonic() < deadline:
        pods: list[dict[str, Any]] = (await c.kube.list(pod_path(c.namespace)))["items"]
        running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
        per_rs = Counter(p["metadata"]["labels"]["rs"] for p in running)
        if all(per_rs[name] == n for name, n, _ in MIXED):
            return pods
        now = time.monotonic()
        for p in pods:
            if p.get("status", {}).get("phase") == "Failed":
                failed_at.setdefault(p["metadata"]["name"], now)
        for name, seen in failed_at.items():
            if name not in nudged and now - seen >= 1.0:
                await nudge(c, f"{name}-failed")
                nudged.add(name)
        await asyncio.sleep(0.25)
    raise AssertionError(
        f"not every replica Running in {timeout_s}s: "
        f"{[(p['metadata']['name'], p.get('status', {}).get('phase')) for p in running]}\n"
        + await why_not_running(c)
    )


async def why_not_running(c: GPUCluster) -> str:
    """For a failure message: each pod not Running with its phase, node and last events, and
    each node's lock holder."""
    pods: list[dict[str, Any]] = (await c.kube.list(pod_path(c.namespace)))["items"]
    events: list[dict[str, Any]] = (await c.kube.list(f"/api/v1/namespaces/{c.namespace}/events"))[
        "items"
    ]
    lines = []
    for p in pods:
        status = p.get("status", {})
        if status.get("phase") == "Running":
            continue
        name = p["metadata"]["name"]
        said = [
            f"{e.get('reason')}: {str(e.get('message'))[:200]}"
            for e in events
            if e["involvedObject"].get("name") == name
        ]
        lines.append(
            f"{name} {status.get('phase')} on {p['spec'].get('nodeName')} "
            f"({status.get('reason')}: {status.get('message')}); events: {said[-4:]}"
        )
    for node in c.nodes:
        try:
            holder = (await c.lease(node))["spec"].get("holderIdentity")
        except NotFound:
            holder = "no Lease"
        lines.append(f"lock of {node}: {holder}")
    return "\n".join(lines)


async def kubelet_gpu_use(c: GPUCluster, node: str) -> tuple[dict[DeviceID, Use], list[GPU]]:
    """What kubelet's PodResources says each physical GPU of ``node`` holds: every container
    kubelet lists with devices, its virtual IDs folded to their GPUs, with its claim read from
    its pod's spec (a pod kubelet lists but the API server does not know is an error)."""
    socket = pod_resources_socket(c.cluster.state_dir, node)
    listed = await asyncio.to_thread(list_pod_resources, socket, resource=RESOURCE)
    node_obj = await c.kube.get(node_path(node))
    inventory = parse_inventory(node_obj["metadata"]["annotations"]["nodelock.io/gpus"])
    pods = {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}": p
        for p in (await c.kube.list(pod_path(), field_selector=f"spec.nodeName={node}"))["items"]
    }
    holdings: list[tuple[DeviceID, Slice]] = []
    for entry in listed:
        for container, ids in entry.containers.items():
            if not ids:
                continue
            assert entry.key in pods, f"kubelet holds {sorted(ids)} for unknown pod {entry.key}"
            claim = pod_slices(pods[entry.key]).get(container)
            assert claim is not None, f"{entry.key}/{container} holds {sorted(ids)} unasked"
            gpus = [physical_of(d) for d in ids]
            assert len(set(gpus)) == len(gpus), f"{entry.key}/{container}: one GPU twice {ids}"
            holdings += [(g, claim) for g in gpus]
    return commitments(inventory, holdings), inventory


def over_capacity(use: dict[DeviceID, Use], inventory: list[GPU]) -> list[str]:
    """The per-GPU invariant: committed memory and cores within capacity, at most ``split``
    slices, a GPU held whole held by nothing else."""
    bad: list[str] = []
    for gpu in inventory:
        u = use.get(gpu.id)
        if u is None:
            continue
        if u.exclusive and u.slices > 1:
            bad.append(f"{gpu.id}: held whole and shared ({u.slices} holders)")
        if u.memory_mib > gpu.memory_mib:
            bad.append(f"{gpu.id}: {u.memory_mib} MiB committed of {gpu.memory_mib}")
        if u.cores > FULL_CORES:
            bad.append(f"{gpu.id}: {u.cores}% cores committed")
        if u.slices > gpu.split:
            bad.append(f"{gpu.id}: {u.slices} slices of {gpu.split}")
    return bad


# how the plugin dies mid-handoff: (its failpoint, the line it logs there, whether the test
# SIGKILLs it then; otherwise it exits there by itself, without cleanup, like a SIGKILL)
CRASHES = {
    # kubelet waits on Allocate for the lock's holder; nothing is recorded yet
    "sigkill-in-allocate": ("allocate.start=sleep:120", SLEEPING, True),
    # the answer is recorded in the plugin's checkpoint (release pending), never sent
    "exit-after-recording": (
        "allocate.after-checkpoint",
        exited_at("allocate.after-checkpoint"),
        False,
    ),
}


async def sample_capacity(c: GPUCluster, node: str, found: list[str], stop: asyncio.Event) -> int:
    """Until ``stop``: read kubelet's PodResources over and over and add every per-GPU
    violation seen to ``found``; returns how many looks it took."""
    looks = 0
    while not stop.is_set():
        use, inventory = await kubelet_gpu_use(c, node)
        found += [f"look {looks}: {v}" for v in over_capacity(use, inventory)]
        looks += 1
        await asyncio.sleep(0.1)
    return looks


@pytest.mark.parametrize("crash", sorted(CRASHES))
async def test_a_mixed_burst_with_the_device_plugin_killed_mid_handoff_stays_within_capacity(
    sharing: GPUCluster, crash: str
) -> None:
    """A burst of shared and exclusive pods (ReplicaSets, so a pod kubelet fails is replaced);
    the node's device plugin dies in the first Allocate of the burst (the holder bound, its lock
    held, kubelet waiting on the answer) and is restarted.  Every ReplicaSet ends with all its
    replicas Running; a pod that failed says why; kubelet's PodResources, its device checkpoint
    (the plugin's answers) and the simulated kubelet's records all keep every GPU within
    capacity, the whole GPU unshared (PodResources also at every look while the burst runs); no
    lock stays held.  A release the plugin had recorded before dying is done by the restarted
    plugin."""
    failpoint, line, sigkill = CRASHES[crash]
    c = sharing
    node = c.nodes[0]
    plugin = f"deviceplugin-{node}"
    seen = plugin_registrations(c.cluster, node)
    c.cluster.restart_component(plugin, env={"NODELOCK_FAILPOINTS": failpoint})
    await wait_registrations(c.cluster, node, seen)
    logged = log_count(c, plugin, line)
    violations: list[str] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_capacity(c, node, violations, stop))
    try:
        await asyncio.gather(
            *(
                c.kube.create(replica_sets_path(c.namespace), replica_set(n, r, limits))
                for n, r, limits in MIXED
            )
        )
        await wait_log(c, plugin, line, logged)
        # mid-handoff: kubelet is in Allocate for the pod that holds the node's lock
        lease = await c.lease(node)
        victim = lease["spec"]["holderIdentity"]
        assert str(victim).startswith(f"{c.namespace}/"), lease["spec"]
        assert (await c.kube.get(pod_path(*victim.split("/"))))["spec"]["nodeName"] == node
        if sigkill:
            c.cluster.kill_component(plugin)
    except BaseException:
        stop.set()
        await asyncio.gather(sampler, return_exceptions=True)
        raise
    finally:
        seen = plugin_registrations(c.cluster, node)
        c.cluster.restart_component(plugin, env={})
        await wait_registrations(c.cluster, node, seen)

    try:
        pods = await wait_replica_sets_ready(c, timeout_s=180)
    finally:
        stop.set()
        looks = await sampler
    # kubelet's PodResources all along: within capacity on every GPU at every look (the burst
    # and the restart take a second or more, a look a tenth: a few looks at the least)
    assert looks >= 3
    assert violations == []
    failed = [p for p in pods if p.get("status", {}).get("phase") == "Failed"]
    assert victim in {c.key(p["metadata"]["name"]) for p in failed}, [
        (p["metadata"]["name"], p.get("status", {}).get("phase")) for p in pods
    ]
    c.expect_unadmitted(*(p["metadata"]["name"] for p in failed))  # replaced by their sets
    for p in failed:
        assert p["status"].get("reason"), p["status"]
        assert p["status"].get("message"), p["status"]
        assert allocated(p) == {}, p["metadata"]["name"]  # kubelet gave it nothing

    # kubelet's PodResources: per physical GPU, within capacity, the whole GPU alone
    use, inventory = await kubelet_gpu_use(c, node)
    assert over_capacity(use, inventory) == []
    shares = sorted((u.exclusive, u.slices, u.memory_mib, u.cores) for u in use.values())
    assert shares == [(False, 4, 80000, 100), (True, 1, 81920, 100)], shares
    # the plugin's answers in kubelet's checkpoint: each container got the GPU kubelet gave it
    answers = read_checkpoint(kubelet_checkpoint(c.cluster.state_dir, node), resource=RESOURCE)
    running = {p["metadata"]["uid"]: p for p in pods if p["status"]["phase"] == "Running"}
    answered = [a for a in answers if a.pod_uid in running]
    assert len(answered) == len(running) == sum(r for _, r, _ in MIXED)
    for a in answered:
        assert a.answered is not None, a
        assert {physical_of(d) for d in a.kubelet_devices} == set(a.answered), a
    # and `nodelock audit` finds the scheduler, kubelet and the plugin in agreement
    result = await audit(c.kube, devcluster_sources(c.cluster.state_dir))
    assert result.disagreements == [], result.text()
    await c.wait_holder(node, None)
    assert not await held_locks(c.kube)
    if not sigkill:
        # the restarted plugin finished the release its checkpoint held (released, or found
        # that a takeover had come first: it may start after the lock expired)
        log = (c.cluster.log_dir / f"{plugin}.log").read_text(errors="replace")
        assert f"released node lock of {victim} (" in log or (
            f"lock of {victim} needs no release" in log
        ), log[-3000:]
