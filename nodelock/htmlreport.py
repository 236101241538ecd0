"""The demo's report as one self-contained HTML page: lock holds per node, waits, latencies.

``render(data)`` returns a complete page, in ASCII (other characters as character references),
with inline CSS and inline SVG only: no scripts, fonts, images or style sheets are fetched, so
the file opens the same offline, from a mail attachment or a CI artifact.  Hovering a hold, a
contention mark or a bar shows its details (SVG ``<title>``).
Every name that comes from the cluster (nodes, pods, summary text) is HTML-escaped.

What it shows:

- a timeline per node: one bar per lock hold (who held the node's lock, from when to when),
  coloured by workload, and a mark for each time a pod found the node locked (contention);
- the distribution of the time from a pod's creation to its node lock's acquisition (the
  scheduling cycle plus the bind's wait in its node's queue);
- the distribution of bind to admission (kubelet's Allocate answered) latency;
- the summary table the caller passes (invariants, counts, request rates).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

WIDTH = 1160  # SVG width in px
GUTTER = 120  # room for node names left of the timeline
ROW = 18  # px per node row
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#9c755f",
    "#ff9da7",
    "#86bcb6",
    "#d37295",
)
CONTENTION = "#d62728"


@dataclass(frozen=True)
class Hold:
    """``holder`` held ``node``'s lock from ``start_s`` to ``end_s`` (seconds into the run)."""

    node: str
    holder: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Contention:
    """``pod`` found ``node``'s lock held at ``t_s`` (its bind failed and was retried)."""

    node: str
    pod: str
    t_s: float


@dataclass(frozen=True)
class ReportData:
    """Everything the page shows; times in seconds since the start of the run."""

    title: str
    duration_s: float
    nodes: list[str]
    holds: list[Hold]
    contention: list[Contention]
    lock_waits_s: list[float]
    bind_to_admit_s: list[float]
    summary: list[tuple[str, str]]


def render(data: ReportData) -> str:
    """The whole page as a string (UTF-8 when written)."""
    duration = max(
        data.duration_s,
        max((h.end_s for h in data.holds), default=0.0),
        max((c.t_s for c in data.contention), default=0.0),
        1e-3,
    )
    colours = workload_colours(h.holder for h in data.holds)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(data.title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{escape(data.title)}</h1>",
        f'<p class="lede">{_lede(data, duration)}</p>',
        '<section id="summary"><h2>Summary</h2>',
        _summary(data.summary),
        "</section>",
        '<section id="timeline"><h2>Node locks over time</h2>',
        '<p class="note">One row per node; a bar is one lock hold (Bind took the lock, the '
        "device plugin released it after Allocate), coloured by workload; a red tick is a bind "
        "that could not get its turn in time and was retried. Hover for details.</p>",
        _timeline(data, duration, colours),
        _legend(colours),
        "</section>",
        '<div class="pair">',
        '<section id="lock-waits"><h2>Creation &#8594; lock acquired</h2>',
        '<p class="note">From the pod&#8217;s creation to its node lock&#8217;s acquisition: '
        "kube-scheduler&#8217;s cycle plus the bind&#8217;s wait for its turn at the node"
        f"{_stats(data.lock_waits_s)}.</p>",
        _histogram(data.lock_waits_s, "creation to lock acquired", "#4e79a7"),
        "</section>",
        '<section id="bind-to-admit"><h2>Bind &#8594; admission</h2>',
        '<p class="note">From the pod&#8217;s binding to its admission by kubelet (Allocate '
        f"answered with its devices){_stats(data.bind_to_admit_s)}.</p>",
        _histogram(data.bind_to_admit_s, "bind to admission", "#59a14f"),
        "</section>",
        "</div>",
        "<footer>nodelock &#183; this page is self-contained: no scripts, no external "
        "resources.</footer>",
        "</body>",
        "</html>",
    ]
    page = "\n".join(parts) + "\n"
    return page.encode("ascii", "xmlcharrefreplace").decode("ascii")  # any file encoding works


# Kubernetes' generated name suffixes (pod-template hash, random suffix) use this alphabet
_SUFFIX = re.compile(r"(-[bcdfghjklmnpqrstvwxz2456789]{5,10})+$")


def workload(holder: str) -> str:
    """The workload a pod belongs to, from its name: ``demo/inference-7d9c6b4f5-x2x4z`` ->
    ``inference`` (generated suffixes dropped; a name without one stays as it is)."""
    name = holder.rsplit("/", 1)[-1]
    return _SUFFIX.sub("", name) or name


