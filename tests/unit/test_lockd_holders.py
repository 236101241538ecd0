"""``holders()``: the held nodes and their holders, indexed as observations arrive.

The extender asks it once per filter/prioritize instead of asking ``view(node)`` for thousands
of nodes; it must say exactly what the views say, after any order of observations (late ones,
replacing reads, forgets).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX
from kube.client import KubeClient
from lockd.lease import LeaseFormat
from lockd.locks import NodeLocks
from lockd.metrics import LockMetrics
from lockd.model import FencingToken, Holder, HolderKey, NodeName, Outcome
from lockd.observed import Observations

FMT = LeaseFormat(namespace=DEFAULT_LOCK_NAMESPACE, prefix=DEFAULT_PREFIX)
NODES = [NodeName("g0"), NodeName("g1"), NodeName("g2")]
HOLDERS = [
    Holder(HolderKey("ns/a"), "uid-a", {"assignment": "x"}),
    Holder(HolderKey("ns/b"), "uid-b"),
]
NOW = "2024-05-01T12:00:00.000000Z"


def lease(node: NodeName, holder: Holder | None, token: int, rv: int) -> Any:
    held = FMT.acquired(
        {"metadata": {"name": node, "resourceVersion": str(rv)}},
        holder or HOLDERS[0],
        token=FencingToken(token),
        duration_s=10,
        now=NOW,
    )
    if holder is not None:
        return held
    free = FMT.released(held, outcome=Outcome.ALLOCATED, now=NOW)
    free["metadata"]["resourceVersion"] = str(rv)
    return free


OPS = st.one_of(
    st.tuples(
        st.just("observe"),
        st.sampled_from(NODES),
        st.one_of(st.none(), st.sampled_from(HOLDERS)),
        st.integers(1, 4),
        st.booleans(),
    ),
    st.tuples(st.just("forget"), st.sampled_from(NODES), st.none(), st.just(0), st.just(False)),
)


def apply(obs: Observations, rv: int, op: tuple[str, NodeName, Holder | None, int, bool]) -> None:
    """One drawn operation, seen at local time ``rv`` (the Lease's resourceVersion too)."""
    kind, node, holder, token, replace = op
    if kind == "forget":
        obs.forget(node)
    else:
        body = lease(node, holder, token, rv)
        obs.observe(FMT.parse(body), body, float(rv), replace=replace)


def held_per_view(obs: Observations) -> dict[NodeName, Holder]:
    out: dict[NodeName, Holder] = {}
    for node in obs.nodes():
        view = obs.view(node, 0.0)
        if view is not None and view.record.holder is not None:
            out[node] = view.record.holder
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=30))
def test_holders_say_what_the_views_say_after_any_observations(
    ops: list[tuple[str, NodeName, Holder | None, int, bool]],
) -> None:
    obs = Observations()
    for rv, op in enumerate(ops, start=1):
        apply(obs, rv, op)
        assert obs.holders() == held_per_view(obs)


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=30), st.floats(0.0, 60.0))
def test_held_ages_and_expiry_say_what_the_views_say(
    ops: list[tuple[str, NodeName, Holder | None, int, bool]], later: float
) -> None:
    obs = Observations()
    for rv, op in enumerate(ops, start=1):
        apply(obs, rv, op)
    now = len(ops) + later
    ages = obs.held_ages(now)
    assert set(ages) == set(obs.holders())
    for node in NODES:
        view = obs.view(node, now)
        assert obs.expired(node, now) == (view is not None and view.expired)
        if view is not None and view.record.holder is not None:
            assert ages[node] == view.held_for_s


def test_node_locks_holders_follow_acquire_and_release_seen_on_the_watch() -> None:
    locks = NodeLocks(
        KubeClient(api_client=None),
        metrics=LockMetrics(registry=CollectorRegistry()),
        namespace=DEFAULT_LOCK_NAMESPACE,
        prefix=DEFAULT_PREFIX,
    )
    assert locks.holders() == {}
    locks.observe(lease(NODES[0], HOLDERS[0], 1, 1))
    locks.observe(lease(NODES[1], HOLDERS[1], 1, 2))
    locks.observe(lease(NODES[2], None, 1, 3))
    assert locks.holders() == {NODES[0]: HOLDERS[0], NODES[1]: HOLDERS[1]}
    locks.observe(lease(NODES[0], None, 1, 4))
    assert locks.holders() == {NODES[1]: HOLDERS[1]}
    snapshot = locks.holders()
    locks.observe(lease(NODES[2], HOLDERS[0], 2, 5))
    assert snapshot == {NODES[1]: HOLDERS[1]}  # a copy: later observations do not change it
