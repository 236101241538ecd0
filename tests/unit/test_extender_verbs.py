"""Filter and prioritize over many nodes: judging each distinct node shape once changes nothing.

``filter_nodes`` and ``prioritize_nodes`` call ``fit``/``score`` once per distinct
``NodeGPUs.fit_key`` and spread the answer over the nodes with that key.  These tests compare them
with the plain per-node loop (``fit``/``score`` for every node, then steering by wait) on
arbitrary clusters whose nodes share shapes, with unknown and repeated names, and check that
``fit_key`` holds everything ``fit`` and ``score`` read.  With a ``KeyIndex`` (each node's key
looked up and a picture per key, as the server passes from the cache) the answers are the same.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from handoff.request import ContainerKind, ContainerNeed
from handoff.wire import GPU, ContainerName, DeviceID
from lockd.model import NodeName
from scheduler_ext.choose import (
    Fit,
    NodeGPUs,
    Policy,
    fit,
    score,
)
from scheduler_ext.need import PodNeed, plan_slots
from scheduler_ext.verbs import UNKNOWN_NODE, KeyIndex, filter_nodes, prioritize_nodes

PROBLEMS = [None, None, None, "node has no GPU inventory", "node's GPU inventory does not parse"]


@st.composite
def pictures(draw: st.DrawFn, name: str) -> NodeGPUs:
    n = draw(st.integers(0, 8))
    devices = tuple(
        GPU(DeviceID(f"GPU-{name}-{i}"), i, "H100", 81559, 0, draw(st.booleans()) or i % 3 > 0)
        for i in range(n)
    )
    taken = draw(st.sets(st.sampled_from([d.id for d in devices]))) if devices else set()
    return NodeGPUs(
        node=NodeName(name),
        devices=devices,
        taken=frozenset(taken),
        unattributed=draw(st.integers(0, 2)),
        allocatable=draw(st.one_of(st.none(), st.integers(0, 9))),
        problem=draw(st.sampled_from(PROBLEMS)),
    )


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[NodeName, NodeGPUs], list[NodeName]]:
    count = draw(st.integers(0, 30))
    known = {NodeName(f"n{i}"): draw(pictures(f"n{i}")) for i in range(count)}
    pool = [*known, NodeName("ghost-1"), NodeName("ghost-2")]
    names = draw(st.lists(st.sampled_from(pool), max_size=40))  # unknown and repeated names too
    return known, names


WAITS = st.dictionaries(  # node -> expected wait of a bind there
    st.sampled_from([NodeName(f"n{i}") for i in range(30)]),
    st.floats(min_value=0.01, max_value=2.0),
    max_size=6,
)


def need(total: int) -> PodNeed:
    if total == 0:
        return plan_slots([])
    return plan_slots([ContainerNeed(ContainerName("c"), total, ContainerKind.APP)])


def index_of(known: dict[NodeName, NodeGPUs]) -> KeyIndex:
    """The index the server builds: each node's key, and for each key the last picture seen
    with it (not necessarily the node's own: equal keys judge alike)."""
    keys = {n: g.fit_key for n, g in known.items()}
    with_key = {g.fit_key: g for g in known.values()}
    return KeyIndex(keys.get, with_key.__getitem__)


def naive_filter(
    pod: PodNeed, names: list[NodeName], known: dict[NodeName, NodeGPUs]
) -> tuple[tuple[NodeName, ...], dict[NodeName, str], dict[NodeName, str]]:
    if not pod.wants_gpus:
        return tuple(names), {}, {}
    passed: list[NodeName] = []
    failed: dict[NodeName, str] = {}
    unresolvable: dict[NodeName, str] = {}
    for name in names:
        gpus = known.get(name)
        if gpus is None:
            failed[name] = UNKNOWN_NODE
            continue
        verdict = fit(gpus, pod)
        if verdict.fit is Fit.FITS:
            passed.append(name)
        elif verdict.fit is Fit.NO_ROOM:
            failed[name] = verdict.reason
        else:
            unresolvable[name] = verdict.reason
    return tuple(passed), failed, unresolvable


@settings(max_examples=300, deadline=None)
@given(clusters(), st.integers(0, 9))
def test_filter_equals_judging_every_node_on_its_own(
    cluster: tuple[dict[NodeName, NodeGPUs], list[NodeName]], total: int
) -> None:
    known, names = cluster
    pod = need(total)
    passed, failed, unresolvable = naive_filter(pod, names, known)
    for index in (None, index_of(known)):
        out = filter_nodes(pod, names, known.get, index=index)
        assert out.passed == passed
        assert list(out.failed.items()) == list(failed.items())  # same reasons, same order
        assert list(out.unresolvable.items()) == list(unresolvable.items())


@settings(max_examples=300, deadline=None)
@given(
    clusters(),
    st.integers(0, 9),
    st.sampled_from(list(Policy)),
    WAITS,
    st.sampled_from([0.0, 0.1, 0.5]),
)
def test_prioritize_equals_scoring_every_node_on_its_own(
    cluster: tuple[dict[NodeName, NodeGPUs], list[NodeName]],
    total: int,
    policy: Policy,
    waits: dict[NodeName, float],
    tolerance: float,
) -> None:
    known, names = cluster
    pod = need(total)
    plain: dict[NodeName, int] = {}
    for name in names:
        gpus = known.get(name)
        plain[name] = 0 if gpus is None else score(gpus, pod, policy)
    fitting = [n for n, s in plain.items() if s > 0]
    soonest = min((waits.get(n, 0.0) for n in fitting), default=0.0)
    expected = [
        plain[n] if plain[n] <= 0 or waits.get(n, 0.0) <= soonest + tolerance else 0 for n in names
    ]
    for index in (None, index_of(known)):
        scores = prioritize_nodes(
            pod, names, known.get, policy=policy, waits=waits, tolerance_s=tolerance, index=index
        )
        assert scores == expected


@settings(max_examples=300, deadline=None)
@given(pictures("a"), pictures("b"), st.integers(0, 9), st.sampled_from(list(Policy)))
def test_equal_fit_keys_mean_equal_verdicts_and_scores(
    a: NodeGPUs, b: NodeGPUs, total: int, policy: Policy
) -> None:
    pod = need(total)
    if a.fit_key == b.fit_key:
        assert fit(a, pod) == fit(b, pod)
        assert score(a, pod, policy) == score(b, pod, policy)
    else:
        assert (a.problem, a.healthy, a.allocatable, a.capacity, a.available) != (
            b.problem,
            b.healthy,
            b.allocatable,
            b.capacity,
            b.available,
        )


def test_prioritize_keeps_the_empty_node_a_larger_pending_pod_needs() -> None:
    def picture(name: str, taken: int) -> NodeGPUs:
        devices = tuple(
            GPU(DeviceID(f"GPU-{name}-{i}"), i, "H100", 81559, 0, True) for i in range(8)
        )
        return NodeGPUs(
            node=NodeName(name),
            devices=devices,
            taken=frozenset(d.id for d in devices[:taken]),
            allocatable=8,
        )

    known = {NodeName("empty"): picture("empty", 0), NodeName("half"): picture("half", 4)}
    names = [NodeName("empty"), NodeName("half")]
    spread = prioritize_nodes(need(1), names, known.get, policy=Policy.SPREAD)
    assert spread[0] > spread[1] > 0  # spread alone would open the empty node
    kept = prioritize_nodes(need(1), names, known.get, policy=Policy.SPREAD, larger={8: 1})
    assert kept == [0, spread[1]]
    # where no node is safe (only the empty one fits), the policy decides as before
    big = prioritize_nodes(need(8), names, known.get, policy=Policy.SPREAD, larger={8: 1})
    assert big[0] > 0


def test_binds_on_their_way_count_against_the_room_kept_for_a_larger_pod() -> None:
    def picture(name: str) -> NodeGPUs:
        devices = tuple(
            GPU(DeviceID(f"GPU-{name}-{i}"), i, "H100", 81559, 0, True) for i in range(8)
        )
        return NodeGPUs(node=NodeName(name), devices=devices, taken=frozenset(), allocatable=8)

    names = [NodeName("a"), NodeName("b")]
    known = {n: picture(n) for n in names}
    # both nodes look empty, but six GPUs of queued binds are on their way to a: only b can
    # still take the pending 8-GPU pod, so a 2-GPU pod goes to a
    on_way = {NodeName("a"): 6}
    kept = prioritize_nodes(
        need(2), names, known.get, policy=Policy.BINPACK, larger={8: 1}, inflight=on_way
    )
    assert kept[0] > 0
    assert kept[1] == 0
    blind = prioritize_nodes(need(2), names, known.get, policy=Policy.BINPACK, larger={8: 1})
    assert blind[0] == blind[1]  # without them, the two nodes look alike
