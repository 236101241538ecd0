"""The fault campaign's schedule is fixed by its seed, covers the kinds of fault it names, and
heals within the run; ``make soak`` runs after the binaries are built."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from bench.soak_nemesis import KINDS, WEIGHTS, schedule

NODES = ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
REPLICAS = ["extender-0", "extender-1"]
REPO = Path(__file__).resolve().parents[2]


def three_minutes(seed: int) -> list[object]:
    return list(schedule(seed, run_s=180, nodes=NODES, replicas=REPLICAS, lease_s=5))


def test_the_seed_fixes_the_schedule() -> None:
    assert three_minutes(7) == three_minutes(7)
    assert three_minutes(7) != three_minutes(8)


def test_a_short_campaign_schedules_many_faults_of_many_kinds() -> None:
    faults = schedule(7, run_s=180, nodes=NODES, replicas=REPLICAS, lease_s=5)
    assert len(faults) >= 25
    assert len({f.kind for f in faults}) >= 8
    assert [f.at for f in faults] == sorted(f.at for f in faults)
    assert all(f.at > 0 and f.at + f.duration_s <= 180 for f in faults)


def test_every_kind_can_be_drawn_and_targets_what_it_names() -> None:
    assert set(WEIGHTS) == set(KINDS)
    faults = [
        f
        for seed in range(20)
        for f in schedule(seed, run_s=600, nodes=NODES, replicas=REPLICAS, lease_s=5)
    ]
    assert {f.kind for f in faults} == set(KINDS)
    for f in faults:
        if f.kind == "pause" and f.at + f.duration_s < 600:  # not cut by the run's end
            assert f.duration_s > 5  # past a lock's duration
        if f.kind in ("plugin-kill", "slow-allocate"):
            assert f.target.startswith("deviceplugin-gpu-node-")
        if f.kind.startswith("kubelet-kill"):
            assert f.target.startswith("kubelet-gpu-node-")
        if f.kind == "extender-kill":
            assert f.target in REPLICAS
        if f.kind == "slow-allocate":
            seconds = float(f.detail.removeprefix("allocate.start=sleep:"))
            assert seconds > 5


def test_make_soak_runs_after_the_binaries_are_built() -> None:
    make = shutil.which("make")
    assert make is not None
    lines = subprocess.run(
        [make, "-n", "-B", "--no-print-directory", "soak"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.splitlines()
    build = next(i for i, line in enumerate(lines) if "nodelock devcluster build" in line)
    soak = next(i for i, line in enumerate(lines) if "-m bench.soak" in line)
    assert build < soak
