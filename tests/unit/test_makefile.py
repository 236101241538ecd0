"""The Makefile's order on a new machine: nothing offline runs before the step that fetches.

``go vet`` and ``go test`` of the harness type-check it against the Go module cache, which only
``nodelock devcluster build`` (the ``binaries`` target) fills on a machine that never built the
project. ``make -n TARGET`` prints the recipes of TARGET and of every prerequisite it depends on,
prerequisites first; a recipe that is not a prerequisite is absent. So the fetch step appearing
before ``go vet`` in ``make -n go-check`` means go-check depends on it, which ``make -j`` honours
too. The Makefile in which go-check ran with no such dependency fails here.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FETCH = "nodelock devcluster build"


def dry_run(target: str) -> list[str]:
    """The recipe lines ``make -n -B target`` would run, in order (-B: as on a new machine)."""
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is not on PATH, and the README's two commands need it")
    out = subprocess.run(
        [make, "-n", "-B", "--no-print-directory", target],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return out.splitlines()


def first(lines: list[str], needle: str) -> int:
    hits = [i for i, line in enumerate(lines) if needle in line]
    assert hits, f"no recipe line runs {needle!r}:\n" + "\n".join(lines)
    return hits[0]


@pytest.mark.parametrize("offline", ["go vet", "go test"])
def test_the_go_checks_run_only_after_the_modules_are_fetched(offline: str) -> None:
    lines = dry_run("go-check")
    assert first(lines, FETCH) < first(lines, offline)


def test_the_tests_run_after_every_set_up_step() -> None:
    lines = dry_run("test")
    pytest_at = first(lines, "bin/pytest")
    for step in (FETCH, "go vet", "compileall", "pip install", "dpkg -s"):
        assert first(lines, step) < pytest_at, step


def test_the_demo_builds_nothing_of_the_oldest_release() -> None:
    """``nodelock demo`` builds what it runs itself (``ensure_control_plane``, the harness); the
    oldest release, which only ``make test`` runs, is minutes of a newcomer's first demo."""
    lines = dry_run("demo")
    assert first(lines, "pip install") < first(lines, "bin/nodelock demo")
    assert [line for line in lines if "oldest" in line] == []


def test_the_core_runs_again_on_the_oldest_release_after_it_is_built() -> None:
    """The core tests on the oldest release run beside the suite, after both releases are
    built, and the target fails when either run fails."""
    lines = dry_run("test")
    built = first(lines, f"{FETCH} --kubernetes-version oldest")
    again = first(lines, "-m core --kubernetes-version oldest")
    suite = first(lines, "bin/pytest; suite=$?")
    assert built < again < suite
    assert "test $suite -eq 0 && test $core -eq 0" in lines[-1]
