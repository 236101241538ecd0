"""The invariant checker finds each kind of violation, accepts a clean snapshot, and cannot pass
on missing data: a missing or unreadable record, a missing container, swapped devices, fewer pods
than expected, a wrong resource name, a node without a Lease."""

from __future__ import annotations

import json
from typing import Any

from devcluster.invariants import ContainerRecord, Findings, check_locks_free, check_pods
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
    found = check_pods(pods, expected_pods=4)
    assert found.ok, found
    assert found.checked_pods == 4


def test_s1_two_live_pods_with_one_gpu() -> None:
    found = check_pods(
        [
            pod("a", "n1", {"c": ["G0"]}, {"c": ["G0"]}),
            pod("b", "n1", {"c": ["G0"]}, {"c": ["G0"]}),
        ],
        expected_pods=2,
    )
    assert found.s1 == ["G0 on n1 is held by both ns/a and ns/b"]


def test_s2_kubelet_devices_or_env_differ_from_assignment() -> None:
    found = check_pods([pod("a", "n1", {"c": ["G0"]}, {"c": ["G1"]})], expected_pods=1)
    assert len(found.s2) == 1, (
        found.s2
    )  # kubelet gave a device outside the pod (the env followed it)
    found = check_pods(
        [pod("a", "n1", {"c": ["G0"]}, {"c": ["G0"]}, env={"c": "G3"})], expected_pods=1
    )
    assert found.s2
    assert "NVIDIA_VISIBLE_DEVICES" in found.s2[0]


def test_s2_allows_kubelets_pick_from_the_pods_own_devices() -> None:
    """kubelet reuses an init container's devices in its own order: any of the pod's devices."""
    p = pod("a", "n1", {"i": ["G0", "G1"], "c0": ["G0"], "c1": ["G1"]}, None)
    p["spec"]["initContainers"] = [p["spec"]["containers"].pop(0)]
    seen = {"i": ["G0", "G1"], "c0": ["G1"], "c1": ["G0"]}
    with_record = pod("a", "n1", {"i": ["G0", "G1"], "c0": ["G0"], "c1": ["G1"]}, seen)
    p["metadata"] = with_record["metadata"]
    assert check_pods([p], expected_pods=1).ok
    # ... but not a device outside the pod, and not one device for two app containers
    p["metadata"] = pod("a", "n1", {}, {**seen, "c1": ["G2"]})["metadata"]
    p["metadata"]["annotations"]["nodelock.io/assignment"] = json.dumps(
        {"i": ["G0", "G1"], "c0": ["G0"], "c1": ["G1"]}
    )
    assert check_pods([p], expected_pods=1).s2
    p["metadata"] = pod("a", "n1", {}, {**seen, "c1": ["G1"]})["metadata"]
    p["metadata"]["annotations"]["nodelock.io/assignment"] = json.dumps(
        {"i": ["G0", "G1"], "c0": ["G0"], "c1": ["G1"]}
    )
    assert check_pods([p], expected_pods=1).s1 == ["G1 on n1 is held by both ns/a/c0 and ns/a/c1"]


def test_l1_unadmitted_pod() -> None:
    pending = [pod("a", "n1", {"c": ["G0"]}, None, phase="Pending")]
    found = check_pods(pending, expected_pods=1)
    assert found.l1 == ["ns/a is Pending on n1"]
    assert check_pods(pending, expected_pods=1, require_admitted=False).ok
    assert check_pods(pending, expected_pods=1, may_be_unadmitted={"ns/a"}).ok
    assert check_pods(pending, expected_pods=1, may_be_unadmitted={"ns/b"}).l1


def test_s3_held_lock() -> None:
    found = Findings()
    check_locks_free(
        [
            {"metadata": {"name": "n1"}, "spec": {"holderIdentity": "ns/a"}},
            {"metadata": {"name": "n2"}, "spec": {}},
        ],
        found,
        nodes=["n1", "n2"],
    )
    assert found.s3 == ["node n1 is still locked by ns/a"]
    assert found.coverage == []


