"""The inventory's topology encoding, the link model and the simulated layouts (pure)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceplugin.simulated import LAYOUTS, SimSpec, inventory, layout_of
from handoff.placement import Wishes, parse_wishes
from handoff.topology import NO_TOPO, Link, Topo, format_topo, link, parse_topo, set_link
from handoff.wire import GPU, DeviceID, Keys, MalformedAnnotation, format_inventory, parse_inventory

pytestmark = pytest.mark.unit

OLD_INVENTORY = (
    '[{"id":"GPU-a","index":0,"model":"NVIDIA H100 80GB HBM3","memoryMiB":81559,"numa":0,'
    '"healthy":true},{"id":"GPU-b","index":1,"model":"NVIDIA H100 80GB HBM3","memoryMiB":81559,'
    '"numa":null,"healthy":false}]'
)

topos = st.builds(
    Topo,
    socket=st.one_of(st.none(), st.integers(0, 7)),
    pcie=st.one_of(st.none(), st.sampled_from(["pcie0", "0000:17", "sw/1"])),
    nvswitch=st.one_of(st.none(), st.sampled_from(["0", "nvsw-a"])),
    nvlink=st.lists(st.integers(0, 15), unique=True).map(lambda x: tuple(sorted(x))),
)


def test_an_inventory_written_before_topology_still_parses_and_formats_unchanged() -> None:
    gpus = parse_inventory(OLD_INVENTORY)
    assert [g.topo for g in gpus] == [NO_TOPO, NO_TOPO]
    assert format_inventory(gpus) == OLD_INVENTORY  # no "topo" key where nothing is known


@given(topos)
def test_topo_round_trips(topo: Topo) -> None:
    assert parse_topo(json.loads(json.dumps(format_topo(topo)))) == topo


def test_a_newer_topo_version_is_read_as_absent_not_as_an_error() -> None:
    raw = '[{"id":"GPU-a","index":0,"healthy":true,"topo":{"v":2,"fabric":{"x":1}}}]'
    assert parse_inventory(raw)[0].topo == NO_TOPO


@pytest.mark.parametrize(
    "topo",
    [
        '{"socket":0}',  # no version
        '{"v":1,"nvlink":"1,2"}',
        '{"v":1,"nvlink":[-1]}',
        '{"v":1,"pcie":7}',
        '{"v":1,"socket":true}',
        '{"v":"1"}',
        '"pcie0"',
    ],
)
def test_a_malformed_topo_names_the_annotation(topo: str) -> None:
    raw = f'[{{"id":"GPU-a","index":0,"healthy":true,"topo":{topo}}}]'
    with pytest.raises(MalformedAnnotation, match=r"nodelock\.io/gpus"):
        parse_inventory(raw)


def gpu(i: int, numa: int | None, topo: Topo = NO_TOPO) -> GPU:
    return GPU(DeviceID(f"GPU-{i}"), i, "H100", 1, numa, True, topo)


def test_link_classes_in_order_of_preference() -> None:
    assert link(gpu(0, 0, Topo(nvswitch="s")), gpu(1, 1, Topo(nvswitch="s"))) is Link.NVSWITCH
    assert link(gpu(0, 0, Topo(nvlink=(1,))), gpu(1, 1)) is Link.NVLINK  # either side lists it
    assert link(gpu(0, 0), gpu(1, 1, Topo(nvlink=(0,)))) is Link.NVLINK
    assert link(gpu(0, 0, Topo(pcie="p")), gpu(1, 0, Topo(pcie="p"))) is Link.PCIE
    assert link(gpu(0, 0, Topo(pcie="p")), gpu(1, 0, Topo(pcie="q"))) is Link.NUMA
    assert link(gpu(0, None, Topo(socket=1)), gpu(1, None, Topo(socket=1))) is Link.NUMA
    assert link(gpu(0, 0), gpu(1, 1)) is Link.SYSTEM
    assert link(gpu(0, None), gpu(1, None)) is Link.SYSTEM


def test_a_set_is_as_good_as_its_weakest_pair() -> None:
    pairs = inventory("n", SimSpec(), {"layout": "nvlink-pairs"})
    assert set_link(pairs[0:2]) is Link.NVLINK
    assert set_link(pairs[0:4]) is Link.NUMA
    assert set_link(pairs[3:5]) is Link.SYSTEM
    assert set_link(pairs[0:1]) is Link.NVSWITCH  # one GPU needs no link


@pytest.mark.parametrize("name", LAYOUTS)
def test_layouts_put_half_the_gpus_on_each_numa_node_with_symmetric_links(name: str) -> None:
    placed = layout_of(name, 8)
    assert [n for n, _ in placed] == [0, 0, 0, 0, 1, 1, 1, 1]
    for i, (_, t) in enumerate(placed):
        for peer in t.nvlink:
            assert i in placed[peer][1].nvlink
    gpus = inventory("n", SimSpec(), {"layout": name})
    assert parse_inventory(format_inventory(gpus)) == gpus


def test_layout_classes_of_a_pair() -> None:
    best = {name: set_link(inventory("n", SimSpec(), {"layout": name})[0:2]) for name in LAYOUTS}
    assert best == {"nvswitch": Link.NVSWITCH, "pcie-2numa": Link.PCIE, "nvlink-pairs": Link.NVLINK}


def test_unknown_layout_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown GPU layout 'mesh'"):
        inventory("n", SimSpec(), {"layout": "mesh"})
    with pytest.raises(ValueError, match="divisible by 4"):
        inventory("n", SimSpec(count=6), {"layout": "pcie-2numa"})


def test_wishes_from_annotations_with_hami_aliases() -> None:
    keys = Keys()
    got = parse_wishes(
        {
            "nodelock.io/topology": "Required",
            "nodelock.io/policy": "spread",
            "nvidia.com/use-gputype": "H100, A100",
            "nvidia.com/nouse-gpuuuid": "GPU-1,GPU-2",
        },
        keys,
    )
    assert got.topology.value == "required"
    assert got.policy == "spread"
    assert got.models == ("H100", "A100")
    assert got.exclude_uuids == frozenset({"GPU-1", "GPU-2"})
    # nodelock's own annotation wins over the alias
    both = {"nodelock.io/gpu-model": "A100", "nvidia.com/use-gputype": "H100"}
    assert parse_wishes(both, keys).models == ("A100",)


def test_model_entries_match_ignoring_case_by_containment_uuids_exactly() -> None:
    w = Wishes(models=("h100",), exclude_uuids=frozenset({"GPU-x"}))
    assert w.allows("GPU-a", "NVIDIA H100 80GB HBM3")
    assert not w.allows("GPU-a", "NVIDIA A100-SXM4-40GB")
    assert not w.allows("GPU-x", "NVIDIA H100 80GB HBM3")
    assert Wishes(uuids=frozenset({"GPU-a"})).allows("GPU-a", "x")
    assert not Wishes(uuids=frozenset({"GPU-a"})).allows("GPU-ab", "x")


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"nodelock.io/topology": "strict"}, "nodelock.io/topology: 'strict' is not one of"),
        ({"nodelock.io/policy": "pack"}, "nodelock.io/policy: 'pack' is not one of"),
        ({"nodelock.io/gpu-model": " , "}, "nodelock.io/gpu-model must list at least one"),
        ({"nvidia.com/use-gpuuuid": ""}, "nvidia.com/use-gpuuuid must list at least one"),
    ],
)
def test_bad_wishes_are_named(annotations: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_wishes(annotations, Keys())
