"""``nodelock --version`` and the build info: version from the package metadata, the commit of
the checkout, ``unknown`` where there is none."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from prometheus_client import CollectorRegistry

from kube.build import BuildInfo, build_info, git_commit, register_build_info

REPO_ROOT = Path(__file__).resolve().parents[2]


def head_commit() -> str | None:
    if shutil.which("git") is None:
        return None
    done = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() if done.returncode == 0 else None


def test_nodelock_version_prints_version_and_commit() -> None:
    for argv in (["--version"], ["extender", "--version"], ["locks", "show", "--version"]):
        done = subprocess.run(
            [sys.executable, "-m", "nodelock.cli", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert done.returncode == 0, done.stderr
        line = done.stdout.strip()
        assert line.startswith(f"nodelock {metadata.version('nodelock')} (commit ")
        commit = head_commit()
        if commit is not None:
            assert f"(commit {commit}," in line
        assert re.search(r"kubernetes_asyncio \d", line)


def test_not_a_checkout_of_this_code_is_unknown(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == "unknown"
    # a directory inside a checkout that does not hold these modules at its top
    assert git_commit(REPO_ROOT / "docs") == "unknown"


def test_the_gauge_carries_the_build_and_registers_once() -> None:
    registry = CollectorRegistry()
    info = BuildInfo("1.2.3", "abc1234", "3.11.7", "36.1.0")
    register_build_info(registry, info)
    register_build_info(registry, info)
    labels = {"version": "1.2.3", "commit": "abc1234", "python": "3.11.7"}
    value = registry.get_sample_value(
        "nodelock_build_info", {**labels, "kubernetes_client": "36.1.0"}
    )
    assert value == 1


def test_build_info_is_computed_once() -> None:
    assert build_info() is build_info()
