"""``devcluster.processes.sigterm_unwinds``: a SIGTERM runs the ``finally`` blocks (a throwaway
cluster is stopped) instead of ending the interpreter where it stands."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PROGRAM = """
import sys, time
from pathlib import Path
from devcluster.processes import sigterm_unwinds
mark = Path(sys.argv[1])
with {guard}:
    try:
        mark.write_text("inside")
        time.sleep(60)
    finally:
        mark.write_text("cleaned up")
"""


def _terminated(tmp_path: Path, guard: str) -> tuple[int, str]:
    mark = tmp_path / "mark"
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM.format(guard=guard), str(mark)], cwd=REPO
    )
    deadline = time.monotonic() + 30
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30), mark.read_text()


def test_sigterm_runs_the_finally_blocks(tmp_path: Path) -> None:
    assert _terminated(tmp_path, "sigterm_unwinds()") == (143, "cleaned up")


def test_without_it_sigterm_skips_them(tmp_path: Path) -> None:
    """The default disposition: what ``throwaway_cluster`` did before, its cluster left up."""
    assert _terminated(tmp_path, "__import__('contextlib').nullcontext()") == (-15, "inside")


def test_the_previous_handler_comes_back() -> None:
    from devcluster.processes import sigterm_unwinds

    before = signal.getsignal(signal.SIGTERM)
    with sigterm_unwinds():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