def test_s3_cannot_pass_on_leases_that_are_not_there() -> None:
    """An empty (or wrong) Lease list is not "no lock held" when locks were expected."""
    found = Findings()
    check_locks_free([], found, nodes=["n1"])
    assert found.s3 == []
    assert found.coverage == ["node n1 has no Lease: its lock was expected to exist"]
    free = Findings(checked_pods=1)
    check_locks_free([{"metadata": {"name": "n1"}, "spec": {}}], free, nodes=["n1"])
    assert free.ok, free


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
    assert check_pods(fits, expected_pods=4, inventories=inventory).ok
    over = [*fits[:3], shared("big", "G0", 3, mem="30000")]
    found = check_pods(over, expected_pods=4, inventories=inventory)
    assert found.s1 == [
        "G0 on n1: 90000 MiB committed of 81920 (['ns/big', 'ns/p0', 'ns/p1', 'ns/p2'])"
    ]
    cores = check_pods([*fits[:3], shared("hot", "G0", 3, mem="1", cores="30")], expected_pods=4)
    assert cores.s1 == ["G0 on n1: 105% cores committed (['ns/hot', 'ns/p0', 'ns/p1', 'ns/p2'])"]
    whole = check_pods([fits[0], shared("w", "G0", 1, mem=None)], expected_pods=2)
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
    found = check_pods(clean, expected_pods=3)
    assert found.ok, found
    assert found.checked_pods == 3
    twice = check_pods([*clean, mig_pod("d", "n1", [], ["MIG-0"], "MIG-0")], expected_pods=4)
    assert twice.s1 == ["MIG-0 on n1 is held by both ns/a and ns/d"]
    wrong_env = check_pods([mig_pod("e", "n1", ["G0"], ["MIG-1"], "G0,MIG-2")], expected_pods=1)
    assert len(wrong_env.s2) == 1
    assert "NVIDIA_VISIBLE_DEVICES='G0,MIG-2'" in wrong_env.s2[0]


# ---- missing data fails -----------------------------------------------------------------------


def test_a_pod_that_ran_without_a_readable_record_is_an_s2_violation() -> None:
    for phase in ("Running", "Succeeded"):
        found = check_pods([pod("a", "n1", {"c": ["G0"]}, None, phase=phase)], expected_pods=1)
        assert found.s2 == [f"ns/a is {phase} but kubelet's record of its devices is missing"]
        assert not found.ok
    garbled = pod("a", "n1", {"c": ["G0"]}, {"c": ["G0"]})
    garbled["metadata"]["annotations"]["sim.nodelock.io/allocated"] = "{not json"
    assert check_pods([garbled], expected_pods=1).s2 == [
        "ns/a is Running but kubelet's record of its devices is missing"
    ]
    # a pod not admitted yet has no record, and that is no violation
    assert (
        check_pods([pod("a", "n1", {"c": ["G0"]}, None, phase="Pending")], expected_pods=1).s2 == []
    )


def test_every_container_that_asks_for_devices_must_be_in_the_record() -> None:
    found = check_pods(
        [pod("a", "n1", {"c0": ["G0"], "c1": ["G1"]}, {"c0": ["G0"]})], expected_pods=1
    )
    assert found.s2 == [
        "ns/a/c1 asks for {'nvidia.com/gpu': 1} but kubelet's record has no entry for it"
    ]
    # while the pod is Pending, kubelet may not have allocated c1 yet
    admitting = pod("a", "n1", {"c0": ["G0"], "c1": ["G1"]}, {"c0": ["G0"]}, phase="Pending")
    assert check_pods([admitting], expected_pods=1).s2 == []


def test_swapped_devices_between_containers_are_caught() -> None:
    """No init container hands devices on: each container gets exactly its own assignment."""
    found = check_pods(
        [pod("a", "n1", {"c0": ["G0"], "c1": ["G1"]}, {"c0": ["G1"], "c1": ["G0"]})],
        expected_pods=1,
    )
    assert found.s2 == [
        "ns/a/c0: kubelet allocated ['G1'], assignment ['G0']",
        "ns/a/c1: kubelet allocated ['G0'], assignment ['G1']",
    ]


