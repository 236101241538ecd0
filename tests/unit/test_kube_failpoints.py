"""Failpoints: a misspelt name or an action its call site cannot take is refused when the
variable is parsed, every call site names a declared failpoint, and a firing failpoint says so."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kube import failpoints
from kube.failpoints import KNOWN, Action, BadFailpoint, parse

ROOT = Path(__file__).parents[2]
PACKAGES = ("kube", "lockd", "handoff", "scheduler_ext", "deviceplugin", "devcluster", "nodelock")


def test_parse_reads_names_and_actions() -> None:
    assert parse("") == {}
    assert parse(" bind.after-acquire , allocate.start=sleep:2.5,") == {
        "bind.after-acquire": "exit",
        "allocate.start": "sleep:2.5",
    }
    assert parse("allocate.after-checkpoint=exit") == {"allocate.after-checkpoint": "exit"}


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("bind.after-aquire", "unknown failpoint 'bind.after-aquire'; known: allocate."),
        ("bind.after-acquire,allocate.strat=sleep:1", "unknown failpoint 'allocate.strat'"),
        ("bind.after-binding=sleep:3", "'bind.after-binding' can only exit, not 'sleep:3'"),
        ("allocate.start", "'allocate.start' takes sleep:SECONDS (seconds >= 0), not 'exit'"),
        ("allocate.start=sleep:soon", "not 'sleep:soon'"),
        ("allocate.start=sleep:-1", "not 'sleep:-1'"),
    ],
)
def test_a_misspelt_failpoint_or_action_is_refused(raw: str, says: str) -> None:
    with pytest.raises(BadFailpoint, match="NODELOCK_FAILPOINTS") as err:
        parse(raw)
    assert says in str(err.value)


def _calls(kind: str) -> set[tuple[str, str]]:
    """(file, name) of every ``failpoints.<kind>("name")`` call in the product's packages."""
    found: set[tuple[str, str]] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == kind
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "failpoints"
                ):
                    arg = node.args[0]
                    assert isinstance(arg, ast.Constant), f"{path}: a failpoint name not literal"
                    found.add((str(path.relative_to(ROOT)), str(arg.value)))
    return found


def test_every_call_site_names_a_declared_failpoint_and_every_declared_one_is_used() -> None:
    hits, pauses = _calls("hit"), _calls("pause")
    assert {name for _, name in hits} == {n for n, a in KNOWN.items() if a is Action.EXIT}, hits
    assert {name for _, name in pauses} == {n for n, a in KNOWN.items() if a is Action.SLEEP}
    assert len(hits) + len(pauses) == len(KNOWN)  # one call site each


async def test_an_undeclared_name_at_a_call_site_is_refused() -> None:
    with pytest.raises(BadFailpoint, match="not declared"):
        failpoints.hit("bind.after-aquire")
    with pytest.raises(BadFailpoint, match="not declared"):
        failpoints.hit("allocate.start")  # declared, but as a sleep
    with pytest.raises(BadFailpoint, match="not declared"):
        await failpoints.pause("bind.after-acquire")


def _python(code: str, env_value: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NODELOCK_FAILPOINTS": env_value, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_process_given_a_misspelt_failpoint_stops_at_its_start() -> None:
    done = _python("import kube.failpoints; print('started')", "bind.after-aquire")
    assert done.returncode != 0
    assert "started" not in done.stdout
    assert "unknown failpoint 'bind.after-aquire'" in done.stderr


def test_an_active_failpoint_logs_its_line_then_exits_like_a_kill() -> None:
    code = "from kube import failpoints; failpoints.hit('bind.after-binding'); print('survived')"
    done = _python(code, "bind.after-binding")
    assert done.returncode == failpoints.EXIT_CODE
    assert done.stdout == ""
    assert done.stderr == "nodelock failpoint bind.after-binding: exiting now\n"
    inactive = _python(code, "bind.after-acquire")  # another point is active: this one passes
    assert (inactive.returncode, inactive.stdout) == (0, "survived\n")
