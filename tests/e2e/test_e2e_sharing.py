"""Shared GPUs end to end: one node x two simulated 80 GiB GPUs, ``--gpu-split 4``, through the
real kube-scheduler (extender wired in) and kubelet's own device manager (the simulated kubelet),
judged from kubelet's records (``sim.nodelock.io/allocated``)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from devcluster.invariants import allocated
from handoff.sharing import physical_of
from kube.client import node_path, pod_path
from tests.e2e.conftest import SHARING_SPLIT
from tests.e2e.kit import GPUCluster, assignment, gpu_pod, restart_extenders

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
    """Make kube-scheduler retry its unschedulable pods now: it retries a pod an extender
    rejected on a node event its plugins care about (a label change), or after five minutes in
    the unschedulable queue, not on the deletion of another pod (docs/sharing.md)."""
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
    await restart_extenders(c.cluster, {"NODELOCK_FAILPOINTS": "bind.after-acquire"})
    try:
        await create(c, "first", gpumem="30000")
        await c.wait_holder(node, c.key("first"))
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
