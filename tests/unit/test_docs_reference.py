"""The configuration reference (``docs/reference.md``) is generated, complete and current.

It is written by ``python -m nodelock.reference`` (``make generate``) from the commands' argument
parsers and the chart's ``values.schema.json``.  These tests fail when the committed file is
stale, when a flag of some command or a chart value is missing from it, and when a chart value
has no description in the schema.
"""

from __future__ import annotations

import argparse
import os
import re

import pytest

from nodelock import cli, reference

pytestmark = pytest.mark.unit


def _sections(text: str) -> dict[str, str]:
    """The reference's ``### `command``` sections, by command."""
    parts = re.split(r"^### `([^`]+)`$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_committed_reference_is_what_make_generate_writes() -> None:
    committed = reference.OUTPUT.read_text()
    assert committed == reference.render(), "docs/reference.md is stale: run `make generate`"


def test_every_flag_of_every_command_is_in_its_section() -> None:
    sections = _sections(reference.render())
    root = cli.build_parser({})
    missing = []
    commands = 0
    for parser in cli._parsers(root):
        commands += 1
        section = sections.get(parser.prog)
        if section is None:
            missing.append(f"{parser.prog} (no section)")
            continue
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            for option in action.option_strings:
                if not re.search(rf"`[^`]*{re.escape(option)}\b", section):
                    missing.append(f"{parser.prog} {option}")
            if (
                not action.option_strings
                and str(action.metavar or action.dest.upper()) not in section
            ):
                missing.append(f"{parser.prog} {action.dest}")
    assert commands >= 12, "the command tree lost its subcommands"
    assert missing == []


def test_a_flags_environment_variable_is_the_one_the_command_reads() -> None:
    text = reference.render()
    row = next(line for line in text.splitlines() if line.startswith("| `--bind-wait-budget"))
    assert "`NODELOCK_BIND_WAIT_BUDGET`" in row
    assert "`4.0`" in row
    parsed = cli.build_parser({"NODELOCK_BIND_WAIT_BUDGET": "1.5"}).parse_args(["extender"])
    assert parsed.bind_wait_budget == 1.5


def test_every_chart_value_is_in_the_reference() -> None:
    schema, values = reference.load_chart()
    text = reference.render()
    rows = reference.chart_values(schema, values)
    assert len(rows) > 50
    absent = [row.path for row in rows if f"| `{row.path}` |" not in text]
    assert absent == []
    assert "devicePlugin.nodeSelector" in {row.path for row in rows}


def test_a_chart_value_shows_its_default_from_values_yaml() -> None:
    schema, values = reference.load_chart()
    rows = {row.path: row for row in reference.chart_values(schema, values)}
    assert rows["devicePlugin.nodeSelector"].default != "`null`"
    assert rows["devicePlugin.tolerations"].default.startswith("`[")


def test_every_chart_value_has_a_description() -> None:
    schema, values = reference.load_chart()
    undescribed = [
        row.path for row in reference.chart_values(schema, values) if not row.description
    ]
    assert undescribed == [], (
        f"{len(undescribed)} chart values have no description in values.schema.json: "
        + ", ".join(undescribed)
    )


def test_a_value_without_description_is_reported() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "description": "the a"},
            "b": {"type": "object", "properties": {"c": {"type": "integer"}}},
        },
    }
    rows = reference.chart_values(schema, {"a": "x", "b": {"c": 3}})
    assert [(r.path, r.default, r.description) for r in rows] == [
        ("a", '`"x"`', "the a"),
        ("b.c", "`3`", ""),
    ]


def test_the_reference_does_not_depend_on_the_environment_it_is_made_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user's cache settings must not leak into the documented defaults (nor fail the check)."""
    plain = reference.render()
    monkeypatch.setenv("XDG_CACHE_HOME", "/elsewhere/cache")
    monkeypatch.setenv("NODELOCK_CACHE", "/elsewhere/nodelock")
    assert reference.render() == plain
    assert "/elsewhere" not in plain
    assert os.environ["XDG_CACHE_HOME"] == "/elsewhere/cache"  # restored afterwards
