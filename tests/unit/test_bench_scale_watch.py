"""The watch measurements' pure parts: the churn's plan, the summaries, a second replica's argv."""

from __future__ import annotations

import pytest

from bench.scale_watch import (
    Op,
    churn_plan,
    cpu_ms_per_event,
    per_watch,
    quantiles,
    replica_argv,
    shifted,
)


def test_churn_plan_keeps_the_live_set_and_the_rate() -> None:
    ops = list(churn_plan(50.0, 10.0, 100))
    assert len(ops) == 500
    assert [o.at_s for o in ops] == sorted(o.at_s for o in ops)
    assert ops[-1].at_s == pytest.approx(499 / 50)
    alive = set(range(100))  # created before the window
    for op in ops:
        if op.create:
            assert op.index not in alive
            alive.add(op.index)
        else:
            assert op.index in alive  # a delete only ever finds its pod there
            alive.remove(op.index)
        assert len(alive) in (100, 101)
    assert len(alive) == 100


def test_churn_plan_alternates_creates_and_deletes() -> None:
    ops = list(churn_plan(4.0, 1.0, 3))
    assert ops == [Op(0.0, True, 3), Op(0.25, False, 0), Op(0.5, True, 4), Op(0.75, False, 1)]


def test_a_second_plan_shifted_by_the_first_ones_pairs_continues_it() -> None:
    first = list(churn_plan(10.0, 2.0, 5))
    pairs = len(first) // 2
    alive = set(range(5))
    for op in [*first, *shifted(churn_plan(10.0, 2.0, 5), pairs)]:
        if op.create:
            alive.add(op.index)
        else:
            alive.remove(op.index)  # KeyError if the second plan deleted a pod never made
    assert len(alive) == 5


def test_no_churn_at_no_rate() -> None:
    assert list(churn_plan(0.0, 10.0, 5)) == []
    assert list(churn_plan(10.0, 0.0, 5)) == []


def test_quantiles_nearest_rank() -> None:
    got = quantiles([float(v) for v in range(1, 101)])
    assert got == {"count": 100, "p50": 50.0, "p99": 99.0, "max": 100.0}
    assert quantiles([0.3]) == {"count": 1, "p50": 0.3, "p99": 0.3, "max": 0.3}
    assert quantiles([])["p99"] is None


def test_cpu_per_event_is_net_of_the_idle_rate() -> None:
    # 3 CPU-s over 60 s with 0.01 CPU-s/s idle: 2.4 CPU-s for 6000 events
    assert cpu_ms_per_event(3.0, 0.01, 60.0, 6000) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="no events"):
        cpu_ms_per_event(1.0, 0.0, 1.0, 0)


def test_replica_argv_moves_only_the_ports() -> None:
    head = ["python", "-m", "nodelock.cli", "extender"]
    argv = [*head, "--listen=127.0.0.1:4000", "--metrics-port=4001", "--policy=binpack"]
    got = replica_argv(argv, listen_port=5000, metrics_port=5001)
    assert got == [*head, "--listen=127.0.0.1:5000", "--metrics-port=5001", "--policy=binpack"]
    assert argv[4] == "--listen=127.0.0.1:4000"  # not changed in place
    with pytest.raises(ValueError, match="neither"):
        replica_argv(["extender", "--policy=binpack"], listen_port=1, metrics_port=2)


def test_per_watch_divides_the_difference_and_scales_it() -> None:
    got = per_watch({"watches_pods": 20.0, "rss": 500.0}, {"watches_pods": 120.0, "rss": 520.0},
                    100, at=5000)  # fmt: skip
    assert got["watches_pods"] == {"per_node": 1.0, "at_5000": 5000.0}
    assert got["rss"]["per_node"] == pytest.approx(0.2)
    assert got["rss"]["at_5000"] == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="positive"):
        per_watch({}, {}, 0, at=5000)
