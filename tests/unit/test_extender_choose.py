"""Device choice, filter verdicts and policies: plain data in, plain data out."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from handoff.request import ContainerKind, ContainerNeed
from handoff.wire import GPU, ContainerName, DeviceID
from lockd.model import NodeName
from scheduler_ext.choose import (
    MAX_SCORE,
    Fit,
    NodeGPUs,
    NoFit,
    Policy,
    burst_fills_anyway,
    choose,
    conflicts,
    devices_of,
    fit,
    placeable,
    reserved_levels,
    score,
    steer_by_wait,
)
from scheduler_ext.need import PodNeed, plan_slots


def gpus(n: int, *, unhealthy: tuple[int, ...] = (), prefix: str = "GPU-") -> tuple[GPU, ...]:
    return tuple(
        GPU(DeviceID(f"{prefix}{i:02d}"), i, "H100", 81559, i // 4, i not in unhealthy)
        for i in range(n)
    )


def node(
    n: int = 8,
    *,
    taken: tuple[int, ...] = (),
    unhealthy: tuple[int, ...] = (),
    unattributed: int = 0,
    allocatable: int | None = None,
    name: str = "n1",
) -> NodeGPUs:
    devices = gpus(n, unhealthy=unhealthy)
    return NodeGPUs(
        node=NodeName(name),
        devices=devices,
        taken=frozenset(devices[i].id for i in taken),
        unattributed=unattributed,
        allocatable=n if allocatable is None else allocatable,
    )


def apps(*counts: int) -> PodNeed:
    return plan_slots(
        [ContainerNeed(ContainerName(f"c{i}"), c, ContainerKind.APP) for i, c in enumerate(counts)]
    )


def test_fits_when_enough_free_healthy_devices() -> None:
    assert fit(node(8, taken=(0, 1, 2)), apps(5)).fit is Fit.FITS


def test_no_room_while_others_hold_devices() -> None:
    verdict = fit(node(8, taken=(0, 1, 2, 3, 4)), apps(4))
    assert verdict.fit is Fit.NO_ROOM
    assert verdict.reason == "node has 3 free GPUs of 8, pod needs 4"


def test_never_when_the_node_has_too_few_healthy_gpus() -> None:
    verdict = fit(node(4, unhealthy=(3,)), apps(4))
    assert verdict.fit is Fit.NEVER
    assert "3 healthy GPUs" in verdict.reason


def test_kubelets_allocatable_caps_the_inventory() -> None:
    assert fit(node(8, allocatable=2), apps(3)).fit is Fit.NEVER
    assert fit(node(8, allocatable=0), apps(1)).fit is Fit.NEVER


def test_node_without_inventory_never_fits() -> None:
    bare = NodeGPUs(node=NodeName("n"), problem="node has no GPU inventory")
    assert fit(bare, apps(1)) == fit(bare, apps(1))
    assert fit(bare, apps(1)).fit is Fit.NEVER
    assert fit(bare, apps(0)).fit is Fit.FITS  # a pod without GPUs is not ours to judge


def test_unattributed_pods_count_against_free_devices() -> None:
    n = node(8, taken=(0, 1), unattributed=3)
    assert n.available == 3
    assert n.assigned == 5
    assert fit(n, apps(4)).fit is Fit.NO_ROOM


def test_choose_takes_lowest_free_healthy_indices_where_links_do_not_matter() -> None:
    flat = node(8, taken=(0, 2), unhealthy=(1,))
    flat = replace(flat, devices=tuple(replace(g, numa=None) for g in flat.devices))
    got = choose(flat, apps(2, 1))
    assert got == {"c0": ["GPU-03", "GPU-04"], "c1": ["GPU-05"]}


def test_choose_keeps_a_pod_on_one_numa_node_when_the_node_reports_numa_nodes() -> None:
    # GPUs 0-3 on NUMA node 0, 4-7 on 1: the lowest indexes (3, 4, 5) would span both
    got = choose(node(8, taken=(0, 2), unhealthy=(1,)), apps(2, 1))
    assert got == {"c0": ["GPU-04", "GPU-05"], "c1": ["GPU-06"]}


def test_choose_skips_containers_without_gpus_and_keeps_container_order() -> None:
    got = choose(node(), apps(0, 1, 0, 2))
    assert list(got) == ["c1", "c3"]


def test_choose_init_gets_subset_of_app_devices() -> None:
    need = plan_slots(
        [
            ContainerNeed(ContainerName("setup"), 1, ContainerKind.INIT),
            ContainerNeed(ContainerName("train"), 2, ContainerKind.APP),
        ]
    )
    got = choose(node(4, taken=(0,)), need)
    assert got == {"setup": ["GPU-01"], "train": ["GPU-01", "GPU-02"]}
    assert list(got) == ["setup", "train"]  # init containers first


def test_choose_refuses_with_the_filter_reason() -> None:
    with pytest.raises(NoFit, match="node n1: node has 1 free GPUs of 2, pod needs 2"):
        choose(node(2, taken=(0,)), apps(2))


def test_binpack_prefers_the_fuller_node_spread_the_emptier() -> None:
    fuller, emptier = node(8, taken=(0, 1, 2, 3, 4)), node(8, taken=(0,))
    need = apps(2)
    assert score(fuller, need, Policy.BINPACK) > score(emptier, need, Policy.BINPACK)
    assert score(fuller, need, Policy.SPREAD) < score(emptier, need, Policy.SPREAD)
    # a placement that fills the node scores the maximum under binpack, the least that still
    # says "fits" (1) under spread
    full = node(4, taken=(0, 1))
    assert score(full, need, Policy.BINPACK) == MAX_SCORE
    assert score(full, need, Policy.SPREAD) == 1


def test_scores_stay_in_the_protocol_range_and_nodes_that_do_not_fit_score_zero() -> None:
    for n in (node(8), node(8, taken=(0, 1, 2, 3, 4, 5, 6)), node(1), node(3, unattributed=1)):
        for policy in Policy:
            assert 0 <= score(n, apps(1), policy) <= MAX_SCORE
    assert score(node(2, taken=(0, 1)), apps(1), Policy.BINPACK) == 0


_score_shapes = st.tuples(
    st.integers(min_value=0, max_value=16),  # GPUs on the node
    st.integers(min_value=0, max_value=16),  # of them taken
    st.integers(min_value=0, max_value=4),  # held by pods without an assignment
    st.integers(min_value=0, max_value=8),  # the pod's need
)


@given(_score_shapes)
def test_score_is_positive_exactly_where_the_pod_fits(shape: tuple[int, int, int, int]) -> None:
    size, used, unattributed, want = shape
    n = node(size, taken=tuple(range(min(used, size))), unattributed=unattributed)
    for policy in Policy:
        s = score(n, apps(want), policy)
        assert 0 <= s <= MAX_SCORE
        if want:
            assert (s > 0) == (fit(n, apps(want)).fit is Fit.FITS)


def test_steer_by_wait_keeps_the_policy_only_where_a_bind_is_served_soonest() -> None:
    a, b, c, d = (NodeName(x) for x in "abcd")
    # a is the policy's favourite but has a bind queued: the soonest fitting node wins
    assert steer_by_wait({a: 10, b: 3, c: 0}, {a: 0.4}, tolerance_s=0.1) == {a: 0, b: 3, c: 0}
    # nothing else fits: the wait does not matter
    assert steer_by_wait({a: 10, b: 0}, {a: 0.4}, tolerance_s=0.1) == {a: 10, b: 0}
    # every fitting node is busy: the least busy keep their scores, within the tolerance
    assert steer_by_wait({a: 10, b: 4, d: 7}, {a: 0.8, b: 0.4, d: 0.45}, tolerance_s=0.1) == {
        a: 0,
        b: 4,
        d: 7,
    }
    assert steer_by_wait({a: 10, b: 0}, {}, tolerance_s=0.1) == {a: 10, b: 0}
    # a node that does not fit never becomes the "soonest" one
    assert steer_by_wait({a: 10, b: 5, c: 0}, {a: 0.2, b: 0.3}, tolerance_s=0.0) == {
        a: 10,
        b: 0,
        c: 0,
    }


def test_conflicts_name_what_is_wrong() -> None:
    n = node(4, taken=(1,), unhealthy=(2,))
    assignment = {ContainerName("c"): [DeviceID("GPU-00"), DeviceID("GPU-01"), DeviceID("GPU-02")]}
    problems = conflicts(assignment, n)
    assert problems == ["GPU-01 is assigned to another pod", "GPU-02 is unhealthy"]
    assert conflicts({ContainerName("c"): [DeviceID("GPU-77")]}, n) == [
        "GPU-77 is not in the node's inventory"
    ]
    assert conflicts({ContainerName("c"): [DeviceID("GPU-00")]}, n) == []


_counts = st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=4)
_node_shape = st.tuples(
    st.integers(min_value=0, max_value=10),
    st.sets(st.integers(min_value=0, max_value=9)),
    st.sets(st.integers(min_value=0, max_value=9)),
)


@given(_counts, _counts, _node_shape)
def test_choice_never_hands_out_a_taken_or_unhealthy_device(
    init_counts: list[int], app_counts: list[int], shape: tuple[int, set[int], set[int]]
) -> None:
    size, taken, unhealthy = shape
    n = node(size, taken=tuple(t for t in taken if t < size), unhealthy=tuple(unhealthy))
    containers = [
        ContainerNeed(ContainerName(f"i{k}"), c, ContainerKind.INIT)
        for k, c in enumerate(init_counts)
    ] + [
        ContainerNeed(ContainerName(f"a{k}"), c, ContainerKind.APP)
        for k, c in enumerate(app_counts)
    ]
    need = plan_slots(containers)
    verdict = fit(n, need)
    if verdict.fit is not Fit.FITS:
        with pytest.raises(NoFit):
            choose(n, need)
        return
    got = choose(n, need)
    assert conflicts(got, n) == []
    assert len(devices_of(got)) == need.total
    app_devices = [set(got[c.name]) for c in containers if c.kind is ContainerKind.APP and c.count]
    union = set().union(*app_devices) if app_devices else set()
    assert sum(len(s) for s in app_devices) == len(union)  # app containers are disjoint
    for c in containers:
        assert len(got.get(c.name, [])) == c.count
    assert choose(n, need) == got  # deterministic


@given(st.permutations(list(range(8))))
def test_inventory_order_does_not_change_the_choice(order: list[int]) -> None:
    base = node(8, taken=(1, 5))
    shuffled = NodeGPUs(
        node=base.node,
        devices=tuple(base.devices[i] for i in order),
        taken=base.taken,
        allocatable=8,
    )
    assert choose(shuffled, apps(3)) == choose(base, apps(3))


def test_a_burst_that_fills_the_nodes_anyway_may_spread() -> None:
    # 64 single-GPU pods pending, 8 empty nodes of 8: every free GPU is taken either way
    assert burst_fills_anyway(64, 1, apps(1), [8] * 8)
    # the demand counts the pods whose binds are on their way, as free counts their GPUs
    assert burst_fills_anyway(10, 1, apps(1), [3, 4, 3])


def test_a_burst_smaller_than_the_free_gpus_keeps_the_policy() -> None:
    assert not burst_fills_anyway(40, 1, apps(1), [8] * 8)
    assert not burst_fills_anyway(0, 0, apps(1), [])  # nothing pending: nothing to spread


def test_a_larger_pod_still_pending_keeps_the_small_ones_packed() -> None:
    # an 8-GPU pod of the same burst needs an empty node: a 1-GPU pod must not open one
    assert not burst_fills_anyway(64, 8, apps(1), [8] * 8)
    assert burst_fills_anyway(64, 8, apps(8), [8] * 8)
    assert burst_fills_anyway(16, 2, apps(1, 1), [8, 8])  # two containers: 2 GPUs


def test_the_free_sum_stops_once_it_exceeds_the_demand() -> None:
    seen: list[int] = []

    def free() -> Iterator[int]:
        for n in [8] * 1000:
            seen.append(n)
            yield n

    assert not burst_fills_anyway(12, 1, apps(1), free())
    assert len(seen) == 2


def test_placeable_counts_pods_best_fit_largest_first() -> None:
    assert placeable({8: 2}, {8: 2}) == 2
    assert placeable({8: 2}, {8: 3}) == 2
    assert placeable({8: 1, 4: 2}, {4: 3, 8: 1}) == 3  # the 8 takes the empty node first
    assert placeable({8: 1}, {4: 2, 2: 1}) == 2  # two 4s fill it; no room for the 2
    assert placeable({3: 4}, {4: 1}) == 0
    assert placeable({}, {1: 5}) == 0


def test_a_small_pod_may_not_open_the_node_a_larger_pending_pod_needs() -> None:
    # one empty node, two half-used: a 1-GPU pod keeps the empty node for the 8-GPU pod
    assert reserved_levels({8: 1, 4: 2}, {8: 1}, apps(1)) == frozenset({4})
    # two empty nodes and one 8-GPU pod pending: either empty node may be opened
    assert reserved_levels({8: 2}, {8: 1}, apps(1)) is None


def test_reservation_restricts_nothing_when_nothing_is_safe_or_everything_is() -> None:
    assert reserved_levels({8: 1}, {8: 1}, apps(1)) is None  # nothing safe: policy decides
    assert reserved_levels({8: 3}, {4: 1}, apps(2)) is None  # all safe
    assert reserved_levels({8: 2}, {}, apps(1)) is None


def test_reservation_keeps_room_for_several_sizes() -> None:
    # two 8-GPU pods and a 4-GPU pod pending; nodes with 8, 8, 6 and 4 free: a 2-GPU pod keeps
    # both empty nodes for the 8s, and may take the 6 or the 4 (the 4-GPU pod then takes the other)
    assert reserved_levels({8: 2, 6: 1, 4: 1}, {8: 2, 4: 1}, apps(2)) == frozenset({4, 6})
