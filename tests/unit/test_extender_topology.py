"""Topology-aware choice, NUMA alignment as kubelet does it, and device selection (pure)."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.simulated import SimSpec, inventory
from handoff.placement import NO_WISHES, TopologyWish, Wishes
from handoff.request import ContainerKind, ContainerNeed
from handoff.topology import Link, NumaPolicy, Topo, set_link
from handoff.wire import GPU, ContainerName, DeviceID
from lockd.model import NodeName
from scheduler_ext.choose import Fit, NodeGPUs, Policy, choose, fit, score
from scheduler_ext.need import PodNeed, plan_slots
from scheduler_ext.topology import Pick, kubelet_affinity, place
from scheduler_ext.verbs import filter_nodes

pytestmark = pytest.mark.unit


def node(
    layout: str,
    *,
    taken: tuple[int, ...] = (),
    unhealthy: tuple[int, ...] = (),
    policy: NumaPolicy = NumaPolicy.NONE,
    name: str = "n1",
    model: str = "NVIDIA H100 80GB HBM3",
) -> NodeGPUs:
    devices = tuple(
        replace(g, healthy=g.index not in unhealthy)
        for g in inventory(name, SimSpec(model=model), {"layout": layout})
    )
    return NodeGPUs(
        node=NodeName(name),
        devices=devices,
        taken=frozenset(devices[i].id for i in taken),
        allocatable=len(devices),
        numa_policy=policy,
    )


def pod(*counts: int, wishes: Wishes = NO_WISHES) -> PodNeed:
    need = plan_slots(
        [ContainerNeed(ContainerName(f"c{i}"), c, ContainerKind.APP) for i, c in enumerate(counts)]
    )
    return replace(need, wishes=wishes)


def indexes(n: NodeGPUs, need: PodNeed) -> list[list[int]]:
    by_id = {g.id: g.index for g in n.devices}
    return [[by_id[d] for d in ids] for ids in choose(n, need).values()]


def test_two_gpus_go_on_a_connected_pair() -> None:
    # lowest-index would give 1+2: different PCIe switches / different NVLink pairs
    assert indexes(node("pcie-2numa", taken=(0,)), pod(2)) == [[2, 3]]
    assert indexes(node("nvlink-pairs", taken=(0,)), pod(2)) == [[2, 3]]
    assert indexes(node("nvswitch", taken=(0,)), pod(2)) == [[1, 2]]


def test_a_single_gpu_goes_where_it_breaks_no_pair() -> None:
    assert indexes(node("nvlink-pairs", taken=(0,)), pod(1)) == [[1]]
    assert indexes(node("pcie-2numa", taken=(0, 1, 4)), pod(1)) == [[5]]


def test_four_gpus_stay_on_one_numa_node() -> None:
    assert indexes(node("pcie-2numa", taken=(0,)), pod(4)) == [[4, 5, 6, 7]]
    # with NUMA node 1 broken up, whole pairs are still preferred inside NUMA node 0
    assert indexes(node("nvlink-pairs", taken=(4, 6)), pod(4)) == [[0, 1, 2, 3]]


def test_topology_none_takes_the_lowest_indexes() -> None:
    need = pod(2, wishes=Wishes(topology=TopologyWish.NONE))
    assert indexes(node("nvlink-pairs", taken=(0,)), need) == [[1, 2]]


def test_required_keeps_a_pod_off_a_node_with_only_split_pairs_and_says_why() -> None:
    split = node("nvlink-pairs", taken=(0, 2, 4, 6))
    need = pod(2, wishes=Wishes(topology=TopologyWish.REQUIRED))
    verdict = fit(split, need)
    assert verdict.fit is Fit.NO_ROOM
    assert "requires its 2 GPUs connected by NVLink" in verdict.reason
    assert "the same NUMA node" in verdict.reason
    assert fit(split, pod(2)).fit is Fit.FITS  # preferred: any pair will do
    assert fit(node("nvlink-pairs", taken=(0, 2, 4)), need).fit is Fit.FITS


def test_kubelet_picks_the_narrowest_then_lowest_numa_mask() -> None:
    devices = node("pcie-2numa").devices
    free = [g for g in devices if g.index not in (0, 1)]
    assert kubelet_affinity(devices, free, 2, [0, 1]) == (frozenset({0}), True)
    assert kubelet_affinity(devices, free, 3, [0, 1]) == (frozenset({1}), True)
    assert kubelet_affinity(devices, free, 5, [0, 1]) == (frozenset({0, 1}), True)
    split = [g for g in devices if g.index in (2, 3, 4, 5)]
    assert kubelet_affinity(devices, split, 3, [0, 1]) == (frozenset({0, 1}), False)
    assert kubelet_affinity(devices, list(devices), 8, [0, 1]) == (frozenset({0, 1}), True)
    assert kubelet_affinity(devices, free, 7, [0, 1]) is None


def test_numa_aligned_choice_follows_kubelets_pick_not_the_best_pair() -> None:
    # NUMA node 0 has 2 and 3 free (one PCIe switch); NUMA node 1 is empty.  Without alignment the
    # choice is the same pair; with 1 and 3 free on node 0, kubelet still picks node 0 (lowest) and
    # the extender must follow, though node 1 offers a PCIe pair.
    n = node("pcie-2numa", taken=(0, 2), policy=NumaPolicy.BEST_EFFORT)
    assert indexes(n, pod(2)) == [[1, 3]]
    assert indexes(replace(n, numa_policy=NumaPolicy.NONE), pod(2)) == [[4, 5]]


def test_single_numa_node_policy_needs_the_set_on_one_numa_node() -> None:
    spread = node("pcie-2numa", taken=(0, 1, 4, 5), policy=NumaPolicy.SINGLE_NUMA_NODE)
    verdict = fit(spread, pod(4))
    assert verdict.fit is Fit.NO_ROOM
    assert "single-numa-node" in verdict.reason
    assert fit(replace(spread, numa_policy=NumaPolicy.NONE), pod(4)).fit is Fit.FITS
    never = fit(node("pcie-2numa", policy=NumaPolicy.SINGLE_NUMA_NODE), pod(8))
    assert never.fit is Fit.NEVER
    assert "largest NUMA node has 4 healthy GPUs" in never.reason
    # restricted admits 8 GPUs over both NUMA nodes: that is the narrowest mask that holds 8
    assert fit(node("pcie-2numa", policy=NumaPolicy.RESTRICTED), pod(8)).fit is Fit.FITS
    assert fit(replace(spread, numa_policy=NumaPolicy.RESTRICTED), pod(4)).fit is Fit.NO_ROOM


def test_each_container_is_aligned_on_its_own() -> None:
    n = node("pcie-2numa", policy=NumaPolicy.SINGLE_NUMA_NODE)
    got = indexes(n, pod(4, 4))
    assert sorted(got) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_scores_prefer_the_node_where_the_set_is_as_good_as_the_node_gets() -> None:
    need = pod(2)
    # equal fill (4 taken): one node still has a whole NVLink pair free, the other only halves
    whole = node("nvlink-pairs", taken=(0, 2, 4, 5))
    split = node("nvlink-pairs", taken=(0, 2, 4, 6))
    assert score(whole, need, Policy.BINPACK) > score(split, need, Policy.BINPACK)
    # a 2-GPU pod gets the best its node offers on an NVSwitch node and on a PCIe node alike:
    # small pods are not drawn to the NVSwitch nodes that 8-GPU pods need
    assert score(node("nvswitch"), need, Policy.BINPACK) == score(
        node("pcie-2numa"), need, Policy.BINPACK
    )
    # the pod's own policy overrides the extender's
    fuller, emptier = node("nvswitch", taken=(0, 1, 2)), node("nvswitch")
    spread = pod(2, wishes=Wishes(policy="spread"))
    assert score(fuller, pod(2), Policy.BINPACK) > score(emptier, pod(2), Policy.BINPACK)
    assert score(fuller, spread, Policy.BINPACK) < score(emptier, spread, Policy.BINPACK)


def test_model_selection_and_its_reasons() -> None:
    h100, a100 = node("nvswitch", name="h"), node("nvswitch", name="a", model="NVIDIA A100 80GB")
    want = pod(2, wishes=Wishes(models=("A100",)))
    assert fit(h100, want).fit is Fit.NEVER
    assert "matching model A100" in fit(h100, want).reason
    assert fit(a100, want).fit is Fit.FITS
    avoid = pod(1, wishes=Wishes(exclude_models=("h100",)))
    assert fit(h100, avoid).fit is Fit.NEVER
    out = filter_nodes(want, [h100.node, a100.node], {h100.node: h100, a100.node: a100}.get)
    assert out.passed == (a100.node,)
    assert "model A100" in out.unresolvable[h100.node]


def test_uuid_selection_is_judged_node_by_node() -> None:
    a, b = node("nvswitch", name="a"), node("nvswitch", name="b")
    target = b.devices[5].id
    need = pod(1, wishes=Wishes(uuids=frozenset({target})))
    assert a.fit_key == b.fit_key  # same shape, so the UUID must not be judged by key
    out = filter_nodes(need, [a.node, b.node], {a.node: a, b.node: b}.get)
    assert out.passed == (b.node,)
    assert choose(b, need) == {"c0": [target]}
    taken = replace(b, taken=frozenset({target}))
    assert fit(taken, need).fit is Fit.NO_ROOM
    excluded = pod(8, wishes=Wishes(exclude_uuids=frozenset({target})))
    assert fit(b, excluded).fit is Fit.NEVER


# ---- properties on small random layouts ----------------------------------------------------


@st.composite
def layouts(draw: st.DrawFn) -> NodeGPUs:
    n = draw(st.integers(1, 8))
    links = draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=6))
    devices = []
    for i in range(n):
        peers = tuple(sorted({b for a, b in links if a == i and b != i}))
        devices.append(
            GPU(
                DeviceID(f"GPU-{i}"),
                i,
                draw(st.sampled_from(["H100", "A100"])),
                1,
                draw(st.sampled_from([None, 0, 1])),
                draw(st.booleans()) or i % 2 == 0,
                Topo(
                    pcie=draw(st.sampled_from([None, "p0", "p1", "p2"])),
                    nvswitch=draw(st.sampled_from([None, None, "s0"])),
                    nvlink=peers,
                ),
            )
        )
    taken = draw(st.sets(st.sampled_from([d.id for d in devices])))
    return NodeGPUs(
        node=NodeName("n"),
        devices=tuple(devices),
        taken=frozenset(taken),
        numa_policy=draw(st.sampled_from(list(NumaPolicy))),
    )


wishes = st.builds(
    Wishes,
    topology=st.sampled_from(list(TopologyWish)),
    models=st.sampled_from([(), ("H100",)]),
    exclude_uuids=st.sampled_from([frozenset(), frozenset({"GPU-1"})]),
)


@settings(max_examples=400, deadline=None)
@given(layouts(), st.lists(st.integers(1, 4), min_size=1, max_size=2), wishes)
def test_choice_takes_exactly_the_count_of_free_healthy_allowed_devices(
    n: NodeGPUs, counts: list[int], w: Wishes
) -> None:
    need = pod(*counts, wishes=w)
    if fit(n, need).fit is not Fit.FITS:
        return
    got = [d for ids in choose(n, need).values() for d in ids]
    assert len(got) == len(set(got)) == need.total
    health = {g.id: g for g in n.devices}
    for d in got:
        assert health[d].healthy
        assert d not in n.taken
        assert w.allows(d, health[d].model)


@settings(max_examples=400, deadline=None)
@given(layouts(), st.integers(2, 5), wishes)
def test_the_chosen_set_is_of_the_best_class_any_free_set_has(
    n: NodeGPUs, k: int, w: Wishes
) -> None:
    n = replace(n, numa_policy=NumaPolicy.NONE)
    w = replace(w, topology=TopologyWish.PREFERRED)
    need = pod(k, wishes=w)
    if fit(n, need).fit is not Fit.FITS:
        return
    outcome = place(n.devices, n.free, need, n.numa_policy)
    assert isinstance(outcome, Pick)
    allowed = [g for g in n.free if w.allows(g.id, g.model)]
    best = max((set_link(c) for c in combinations(allowed, k)), default=Link.SYSTEM)
    assert outcome.link == best == set_link(outcome.slots)


@settings(max_examples=300, deadline=None)
@given(layouts(), layouts(), st.integers(1, 4), st.sampled_from(list(Policy)))
def test_equal_fit_keys_mean_equal_verdicts_scores_and_choices(
    a: NodeGPUs, b: NodeGPUs, k: int, policy: Policy
) -> None:
    b = replace(
        b,
        node=NodeName("m"),
        devices=tuple(replace(g, id=DeviceID(f"X-{g.index}")) for g in b.devices),
        taken=frozenset(DeviceID(f"X-{d[4:]}") for d in b.taken),
    )
    need = pod(k)
    if a.fit_key != b.fit_key:
        return
    assert fit(a, need) == fit(b, need)
    assert score(a, need, policy) == score(b, need, policy)
    if fit(a, need).fit is Fit.FITS:
        by_a = {g.id: g.index for g in a.devices}
        by_b = {g.id: g.index for g in b.devices}
        assert [[by_a[d] for d in v] for v in choose(a, need).values()] == [
            [by_b[d] for d in v] for v in choose(b, need).values()
        ]
