"""What a burst cost kube-apiserver, by request kind, from two scrapes of its ``/metrics``.

A ``Snapshot`` keeps the counters the handoff benchmark reads:

- ``apiserver_request_total``: requests by verb and resource[/subresource];
- ``apiserver_request_duration_seconds_sum``: the seconds the API server spent serving them, by
  the same key, for the verbs that end (WATCH and CONNECT are long-running: their duration is
  how long the stream stayed open, not work, and is left out).  Wall time inside the server,
  not CPU: it includes waiting for etcd and for a CPU;
- ``apiserver_watch_events_total`` and ``apiserver_watch_events_sizes_sum``: watch events the
  API server sent to watchers, and their encoded bytes, by resource: an object written once and
  watched by N clients whose selectors match it counts N times (the fan-out);
- ``apiserver_longrunning_requests{verb="WATCH"}``: the watches open at the scrape, by resource
  (a gauge: taken from the later scrape, not differenced);
- ``process_cpu_seconds_total``: the API server's own CPU seconds.

The series are those of kube-apiserver 1.37 (``staging/src/k8s.io/apiserver/pkg/endpoints/
metrics/metrics.go`` and ``.../storage/cacher/metrics/metrics.go``, where the watch series carry
``group``/``version``/``resource`` labels); a series a release does not have reads as zero.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

LONG_RUNNING = frozenset({"WATCH", "CONNECT"})

_WANTED = (
    "apiserver_request_total{",
    "apiserver_request_duration_seconds_sum{",
    "apiserver_watch_events_total{",
    "apiserver_watch_events_sizes_sum{",
    "apiserver_longrunning_requests{",
    "process_cpu_seconds_total",
)
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Key = tuple[str, str]  # (verb, resource[/subresource])


@dataclass
class Snapshot:
    """The API server's counters at one scrape (or the difference of two)."""

    requests: Counter[Key] = field(default_factory=Counter)
    handler_s: dict[Key, float] = field(default_factory=dict)
    watch_events: Counter[str] = field(default_factory=Counter)
    watch_bytes: dict[str, float] = field(default_factory=dict)
    watchers: Counter[str] = field(default_factory=Counter)
    cpu_s: float = 0.0

    def __sub__(self, earlier: Snapshot) -> Snapshot:
        """What happened between ``earlier`` and this scrape (watchers: this scrape's)."""
        return Snapshot(
            requests=Counter({k: v - earlier.requests.get(k, 0) for k, v in self.requests.items()}),
            handler_s={k: v - earlier.handler_s.get(k, 0.0) for k, v in self.handler_s.items()},
            watch_events=Counter(
                {k: v - earlier.watch_events.get(k, 0) for k, v in self.watch_events.items()}
            ),
            watch_bytes={
                k: v - earlier.watch_bytes.get(k, 0.0) for k, v in self.watch_bytes.items()
            },
            watchers=Counter(self.watchers),
            cpu_s=self.cpu_s - earlier.cpu_s,
        )

    def net_of(self, background: Snapshot, periods: float) -> Snapshot:
        """This difference less ``periods`` times the idle ``background`` difference (never
        below zero); the watchers and the CPU are left as they are (the CPU is compared
        between phases, each with the same background)."""

        def less(mine: Mapping[Any, float], idle: Mapping[Any, float]) -> dict[Any, float]:
            return {k: max(0.0, v - idle.get(k, 0.0) * periods) for k, v in mine.items()}

        requests = Counter(
            {k: round(v) for k, v in less(self.requests, background.requests).items()}
        )
        events = Counter(
            {k: round(v) for k, v in less(self.watch_events, background.watch_events).items()}
        )
        return Snapshot(
            requests=+requests,
            handler_s=less(self.handler_s, background.handler_s),
            watch_events=+events,
            watch_bytes=less(self.watch_bytes, background.watch_bytes),
            watchers=Counter(self.watchers),
            cpu_s=self.cpu_s,
        )


def _key(labels: Mapping[str, str]) -> Key:
    resource = labels.get("resource", "")
    if labels.get("subresource"):
        resource += "/" + labels["subresource"]
    return labels.get("verb", ""), resource


