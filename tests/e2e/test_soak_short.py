"""The short fault campaign CI runs (``python -m bench.soak``, fixed seed), and the campaign's
checker seen failing on a planted bug.

Each test runs the campaign as its own process, with a devcluster of its own (two extender
replicas, four GPU nodes: whole GPUs, shared GPUs, a MIG GPU), and reads what it wrote in
``soak.json``.  The short campaign's nodes are real kubelets (containers faked); the planted bug's
are simulated kubelets, so the checker is seen reading both kinds of kubelet record.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def campaign(tmp_path: Path, *args: str, timeout_s: float) -> tuple[int, str, dict[str, Any]]:
    res = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--results-dir", str(tmp_path), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    out = res.stdout + res.stderr
    written = sorted(tmp_path.glob("soak*.json"))
    assert written, out[-3000:]
    return res.returncode, out, json.loads(written[0].read_text())


def test_short_campaign_finds_no_violation(tmp_path: Path) -> None:
    rc, out, result = campaign(tmp_path, "--minutes", "2.5", "--seed", "7", timeout_s=900)
    assert result["violations"] == [], out[-6000:]
    assert rc == 0, out[-3000:]
    assert result["kubelet"] == "real"
    assert result["faults"]["injected"] >= 20, result["faults"]
    assert result["faults"]["kinds"] >= 6, result["faults"]
    assert result["pods"]["ran"] >= 50, result["pods"]
    assert result["samples"] >= 100
    assert result["audit"]["disagreements"] == 0
    assert result["probes_ran_s"] is not None
    assert result["leaks"] == []
    assert f"faults injected: {result['faults']['injected']}" in out


def test_a_planted_bug_is_reported_with_its_history(tmp_path: Path) -> None:
    """Halfway through, a running pod's assignment is rewritten to a device kubelet did not give
    it: the checker reports S2 for that pod, with the plant in the events before it."""
    rc, out, result = campaign(
        tmp_path,
        *("--minutes", "1", "--seed", "3", "--plant", "edit-assignment", "--kubelet", "sim"),
        timeout_s=600,
    )
    assert rc == 1, out[-3000:]
    planted = [line for line in out.splitlines() if " plant " in line]
    assert len(planted) == 1, out[-3000:]
    pod = planted[0].split("plant")[1].split(":")[0].strip()
    s2 = [v for v in result["violations"] if v["invariant"] == "S2" and pod in v["message"]]
    assert s2, result["violations"]
    assert any("plant: " + pod in line for line in s2[0]["history"]), s2[0]["history"]
    assert any(line.startswith(f"{pod}: ") for line in s2[0]["history"]), s2[0]["history"]