def test_fewer_pods_than_expected_or_none_is_not_ok() -> None:
    empty = check_pods([], expected_pods=0)
    assert not empty.ok
    assert empty.coverage == ["no GPU pod was checked"]
    short = check_pods([pod("a", "n1", {"c": ["G0"]}, {"c": ["G0"]})], expected_pods=2)
    assert not short.ok
    assert short.coverage == [
        "1 GPU pods checked, 2 expected (resources nvidia.com/gpu and MIG instances)"
    ]


def test_a_wrong_resource_name_fails_instead_of_filtering_every_pod_out() -> None:
    found = check_pods(
        [pod("a", "n1", {"c": ["G0"]}, {"c": ["G0"]})], expected_pods=1, resource="nvidia.com/gpus"
    )
    assert found.s2 == ["ns/a carries an assignment but asks for none of ['nvidia.com/gpus']"]
    assert found.checked_pods == 0
    assert not found.ok


def with_init(
    assigned: dict[str, list[str]],
    seen: dict[str, list[str]],
    *,
    inits: int = 1,
    sidecar: bool = False,
) -> dict[str, Any]:
    """A pod whose first ``inits`` containers of ``assigned`` are init containers (the last of
    them a sidecar with ``sidecar``)."""
    p = pod("a", "n1", assigned, seen)
    init = [p["spec"]["containers"].pop(0) for _ in range(inits)]
    if sidecar:
        init[-1]["restartPolicy"] = "Always"
    p["spec"]["initContainers"] = init
    return p


def test_kubelets_reuse_rule_for_init_containers() -> None:
    """manager.go (v1.37.2): the reuse pool first, the rest exactly the container's own devices."""
    two_from_pool = {"i": ["G0", "G1"], "c": ["G0", "G1", "G2"]}
    assert check_pods([with_init(two_from_pool, two_from_pool)], expected_pods=1).ok
    # the fresh device must be the container's own, not another free one
    fresh_wrong = with_init(two_from_pool, {"i": ["G0", "G1"], "c": ["G0", "G1", "G3"]})
    assert check_pods([fresh_wrong], expected_pods=1).s2 == [
        "ns/a/c: kubelet allocated ['G0', 'G1', 'G3'] (init containers' ['G0', 'G1']), "
        "assignment ['G0', 'G1', 'G2']"
    ]
    # kubelet takes from the pool first: a container that skips it is not what kubelet does
    skipped = with_init({"i": ["G0"], "c": ["G0"]}, {"i": ["G0"], "c": ["G1"]})
    assert check_pods([skipped], expected_pods=1).s2 == [
        "ns/a/c: 0 of nvidia.com/gpu from the pod's reuse pool ['G0'], kubelet takes 1 from it "
        "first",
        "ns/a/c: kubelet allocated ['G1'] (init containers' ['G0']), assignment ['G0']",
    ]


def test_a_sidecar_keeps_its_devices_out_of_the_pool() -> None:
    """A restartable init container takes from the pool and keeps what it took."""
    assigned = {"i": ["G0"], "side": ["G0"], "c": ["G1"]}
    assert check_pods([with_init(assigned, assigned, inits=2, sidecar=True)], expected_pods=1).ok
    stolen = with_init(assigned, {"i": ["G0"], "side": ["G0"], "c": ["G0"]}, inits=2, sidecar=True)
    found = check_pods([stolen], expected_pods=1)
    assert found.s1 == ["G0 on n1 is held by both ns/a/side and ns/a/c"]
    assert found.s2 == [
        "ns/a/c: kubelet allocated ['G0'] (init containers' ['G0']), assignment ['G1']"
    ]


def test_records_from_any_reader_as_plain_data() -> None:
    """A reader without the plugin's environment (kubelet's PodResources) feeds the same check."""
    p = pod("a", "n1", {"c": ["G0"]}, None)
    ok = {"ns/a": {"c": ContainerRecord({"nvidia.com/gpu": ["G0"]})}}
    assert check_pods([p], expected_pods=1, records=ok).ok
    other = {"ns/a": {"c": ContainerRecord({"nvidia.com/gpu": ["G1"]})}}
    assert check_pods([p], expected_pods=1, records=other).s2 == [
        "ns/a/c: kubelet allocated ['G1'], assignment ['G0']"
    ]
