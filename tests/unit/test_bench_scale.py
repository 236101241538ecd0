"""The scale bench's pure parts: the objects it creates, the curve it fits, its results rows."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.scale import (
    GPUS,
    RESOURCE,
    Samples,
    burst_medians,
    chart_memory_limit_mib,
    fit,
    histogram_delta,
    keeping_other_runs,
    memory_mib,
    merge_rows,
    p99,
    pods,
    rate_ratio,
    with_measurements,
)
from handoff.wire import Keys
from scheduler_ext.cache import ClusterCache

VALUES = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "nodelock" / "values.yaml"


def test_pods_mix_most_without_gpus_and_no_node_over_its_gpus() -> None:
    made = list(pods(2000, 10, gpu_share=0.05))
    gpu = [p for p in made if RESOURCE in p["spec"]["containers"][0]["resources"]["limits"]]
    assert len(made) == 2000
    assert 50 <= len(gpu) <= 100
    per_node: dict[str, int] = {}
    for p in gpu:
        per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0) + 1
        assert Keys().assignment in p["metadata"]["annotations"]
    assert max(per_node.values()) <= GPUS
    env = made[0]["spec"]["containers"][0]["env"]
    assert len(env) == 10
    assert all(len(e["value"]) == 40 for e in env)


def test_the_extender_cache_counts_the_gpu_pods_it_is_given() -> None:
    from bench.scale import fake_node, node_status

    cache = ClusterCache()
    cache.replace_nodes([{**fake_node(i), **node_status("2026-01-01T00:00:00Z")} for i in range(4)])
    made = list(pods(400, 4, gpu_share=0.05))
    cache.replace_pods(
        [{**p, "metadata": {**p["metadata"], "uid": str(i)}} for i, p in enumerate(made)]
    )
    taken = sum(g.assigned for g in cache.pictures().values())
    assert taken == sum(1 for p in made if p["metadata"]["name"].startswith("train-"))
    assert all(not g.problem for g in cache.pictures().values())


def test_fit_is_the_line_through_the_points() -> None:
    curve = fit([(10_000, 150.0), (20_000, 200.0), (40_000, 300.0)])
    assert curve.base_mib == pytest.approx(100.0)
    assert curve.mib_per_10k_pods == pytest.approx(50.0)
    assert curve.rss_mib(100_000) == pytest.approx(600.0)
    # 512 MiB with 25% headroom: 384 MiB, 284 MiB above the base, 56,800 pods
    assert curve.pods_within(512, headroom=0.25) == 56_800


def test_fit_of_one_size_has_no_slope() -> None:
    curve = fit([(20_000, 250.0)])
    assert curve.mib_per_10k_pods == 0.0
    assert curve.rss_mib(1) == 250.0


def test_memory_quantities() -> None:
    assert memory_mib("512Mi") == 512
    assert memory_mib("1Gi") == 1024
    assert memory_mib("1048576Ki") == 1024
    assert chart_memory_limit_mib(VALUES.read_text(encoding="utf-8")) > 0


def test_rows_replace_the_same_size_and_sort_by_pods() -> None:
    old = [{"nodes": 50, "pods": 2000, "x": 1}, {"nodes": 500, "pods": 10_000, "x": 2}]
    rows = merge_rows(old, {"nodes": 50, "pods": 2000, "x": 3})
    assert rows == [{"nodes": 50, "pods": 2000, "x": 3}, {"nodes": 500, "pods": 10_000, "x": 2}]


def test_a_size_measured_again_keeps_the_other_runs_headline_figures() -> None:
    first = {"nodes": 5, "pods": 10, "burst_vs_small": 0.5, "restarts": [1], "load_avg": [9]}
    second = keeping_other_runs([first], {"nodes": 5, "pods": 10, "burst_vs_small": 0.8})
    assert second["other_runs"] == [{"burst_vs_small": 0.5, "load_avg": [9]}]
    third = keeping_other_runs([second], {"nodes": 5, "pods": 10, "burst_vs_small": 0.9})
    assert [r["burst_vs_small"] for r in third["other_runs"]] == [0.5, 0.8]
    assert "other_runs" not in keeping_other_runs([first], {"nodes": 6, "pods": 10})


def test_a_watch_measurement_replaces_its_namesake_and_keeps_the_others() -> None:
    args = argparse.Namespace(nodes=5, pods=10)
    first = with_measurements([], args, {"churn": {"x": 1}, "replicas": {"y": 2}}, {"c": "a"})
    assert first == {
        "nodes": 5,
        "pods": 10,
        "churn": {"x": 1, "run": {"c": "a"}},
        "replicas": {"y": 2, "run": {"c": "a"}},
    }
    second = with_measurements([first], args, {"churn": {"x": 3}}, {"c": "b"})
    assert second["churn"] == {"x": 3, "run": {"c": "b"}}
    assert second["replicas"] == {"y": 2, "run": {"c": "a"}}
    other = with_measurements([first], argparse.Namespace(nodes=6, pods=10), {}, {})
    assert other == {"nodes": 6, "pods": 10}


def _scrape(counts: dict[str, list[float]], name: str = "h") -> Samples:
    """A histogram ``name``'s samples: per verb, cumulative counts at le 0.01, 0.1, +Inf."""
    out: Samples = []
    for verb, cum in counts.items():
        for le, c in zip(("0.01", "0.1", "+Inf"), cum, strict=True):
            out.append((f"{name}_bucket", {"verb": verb, "le": le}, c))
        out.append((f"{name}_count", {"verb": verb}, cum[-1]))
    return out


def test_histogram_delta_is_what_was_observed_between_scrapes_for_the_matching_series() -> None:
    before = _scrape({"bind": [10, 10, 10], "filter": [5, 5, 5]})
    after = _scrape({"bind": [10, 110, 110], "filter": [500, 500, 500]})
    bind = histogram_delta(before, after, "h", verb="bind")
    assert bind.count == 100
    assert bind.buckets == ((0.01, 0.0), (0.1, 100.0), (float("inf"), 100.0))
    assert p99(bind) == pytest.approx(0.01 + 0.09 * 0.99)


def test_p99_of_nothing_observed_is_none() -> None:
    same = _scrape({"bind": [1, 2, 3]})
    assert p99(histogram_delta(same, same, "h", verb="bind")) is None
    assert p99(histogram_delta([], [], "h")) is None


def testrate_ratio_is_at_size_over_small_and_none_without_both() -> None:
    assert rate_ratio({"small": {"pods_per_s": 20.0}, "big": {"pods_per_s": 5.0}}) == 0.25
    assert rate_ratio({"small": {"pods_per_s": 20.0}}) is None


def test_burst_medians_are_per_figure_and_per_part_and_skip_missing_parts() -> None:
    rows = [
        {"pods_per_s": 10.0, "cpu_ms_per_pod_burst": {"extender": 4.0, "kube-scheduler": 9.0}},
        {"pods_per_s": 30.0, "cpu_ms_per_pod_burst": {"kube-scheduler": 11.0}},
        {"pods_per_s": 20.0, "cpu_ms_per_pod_burst": {"extender": 6.0, "kube-scheduler": 10.0}},
    ]
    m = burst_medians(rows)
    assert m["rounds"] == 3
    assert m["pods_per_s"] == 20.0
    assert m["cpu_ms_per_pod_burst"] == {"extender": 5.0, "kube-scheduler": 10.0}
    assert m["scheduler_attempt_p99_s"] is None
