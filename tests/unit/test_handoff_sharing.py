"""The shared-GPU model (handoff.sharing) on plain data."""

from __future__ import annotations

import json
from typing import Any

import pytest

from handoff.sharing import (
    FREE,
    WHOLE,
    BadShare,
    Miss,
    Slice,
    Use,
    bound_slices,
    commitments,
    container_slice,
    limit_envs,
    node_use,
    physical_of,
    place,
    pod_slices,
    slot_slices,
    virtual_id,
)
from handoff.wire import GPU, DeviceID, format_inventory, parse_inventory

MIB_80G = 81920


def gpus(n: int = 2, memory: int = MIB_80G, split: int = 4) -> list[GPU]:
    return [GPU(DeviceID(f"GPU-{i}"), i, "H100", memory, None, True, split=split) for i in range(n)]


def c(
    gpu: str = "1", mem: str | None = None, pct: str | None = None, cores: str | None = None
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": gpu}
    if mem is not None:
        limits["nvidia.com/gpumem"] = mem
    if pct is not None:
        limits["nvidia.com/gpumem-percentage"] = pct
    if cores is not None:
        limits["nvidia.com/gpucores"] = cores
    return {"name": "main", "resources": {"limits": limits}}


def test_request_model_is_hamis() -> None:
    assert container_slice(c()) == WHOLE
    assert container_slice(c(mem="20000")) == Slice(memory_mib=20000)
    assert container_slice(c(mem="20k")) == Slice(memory_mib=20000)  # as the API server stores it
    assert container_slice(c(gpu="1", mem="1e3")) == Slice(memory_mib=1000)
    assert container_slice(c(pct="25", cores="30")) == Slice(memory_percent=25, cores=30)
    assert container_slice(c(cores="50")) == Slice(cores=50)  # all memory, half the cores
    assert container_slice({"name": "x", "resources": {}}) is None


@pytest.mark.parametrize(
    ("box", "words"),
    [
        (c(cores="101"), "over 100"),
        (c(pct="0"), "between 1 and 100"),
        (c(pct="150"), "between 1 and 100"),
        (c(mem="0"), "at least 1 MiB"),
        (c(mem="1.5"), "not a whole number"),
        (c(mem="20000", pct="10"), "ask for one"),
        (c(gpu="0", mem="20000"), "no nvidia.com/gpu"),
        ({"name": "main", "resources": {"limits": {"nvidia.com/gpumem": "1"}}}, "needs"),
    ],
)
def test_bad_requests_get_a_reason(box: dict[str, Any], words: str) -> None:
    with pytest.raises(BadShare, match=words) as err:
        container_slice(box)
    assert "'main'" in str(err.value)


def test_slot_claims_take_the_larger_of_containers_sharing_a_slot() -> None:
    pod = {
        "spec": {
            "initContainers": [{**c(mem="30000"), "name": "init"}],
            "containers": [c(mem="10000", cores="20")],
        }
    }
    slices = pod_slices(pod)
    slots = slot_slices(slices, [("init", (0,)), ("main", (0,))])
    assert slots == (Slice(memory_mib=30000, cores=20),)


def test_eight_quarter_slices_fill_two_gpus_four_each_then_no_room() -> None:
    devs = gpus()
    held: list[tuple[DeviceID, Slice]] = []
    claim = Slice(memory_mib=20000)
    for _ in range(8):
        got = place(devs, commitments(devs, held), (claim,), split=4, binpack=True)
        assert not isinstance(got, Miss), got
        held.append((got[0].id, claim))
    per_gpu = [sum(1 for d, _ in held if d == g.id) for g in devs]
    assert per_gpu == [4, 4]
    ninth = place(devs, commitments(devs, held), (claim,), split=4, binpack=True)
    assert isinstance(ninth, Miss)
    assert ninth.ever
    assert "all 4 slices in use" in ninth.reason


def test_memory_not_slices_can_be_the_limit() -> None:
    devs = gpus(1, memory=MIB_80G, split=8)
    held = [(devs[0].id, Slice(memory_mib=30000))] * 2
    got = place(devs, commitments(devs, held), (Slice(memory_mib=30000),), split=8, binpack=True)
    assert isinstance(got, Miss)
    assert "21920 of 81920 MiB free" in got.reason
    assert not isinstance(
        place(devs, commitments(devs, held), (Slice(memory_mib=21920),), split=8, binpack=True),
        Miss,
    )


def test_cores_cannot_exceed_100_percent() -> None:
    devs = gpus(1)
    held = [(devs[0].id, Slice(memory_mib=1, cores=70))]
    got = place(
        devs, commitments(devs, held), (Slice(memory_mib=1, cores=40),), split=4, binpack=True
    )
    assert isinstance(got, Miss)
    assert "30% cores free" in got.reason


def test_whole_gpu_goes_only_where_nothing_is_committed_and_is_never_shared() -> None:
    devs = gpus()
    held = [(devs[0].id, Slice(memory_mib=1000))]
    got = place(devs, commitments(devs, held), (WHOLE,), split=4, binpack=True)
    assert not isinstance(got, Miss)
    assert got[0].id == devs[1].id
    held.append((devs[1].id, WHOLE))
    use = commitments(devs, held)
    assert use[devs[1].id].exclusive
    # nothing fits beside a whole GPU, however small
    got = place(devs, use, (Slice(memory_mib=1),), split=4, binpack=True)
    assert not isinstance(got, Miss)
    assert got[0].id == devs[0].id
    full = commitments(devs, [*held, (devs[0].id, Slice(memory_mib=MIB_80G - 1000))])
    miss = place(devs, full, (Slice(memory_mib=1),), split=4, binpack=True)
    assert isinstance(miss, Miss)
    assert "held whole by another pod" in miss.reason


def test_unknown_holders_count_as_whole() -> None:
    devs = gpus()
    use = commitments(devs, [], unknown=[devs[0].id])
    got = place(devs, use, (Slice(memory_mib=1),), split=4, binpack=True)
    assert not isinstance(got, Miss)
    assert got[0].id == devs[1].id


def test_n_gpus_are_distinct_physical_gpus() -> None:
    devs = gpus(3)
    got = place(devs, {}, (Slice(memory_mib=10),) * 3, split=4, binpack=True)
    assert not isinstance(got, Miss)
    assert len({g.id for g in got}) == 3
    miss = place(devs, {}, (Slice(memory_mib=10),) * 4, split=4, binpack=True)
    assert isinstance(miss, Miss)
    assert not miss.ever
    assert "4 distinct GPUs" in miss.reason


def test_binpack_fills_the_fullest_gpu_spread_the_emptiest() -> None:
    devs = gpus(3)
    use = commitments(devs, [(devs[1].id, Slice(memory_mib=40000))])
    claim = (Slice(memory_mib=10000),)
    packed = place(devs, use, claim, split=4, binpack=True)
    spread = place(devs, use, claim, split=4, binpack=False)
    assert not isinstance(packed, Miss)
    assert packed[0].id == devs[1].id
    assert not isinstance(spread, Miss)
    assert spread[0].id == devs[0].id


@pytest.mark.parametrize(
    ("slots", "split", "words"),
    [
        ((Slice(memory_mib=90000),), 4, "the largest GPU here has 81920 MiB"),
        ((Slice(memory_mib=1000),), 1, "does not share GPUs"),
        ((Slice(cores=10),), 1, "does not share GPUs"),
    ],
)
def test_never_fits_reasons(slots: tuple[Slice, ...], split: int, words: str) -> None:
    devs = gpus(2, split=split)
    got = place(devs, {}, slots, split=split, binpack=True)
    assert isinstance(got, Miss)
    assert not got.ever
    assert words in got.reason


def test_selection_filters_gpus() -> None:
    devs = gpus(2)
    got = place(
        devs, {}, (Slice(memory_mib=1),), split=4, binpack=True, allows=lambda g: g.index == 1
    )
    assert not isinstance(got, Miss)
    assert got[0].index == 1


def test_percentages_commit_by_each_gpus_size() -> None:
    small = GPU(DeviceID("GPU-s"), 0, "A", 40000, None, True, split=4)
    assert Slice(memory_percent=50).memory_on(small) == 20000
    assert (
        commitments([small], [(small.id, Slice(memory_percent=25))])[small.id].memory_mib == 10000
    )
    assert commitments([small], []).get(small.id, FREE) == FREE


def test_virtual_ids_name_their_physical_gpu() -> None:
    v = virtual_id(DeviceID("GPU-0c1b2a3d-4e5f-6071-8293-a4b5c6d7e8f9"), 3)
    assert v == "GPU-0c1b2a3d-4e5f-6071-8293-a4b5c6d7e8f9::3"
    assert physical_of(v) == "GPU-0c1b2a3d-4e5f-6071-8293-a4b5c6d7e8f9"
    assert physical_of("GPU-x") == "GPU-x"


def test_limit_envs_for_mps_and_hami_core() -> None:
    devs = gpus(2, memory=40000)
    envs = limit_envs(Slice(memory_percent=50, cores=25), devs)
    assert envs == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20000M,1=20000M",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "20000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "20000m",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_DEVICE_SM_LIMIT": "25",
    }
    assert "CUDA_DEVICE_SM_LIMIT" not in limit_envs(Slice(memory_mib=5), devs)
    assert limit_envs(WHOLE, devs) == {}


