"""The alert rules: promtool accepts them, they read documented metrics, the docs list them all.

Needs Debian's ``prometheus`` package for ``promtool`` (the Makefile's test setup installs it).
Prometheus loading and evaluating them: tests/e2e/test_observability_prometheus.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from dashboards.promql import metric_names, operands

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "dashboards" / "alerts.yaml"
DOC = (ROOT / "docs" / "metrics.md").read_text()
DOCUMENTED = set(re.findall(r"^\| `(nodelock_[a-z0-9_]+)` \|", DOC, re.M))


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text())
    return [r for g in data["groups"] for r in g["rules"]]


def test_promtool_check_rules_passes() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install -y prometheus"
    res = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules())} rules found" in res.stdout


def test_alerts_cover_stuck_locks_contention_fencing_and_device_plugins() -> None:
    names = {r["alert"] for r in rules()}
    assert {
        "NodelockLockStuck",
        "NodelockLocksExpired",
        "NodelockLockContentionHigh",
        "NodelockFencingRejections",
        "NodelockDevicePluginNotRegistered",
        "NodelockDevicePluginMissing",
    } <= names
    exprs = {r["alert"]: r["expr"] for r in rules()}
    assert "nodelock_lock_unchanged_seconds" in exprs["NodelockLockStuck"]
    assert 'nodelock_locks_observed{state="expired"}' in exprs["NodelockLocksExpired"]


def test_every_alert_is_documented_and_every_documented_alert_exists() -> None:
    section = DOC[DOC.index("\n## Alerts") :]
    documented = set(re.findall(r"^\| `(Nodelock\w+)` \|", section, re.M))
    assert documented == {r["alert"] for r in rules()}


def test_rules_read_documented_metrics_and_say_what_to_do() -> None:
    for rule in rules():
        names = metric_names(rule["expr"]) - {"up"}
        for name in names:
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in DOCUMENTED or base in DOCUMENTED, (rule["alert"], name)
        assert operands(rule["expr"]), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["annotations"]["description"], rule["alert"]


def test_every_alert_has_a_runbook_url_to_its_row_in_metrics_md() -> None:
    anchors = set(re.findall(r'<a id="([a-z0-9-]+)"></a>', DOC))
    for rule in rules():
        url = rule["annotations"].get("runbook_url", "")
        page, _, anchor = url.partition("#")
        assert page.endswith("/docs/metrics.md"), (rule["alert"], url)
        assert anchor == rule["alert"].lower(), (rule["alert"], url)
        assert anchor in anchors, f"docs/metrics.md has no anchor {anchor!r}"
        row = DOC[DOC.index(f'<a id="{anchor}">') - 400 : DOC.index(f'<a id="{anchor}">')]
        assert f"`{rule['alert']}`" in row.rsplit("\n", 1)[-1], "the anchor is on another row"
