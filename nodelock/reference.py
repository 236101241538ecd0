"""Generate the configuration reference, ``docs/reference.md``: ``python -m nodelock.reference``.

Two parts, each read from the one place that owns it, never written by hand:

- every flag and argument of every ``nodelock`` command, from the argparse tree that
  ``nodelock.cli.build_parser`` builds (the same parsers the commands run with): name, the
  ``NODELOCK_<FLAG>`` environment variable where the flag has one, default and help;
- every value of the Helm chart, from ``deploy/helm/nodelock/values.schema.json`` (type and
  description) with its default from ``values.yaml`` beside it.

``--check`` writes nothing and exits 1 when the committed file differs from what would be written
(``tests/unit/test_docs_reference.py`` runs the same comparison; ``make generate`` writes it).
The output does not depend on the environment it runs in: flags are read with an empty
environment, and the home directory in a help text is written ``~``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nodelock import cli

REPO_ROOT = Path(__file__).resolve().parents[1]
CHART = REPO_ROOT / "deploy" / "helm" / "nodelock"
OUTPUT = REPO_ROOT / "docs" / "reference.md"

JSON = dict[str, Any]


@dataclass(frozen=True)
class Flag:
    """One row of a command's table."""

    names: str  # "--listen", "-o, --output", "NODE" for a positional argument
    env: str  # "NODELOCK_LISTEN", or "" when the flag has no variable
    default: str
    help: str


@dataclass(frozen=True)
class ChartValue:
    """One row of the chart's table: a leaf of values.schema.json."""

    path: str  # "devicePlugin.nodeSelector"
    type: str
    default: str
    description: str  # "" when the schema has none


def _parser_tree(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parser and every subcommand's below it, in the order they were registered."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for sub in action.choices.values():
                if id(sub) not in seen:  # aliases share one parser
                    seen.add(id(sub))
                    yield from _parser_tree(sub)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(action: argparse.Action, parent: str) -> str:
    value = action.default
    if value is argparse.SUPPRESS:
        return f"as given to `{parent}`"
    switches = (
        argparse._StoreTrueAction | argparse._StoreFalseAction | argparse.BooleanOptionalAction
    )
    if isinstance(action, switches):
        return "on" if value else "off"
    if value is None or value == [] or value == "":
        return "—"
    return f"`{value}`"


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    if not action.help or action.help is argparse.SUPPRESS:
        return ""
    text = parser._get_formatter()._expand_help(action)
    if action.option_strings:
        text = text.replace(f"[env {cli.environment_name(action)}]", "")
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        listed = ", ".join(map(str, action.choices))
        if listed not in text:
            text = f"{text} (one of: {listed})".strip()
    return _cell(text.replace(str(Path.home()), "~"))


def command_flags(parser: argparse.ArgumentParser) -> list[Flag]:
    """The rows for one command: its arguments and flags, ``--help`` left out."""
    parent = parser.prog.rsplit(" ", 1)[0]
    has_env = {id(a) for a in cli._options(parser) if a.default is not argparse.SUPPRESS}
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.option_strings:
            names = ", ".join(action.option_strings)
            if isinstance(action, argparse.BooleanOptionalAction):
                names = " / ".join(action.option_strings)
            elif action.nargs != 0:
                names += f" {action.metavar or action.dest.upper()}"
        else:
            names = str(action.metavar or action.dest.upper())
        env = cli.environment_name(action) if id(action) in has_env else ""
        default = "—" if not action.option_strings else _default(action, parent)
        if action.required:
            default = "required"
        rows.append(Flag(names, env, default, _help(action, parser)))
    return rows


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(dict.fromkeys(action.choices))
    return []


def commands_section() -> list[str]:
    root = cli.build_parser({}, prog="nodelock")
    lines = [
        "## Commands",
        "",
        "Every flag of every `nodelock` command (also run as `kubectl nodelock`). "
        + cli.PRECEDENCE
        + " `--help`, `--version` and `--yes` have no variable.",
        "",
    ]
    for parser in _parser_tree(root):
        lines += [f"### `{parser.prog}`", ""]
        if parser.description:
            lines += [_cell(parser.description.split("\n\n")[0]), ""]
        subs = _subcommands(parser)
        if subs:
            lines += ["Subcommands: " + ", ".join(f"`{parser.prog} {s}`" for s in subs) + ".", ""]
        rows = command_flags(parser)
        lines += [
            "| flag | environment variable | default | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for row in rows:
            env = f"`{row.env}`" if row.env else "—"
            lines.append(f"| `{row.names}` | {env} | {row.default} | {row.help} |")
        lines.append("")
    return lines


def _type(node: JSON) -> str:
    kind = node.get("type", "any")
    text = " or ".join(kind) if isinstance(kind, list) else str(kind)
    if "enum" in node:
        text += ": " + ", ".join(f"`{v}`" for v in node["enum"])
    return text


def chart_values(schema: JSON, values: Mapping[str, Any]) -> list[ChartValue]:
    """Every leaf of the schema (an object with declared properties is opened, anything else is
    one value), with its default from ``values``."""
    rows: list[ChartValue] = []

    def walk(path: list[str], node: JSON, default: Any) -> None:
        props = node.get("properties")
        if props and node.get("type") == "object":
            for key, child in props.items():
                inner = default.get(key) if isinstance(default, Mapping) else None
                walk([*path, key], child, inner)
            return
        shown = "`" + json.dumps(default, sort_keys=False) + "`"
        rows.append(
            ChartValue(
                path=".".join(path),
                type=_type(node),
                default=_cell(shown),
                description=_cell(str(node.get("description", ""))),
            )
        )

    walk([], schema, values)
    return rows


def load_chart() -> tuple[JSON, Mapping[str, Any]]:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text()) or {}
    return schema, values


def chart_section() -> list[str]:
    schema, values = load_chart()
    lines = [
        "## Chart values",
        "",
        "Every value of the Helm chart (`deploy/helm/nodelock`): its type and description from "
        "`values.schema.json`, its default from `values.yaml`. Set them with `--set` or "
        "`--values`; a value the schema does not know fails `helm install`. How to install: "
        "[install.md](install.md).",
        "",
        "| value | type | default | description |",
        "| --- | --- | --- | --- |",
    ]
    for row in chart_values(schema, values):
        lines.append(f"| `{row.path}` | {row.type} | {row.default} | {row.description} |")
    lines.append("")
    return lines


@contextlib.contextmanager
def documented_environment() -> Iterator[None]:
    """The process environment without what changes the parsers' defaults (``XDG_CACHE_HOME``
    and every ``NODELOCK_*`` variable), restored afterwards: the reference shows the defaults a
    user without them gets, whatever the environment it is generated or checked in."""
    saved = {
        k: v for k, v in os.environ.items() if k == "XDG_CACHE_HOME" or k.startswith("NODELOCK_")
    }
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


def render() -> str:
    with documented_environment():
        return _render()


def _render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m nodelock.reference` (`make generate`) from the commands' "
        "argument parsers and deploy/helm/nodelock/values.schema.json; do not edit by hand. -->",
        "",
        *commands_section(),
        *chart_section(),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodelock.reference", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where to write")
    args = parser.parse_args(argv)
    text = render()
    current = args.output.read_text() if args.output.exists() else None
    if args.check:
        if current != text:
            print(f"stale: {args.output}; run `make generate`", file=sys.stderr)
            return 1
        return 0
    if current != text:
        args.output.write_text(text)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