def test_inventory_carries_the_split_and_stays_unchanged_without_it() -> None:
    shared = gpus(1, split=4)
    raw = format_inventory(shared)
    assert '"split":4' in raw
    assert parse_inventory(raw) == shared
    plain = gpus(1, split=1)
    assert "split" not in format_inventory(plain)
    assert parse_inventory(format_inventory(plain)) == plain


# ---- what the pods bound to a node commit (bound_slices, node_use) ------------------------------


def bound_pod(
    name: str,
    assignment: dict[str, list[str]] | None,
    containers: list[dict[str, Any]],
    phase: str = "Running",
) -> dict[str, Any]:
    annotations = {} if assignment is None else {"nodelock.io/assignment": json.dumps(assignment)}
    return {
        "metadata": {"namespace": "ml", "name": name, "annotations": annotations},
        "spec": {"containers": containers},
        "status": {"phase": phase},
    }


def named(name: str, container: dict[str, Any]) -> dict[str, Any]:
    return {**container, "name": name}


def test_node_use_adds_the_bound_pods_slices_and_counts_a_whole_gpu_pod_as_the_full_gpu() -> None:
    devs = gpus(3)
    pods = [
        bound_pod("a", {"main": ["GPU-0"]}, [named("main", c(mem="20000", cores="30"))]),
        bound_pod("b", {"main": ["GPU-0::1"]}, [named("main", c(pct="25"))]),
        bound_pod("whole", {"main": ["GPU-1"]}, [named("main", c())]),
        bound_pod("done", {"main": ["GPU-2"]}, [named("main", c(mem="1000"))], phase="Succeeded"),
        bound_pod("no-assignment", None, [named("main", c(mem="1000"))]),
    ]
    held = bound_slices(pods)
    assert [(h.pod, h.gpu) for h in held] == [
        ("ml/a", "GPU-0"),
        ("ml/b", "GPU-0"),
        ("ml/whole", "GPU-1"),
    ]
    use = node_use(devs, held)
    assert use[DeviceID("GPU-0")] == Use(memory_mib=20000 + MIB_80G // 4, cores=30, slices=2)
    assert use[DeviceID("GPU-1")] == Use(memory_mib=MIB_80G, cores=100, slices=1, exclusive=True)
    assert use[DeviceID("GPU-2")] == FREE  # a finished pod holds nothing


def test_bound_slices_takes_the_larger_claim_of_containers_sharing_a_gpu_and_skips_bad_input() -> (
    None
):
    pods = [
        bound_pod(
            "p",
            {"init": ["GPU-0::0"], "main": ["GPU-0::2"]},
            [named("init", c(mem="1000", cores="50")), named("main", c(mem="3000", cores="10"))],
        ),
        bound_pod("bad", {"main": "GPU-1"}, [named("main", c(mem="1"))]),  # type: ignore[dict-item]
        bound_pod("odd", {"main": ["GPU-1"]}, [named("main", c(mem="lots"))]),
    ]
    held = bound_slices(pods)
    assert [(h.pod, h.gpu, h.claim) for h in held] == [
        ("ml/odd", "GPU-1", WHOLE),  # a request not accepted: held whole, the safe side
        ("ml/p", "GPU-0", Slice(memory_mib=3000, cores=50)),
    ]
    assert node_use(gpus(1), held) == {DeviceID("GPU-0"): Use(3000, 50, 1)}