def _resource(labels: Mapping[str, str]) -> str:
    """A watch series' resource (releases before 1.32 label it ``kind``)."""
    return labels.get("resource") or labels.get("kind") or ""


def parse(text: str) -> Snapshot:
    """The counters of one ``/metrics`` text (other series are skipped unparsed: the API server
    exposes some 30,000 lines)."""
    snap = Snapshot()
    for line in text.splitlines():
        if not line.startswith(_WANTED):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        name = m.group(1)
        labels = dict(_LABEL.findall(m.group(2) or ""))
        if name == "apiserver_request_total":
            snap.requests[_key(labels)] += int(value)
        elif name == "apiserver_request_duration_seconds_sum":
            key = _key(labels)
            if key[0] not in LONG_RUNNING:
                snap.handler_s[key] = snap.handler_s.get(key, 0.0) + value
        elif name == "apiserver_watch_events_total":
            snap.watch_events[_resource(labels)] += int(value)
        elif name == "apiserver_watch_events_sizes_sum":
            res = _resource(labels)
            snap.watch_bytes[res] = snap.watch_bytes.get(res, 0.0) + value
        elif name == "apiserver_longrunning_requests" and labels.get("verb") == "WATCH":
            snap.watchers[labels.get("resource", "")] += int(value)
        elif name == "process_cpu_seconds_total":
            snap.cpu_s = value
    return snap


# the resources a handoff writes or watches, and the fan-out read for each
FANOUT = {
    "leases": ("POST leases", "PUT leases"),
    "pods": (
        "POST pods",
        "PATCH pods",
        "PUT pods",
        "PATCH pods/status",
        "PUT pods/status",
        "POST pods/binding",
        "DELETE pods",
    ),
}


def per_pod(diff: Snapshot, pods: int) -> dict[str, Any]:
    """A burst's difference as per-pod figures for the results JSON: the API server's handler
    milliseconds by request kind, watch events (with kB) by resource, the watches open after
    the burst by resource, and watch events per write of the resources a handoff uses
    (``fanout``).  (The API server's CPU is read from /proc, as every component's.)"""

    def name(k: Key) -> str:
        return f"{k[0]} {k[1]}"

    writes = {name(k): v for k, v in diff.requests.items()}
    fanout = {}
    for res, kinds in FANOUT.items():
        n = sum(writes.get(k, 0) for k in kinds)
        if n:
            fanout[res] = diff.watch_events.get(res, 0) / n
    return {
        "handler_ms_per_pod": {
            name(k): v * 1000 / pods
            for k, v in sorted(diff.handler_s.items(), key=lambda kv: -kv[1])
            if v > 0
        },
        "watch_events_per_pod": {
            k: v / pods for k, v in sorted(diff.watch_events.items(), key=lambda kv: -kv[1]) if v
        },
        "watch_kb_per_pod": {
            k: v / 1000 / pods
            for k, v in sorted(diff.watch_bytes.items(), key=lambda kv: -kv[1])
            if v > 0
        },
        "watchers": {k: v for k, v in sorted(diff.watchers.items()) if v},
        "fanout": fanout,
    }


def lines(label: str, cost: Mapping[str, Any], *, top: int = 6) -> list[str]:
    """The report's lines for one burst's ``per_pod`` figures."""
    handler = cost.get("handler_ms_per_pod") or {}
    events = cost.get("watch_events_per_pod") or {}
    kb = cost.get("watch_kb_per_pod") or {}
    watchers = cost.get("watchers") or {}
    fanout = cost.get("fanout") or {}
    out = [
        f"  {label:<22}handler ms/pod {sum(handler.values()):.1f}: "
        + "  ".join(f"{k} {v:.2f}" for k, v in list(handler.items())[:top])
    ]
    watched = [
        f"{k} {v:.1f} ({kb.get(k, 0.0):.1f} kB, {watchers.get(k, 0)} watches"
        + (f", {fanout[k]:.1f} per write" if k in fanout else "")
        + ")"
        for k, v in list(events.items())[:3]
        if v >= 0.05
    ]
    out.append(f"  {'':<22}watch events/pod: " + "  ".join(watched))
    return out
