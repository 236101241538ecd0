"""Every committed generated file is what ``make generate`` writes.

``make generate`` regenerates the gRPC stubs (``proto/``), the Grafana dashboards
(``dashboards/*.json``), the chart's alert rules and the plain manifests rendered from the chart
(``deploy/manifests``, ``devcluster/admission.yaml``).  The test runs the same Makefile target on
a copy of the repository's files and fails, naming them, when any file it writes or removes
differs from the committed one.  It needs Helm (built once into the cache, like the other
binaries).
"""

from __future__ import annotations

import filecmp
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devcluster.helm import ensure_helm

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def _tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [p for p in out.split("\0") if p and (REPO_ROOT / p).is_file()]


def test_make_generate_changes_no_committed_file(tmp_path: Path) -> None:
    ensure_helm()  # built (or verified) here, so the make run below does not build it
    copy = tmp_path / "repo"
    files = _tracked()
    for rel in files:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / rel, copy / rel)
    done = subprocess.run(
        ["make", "--no-print-directory", "generated-files", f"BIN={Path(sys.executable).parent}"],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    changed = [rel for rel in files if not (copy / rel).exists()]
    changed += [
        rel
        for rel in files
        if (copy / rel).exists() and not filecmp.cmp(REPO_ROOT / rel, copy / rel, shallow=False)
    ]
    known = set(files)
    added = [
        str(p.relative_to(copy))
        for p in copy.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and str(p.relative_to(copy)) not in known
    ]
    hint = "run `make generate` and commit the result"
    assert changed == [], f"`make generate` would change {changed}; {hint}"
    assert added == [], f"`make generate` would add {added}; {hint}"
