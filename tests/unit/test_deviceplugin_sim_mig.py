"""Simulated MIG layouts (deviceplugin.simulated) and MIG rows of the inventory (handoff.wire)."""

from __future__ import annotations

import json

import pytest

from deviceplugin.simulated import (
    SimSpec,
    inventory,
    mig_layout,
    parse_mig_flags,
    simulated_id,
    simulated_mig_id,
)
from handoff.wire import (
    DEFAULT_RESOURCE,
    MalformedAnnotation,
    format_inventory,
    mig_profile_of,
    parse_inventory,
    valid_device_id,
)

H100_MIB = 81559


def test_layout_expands_counts_in_order() -> None:
    assert mig_layout("7x1g.10gb", parent_memory_mib=H100_MIB) == ("1g.10gb",) * 7
    assert mig_layout("3g.40gb+2g.20gb+2x1g.10gb", parent_memory_mib=H100_MIB) == (
        "3g.40gb",
        "2g.20gb",
        "1g.10gb",
        "1g.10gb",
    )
    assert mig_layout("1c.3g.40gb", parent_memory_mib=H100_MIB) == ("1c.3g.40gb",)


@pytest.mark.parametrize(
    ("layout", "why"),
    [
        ("8x1g.10gb", "more than 7"),
        ("3x3g.40gb", "9 GPU slices"),
        ("3g.40gb+4g.40gb+1g.10gb", "8 GPU slices"),
        ("2x2g.50gb", "100 GB of instances"),
        ("1g.10gb+", "is not \\[<n>x\\]"),
        ("0x1g.10gb", "is not \\[<n>x\\]"),
        ("1g.10gb+me", "is not \\[<n>x\\]"),
        ("one", "is not \\[<n>x\\]"),
    ],
)
def test_layout_refuses_what_no_gpu_can_hold(layout: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        mig_layout(layout, parent_memory_mib=H100_MIB)


def test_gpu_in_mig_mode_is_only_its_instances() -> None:
    spec = SimSpec(count=2, mig=((0, "3g.40gb+2x1g.10gb"),))
    gpus = inventory("n1", spec, {"unhealthy": [0], "numaNodes": 2})
    whole = [g for g in gpus if not g.profile]
    mig = [g for g in gpus if g.profile]
    assert [g.id for g in whole] == [simulated_id("n1", 1)]
    assert simulated_id("n1", 0) not in {g.id for g in gpus}  # the parent is no device
    assert [(g.id, g.profile, g.parent) for g in mig] == [
        (simulated_mig_id("n1", 0, slot), profile, simulated_id("n1", 0))
        for slot, profile in enumerate(["3g.40gb", "1g.10gb", "1g.10gb"])
    ]
    assert [g.resource for g in mig] == ["nvidia.com/mig-3g.40gb", *["nvidia.com/mig-1g.10gb"] * 2]
    assert whole[0].resource == DEFAULT_RESOURCE
    # an instance has its parent's health and NUMA node, and its profile's memory
    assert all(not g.healthy and g.numa == 0 and g.index == 0 for g in mig)
    assert [g.memory_mib for g in mig] == [40 * 1024, 10 * 1024, 10 * 1024]
    assert all(valid_device_id(g.id) for g in gpus)
    assert len({g.id for g in gpus}) == len(gpus)
    assert simulated_mig_id("n1", 0, 0) != simulated_mig_id("n2", 0, 0)


def test_file_layout_overrides_the_flag_and_bad_ones_are_refused() -> None:
    spec = SimSpec(count=1, mig=((0, "7x1g.10gb"),))
    gpus = inventory("n1", spec, {"devices": [{"index": 0, "mig": "2x3g.40gb"}]})
    assert [g.profile for g in gpus] == ["3g.40gb", "3g.40gb"]
    assert [g.profile for g in inventory("n1", spec, {"devices": [{"index": 0, "mig": ""}]})] == [
        ""
    ]  # an empty layout in the file takes the GPU out of MIG mode
    with pytest.raises(ValueError, match="GPUs \\[3\\]"):
        inventory("n1", SimSpec(count=2, mig=((3, "7x1g.10gb"),)))
    with pytest.raises(ValueError, match="GB of instances"):
        inventory("n1", spec, {"memoryMiB": 40960})


def test_flags() -> None:
    assert parse_mig_flags(["1=7x1g.10gb", "0=3g.40gb"]) == ((0, "3g.40gb"), (1, "7x1g.10gb"))
    for bad in (["7x1g.10gb"], ["a=1g.10gb"], ["0="], ["0=1g.10gb", "0=2g.20gb"]):
        with pytest.raises(ValueError, match="--sim-mig"):
            parse_mig_flags(bad)


def test_mig_rows_round_trip_through_the_node_annotation() -> None:
    gpus = inventory("n1", SimSpec(count=2, mig=((1, "4g.40gb+3g.40gb"),)))
    raw = format_inventory(gpus)
    assert sorted(parse_inventory(raw), key=lambda g: g.id) == sorted(gpus, key=lambda g: g.id)
    whole_only = format_inventory([g for g in gpus if not g.profile])
    assert '"mig"' not in whole_only  # inventories without MIG are unchanged


@pytest.mark.parametrize(
    "mig",
    [
        {"profile": "1g.10gb"},  # no parent
        {"profile": "one", "parent": "GPU-1"},
        {"profile": "1g.10gb", "parent": "bad id!"},
        "1g.10gb",
    ],
)
def test_malformed_mig_rows_are_refused(mig: object) -> None:
    raw = format_inventory(inventory("n1", SimSpec(count=1)))
    row = raw[1:-2] + ',"mig":' + json.dumps(mig) + "}"
    with pytest.raises(MalformedAnnotation, match=r"MIG|bad device entry"):
        parse_inventory(f"[{row}]")


def test_mig_resource_names() -> None:
    assert mig_profile_of("nvidia.com/mig-1g.10gb") == "1g.10gb"
    assert mig_profile_of("nvidia.com/mig-1c.3g.40gb") == "1c.3g.40gb"
    assert mig_profile_of("nvidia.com/gpu") is None
    assert mig_profile_of("nvidia.com/mig-") is None
    assert mig_profile_of("nvidia.com/mig-1g.10gb+me") is None