def workload_colours(holders: Iterable[str]) -> dict[str, str]:
    """A colour per workload, in sorted order, cycling through the palette."""
    names = sorted({workload(h) for h in holders})
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def nice_step(span: float, ticks: int = 8) -> float:
    """The smallest round step (1, 2 or 5 times a power of ten) that cuts ``span`` into at
    most ``ticks`` intervals."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    power = 10.0 ** math.floor(math.log10(raw))
    for mult in (1.0, 2.0, 5.0, 10.0):
        if raw <= mult * power:
            return mult * power
    return 10.0 * power


def bins(values: Sequence[float], count: int = 24) -> tuple[float, list[int]]:
    """Equal-width bins from 0 over ``values``, the width a nice step: (width, counts)."""
    top = max(values, default=0.0)
    if top <= 0:
        return 1.0, [len(values)]
    width = nice_step(top, count)
    n = int(top // width) + 1
    counts = [0] * n
    for v in values:
        counts[min(n - 1, max(0, int(v // width)))] += 1
    return width, counts


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank quantile (NaN for no values)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def fmt_s(seconds: float) -> str:
    """``0.062`` -> ``62 ms``, ``2.5`` -> ``2.5 s``, ``75`` -> ``1m15s``."""
    if math.isnan(seconds):
        return "n/a"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    return f"{int(seconds // 60)}m{seconds % 60:02.0f}s"


def _lede(data: ReportData, duration: float) -> str:
    return escape(
        f"{len(data.nodes)} nodes \u00b7 {len(data.holds)} lock holds \u00b7 "
        f"{len(data.contention)} contended binds \u00b7 run of {fmt_s(duration)}"
    )


def _stats(values: Sequence[float]) -> str:
    if not values:
        return ""
    p50, p99 = fmt_s(quantile(values, 0.5)), fmt_s(quantile(values, 0.99))
    return f": p50 {p50}, p99 {p99}, max {fmt_s(max(values))}"


def _summary(rows: Sequence[tuple[str, str]]) -> str:
    if not rows:
        return '<p class="empty">No summary.</p>'
    body = "".join(
        f"<tr><th>{escape(k)}</th><td{_verdict_class(v)}>{escape(v)}</td></tr>" for k, v in rows
    )
    return f'<table class="summary">{body}</table>'


def _verdict_class(value: str) -> str:
    if value.startswith("PASS"):
        return ' class="pass"'
    if value.startswith("FAIL"):
        return ' class="fail"'
    return ""


def _timeline(data: ReportData, duration: float, colours: dict[str, str]) -> str:
    plot = WIDTH - GUTTER - 16
    top = 8
    height = top + ROW * len(data.nodes) + 30
    scale = plot / duration
    row_of = {node: i for i, node in enumerate(data.nodes)}
    out = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="node lock holds over time">'
    ]
    step = nice_step(duration, 12)
    t = 0.0
    axis_y = top + ROW * len(data.nodes)
    while t <= duration + 1e-9:
        x = GUTTER + t * scale
        out.append(
            f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{axis_y}"/>'
            f'<text class="tick" x="{x:.1f}" y="{axis_y + 14}">{_tick_label(t, step)}</text>'
        )
        t += step
    out.append(
        f'<text class="axis" x="{GUTTER + plot / 2:.0f}" y="{axis_y + 28}">'
        "seconds since the start</text>"
    )
    for node, i in row_of.items():
        y = top + i * ROW
        out.append(
            f'<g class="node-row" data-node="{escape(node)}">'
            f'<rect class="band{i % 2}" x="{GUTTER}" y="{y}" width="{plot}" height="{ROW}"/>'
            f'<text class="node" x="{GUTTER - 6}" y="{y + ROW - 5}">{escape(node)}</text>'
        )
        for h in (h for h in data.holds if h.node == node):
            x = GUTTER + h.start_s * scale
            w = max(2.0, (h.end_s - h.start_s) * scale)
            colour = colours[workload(h.holder)]
            out.append(
                f'<rect class="hold" x="{x:.1f}" y="{y + 3}" width="{w:.1f}" '
                f'height="{ROW - 6}" fill="{colour}"><title>{escape(h.holder)} held '
                f"{escape(node)}: {h.start_s:.2f}&#8211;{h.end_s:.2f} s "
                f"({fmt_s(h.end_s - h.start_s)})</title></rect>"
            )
        for c in (c for c in data.contention if c.node == node):
            x = GUTTER + c.t_s * scale
            out.append(
                f'<path class="contention" d="M{x - 3:.1f} {y + 1} h6 l-3 6 z" '
                f'fill="{CONTENTION}"><title>{escape(c.pod)} found {escape(node)} locked at '
                f"{c.t_s:.2f} s</title></path>"
            )
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def _tick_label(t: float, step: float) -> str:
    return f"{t:.0f}" if step >= 1 else f"{t:.1f}"


def _legend(colours: dict[str, str]) -> str:
    items = "".join(
        f'<li><span class="swatch" style="background:{c}"></span>{escape(w)}</li>'
        for w, c in colours.items()
    )
    mark = (
        f'<li><span class="swatch mark" style="border-top-color:{CONTENTION}"></span>'
        "contended bind</li>"
    )
    return f'<ul class="legend">{items}{mark}</ul>'


def _histogram(values: Sequence[float], what: str, colour: str) -> str:
    if not values:
        return f'<p class="empty">No {escape(what)} was measured.</p>'
    w, h, left, bottom, top = 560, 270, 44, 34, 38
    width, counts = bins(values)
    plot_w, plot_h = w - left - 12, h - bottom - top
    peak = max(counts)
    bar = plot_w / len(counts)
    out = [
        f'<svg class="histogram" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" role="img" aria-label="{escape(what)} distribution">'
    ]
    ystep = max(1, int(nice_step(peak, 4)))
    for yv in range(0, peak + 1, ystep):
        y = top + plot_h - yv / peak * plot_h
        out.append(
            f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}"/>'
            f'<text class="ytick" x="{left - 5}" y="{y + 4:.1f}">{yv}</text>'
        )
    for i, n in enumerate(counts):
        if not n:
            continue
        bh = n / peak * plot_h
        lo, hi = i * width, (i + 1) * width
        out.append(
            f'<rect class="bar" x="{left + i * bar + 1:.1f}" y="{top + plot_h - bh:.1f}" '
            f'width="{max(1.0, bar - 2):.1f}" height="{bh:.1f}" fill="{colour}">'
            f"<title>{n} pods: {fmt_s(lo)}&#8211;{fmt_s(hi)}</title></rect>"
        )
    label_every = max(1, math.ceil(len(counts) / 8))
    for i in range(0, len(counts) + 1, label_every):
        x = left + i * bar
        label = fmt_s(i * width)
        out.append(f'<text class="tick" x="{x:.1f}" y="{top + plot_h + 14}">{label}</text>')
    span = len(counts) * width
    for row, (q, name) in enumerate(((0.5, "p50"), (0.99, "p99"))):
        v = quantile(values, q)
        x = left + v / span * plot_w
        label_y = 13 + 13 * row  # one line per quantile above the plot, so they never collide
        anchor, dx = ("end", -4) if x > left + plot_w * 0.6 else ("start", 4)
        out.append(
            f'<line class="q" x1="{x:.1f}" y1="{label_y - 9}" x2="{x:.1f}" y2="{top + plot_h}"/>'
            f'<text class="qlabel" text-anchor="{anchor}" x="{x + dx:.1f}" y="{label_y}">'
            f"{name} {fmt_s(v)}</text>"
        )
    out.append(
        f'<text class="axis" x="{left + plot_w / 2:.0f}" y="{h - 4}">'
        f"{escape(what)} ({len(values)} pods)</text>"
    )
    out.append("</svg>")
    return "".join(out)


_CSS = """
:root { color-scheme: light; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
  margin: 24px auto; max-width: 1200px; padding: 0 16px; background: #fff; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 6px; }
.lede { color: #57606a; margin: 0 0 8px; }
.note { color: #57606a; margin: 0 0 8px; font-size: 13px; }
.empty { color: #57606a; font-style: italic; }
table.summary { border-collapse: collapse; width: 100%; }
table.summary th, table.summary td { text-align: left; padding: 4px 12px 4px 0;
  border-bottom: 1px solid #eaeef2; vertical-align: top; }
table.summary th { font-weight: 600; width: 36%; }
td.pass { color: #1a7f37; font-weight: 600; }
td.fail { color: #cf222e; font-weight: 600; }
svg text { font: 11px system-ui, sans-serif; fill: #57606a; }
svg text.node { text-anchor: end; fill: #1f2328; }
svg text.tick { text-anchor: middle; }
svg text.ytick { text-anchor: end; }
svg text.axis { text-anchor: middle; fill: #1f2328; }
svg text.qlabel { fill: #1f2328; font-weight: 600; }
svg .grid { stroke: #d0d7de; stroke-width: 1; stroke-dasharray: 2 3; }
svg .band0 { fill: #f6f8fa; }
svg .band1 { fill: #ffffff; }
svg .hold { stroke: rgba(0, 0, 0, 0.25); stroke-width: 0.5; }
svg .q { stroke: #1f2328; stroke-width: 1.5; stroke-dasharray: 5 3; }
.legend { list-style: none; padding: 0; margin: 6px 0 0; display: flex; flex-wrap: wrap;
  gap: 4px 16px; font-size: 13px; }
.legend li { display: flex; align-items: center; gap: 6px; }
.swatch { display: inline-block; width: 14px; height: 10px; border-radius: 2px; }
.swatch.mark { width: 0; height: 0; border-left: 5px solid transparent;
  border-right: 5px solid transparent; border-top: 8px solid; border-radius: 0; }
.pair { display: flex; flex-wrap: wrap; gap: 8px 32px; }
.pair > section { flex: 0 1 560px; }
footer { margin-top: 32px; color: #8c959f; font-size: 12px; }
"""
