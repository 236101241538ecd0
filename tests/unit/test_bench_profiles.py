"""``bench.handoff --profile``'s hook: a Python component spawned with NODELOCK_PROFILE_DIR
runs unchanged and writes a cProfile of what it did between SIGUSR1 and SIGUSR2."""

import os
import pstats
import signal
import sys
import time
from pathlib import Path

from bench.profiles import kind_of, summary
from devcluster import processes

PROGRAM = """\
import time
from pathlib import Path

def busy_step():
    return sum(i * i for i in range(2000))

Path(__file__).with_name("started").write_text("yes")
while True:
    busy_step()
    time.sleep(0.001)
"""


def wait_for(predicate, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_hooked_component_writes_the_profile_of_what_it_ran_between_the_signals(
    tmp_path: Path,
) -> None:
    (tmp_path / "busyprog.py").write_text(PROGRAM)
    out = tmp_path / "profiles"
    out.mkdir()
    env = {"PYTHONPATH": str(tmp_path), processes.PROFILE_DIR_ENV: str(out)}
    proc = processes.spawn(
        "deviceplugin-gpu-node-0",
        [sys.executable, "-m", "busyprog"],
        log_dir=tmp_path / "logs",
        env=env,
    )
    try:
        assert proc.argv == [sys.executable, "-m", "busyprog"]  # recorded unwrapped
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"--profiled" in cmdline
        assert wait_for((tmp_path / "started").exists), processes.log_tail(proc)
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGUSR2)
        written = out / f"deviceplugin-gpu-node-0.{proc.pid}.1.pstats"
        assert wait_for(written.exists), processes.log_tail(proc)
        assert processes.alive(proc)  # the signals did not end it
        functions = {name for _, _, name in pstats.Stats(str(written)).stats}  # type: ignore[attr-defined]
        assert "busy_step" in functions
        text = summary([written], missing=["extender"])
        assert "===== deviceplugin: 1 process(es)" in text
        assert "busy_step" in text
        assert "no profile written by: extender" in text
    finally:
        processes.stop(proc)


def test_without_the_variable_nothing_is_wrapped(tmp_path: Path) -> None:
    (tmp_path / "busyprog.py").write_text(PROGRAM)
    env = {"PYTHONPATH": str(tmp_path), processes.PROFILE_DIR_ENV: ""}
    proc = processes.spawn(
        "extender", [sys.executable, "-m", "busyprog"], log_dir=tmp_path / "logs", env=env
    )
    try:
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"--profiled" not in cmdline
        assert b"busyprog" in cmdline
    finally:
        processes.stop(proc)


def test_kinds_group_the_nodes_and_replicas() -> None:
    assert kind_of("deviceplugin-gpu-node-12") == "deviceplugin"
    assert kind_of("extender-1") == "extender"
    assert kind_of("extender") == "extender"
