"""The device plugin's edge on a sharing node (deviceplugin.sharing) with plain data: virtual
devices in, physical decisions, virtual choices and limit environments out."""

from __future__ import annotations

import asyncio
from typing import Any

from deviceplugin.answer import ContainerAnswer
from deviceplugin.decide import (
    Allocation,
    Context,
    Refusal,
    RefusalKind,
    check_request,
    decide_allocate,
    decide_preferred,
)
from deviceplugin.sharing import (
    SplitDeviceState,
    fold,
    physical_request,
    virtual_choice,
    virtual_devices,
    with_limits,
)
from handoff.wire import GPU, ContainerName, DeviceID, format_assignment, parse_inventory
from handoff.wire import format_inventory as fmt
from lockd.model import FencingToken, Holder, HolderKey, LockRecord, NodeLockView, NodeName

NODE = NodeName("n1")
A, B = DeviceID("GPU-a"), DeviceID("GPU-b")
PHYS = [GPU(A, 0, "H100", 81920, 0, True), GPU(B, 1, "H100", 81920, 0, True)]
CTX = Context(node=NODE, devices=dict.fromkeys([A, B], True))


def view(assignment: dict[ContainerName, list[DeviceID]]) -> NodeLockView:
    h = Holder(HolderKey("ns/p"), "u1", {"assignment": format_assignment(assignment)})
    rec = LockRecord(NODE, h, FencingToken(3), 15, None, None, "1")
    return NodeLockView(record=rec, unchanged_for_s=0.0, expired=False)


def shared_pod(assignment: dict[ContainerName, list[DeviceID]], **limits: str) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": "p",
            "uid": "u1",
            "annotations": {
                "nodelock.io/assignment": format_assignment(assignment),
                "nodelock.io/token": "3",
            },
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1", **limits}}}
            ],
        },
        "status": {"phase": "Pending"},
    }


def split_state(split: int = 4) -> SplitDeviceState:
    state = SplitDeviceState(split)
    asyncio.run(state.update(PHYS))
    return state


def test_split_state_publishes_the_split_and_kubelet_sees_s_virtual_devices_per_gpu() -> None:
    state = split_state(4)
    assert [g.split for g in state.gpus] == [4, 4]
    assert [g.split for g in parse_inventory(fmt(state.gpus))] == [4, 4]
    devs = virtual_devices(state.gpus)
    assert [d.ID for d in devs] == [f"GPU-{x}::{k}" for x in "ab" for k in range(4)]
    assert all(d.health == "Healthy" and d.topology.nodes[0].ID == 0 for d in devs)


def test_allocate_folds_virtual_ids_and_refuses_two_slices_of_one_gpu() -> None:
    assert physical_request([["GPU-a::2", "GPU-b::0"]]) == [["GPU-a", "GPU-b"]]
    bad = physical_request([["GPU-a::2", "GPU-a::3"]])
    assert isinstance(bad, Refusal)
    assert bad.kind is RefusalKind.BAD_REQUEST
    assert "distinct GPUs" in bad.message


def test_a_slice_is_served_its_physical_gpu_with_its_limits() -> None:
    assignment = {ContainerName("main"): [B]}
    pod = shared_pod(assignment, **{"nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "30"})
    phys = physical_request([["GPU-b::3"]])
    assert not isinstance(phys, Refusal)
    ids = check_request(phys, CTX)
    assert not isinstance(ids, Refusal)
    alloc = decide_allocate(view(assignment), pod, ids, None, CTX)
    assert isinstance(alloc, Allocation), alloc
    assert alloc.devices == (B,)
    answer = with_limits(
        ContainerAnswer(envs={"NVIDIA_VISIBLE_DEVICES": "GPU-b"}), alloc, split_state()
    )
    assert answer.envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-b",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20000M",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "20000m",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_DEVICE_SM_LIMIT": "30",
    }


def test_a_slice_of_another_gpu_is_refused() -> None:
    assignment = {ContainerName("main"): [B]}
    pod = shared_pod(assignment, **{"nvidia.com/gpumem": "20000"})
    phys = physical_request([["GPU-a::0"]])
    assert not isinstance(phys, Refusal)
    ids = check_request(phys, CTX)
    assert not isinstance(ids, Refusal)
    result = decide_allocate(view(assignment), pod, ids, None, CTX)
    assert isinstance(result, Refusal)
    assert result.kind is RefusalKind.DEVICES_MISMATCH


def test_whole_gpu_container_gets_no_limits() -> None:
    assignment = {ContainerName("main"): [A]}
    pod = shared_pod(assignment)
    alloc = decide_allocate(view(assignment), pod, [A], None, CTX)
    assert isinstance(alloc, Allocation)
    answer = with_limits(ContainerAnswer(envs={"X": "1"}), alloc, split_state())
    assert answer.envs == {"X": "1"}


def test_preferred_steers_kubelet_to_a_free_slice_of_exactly_the_assigned_gpu() -> None:
    assignment = {ContainerName("main"): [B]}
    pod = shared_pod(assignment, **{"nvidia.com/gpumem": "1000"})
    available = ["GPU-a::0", "GPU-a::1", "GPU-b::2", "GPU-b::3"]  # b::0, b::1 held by others
    pref = decide_preferred(view(assignment), pod, fold(available), [], 1, None, CTX)
    assert pref.hit
    assert virtual_choice(pref.devices, available, []) == ["GPU-b::2"]
    # a must-include slice of the GPU comes first; GPUs without a free slice are left out
    assert virtual_choice([B], available, ["GPU-b::3"]) == ["GPU-b::3"]
    assert virtual_choice([A, B], ["GPU-b::1"], []) == ["GPU-b::1"]
    # no free slice of the assigned GPU: a miss, kubelet is not steered onto another GPU's
    miss = decide_preferred(view(assignment), pod, fold(["GPU-a::0"]), [], 1, None, CTX)
    assert not miss.hit
