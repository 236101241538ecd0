"""Grafana dashboard models (JSON, schemaVersion 39) from a few plain dataclasses.

Every panel and target reads Prometheus through the ``datasource`` template variable; panels are
laid out left to right in rows of 24 grid units.  Used by ``dashboards.overview`` and
``dashboards.node``; ``python -m dashboards.build`` writes the JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DS: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"
OVERVIEW_UID = "nodelock-overview"
NODE_UID = "nodelock-node"

JSON = dict[str, Any]


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""
    heatmap: bool = False


@dataclass(frozen=True)
class Panel:
    """One panel; ``kind`` is Grafana's panel type."""

    title: str
    targets: Sequence[Target]
    description: str
    kind: str = "timeseries"
    unit: str = "short"
    width: int = 8
    height: int = 8
    stack: bool = False
    thresholds: Sequence[tuple[float, str]] = ()  # (from value, color) above green
    mappings: Sequence[tuple[int, str, str]] = ()  # (value, text, color)
    links: Sequence[JSON] = ()
    minimum: float | None = None


@dataclass(frozen=True)
class Row:
    title: str
    panels: Sequence[Panel]


@dataclass
class _Layout:
    x: int = 0
    y: int = 0
    row_height: int = 0
    next_id: int = 1
    out: list[JSON] = field(default_factory=list)

    def place(self, width: int, height: int) -> JSON:
        if self.x + width > 24:
            self.x, self.y, self.row_height = 0, self.y + self.row_height, 0
        pos = {"h": height, "w": width, "x": self.x, "y": self.y}
        self.x += width
        self.row_height = max(self.row_height, height)
        return pos

    def new_row(self) -> JSON:
        if self.x:
            self.x, self.y, self.row_height = 0, self.y + self.row_height, 0
        pos = {"h": 1, "w": 24, "x": 0, "y": self.y}
        self.y += 1
        return pos

    def take_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def quantiles(metric: str, selector: str = "", *, by: str = "le") -> list[Target]:
    """p50 and p99 of a histogram over ``$__rate_interval``."""
    return [
        Target(
            f"histogram_quantile({q}, sum by ({by}) (rate({metric}_bucket{selector}[{RI}])))",
            f"p{int(q * 100)}",
        )
        for q in (0.5, 0.99)
    ]


def _thresholds(steps: Sequence[tuple[float, str]]) -> JSON:
    return {
        "mode": "absolute",
        "steps": [{"color": "green", "value": None}]
        + [{"color": color, "value": value} for value, color in steps],
    }


def _mappings(items: Sequence[tuple[int, str, str]]) -> list[JSON]:
    if not items:
        return []
    return [
        {
            "type": "value",
            "options": {
                str(value): {"color": color, "index": i, "text": text}
                for i, (value, text, color) in enumerate(items)
            },
        }
    ]


def _options(panel: Panel) -> JSON:
    legend = {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True}
    reduce = {"calcs": ["lastNotNull"], "fields": "", "values": False}
    if panel.kind == "stat":
        return {
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": reduce,
            "textMode": "auto",
        }
    if panel.kind == "bargauge":
        return {
            "displayMode": "gradient",
            "minVizHeight": 16,
            "orientation": "horizontal",
            "reduceOptions": reduce,
            "showUnfilled": True,
            "valueMode": "color",
        }
    if panel.kind == "state-timeline":
        return {
            "alignValue": "left",
            "legend": legend,
            "mergeValues": True,
            "rowHeight": 0.8,
            "showValue": "never",
            "tooltip": {"mode": "single", "sort": "none"},
        }
    if panel.kind == "heatmap":
        return {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
            "legend": {"show": True},
            "tooltip": {"mode": "single", "yHistogram": True},
            "yAxis": {"axisPlacement": "left", "unit": panel.unit},
        }
    return {"legend": legend, "tooltip": {"mode": "multi", "sort": "desc"}}


def _custom(panel: Panel) -> JSON:
    if panel.kind == "timeseries":
        return {
            "drawStyle": "line",
            "fillOpacity": 25 if panel.stack else 10,
            "lineWidth": 1,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "normal" if panel.stack else "none"},
        }
    if panel.kind == "state-timeline":
        return {"fillOpacity": 80, "lineWidth": 0}
    return {}


def _panel(panel: Panel, layout: _Layout) -> JSON:
    defaults: JSON = {
        "custom": _custom(panel),
        "mappings": _mappings(panel.mappings),
        "thresholds": _thresholds(panel.thresholds),
        "unit": panel.unit,
    }
    if panel.kind in ("timeseries", "state-timeline"):
        defaults["color"] = {"mode": "palette-classic"}
    else:
        defaults["color"] = {"mode": "thresholds"}
    if panel.minimum is not None:
        defaults["min"] = panel.minimum
    if panel.links:
        defaults["links"] = list(panel.links)
    targets = []
    for i, t in enumerate(panel.targets):
        target: JSON = {
            "datasource": DS,
            "editorMode": "code",
            "expr": t.expr,
            "legendFormat": t.legend or "__auto",
            "range": True,
            "refId": chr(ord("A") + i),
        }
        if t.heatmap:
            target["format"] = "heatmap"
            target["legendFormat"] = "{{le}}"
        targets.append(target)
    return {
        "datasource": DS,
        "description": panel.description,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "gridPos": layout.place(panel.width, panel.height),
        "id": layout.take_id(),
        "options": _options(panel),
        "targets": targets,
        "title": panel.title,
        "type": panel.kind,
    }


def _datasource_variable() -> JSON:
    return {
        "current": {},
        "hide": 0,
        "includeAll": False,
        "label": "Prometheus",
        "multi": False,
        "name": "datasource",
        "options": [],
        "query": "prometheus",
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
        "type": "datasource",
    }


def node_variable() -> JSON:
    definition = "label_values(nodelock_extender_gpus, node)"
    return {
        "current": {},
        "datasource": DS,
        "definition": definition,
        "hide": 0,
        "includeAll": False,
        "label": "Node",
        "multi": False,
        "name": "node",
        "options": [],
        "query": {
            "qryType": 1,
            "query": definition,
            "refId": "PrometheusVariableQueryEditor-VariableQuery",
        },
        "refresh": 2,
        "regex": "",
        "skipUrlSync": False,
        "sort": 1,
        "type": "query",
    }


def dashboard(
    *, uid: str, title: str, description: str, rows: Sequence[Row], variables: Sequence[JSON]
) -> JSON:
    layout = _Layout()
    for row in rows:
        layout.out.append(
            {
                "collapsed": False,
                "gridPos": layout.new_row(),
                "id": layout.take_id(),
                "panels": [],
                "title": row.title,
                "type": "row",
            }
        )
        layout.out.extend(_panel(p, layout) for p in row.panels)
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [
            {
                "asDropdown": False,
                "icon": "external link",
                "includeVars": False,
                "keepTime": True,
                "tags": ["nodelock"],
                "targetBlank": False,
                "title": "nodelock",
                "type": "dashboards",
            }
        ],
        "panels": layout.out,
        "refresh": "30s",
        "schemaVersion": 39,
        "tags": ["nodelock", "gpu"],
        "templating": {"list": [_datasource_variable(), *variables]},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }
