"""``TurnedAway``: which pods filter turned away are named again, and when (plain data)."""

from __future__ import annotations

from handoff.request import ContainerKind, ContainerNeed
from handoff.wire import GPU, ContainerName, DeviceID
from lockd.model import NodeName
from scheduler_ext.choose import NodeGPUs
from scheduler_ext.need import PodNeed, plan_slots
from scheduler_ext.retries import Due, TurnedAway

N1, N2 = NodeName("n1"), NodeName("n2")


def need(total: int) -> PodNeed:
    return plan_slots([ContainerNeed(ContainerName("c"), total, ContainerKind.APP)])


def picture(node: NodeName, gpus: int, taken: int) -> NodeGPUs:
    devices = tuple(
        GPU(DeviceID(f"GPU-{node}-{i}"), i, "H100", 81559, 0, True) for i in range(gpus)
    )
    return NodeGPUs(
        node=node,
        devices=devices,
        taken=frozenset(d.id for d in devices[:taken]),
        unattributed=0,
        allocatable=gpus,
        problem=None,
    )


def cluster(**free: tuple[int, int]) -> dict[NodeName, NodeGPUs]:
    return {NodeName(n): picture(NodeName(n), gpus, taken) for n, (gpus, taken) in free.items()}


def test_a_pod_is_named_once_room_appears_on_a_node_it_was_turned_away_from() -> None:
    away = TurnedAway(window_s=30)
    away.turned_away("u1", "ns/p", need(1), [N1, N2], now=0.0)
    full = cluster(n1=(2, 2), n2=(2, 2))
    assert away.due([N1, N2], full.get, now=1.0) == []  # changed, but still no room
    freed = cluster(n1=(2, 2), n2=(2, 1))
    assert away.due([N1], freed.get, now=2.0) == []  # n1 changed, n2 has the room
    assert away.due([N2], freed.get, now=3.0) == [Due("u1", "ns/p", N2)]
    assert away.due([N1, N2], freed.get, now=4.0) == []  # named once
    assert len(away) == 0


def test_only_nodes_it_was_turned_away_from_for_room_count() -> None:
    away = TurnedAway(window_s=30)
    away.turned_away("u1", "ns/p", need(2), [N1], now=0.0)
    roomy = cluster(n1=(2, 1), n2=(4, 0))
    assert away.due([N2], roomy.get, now=1.0) == []  # never turned away from n2
    assert away.due([N1], roomy.get, now=1.0) == []  # one free GPU of the two it needs
    assert away.due([N1], cluster(n1=(2, 0)).get, now=2.0) == [Due("u1", "ns/p", N1)]


def test_a_pod_turned_away_longer_ago_than_the_window_is_forgotten() -> None:
    away = TurnedAway(window_s=30)
    away.turned_away("old", "ns/old", need(1), [N1], now=0.0)
    away.turned_away("new", "ns/new", need(1), [N1], now=20.0)
    free = cluster(n1=(2, 0))
    assert away.due([N1], free.get, now=40.0) == [Due("new", "ns/new", N1)]
    assert len(away) == 0


def test_turning_a_pod_away_again_restarts_its_window_and_replaces_its_nodes() -> None:
    away = TurnedAway(window_s=30)
    away.turned_away("u1", "ns/p", need(1), [N1], now=0.0)
    away.turned_away("u1", "ns/p", need(1), [N2], now=25.0)
    free = cluster(n1=(1, 0), n2=(1, 0))
    assert away.due([N1], free.get, now=40.0) == []
    assert away.due([N2], free.get, now=50.0) == [Due("u1", "ns/p", N2)]


def test_a_pod_filter_passed_is_forgotten() -> None:
    away = TurnedAway()
    away.turned_away("u1", "ns/p", need(1), [N1], now=0.0)
    away.forget("u1")
    assert away.due([N1], cluster(n1=(1, 0)).get, now=1.0) == []
    away.turned_away("u2", "ns/q", need(1), [], now=0.0)  # no node for want of room
    assert len(away) == 0


def test_at_most_limit_pods_are_remembered_oldest_forgotten_first() -> None:
    away = TurnedAway(window_s=30, limit=2)
    for i in range(3):
        away.turned_away(f"u{i}", f"ns/p{i}", need(1), [N1], now=float(i))
    assert len(away) == 2
    named = away.due([N1], cluster(n1=(8, 0)).get, now=3.0)
    assert [d.uid for d in named] == ["u1", "u2"]


def test_an_unknown_node_names_nobody() -> None:
    away = TurnedAway()
    away.turned_away("u1", "ns/p", need(1), [N1], now=0.0)
    nothing: dict[NodeName, NodeGPUs] = {}
    assert away.due([N1], nothing.get, now=1.0) == []
    assert len(away) == 1


def test_expire_forgets_only_what_is_older_than_the_window() -> None:
    away = TurnedAway(window_s=30)
    away.turned_away("old", "ns/old", need(1), [N1], now=0.0)
    away.turned_away("new", "ns/new", need(1), [N2], now=10.0)
    away.expire(now=35.0)
    assert len(away) == 1
    assert away.due([N2], cluster(n2=(1, 0)).get, now=36.0) == [Due("new", "ns/new", N2)]
