"""The demo's HTML report: structure, escaping, self-containment, the numbers behind the marks."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

import pytest

from nodelock.htmlreport import (
    GUTTER,
    WIDTH,
    Contention,
    Hold,
    ReportData,
    bins,
    fmt_s,
    nice_step,
    quantile,
    render,
    workload,
    workload_colours,
)


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parents: list[Element]
    text: str = ""
    children: list[Element] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())


class Tree(HTMLParser):
    """Every element with its ancestors and direct text (void elements closed at once)."""

    VOID = frozenset({"meta", "br", "img", "input", "link", "hr"})

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[Element] = []
        self.all: list[Element] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = Element(tag, {k: v or "" for k, v in attrs}, list(self.stack))
        if self.stack:
            self.stack[-1].children.append(el)
        self.all.append(el)
        if tag not in self.VOID:
            self.stack.append(el)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in self.VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        assert self.stack, f"</{tag}> closes nothing"
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self.stack:
            self.stack[-1].text += data

    def find(self, tag: str, cls: str) -> list[Element]:
        return [e for e in self.all if e.tag == tag and cls in e.classes]


def data(**changes: object) -> ReportData:
    base: dict[str, object] = {
        "title": "nodelock demo report",
        "duration_s": 10.0,
        "nodes": ["n1", "n2", "n3"],
        "holds": [
            Hold("n1", "demo/inference-7d9c6b4f5-x2x4z", 0.0, 0.06),
            Hold("n1", "demo/train-4gpu-bx7kp", 1.0, 1.4),
            Hold("n2", "demo/inference-7d9c6b4f5-q7wzk", 5.0, 10.0),
        ],
        "contention": [
            Contention("n1", "demo/burst-q2w4r", 0.03),
            Contention("n1", "demo/burst-zz4rt", 1.2),
            Contention("n2", "demo/burst-q2w4r", 6.0),
        ],
        "lock_waits_s": [0.5, 1.9, 2.1, 2.2, 4.8],
        "bind_to_admit_s": [0.03, 0.05, 0.06, 0.4],
        "summary": [("S1 no GPU assigned to two live pods", "PASS"), ("S3 locks", "FAIL (1)")],
    }
    base.update(changes)
    return ReportData(**base)  # type: ignore[arg-type]


def test_one_row_per_node_in_order() -> None:
    tree = Tree(render(data()))
    rows = tree.find("g", "node-row")
    assert [r.attrs["data-node"] for r in rows] == ["n1", "n2", "n3"]
    assert [next(c.text for c in r.children if "node" in c.classes) for r in rows] == [
        "n1",
        "n2",
        "n3",
    ]


def test_one_rect_per_hold_in_its_node_row_with_who_and_when() -> None:
    tree = Tree(render(data()))
    holds = tree.find("rect", "hold")
    assert len(holds) == 3
    per_node = {r.attrs["data-node"]: r for r in tree.find("g", "node-row")}
    assert sum(per_node["n1"] in h.parents for h in holds) == 2
    assert sum(per_node["n2"] in h.parents for h in holds) == 1
    assert sum(per_node["n3"] in h.parents for h in holds) == 0
    titles = [h.children[0].text for h in holds]
    assert titles[1] == "demo/train-4gpu-bx7kp held n1: 1.00\u20131.40 s (400 ms)"


def test_hold_geometry_follows_time() -> None:
    tree = Tree(render(data()))
    plot = WIDTH - GUTTER - 16
    last = tree.find("rect", "hold")[2]  # n2, 5 s to the end of the 10 s run
    assert float(last.attrs["x"]) == pytest.approx(GUTTER + plot / 2, abs=0.1)
    assert float(last.attrs["width"]) == pytest.approx(plot / 2, abs=0.1)
    short = tree.find("rect", "hold")[0]
    assert float(short.attrs["width"]) >= 2.0  # a 60 ms hold stays visible


def test_a_mark_per_contention_in_its_node_row() -> None:
    tree = Tree(render(data()))
    per_node = {r.attrs["data-node"]: r for r in tree.find("g", "node-row")}
    marks = tree.find("path", "contention")
    assert len(marks) == 3
    assert sum(per_node["n1"] in m.parents for m in marks) == 2
    assert sum(per_node["n2"] in m.parents for m in marks) == 1
    assert marks[2].children[0].text == "demo/burst-q2w4r found n2 locked at 6.00 s"


def test_names_are_escaped_everywhere() -> None:
    evil = '<script>alert("x")</script>&'
    page = render(
        data(
            title=evil,
            nodes=[evil],
            holds=[Hold(evil, evil, 0, 1)],
            contention=[Contention(evil, evil, 0.5)],
            summary=[(evil, evil)],
        )
    )
    assert "<script" not in page
    assert "&lt;script&gt;" in page
    tree = Tree(page)  # still well-formed
    assert tree.find("g", "node-row")[0].attrs["data-node"] == evil
    assert tree.find("rect", "hold")[0].children[0].text.startswith(evil)
    assert [e.text for e in tree.all if e.tag == "h1"] == [evil]


def test_self_contained_nothing_fetched() -> None:
    page = render(data())
    assert "<script" not in page
    assert "<link" not in page
    assert "@import" not in page
    assert "url(" not in page
    assert not re.search(r"\b(src|href)=", page)
    # the only URL is SVG's namespace name, which is never fetched
    assert set(re.findall(r"https?://[^\s\"')]+", page)) == {"http://www.w3.org/2000/svg"}
    assert page.startswith("<!DOCTYPE html>")
    assert page.isascii()  # written in any encoding, read back the same


def test_histograms_count_every_value_and_mark_quantiles() -> None:
    tree = Tree(render(data()))
    svgs = [e for e in tree.all if e.tag == "svg" and "histogram" in e.classes]
    assert len(svgs) == 2
    for svg, values in zip(svgs, (data().lock_waits_s, data().bind_to_admit_s), strict=True):
        bars = [c for c in svg.children if "bar" in c.classes]
        counted = sum(int(b.children[0].text.split()[0]) for b in bars)
        assert counted == len(values)
        labels = [c.text for c in svg.children if "qlabel" in c.classes]
        assert labels == [
            f"p50 {fmt_s(quantile(values, 0.5))}",
            f"p99 {fmt_s(quantile(values, 0.99))}",
        ]


def test_summary_table_and_verdicts() -> None:
    tree = Tree(render(data()))
    cells = [e for e in tree.all if e.tag == "td"]
    assert [c.text for c in cells] == ["PASS", "FAIL (1)"]
    assert [c.classes for c in cells] == [{"pass"}, {"fail"}]


def test_empty_run_renders_without_marks() -> None:
    page = render(data(nodes=["n1"], holds=[], contention=[], lock_waits_s=[], bind_to_admit_s=[]))
    tree = Tree(page)
    assert len(tree.find("g", "node-row")) == 1
    assert not tree.find("rect", "hold")
    assert "No creation to lock acquired was measured." in page
    assert "No bind to admission was measured." in page


def test_workload_from_pod_names() -> None:
    assert workload("demo/inference-7d9c6b4f5-x2x4z") == "inference"
    assert workload("demo/preprocess-then-serve-6f7d8c9b5-x2x4z") == "preprocess-then-serve"
    assert workload("demo/train-4gpu-bx7kp") == "train-4gpu"
    assert workload("ns/plain") == "plain"
    colours = workload_colours(["a/x-bx7kp", "a/x-q2w4r", "a/y-bx7kp"])
    assert list(colours) == ["x", "y"]
    assert colours["x"] != colours["y"]


@pytest.mark.parametrize(
    ("span", "step"), [(16, 2), (10, 2), (18.8, 5), (60, 10), (0.3, 0.05), (250, 50), (0, 1)]
)
def test_nice_steps_are_round_and_give_at_most_the_asked_ticks(span: float, step: float) -> None:
    assert nice_step(span, 8) == pytest.approx(step)
    assert span / nice_step(span, 8) <= 8


def test_bins_cover_every_value() -> None:
    width, counts = bins([0.0, 0.9, 1.0, 9.99, 10.0], 10)
    assert width == 1.0
    assert sum(counts) == 5
    assert counts[0] == 2
    assert counts[-1] == 1
    assert bins([], 10) == (1.0, [0])


def test_quantile_and_format() -> None:
    assert quantile([3, 1, 2], 0.5) == 2
    assert quantile([1, 2, 3, 4], 0.99) == 4
    assert math.isnan(quantile([], 0.5))
    assert fmt_s(0.0625) == "62 ms"
    assert fmt_s(2.5) == "2.5 s"
    assert fmt_s(75) == "1m15s"
    assert fmt_s(math.nan) == "n/a"
