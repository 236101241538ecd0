"""Every dashboard query and alert expression, evaluated by a real Prometheus on a GPU devcluster.

Debian's ``prometheus`` binary (``apt-get install prometheus``; run as a plain subprocess, no
service) scrapes each extender replica and each device plugin of the e2e cluster the way
docs/metrics.md's scrape setup says (device plugin targets labelled ``node``) and loads
``dashboards/alerts.yaml``.  The test sends a burst of GPU pods through the real kube-scheduler
(a pod whose bind runs out of its wait budget behind a lock that nobody will release, and is
bound on kube-scheduler's retry once the lock is taken over; then eleven one-GPU pods for the
other eleven GPUs, so binds contend for node locks), then holds one node's lock
past its duration with a holder that never progresses on every node (what a stuck handoff looks
like to the metrics), and asks Prometheus's HTTP API:

- every target of both dashboards (``$node`` = each node in turn, ``$__rate_interval`` = a window
  covering the test) must return at least one series with a finite value;
- the ``node`` variable's ``label_values`` must list every node;
- every alert expression must evaluate as written (it may be empty: thresholds are for bad
  days), and each operand of its top-level operators, threshold removed (``dashboards.promql.
  operands``), must return series;
- Prometheus must report every loaded rule healthy (evaluated without error).
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client import CollectorRegistry

from dashboards import build
from dashboards.promql import dashboard_queries, operands, substitute, variable_queries
from devcluster.processes import free_port
from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX
from lockd.locks import NodeLocks
from lockd.metrics import LockMetrics
from lockd.model import Holder, HolderKey, NodeName, Outcome
from tests.e2e.kit import LEASE_S, GPUCluster

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "dashboards" / "alerts.yaml"
EXTENDER_JOB = "nodelock-extender-metrics"  # the chart's ServiceMonitor job names
PLUGIN_JOB = "nodelock-device-plugin-metrics"


@dataclass
class Prometheus:
    url: str
    started: float
    log: Path


def scrape_config(gpu_cluster: GPUCluster) -> dict[str, Any]:
    settings = gpu_cluster.cluster.settings()
    extenders = [u.removeprefix("http://") for u in settings["extender"]["metrics"]]
    plugins = [
        {"targets": [f"127.0.0.1:{port}"], "labels": {"node": name.removeprefix("deviceplugin-")}}
        for name, port in sorted(settings["metrics"].items())
        if name.startswith("deviceplugin-")
    ]
    assert len(extenders) == 2, extenders
    assert len(plugins) == len(gpu_cluster.nodes), plugins
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": EXTENDER_JOB, "static_configs": [{"targets": extenders}]},
            {"job_name": PLUGIN_JOB, "static_configs": plugins},
        ],
    }


@pytest.fixture
def prometheus(gpu_cluster: GPUCluster, tmp_path: Path) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus is missing: apt-get install -y prometheus"
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(gpu_cluster)))
    port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _ready(url):
            assert proc.poll() is None, f"prometheus exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"prometheus not ready: {log.read_text()[-2000:]}"
            time.sleep(0.2)
        yield Prometheus(url, time.monotonic(), log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class API:
    """Prometheus's HTTP API (``/api/v1``)."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self.calls = 0

    async def get(self, path: str, **params: str) -> Any:
        self.calls += 1
        async with self.session.get(f"{self.url}/api/v1/{path}", params=params) as resp:
            body = await resp.json()
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        data = await self.get("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        result: list[dict[str, Any]] = data["result"]
        return result


def finite(series: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in series)


async def wait_for(api: API, expr: str, *, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await api.query(expr):
        assert time.monotonic() < deadline, f"{expr} never returned data"
        await asyncio.sleep(1.0)


@dataclass
class Outcomes:
    evaluated: int = 0
    failures: list[str] = field(default_factory=list)


async def evaluate_dashboards(api: API, nodes: list[str], window: str) -> Outcomes:
    """Every dashboard target (per node for the node dashboard) and every variable query."""
    out = Outcomes()
    for name, make in build.DASHBOARDS.items():
        model = make()
        assert model == json.loads((ROOT / "dashboards" / name).read_text()), "stale JSON"
        values_per_run = [{"node": n} for n in nodes] if variable_queries(model) else [{}]
        for values in values_per_run:
            variables = {"__rate_interval": window, "__interval": "15s", **values}
            for q in dashboard_queries(model):
                expr = substitute(q.expr, variables)
                out.evaluated += 1
                series = await api.query(expr)
                if not finite(series):
                    out.failures.append(f"{name} / {q.panel} / {q.ref_id} {values}: {expr}")
        for var, definition in variable_queries(model).items():
            metric, label = definition.removeprefix("label_values(").rstrip(")").split(", ")
            out.evaluated += 1
            got = await api.get(f"label/{label}/values", **{"match[]": metric})
            if sorted(got) != sorted(nodes):
                out.failures.append(f"{name} variable {var}: {got} != {nodes}")
    return out


async def evaluate_alerts(api: API) -> Outcomes:
    """Each rule as written must evaluate; each operand without its threshold must have series."""
    out = Outcomes()
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    for rule in rules:
        out.evaluated += 1
        await api.query(rule["expr"])  # raises on a parse or evaluation error
        for operand in operands(rule["expr"]):
            out.evaluated += 1
            if not await api.query(operand):
                out.failures.append(f"{rule['alert']}: no series for {operand}")
    return out


async def test_every_dashboard_query_and_alert_returns_data(
    e2e: GPUCluster, prometheus: Prometheus
) -> None:
    targets = 2 + len(e2e.nodes)
    async with aiohttp.ClientSession() as session:
        api = API(session, prometheus.url)
        await wait_for(api, f"count(up == 1) == {targets}")  # every target scraped once

        locks = NodeLocks(
            e2e.kube,
            namespace=DEFAULT_LOCK_NAMESPACE,
            prefix=DEFAULT_PREFIX,
            duration_s=LEASE_S,
            metrics=LockMetrics(registry=CollectorRegistry()),  # the test's own, not scraped
        )
        # A bind that runs out of its wait budget and is bound on kube-scheduler's retry (the
        # per-pod lock wait across retries): the first node's lock is held by a holder that is
        # not a pod, so the pinned pod waits its whole budget, and binds once the lock expired
        # and is taken over.
        first = NodeName(e2e.nodes[0])
        await locks.acquire(first, Holder(HolderKey(f"{e2e.namespace}/gone"), secrets.token_hex(8)))
        await e2e.create_pod("retried", [1], node=first)
        await e2e.wait_phase("retried", ["Running"], timeout_s=180)

        names = [f"burst-{i}" for i in range(4 * len(e2e.nodes) - 1)]
        await asyncio.gather(*(e2e.create_pod(n, [1]) for n in names))
        for n in names:
            await e2e.wait_phase(n, ["Running"], timeout_s=180)

        # Handoffs that never progress: every node's lock held by a holder that is not a pod,
        # past its duration, so that the stuck-lock series (unchanged seconds, expired) exist.
        held = [
            await locks.acquire(
                NodeName(node), Holder(HolderKey(f"{e2e.namespace}/stuck-probe"), uid)
            )
            for node, uid in ((n, secrets.token_hex(8)) for n in e2e.nodes)
        ]
        try:
            for node in e2e.nodes:
                await wait_for(api, f'max(nodelock_lock_expired_seen_total{{node="{node}"}}) > 0')
            await wait_for(api, 'max(nodelock_locks_observed{state="expired"}) > 0')
            deadline = time.monotonic() + 30
            while True:  # a rate needs two scrapes of a series: give late ones a few seconds
                # a window from before the first scrape to now: everything the test did
                window = f"{math.ceil(time.monotonic() - prometheus.started) + 10}s"
                dashboards = await evaluate_dashboards(api, e2e.nodes, window)
                alerts = await evaluate_alerts(api)
                if not (dashboards.failures or alerts.failures) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(2.0)
            rules = await rule_health(api)
        finally:
            for lock in held:
                await locks.release(lock, outcome=Outcome.BIND_FAILED)
    print(
        f"\nPrometheus evaluated {dashboards.evaluated} dashboard queries "
        f"({len(e2e.nodes)} nodes for the node dashboard) and {alerts.evaluated} alert "
        f"expressions and operands; {len(rules)} rules loaded, all healthy; "
        f"{api.calls} API calls"
    )
    assert dashboards.failures == [], "\n".join(dashboards.failures)
    assert alerts.failures == [], "\n".join(alerts.failures)
    expected_targets = sum(
        len(dashboard_queries(make())) * (len(e2e.nodes) if variable_queries(make()) else 1)
        for make in build.DASHBOARDS.values()
    )
    assert dashboards.evaluated == expected_targets + 1  # + the node variable
    assert {r["name"] for r in rules} == {
        r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
    }


async def rule_health(api: API, *, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The loaded alerting rules once each has been evaluated; all must be healthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        groups = (await api.get("rules", type="alert"))["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(r["health"] != "unknown" for r in rules):
            break
        assert time.monotonic() < deadline, "rules were never evaluated"
        await asyncio.sleep(1.0)
    bad = [f"{r['name']}: {r.get('lastError')}" for r in rules if r["health"] != "ok"]
    assert bad == [], bad
    return rules
