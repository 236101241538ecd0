"""The handoff benchmark's headline figures (the issue's targets): nodelock against the stock
GPU phase of the same round, its own processes' CPU, the API server's extra CPU."""

import math
from typing import Any

from bench.handoff import TARGETS, headline, kubelet_comparison, table, target_lines
from devcluster.realkubelet import KubeletKind


def row(phase: str, round_: int, pods_per_s: float, cpu: dict[str, float]) -> dict[str, Any]:
    return {
        "phase": phase,
        "round": round_,
        "pods_per_s": pods_per_s,
        "to_running_p50_s": 0.5,
        "to_running_p99_s": 1.0 + round_ / 10,
        "contended_binds": float(round_ == 2),
        "handoff_p50_s": math.nan,
        "handoff_p99_s": math.nan,
        "handoff_writes_per_pod": 3.0 + round_ / 100,
        "lists_per_pod": 0.0,
        "all_requests_per_pod": 7.0,
        "cpu_ms_per_pod": cpu,
    }


ROWS = [
    row("nodelock", 1, 40.0, {"kube-apiserver": 15.0, "extender": 4.0, "deviceplugin": 8.0}),
    row("stock-gpu", 1, 80.0, {"kube-apiserver": 12.0, "stockplugin": 1.0}),
    row("nodelock", 2, 30.0, {"kube-apiserver": 20.0, "extender": 3.0, "deviceplugin": 2.0}),
    row("stock-gpu", 2, 40.0, {"kube-apiserver": 11.0}),
    row("nodelock", 3, 45.0, {"kube-apiserver": 14.0, "extender": 2.0, "deviceplugin": 3.0}),
    row("stock-gpu", 3, 50.0, {"kube-apiserver": 13.0}),
]


def test_headline_pairs_each_nodelock_round_with_its_own_stock_round() -> None:
    h = headline(ROWS)
    assert h["nodelock_vs_stock"] == 0.75  # median of 0.5, 0.75, 0.9
    assert h["own_cpu_ms_per_pod"] == 5.0  # median of 12, 5, 5
    assert h["apiserver_extra_cpu_ms_per_pod"] == 3.0  # median of 3, 9, 1
    assert h["to_running_p99_s"] == 1.2
    assert h["contended_binds"] == 1.0  # the worst round
    assert h["handoff_writes_per_pod"] == 3.03


def test_without_a_stock_phase_the_ratios_against_it_are_not_measured() -> None:
    h = headline([r for r in ROWS if r["phase"] == "nodelock"])
    assert h["nodelock_vs_stock"] is None
    assert h["apiserver_extra_cpu_ms_per_pod"] is None
    assert h["own_cpu_ms_per_pod"] == 5.0
    assert headline([r for r in ROWS if r["phase"] == "stock-gpu"]) == dict.fromkeys(TARGETS)


def test_target_lines_say_met_or_missed_against_each_bound() -> None:
    text = "\n".join(target_lines(headline(ROWS)))
    assert "nodelock_vs_stock               0.75  (target >= 0.8: missed)" in text
    assert "own_cpu_ms_per_pod              5.00  (target <= 6: met)" in text
    assert "contended_binds                 1.00  (target <= 0: missed)" in text
    assert "targets (nodelock; 3 round(s)" in table(ROWS, cores=2)


def test_the_kubelet_comparison_sets_each_phase_and_figure_side_by_side() -> None:
    real = [
        {
            **r,
            "pods_per_s": r["pods_per_s"] / 2,
            "cpu_ms_per_pod": {**r["cpu_ms_per_pod"], "kubelet": 9.0},
        }
        for r in ROWS
    ]
    text = kubelet_comparison({KubeletKind.SIM: ROWS, KubeletKind.REAL: real})
    lines = text.splitlines()
    nodelock = next(line for line in lines if line.strip().startswith("nodelock "))
    assert nodelock.split() == [
        "nodelock",
        "40.0",
        "20.0",
        "1200",
        "1200",
        "25.0",
        "34.0",
        "0.0",
        "9.0",
    ]
    vs_stock = next(line for line in lines if "nodelock_vs_stock" in line)
    assert vs_stock.split() == ["nodelock_vs_stock", "0.75", "0.75", "+0.00"]
    own = next(line for line in lines if "own_cpu_ms_per_pod" in line)
    assert own.split() == ["own_cpu_ms_per_pod", "5.00", "5.00", "+0.00"]


def test_the_idle_cost_is_shown_per_pod_over_the_bursts_window() -> None:
    r = {
        **ROWS[0],
        "pods": 64,
        "cpu_window_s": 4.0,
        "idle_cpu_ms_per_s": {"deviceplugin": 24.0, "extender": 0.1},
    }
    text = table([r], cores=2)
    idle = next(line for line in text.splitlines() if "idle  the same seconds" in line)
    assert idle.split(": ", 1)[1] == "deviceplugin 1.5"  # 24 ms/s x 4 s / 64; extender too small
