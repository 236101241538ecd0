"""The handoff benchmark's rounds (each ratio against its own round's base phase, medians) and
its CPU columns."""

import math
from typing import Any

import pytest

from bench.handoff import (
    ceiling,
    cores_busy,
    cpu_ms_per_pod,
    medians,
    table,
    vs_default_binder,
    vs_phase,
)


def row(phase: str, pods_per_s: float, round_: int | None, *, p99: float = 1.0) -> dict[str, Any]:
    out: dict[str, Any] = {
        "phase": phase,
        "pods_per_s": pods_per_s,
        "to_running_p50_s": p99 / 2,
        "to_running_p99_s": p99,
        "contended_binds": 0.0,
        "handoff_p50_s": math.nan,
        "handoff_p99_s": math.nan,
        "handoff_writes_per_pod": 3.0,
        "lists_per_pod": 0.0,
        "all_requests_per_pod": 7.0,
    }
    if round_ is not None:
        out["round"] = round_
    return out


def test_each_ratio_is_against_the_default_binder_of_its_own_round() -> None:
    rows = [
        row("nodelock", 40.0, 1),
        row("default-binder", 100.0, 1),
        row("nodelock", 30.0, 2),
        row("default-binder", 60.0, 2),  # a slower round: its own base
    ]
    assert vs_default_binder(rows) == [0.4, 1.0, 0.5, 1.0]


def test_a_round_without_a_default_binder_has_no_ratio() -> None:
    rows = [row("nodelock", 40.0, None), row("nodelock", 40.0, 2), row("default-binder", 80.0, 2)]
    assert vs_default_binder(rows) == [None, 0.5, 1.0]  # no round: round 1, which has no base


def test_medians_take_the_median_of_each_rounds_ratio() -> None:
    rows = [
        row("nodelock", 40.0, 1, p99=1.2),
        row("default-binder", 100.0, 1),
        row("nodelock", 30.0, 2, p99=1.6),
        row("default-binder", 60.0, 2),
        row("nodelock", 45.0, 3, p99=1.1),
        row("default-binder", 150.0, 3),
    ]
    got = medians(rows)
    assert list(got) == ["nodelock", "default-binder"]
    assert got["nodelock"]["rounds"] == 3
    assert got["nodelock"]["pods_per_s"] == 40.0
    assert got["nodelock"]["to_running_p99_s"] == 1.2
    # ratios 0.4, 0.5, 0.3: the median of the ratios, not 40 / 100 (the medians' ratio)
    assert got["nodelock"]["vs_default_binder"] == pytest.approx(0.4)
    assert got["nodelock"]["vs_default_binder_min"] == pytest.approx(0.3)
    assert got["nodelock"]["vs_default_binder_max"] == pytest.approx(0.5)


def test_medians_leave_the_ratio_out_without_a_default_binder() -> None:
    got = medians([row("nodelock", 40.0, 1), row("nodelock", 20.0, 2)])
    assert got["nodelock"]["pods_per_s"] == 30.0
    assert "vs_default_binder" not in got["nodelock"]


def test_the_table_labels_rounds_and_adds_the_medians_only_for_several() -> None:
    one = table([row("nodelock", 40.0, 1), row("default-binder", 100.0, 1)])
    assert "nodelock #1" not in one
    assert "medians" not in one
    assert " 0.40" in one
    two = table(
        [
            row("nodelock", 40.0, 1),
            row("default-binder", 100.0, 1),
            row("nodelock", 30.0, 2),
            row("default-binder", 60.0, 2),
        ]
    )
    assert "nodelock #2" in two
    assert "medians over 2 rounds" in two
    assert "35.0 pods/s  vs base 0.45 (0.40-0.50)" in two


def test_cpu_per_pod_is_each_components_use_between_two_readings() -> None:
    before = {"kube-apiserver": 10.0, "extender": 2.0, "etcd": 1.0}
    after = {"kube-apiserver": 10.64, "extender": 2.32, "etcd": 1.0, "new": 5.0}
    got = cpu_ms_per_pod(before, after, 64)
    assert got == {"kube-apiserver": pytest.approx(10.0), "extender": pytest.approx(5.0)}


def test_the_table_shows_the_bursts_cpu_and_the_cpu_to_a_second_after() -> None:
    nodelock = row("nodelock", 40.0, 1)
    nodelock["cpu_ms_per_pod_burst"] = {"kube-apiserver": 15.0, "deviceplugin": 8.0}
    nodelock["cpu_ms_per_pod"] = {"kube-apiserver": 20.0, "deviceplugin": 9.0}
    lines = table([nodelock]).splitlines()
    burst = next(i for i, line in enumerate(lines) if "burst total 23:" in line)
    assert lines[burst].strip().startswith("nodelock")
    assert "+1 s  total 29: kube-apiserver 20  deviceplugin 9" in lines[burst + 1]


def test_the_stock_gpu_ratio_is_against_the_stock_phase_of_each_round() -> None:
    rows = [
        row("nodelock", 40.0, 1),
        row("stock-gpu", 80.0, 1),
        row("default-binder", 160.0, 1),
        row("nodelock", 30.0, 2),
        row("stock-gpu", 50.0, 2),
        row("default-binder", 100.0, 2),
    ]
    assert vs_phase(rows, "stock-gpu") == [0.5, 1.0, 2.0, 0.6, 1.0, 2.0]
    got = medians(rows)["nodelock"]
    assert got["vs_stock_gpu"] == pytest.approx(0.55)
    assert (got["vs_stock_gpu_min"], got["vs_stock_gpu_max"]) == (0.5, 0.6)
    assert got["vs_default_binder"] == pytest.approx(0.275)
    assert "vs_stock_gpu" not in medians([row("nodelock", 40.0, 1)])["nodelock"]
    text = table(rows)
    assert "35.0 pods/s  vs base 0.28 (0.25-0.30)  vs stock 0.55 (0.50-0.60)" in text
    first = next(line for line in text.splitlines() if line.startswith("nodelock #1"))
    assert first.split()[3:5] == ["0.25", "0.50"]  # vs base, then vs stock


def test_the_ceiling_is_the_rate_the_cores_allow_without_the_products_processes() -> None:
    nodelock = row("nodelock", 40.0, 1)
    nodelock["cpu_ms_per_pod_burst"] = {
        "kube-apiserver": 20.0,
        "extender": 6.0,
        "deviceplugin": 8.0,
        "etcd": 5.0,
    }
    assert cores_busy(nodelock) == pytest.approx(39.0 * 40.0 / 1000)  # 1.56 cores
    assert ceiling(nodelock, 2) == pytest.approx(2000 / 25)  # 25 ms/pod left: 80 pods/s
    assert ceiling(nodelock, 2, without=()) == pytest.approx(2000 / 39)
    assert ceiling(row("nodelock", 40.0, 1), 2) is None  # no CPU reading
    assert cores_busy(row("nodelock", 40.0, 1)) is None
    text = table([nodelock, row("default-binder", 160.0, 1)], cores=2)
    line = next(x for x in text.splitlines() if "cores busy" in x)
    # 80 pods/s against the default binder's 160: half of it, the most this machine allows
    assert (
        " ".join(line.split()) == "nodelock cores busy 1.56 of 2; at most 80.0 pods/s (0.50 x base)"
    )
    # the kube-scheduler-alone phases have no ceiling line
    stock = row("stock-gpu", 80.0, 1)
    stock["cpu_ms_per_pod_burst"] = {"kube-apiserver": 20.0}
    assert "cores busy" not in table([stock, row("default-binder", 160.0, 1)], cores=2)
