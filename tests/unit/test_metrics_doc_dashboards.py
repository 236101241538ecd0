"""The dashboards: generated JSON in step with its code, Grafana's model, documented metrics only.

That every query returns data is proven on a real Prometheus in
tests/e2e/test_observability_prometheus.py; here only what needs no server.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dashboards import build
from dashboards.promql import (
    dashboard_queries,
    metric_names,
    operands,
    substitute,
    variable_queries,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "metrics.md").read_text()
DOCUMENTED = dict(re.findall(r"^\| `(nodelock_[a-z0-9_]+)` \| (\w+) \|", DOC, re.M))
FILES = sorted(build.DASHBOARDS)


def load(name: str) -> dict[str, Any]:
    model: dict[str, Any] = json.loads((ROOT / "dashboards" / name).read_text())
    return model


def all_panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in model["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def base_metric(name: str) -> str:
    """A histogram's ``_bucket``/``_sum``/``_count`` series by the histogram's name."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and DOCUMENTED.get(name.removesuffix(suffix)) == "histogram":
            return name.removesuffix(suffix)
    return name


def test_committed_json_is_what_the_code_generates() -> None:
    assert build.main(["--check"]) == 0, "run `python -m dashboards.build`"


@pytest.mark.parametrize("name", FILES)
def test_grafana_model_with_datasource_variable(name: str) -> None:
    model = load(name)
    assert model["schemaVersion"] == 39
    assert model["uid"].startswith("nodelock-")
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = all_panels(model)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
        pos = panel["gridPos"]
        assert pos["x"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]


@pytest.mark.parametrize("name", FILES)
def test_panels_do_not_overlap(name: str) -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in all_panels(load(name)):
        pos = panel["gridPos"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, (panel["title"], cells.get((x, y)))
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("name", FILES)
def test_queries_read_documented_metrics_only(name: str) -> None:
    model = load(name)
    exprs = [q.expr for q in dashboard_queries(model)] + list(variable_queries(model).values())
    assert exprs
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"reads no metric: {expr}"
        for metric in names - {"up"}:
            assert base_metric(metric) in DOCUMENTED, f"{metric} is not in docs/metrics.md"


def test_no_query_aggregates_per_node_gauges_by_sum_over_replicas() -> None:
    """Every extender replica reports the whole cluster's per-node gauges: sum would double."""
    replicated = ("nodelock_extender_gpus", "nodelock_lock_held", "nodelock_lock_fencing_token")
    for name in FILES:
        for q in dashboard_queries(load(name)):
            for metric in replicated:
                assert not re.search(rf"sum[^(]*\(\s*{metric}\b", q.expr), (q.panel, q.expr)


def test_dashboards_cover_what_the_design_asks_for() -> None:
    overview = {q.panel for q in dashboard_queries(load("overview.json"))}
    for title in (
        "Handoffs/s",
        "Bind latency",
        "Allocate latency",
        "Lock acquisitions by result",
        "Bind queue wait",
        "Binds queued per node",
        "GPUs assigned vs free",
        "Errors per second",
    ):
        assert title in overview
    node = load("node.json")
    panels = {q.panel for q in dashboard_queries(node)}
    assert {"Lock held", "Hold duration", "Device health"} <= panels
    assert variable_queries(node) == {"node": "label_values(nodelock_extender_gpus, node)"}
    link = json.dumps(load("overview.json"))
    assert "/d/nodelock-node/" in link, "the per-node panel links to the drill-down"


def test_substitute_replaces_grafana_variables() -> None:
    expr = 'rate(x{node="$node"}[$__rate_interval]) + y{n="${node}"} + z{n="${node:regex}"}'
    got = substitute(expr, {"node": "gpu-1", "__rate_interval": "2m"})
    assert got == 'rate(x{node="gpu-1"}[2m]) + y{n="gpu-1"} + z{n="gpu-1"}'
    with pytest.raises(KeyError):
        substitute("x[$__interval]", {})


@pytest.mark.parametrize(
    ("expr", "leaves"),
    [
        ("max by (node) (a) > 300", ["max by (node) (a)"]),
        ('a{x=">"} >= 1', ['a{x=">"}']),
        ("a > 0 and b == 0 or c == 0", ["a", "b", "c"]),
        ("absent(up{job=~'x'} == 1)", ["up{job=~'x'}"]),
        ("a unless on (node) max by (node) (b == 1)", ["a", "max by (node) (b == 1)"]),
        ("sum(rate(a[5m])) / sum(rate(b[5m])) > 0.5", ["sum(rate(a[5m]))", "sum(rate(b[5m]))"]),
        ("a * on (node) group_left (x) b", ["a", "b"]),
        ("a > bool 1", ["a"]),
        ("(a) or (b)", ["a", "b"]),
        ("histogram_quantile(0.99, sum by (le) (rate(h[5m])))", None),
    ],
)
def test_operands_are_the_leaves_of_top_level_operators(
    expr: str, leaves: list[str] | None
) -> None:
    assert operands(expr) == (leaves if leaves is not None else [expr])


def test_metric_names() -> None:
    expr = 'sum(rate(nodelock_a_bucket[5m])) / up{job="x"} + nodelock_b_total'
    assert metric_names(expr) == {"nodelock_a_bucket", "up", "nodelock_b_total"}
