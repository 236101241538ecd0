"""The invariant checker finds each kind of violation, and accepts a clean snapshot."""

from __future__ import annotations

import json
from typing import Any

from devcluster.invariants import check_locks_free, check_pods
from handoff.wire import GPU, DeviceID


def pod(
    name: str,
    node: str,
    assignment: dict[str, list[str]],
    seen: dict[str, list[str]] | None,
    *,
    phase: str = "Running",
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    annotations = {"nodelock.io/assignment": json.dumps(assignment)}
    if seen is not None:
        record = {
            c: {
                "deviceIDs": ids,
                "envs": {"NVIDIA_VISIBLE_DEVICES": (env or {}).get(c, ",".join(ids))},
            }
            for c, ids in seen.items()
        }
        annotations["sim.nodelock.io/allocated"] = json.dumps(record)
    containers = [
        {"name": c, "resources": {"limits": {"nvidia.com/gpu": str(len(ids))}}}
        for c, ids in assignment.items()
    ]
    return {
        "metadata": {"namespace": "ns", "name": name, "annotations": annotations},
        "spec": {"nodeName": node, "containers": containers},
        "status": {"phase": phase},
    }


def test_clean_snapshot_passes() -> None:
    pods = [
        pod("a", "n1", {"c": ["G0", "G1"]}, {"c": ["G0", "G1"]}),
        pod("b", "n1", {"c": ["G2"]}, {"c": ["G2"]}),
        pod("c", "n2", {"c": ["G0"]}, {"c": ["G0"]}),  # same ID, other node
        pod("d", "n1", {"c": ["G2"]}, {"c": ["G2"]}, phase="Succeeded"),  # freed before b
    ]
    found = check_pods(pods)
    assert found.ok, found
    assert found.checked_pods == 4


def test_s1_two_live_pods_with_one_gpu() -> None:
    found = check_pods(
        [pod("a", "n1", {"c": ["G0"]}, {"c": ["G0"]}), pod("b", "n1", {"c": ["G0"]}, {"c": ["G0"]})]
    )
    assert found.s1 == ["G0 on n1 is held by both ns/a and ns/b"]


def test_s2_kubelet_devices_or_env_differ_from_assignment() -> None:
    found = check_pods([pod("a", "n1", {"c": ["G0"]}, {"c": ["G1"]})])
    assert len(found.s2) == 1  # kubelet gave a device outside the pod (the env followed it)
    found = check_pods([pod("a", "n1", {"c": ["G0"]}, {"c": ["G0"]}, env={"c": "G3"})])
    assert found.s2
    assert "NVIDIA_VISIBLE_DEVICES" in found.s2[0]


def test_s2_allows_kubelets_pick_from_the_pods_own_devices() -> None:
    """kubelet reuses an init container's devices in its own order: any of the pod's devices."""
    p = pod("a", "n1", {"i": ["G0", "G1"], "c0": ["G0"], "c1": ["G1"]}, None)
    p["spec"]["initContainers"] = [p["spec"]["containers"].pop(0)]
    seen = {"i": ["G0", "G1"], "c0": ["G1"], "c1": ["G0"]}
    with_record = pod("a", "n1", {"i": ["G0", "G1"], "c0": ["G0"], "c1": ["G1"]}, seen)
    p["metadata"] = with_record["metadata"]
    assert check_pods([p]).ok
    # ... but not a device outside the pod, and not one device for two app containers
    p["metadata"] = pod("a", "n1", {}, {**seen, "c1": ["G2"]})["metadata"]
    p["metadata"]["annotations"]["nodelock.io/assignment"] = json.dumps(
        {"i": ["G0", "G1"], "c0": ["G0"], "c1": ["G1"]}
    )
    assert check_pods([p]).s2
    p["metadata"] = pod("a", "n1", {}, {**seen, "c1": ["G1"]})["metadata"]
    p["metadata"]["annotations"]["nodelock.io/assignment"] = json.dumps(
        {"i": ["G0", "G1"], "c0": ["G0"], "c1": ["G1"]}
    )
    assert check_pods([p]).s1 == ["G1 on n1 is held by both ns/a/c0 and ns/a/c1"]


def test_l1_unadmitted_pod() -> None:
    found = check_pods([pod("a", "n1", {"c": ["G0"]}, None, phase="Pending")])
    assert found.l1 == ["ns/a is Pending on n1"]
    assert check_pods(
        [pod("a", "n1", {"c": ["G0"]}, None, phase="Pending")], require_admitted=False
    ).ok


def test_s3_held_lock() -> None:
    found = check_pods([])
    check_locks_free(
        [
            {"metadata": {"name": "n1"}, "spec": {"holderIdentity": "ns/a"}},
            {"metadata": {"name": "n2"}, "spec": {}},
        ],
        found,
    )
    assert found.s3 == ["node n1 is still locked by ns/a"]


def shared(name: str, gpu: str, k: int, *, mem: str | None, cores: str = "0") -> dict[str, Any]:
    """A pod holding slice ``k`` of ``gpu`` (kubelet's virtual ID), or the whole GPU."""
    p = pod(name, "n1", {"c": [gpu]}, {"c": [f"{gpu}::{k}"]}, env={"c": gpu})
    limits = p["spec"]["containers"][0]["resources"]["limits"]
    if mem is not None:
        limits.update({"nvidia.com/gpumem": mem, "nvidia.com/gpucores": cores})
    return p


def test_shared_gpus_slices_may_share_within_capacity() -> None:
    inventory = {"n1": [GPU(DeviceID("G0"), 0, "H100", 81920, None, True, split=4)]}
    fits = [shared(f"p{k}", "G0", k, mem="20000", cores="25") for k in range(4)]
    assert check_pods(fits, inventories=inventory).ok
    over = [*fits[:3], shared("big", "G0", 3, mem="30000")]
    found = check_pods(over, inventories=inventory)
    assert found.s1 == [
        "G0 on n1: 90000 MiB committed of 81920 (['ns/big', 'ns/p0', 'ns/p1', 'ns/p2'])"
    ]
    cores = check_pods([*fits[:3], shared("hot", "G0", 3, mem="1", cores="30")])
    assert cores.s1 == ["G0 on n1: 105% cores committed (['ns/hot', 'ns/p0', 'ns/p1', 'ns/p2'])"]
    whole = check_pods([fits[0], shared("w", "G0", 1, mem=None)])
    assert whole.s1 == ["G0 on n1 is held by both ns/p0 and ns/w"]


def mig_pod(
    name: str, node: str, whole: list[str], instances: list[str], env: str
) -> dict[str, Any]:
    """A pod whose one container got whole GPUs and 1g.10gb instances (kubelet records the
    instances under ``otherResources``)."""
    mig = "nvidia.com/mig-1g.10gb"
    record = {
        "c": {
            "deviceIDs": whole,
            "otherResources": {mig: instances} if instances else {},
            "envs": {"NVIDIA_VISIBLE_DEVICES": env},
        }
    }
    limits = {mig: str(len(instances))}
    if whole:
        limits["nvidia.com/gpu"] = str(len(whole))
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "annotations": {
                "nodelock.io/assignment": json.dumps({"c": whole + instances}),
                "sim.nodelock.io/allocated": json.dumps(record),
            },
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": "Running"},
    }


def test_mig_instances_are_devices_for_s1_and_s2() -> None:
    clean = [
        mig_pod("a", "n1", [], ["MIG-0"], "MIG-0"),
        mig_pod("b", "n1", ["G0"], ["MIG-1"], "G0"),  # kubelet kept the whole GPU plugin's env
        mig_pod("c", "n1", ["G1"], ["MIG-2"], "MIG-2"),
    ]
    found = check_pods(clean)
    assert found.ok, found
    assert found.checked_pods == 3
    twice = check_pods([*clean, mig_pod("d", "n1", [], ["MIG-0"], "MIG-0")])
    assert twice.s1 == ["MIG-0 on n1 is held by both ns/a and ns/d"]
    wrong_env = check_pods([mig_pod("e", "n1", ["G0"], ["MIG-1"], "G0,MIG-2")])
    assert len(wrong_env.s2) == 1
    assert "NVIDIA_VISIBLE_DEVICES='G0,MIG-2'" in wrong_env.s2[0]
