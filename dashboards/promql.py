"""What the dashboards and alerts ask Prometheus, as plain strings: extraction and light parsing.

Used by the tests that evaluate every query on a real Prometheus.  ``operands`` is a small
splitter, not a PromQL parser: it knows parentheses, braces, brackets, strings, binary operators
with their modifiers (``bool``, ``on``, ``ignoring``, ``group_left``, ``group_right``) and
``absent(...)``, which is what the rule file uses; anything it cannot split stays one operand.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

_WORD_OPS = ("unless", "and", "or")
_SYMBOL_OPS = ("==", "!=", ">=", "<=", ">", "<", "+", "-", "*", "/", "%", "^")
_MODIFIERS = ("bool", "on", "ignoring", "group_left", "group_right")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$|^[+-]?(Inf|NaN)$")
_METRIC = re.compile(r"\bnodelock_[a-z0-9_]+|\bup(?=\s*\{)")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a dashboard, and where it is."""

    dashboard: str
    panel: str
    ref_id: str
    expr: str


def dashboard_queries(model: Mapping[str, Any]) -> list[Query]:
    """Every target's ``expr`` in a Grafana dashboard model (rows' nested panels included)."""
    out: list[Query] = []

    def walk(panels: list[Mapping[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append(
                        Query(model["title"], panel["title"], target["refId"], target["expr"])
                    )

    walk(model.get("panels", []))
    return out


def variable_queries(model: Mapping[str, Any]) -> dict[str, str]:
    """Query variables' definitions (``label_values(metric, label)``) by variable name."""
    out = {}
    for var in model.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]
            out[var["name"]] = query["query"] if isinstance(query, dict) else str(query)
    return out


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace Grafana variables (``$x``, ``${x}``, ``${x:fmt}``) with ``values``; unknown ones
    raise ``KeyError``."""

    def repl(m: re.Match[str]) -> str:
        return values[m.group(1) or m.group(2)]

    return _VARIABLE.sub(repl, expr)


def metric_names(expr: str) -> set[str]:
    """Names of the nodelock metrics (and ``up``) an expression reads, as written."""
    return {m.group(0) for m in _METRIC.finditer(expr)}


def operands(expr: str) -> list[str]:
    """The leaves of an expression's top-level binary operators, without number literals.

    ``max by (node) (x) > 300`` gives ``["max by (node) (x)"]``; ``a > 0 and b == 0`` gives
    ``["a", "b"]``; parentheses and ``absent(...)`` around a whole operand are looked into.
    """
    leaves: list[str] = []
    for part in _split(expr):
        part = part.strip()
        if not part or _NUMBER.match(part):
            continue
        inner = _unwrap(part)
        if inner is not None:
            leaves.extend(operands(inner))
        else:
            leaves.append(part)
    return leaves


def _unwrap(part: str) -> str | None:
    """The inside of ``( ... )`` or ``absent( ... )`` spanning the whole operand, else None."""
    for opener in ("absent(", "("):
        if part.startswith(opener) and part.endswith(")"):
            body = part[len(opener) : -1]
            if _balanced(body):
                return body
    return None


def _balanced(text: str) -> bool:
    depth = 0
    for ch, _ in _scan(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def _scan(text: str) -> Iterator[tuple[str, int]]:
    """Characters outside string literals, with their index."""
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch in "\"'`":
            quote = ch
        else:
            yield ch, i
        i += 1


def _split(expr: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    start = 0
    skip_to = 0
    for ch, i in _scan(expr):
        if i < skip_to:
            continue
        if ch in "([{":
            depth += 1
            continue
        if ch in ")]}":
            depth -= 1
            continue
        if depth:
            continue
        width = _operator_at(expr, i, parts_so_far=expr[start:i])
        if width:
            parts.append(expr[start:i])
            start = skip_to = _skip_modifiers(expr, i + width)
    parts.append(expr[start:])
    return parts


def _operator_at(expr: str, i: int, *, parts_so_far: str) -> int:
    if not parts_so_far.strip():
        return 0  # a sign, not a binary operator
    for op in _WORD_OPS:
        end = i + len(op)
        if (
            expr.startswith(op, i)
            and (i == 0 or not _ident(expr[i - 1]))
            and (end >= len(expr) or not _ident(expr[end]))
        ):
            return len(op)
    for op in _SYMBOL_OPS:
        if expr.startswith(op, i):
            return len(op)
    return 0


def _skip_modifiers(expr: str, i: int) -> int:
    while True:
        rest = expr[i:]
        stripped = rest.lstrip()
        i += len(rest) - len(stripped)
        for word in _MODIFIERS:
            if stripped.startswith(word) and not _ident(stripped[len(word) : len(word) + 1]):
                i += len(word)
                after = expr[i:].lstrip()
                if after.startswith("("):
                    i += len(expr[i:]) - len(after)
                    i = expr.index(")", i) + 1
                break
        else:
            return i


def _ident(ch: str) -> bool:
    return bool(ch) and (ch.isalnum() or ch == "_")
