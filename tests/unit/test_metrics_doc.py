"""docs/metrics.md lists exactly the metrics each part registers: names, types and label names.

Both directions: a metric registered but not documented fails, and so does a documented metric
that no code registers.  Each part's metrics class is built on a fresh ``CollectorRegistry`` and
fed one event of each kind, so that scrape-time gauges have samples to read label names from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from deviceplugin.metrics import PluginMetrics
from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX, GPU, DeviceID, format_inventory
from kube.build import register_build_info
from lockd.lease import LeaseFormat
from lockd.metrics import LockMetrics
from lockd.model import Holder, HolderKey, NodeLockView, NodeName
from scheduler_ext.cache import ClusterCache
from scheduler_ext.metrics import ExtenderMetrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
NODE = NodeName("gpu-1")


@dataclass(frozen=True)
class Documented:
    name: str
    kind: str
    labels: frozenset[str]
    when: str


def documented(section: str) -> dict[str, Documented]:
    """The table rows of ``## section`` in docs/metrics.md, by metric name."""
    text = DOC.read_text()
    match = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/metrics.md has no section '## {section}'"
    rows: dict[str, Documented] = {}
    for line in match.group(1).splitlines():
        if not line.startswith("| `nodelock_"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 5, f"a metrics row needs 5 cells (name … when it moves): {line}"
        name, kind, labels, _meaning, when = cells
        rows[name.strip("`")] = Documented(
            name.strip("`"), kind, frozenset(re.findall(r"`([a-z_]+)`", labels)), when
        )
    return rows


def registered(registry: CollectorRegistry) -> dict[str, tuple[str, frozenset[str]]]:
    """Exposed name (counters with ``_total``) -> (type, label names) of every family."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert family.samples, f"{family.name} has no samples: create its series at 0 up front"
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        out[name] = (family.type, frozenset(labels))
    return out


class Views:
    """A view source for the scrape-time lock gauges (held weakly by ``LockMetrics``)."""

    def __init__(self, views: list[NodeLockView]) -> None:
        self.items = views

    def views(self) -> list[NodeLockView]:
        return self.items


_SOURCES: list[Views] = []  # alive for the whole module, so the gauges keep their samples


def lockd_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    metrics = LockMetrics(registry=registry)
    fmt = LeaseFormat(namespace=DEFAULT_LOCK_NAMESPACE, prefix=DEFAULT_PREFIX)
    body = fmt.new_lease(NODE, Holder(HolderKey("ns/a"), "u"), duration_s=15, now="x")
    source = Views([NodeLockView(fmt.parse(body), 3.0, False)])
    _SOURCES.append(source)
    metrics.add_view_source(source.views)
    metrics.contended(NODE, "u", 1.0)
    return registry


def extender_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    cache = ClusterCache()
    gpus = [GPU(DeviceID("GPU-0"), 0, "H100", 81559, 0, True)]
    cache.replace_nodes(
        [
            {
                "metadata": {
                    "name": NODE,
                    "annotations": {"nodelock.io/gpus": format_inventory(gpus)},
                    "resourceVersion": "1",
                },
                "status": {"allocatable": {"nvidia.com/gpu": "1"}},
            }
        ]
    )
    cache.replace_pods([])
    ExtenderMetrics(cache, registry=registry)
    return registry


def deviceplugin_registry() -> CollectorRegistry:
    metrics = PluginMetrics(CollectorRegistry())
    gpus = [GPU(DeviceID("GPU-0"), 0, "H100", 81559, 0, True)]
    metrics.set_devices(gpus)
    metrics.set_gpu_use(gpus, {})
    return metrics.registry


def build_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    register_build_info(registry)
    return registry


PARTS = {
    "build": build_registry,
    "lockd": lockd_registry,
    "extender": extender_registry,
    "deviceplugin": deviceplugin_registry,
}
# Documented once in section "build", registered by every long-running part as well.
EVERY_PART = "build"
LONG_RUNNING = ("extender", "deviceplugin")


@pytest.mark.parametrize("part", list(PARTS))
def test_documented_names_are_the_registered_names(part: str) -> None:
    code = registered(PARTS[part]())
    doc = documented(part)
    if part != EVERY_PART:
        for name in documented(EVERY_PART):
            code.pop(name, None)
    assert sorted(set(code) - set(doc)) == [], f"registered by {part} but not in docs/metrics.md"
    assert sorted(set(doc) - set(code)) == [], f"in docs/metrics.md but {part} registers none"


@pytest.mark.parametrize("part", list(PARTS))
def test_documented_types_and_labels_are_the_registered_ones(part: str) -> None:
    code = registered(PARTS[part]())
    for name, row in documented(part).items():
        kind, labels = code[name]
        assert row.kind == kind, f"{name}: documented as {row.kind}, registered as {kind}"
        assert row.labels == labels, f"{name}: documented labels {sorted(row.labels)}"


@pytest.mark.parametrize("part", list(PARTS))
def test_every_metric_says_what_to_do_when_it_moves(part: str) -> None:
    for name, row in documented(part).items():
        assert len(row.when) > 20, f"{name}: the 'when it moves' cell is empty or too short"


@pytest.mark.parametrize("part", list(PARTS))
def test_names_follow_the_conventions(part: str) -> None:
    for name, (kind, labels) in registered(PARTS[part]()).items():
        assert name.startswith("nodelock_"), name
        assert (kind == "counter") == name.endswith("_total"), name
        assert not (labels & {"pod", "uid", "holder", "device", "namespace"}), (name, labels)
        if kind == "histogram" and name != "nodelock_extender_bind_attempts":
            assert name.endswith("_seconds"), f"{name}: a latency histogram in base units"


@pytest.mark.parametrize("part", LONG_RUNNING)
def test_every_long_running_part_registers_the_build_info(part: str) -> None:
    code = registered(PARTS[part]())
    missing = sorted(set(documented(EVERY_PART)) - set(code))
    assert missing == [], f"{part} does not register {missing} (kube.build.register_build_info)"
