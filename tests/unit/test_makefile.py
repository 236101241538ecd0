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
    """The oldest release is built beside the suite, not before it: the core tests on it run
    after its build in the same background job, which starts before the cluster suite; the unit
    tests run beside both; the target fails when any of the three runs fails."""
    lines = dry_run("test")
    built = first(lines, f"{FETCH} --kubernetes-version oldest")
    again = first(lines, "-m core --kubernetes-version oldest")
    units = first(lines, "bin/pytest -p no:cacheprovider tests/unit")
    suite = first(lines, "bin/pytest --ignore=tests/unit; suite=$?")
    assert built < again < units < suite
    assert "&& \\" in lines[built], "the core run must wait for the build to succeed"
    assert "tests/shipped" in lines[again]
    assert "test $suite -eq 0 && test $units -eq 0 && test $core -eq 0" in lines[-1]


def test_the_oldest_release_is_not_built_before_the_suite() -> None:
    """The set-up steps before the test runs build only the default release; the oldest one's
    build runs in the background job that the cluster suite does not wait for."""
    lines = dry_run("test")
    recipe = first(lines, "mktemp /tmp/nodelock-core-oldest")
    assert [line for line in lines[:recipe] if "--kubernetes-version oldest" in line] == []
    job = first(lines, f"{FETCH} --kubernetes-version oldest")
    assert "& opid=$!" in lines[job + 1]
