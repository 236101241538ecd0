"""``nodelock.demo``: the report's node view of shared GPUs and the inference wave (plain data)."""

from __future__ import annotations

import json
from typing import Any

from handoff.wire import GPU, DeviceID
from nodelock.demo import manifest, node_view, shared_workload

INVENTORY = {
    "n1": [
        GPU(DeviceID("G0"), 0, "H100", 81559, None, True, split=4),
        GPU(DeviceID("G1"), 1, "H100", 81559, None, True, split=4),
    ],
    "n2": [GPU(DeviceID("X0"), 0, "H100", 81559, None, True)],  # not sharing: not in the view
}


def pod(
    name: str, node: str, devices: list[str], *, mem: str | None, phase: str = "Running"
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(len(devices))}
    if mem is not None:
        limits.update({"nvidia.com/gpumem": mem, "nvidia.com/gpucores": "25"})
    record = {"c": {"deviceIDs": devices, "envs": {}}}
    return {
        "metadata": {
            "namespace": "demo",
            "name": name,
            "annotations": {"sim.nodelock.io/allocated": json.dumps(record)},
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": phase},
    }


def test_node_view_sums_slices_per_physical_gpu() -> None:
    pods = [
        pod("a", "n1", ["G0::0"], mem="20000"),
        pod("b", "n1", ["G0::2"], mem="20000"),
        pod("done", "n1", ["G0::1"], mem="20000", phase="Succeeded"),  # holds nothing now
        pod("whole", "n1", ["G1::0", "G1::1", "G1::2", "G1::3"], mem=None),
        pod("x", "n2", ["X0"], mem=None),
    ]
    assert node_view(pods, INVENTORY) == [
        ("n1 GPU 0", "2/4 slices, memory 40000/81559 MiB, cores 50/100%: a, b"),
        ("n1 GPU 1", "whole, memory 81559/81559 MiB, cores 100/100%: whole"),
    ]
    assert node_view(pods[-2:], INVENTORY) == [
        ("n1 GPU 1", "whole, memory 81559/81559 MiB, cores 100/100%: whole"),
        ("n1 GPU 0", "nothing committed"),
    ]


def test_node_view_is_empty_without_sharing_nodes() -> None:
    assert node_view([pod("x", "n2", ["X0"], mem=None)], {"n2": INVENTORY["n2"]}) == []


def test_the_inference_wave_asks_for_memory_slices() -> None:
    assert shared_workload(0, 4) == []
    assert shared_workload(2, 1) == []
    (wave,) = shared_workload(2, 4)
    assert wave.replicas == 8
    _, body = manifest(wave)
    limits = body["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}
