"""``bench.handoff --profile``'s hook: a Python component spawned with NODELOCK_PROFILE_DIR
runs unchanged and writes a cProfile of what it did between SIGUSR1 and SIGUSR2."""

import os
import pstats
import signal
import sys
import time
from pathlib import Path

from bench.profiles import kind_of, place, share_lines, shares, summary
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


def exec_done_cmdline(proc: processes.Proc, started: Path) -> list[bytes]:
    """The command line of ``proc`` once its program runs (it wrote ``started``).

    Popen returns when the child's close-on-exec pipe closes, which the kernel does in
    ``begin_new_exec`` before ``create_elf_tables`` sets the new argument area, so a read right
    after spawn can see an empty command line (fs/exec.c, fs/binfmt_elf.c)."""
    assert wait_for(started.exists), processes.log_tail(proc)
    return Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")


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
        assert b"--profiled" in exec_done_cmdline(proc, tmp_path / "started")
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
        cmdline = exec_done_cmdline(proc, tmp_path / "started")
        assert b"--profiled" not in cmdline
        assert b"busyprog" in cmdline
    finally:
        processes.stop(proc)


def test_kinds_group_the_nodes_and_replicas() -> None:
    assert kind_of("deviceplugin-gpu-node-12") == "deviceplugin"
    assert kind_of("extender-1") == "extender"
    assert kind_of("extender") == "extender"


REPO = Path("/src/nodelock")
SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"


def test_each_profiled_function_is_placed_by_the_kind_of_code_it_is() -> None:
    assert place((f"{REPO}/deviceplugin/admission.py", 10, "allocate"), repo=REPO) == (
        "nodelock deviceplugin"
    )
    assert place((f"{SITE}/aiohttp/client.py", 5, "_request"), repo=REPO) == "library aiohttp"
    assert place((f"{STDLIB}/asyncio/base_events.py", 1, "_run_once"), repo=REPO) == "event loop"
    assert place((f"{STDLIB}/selectors.py", 1, "select"), repo=REPO) == "event loop"
    assert place((f"{STDLIB}/logging/__init__.py", 1, "info"), repo=REPO) == "stdlib logging"
    assert place((f"{STDLIB}/dataclasses.py", 1, "replace"), repo=REPO) == "stdlib dataclasses"
    assert place(("~", 0, "<method 'poll' of 'select.epoll' objects>"), repo=REPO) == "event loop"
    assert place(("~", 0, "<method 'run' of '_contextvars.Context' objects>"), repo=REPO) == (
        "event loop"
    )
    assert place(("~", 0, "<method 'read' of '_ssl._SSLSocket' objects>"), repo=REPO) == (
        "C _ssl._SSLSocket.read"
    )
    assert place(("~", 0, "<built-in method orjson.loads>"), repo=REPO) == "C orjson.loads"


def test_shares_add_the_functions_own_time_per_kind_largest_first() -> None:
    stats: dict[tuple[str, int, str], tuple[object, ...]] = {
        (f"{REPO}/lockd/locks.py", 1, "acquire"): (1, 1, 0.25, 0.9, {}),
        (f"{REPO}/lockd/lease.py", 1, "parse"): (1, 1, 0.25, 0.3, {}),
        (f"{STDLIB}/asyncio/events.py", 1, "_run"): (1, 1, 0.375, 1.0, {}),
        (f"{SITE}/grpc/aio/_call.py", 1, "_invoke"): (1, 1, 0.125, 0.2, {}),
    }
    got = shares(stats, repo=REPO)
    assert got == {"nodelock lockd": 0.5, "event loop": 0.375, "library grpc": 0.125}
    assert list(got) == ["nodelock lockd", "event loop", "library grpc"]
    assert shares({}, repo=REPO) == {}
    text = share_lines(got)
    assert text.startswith("where the time went: nodelock 50%  event loop 38%  library 12%\n")
    assert " 50.0%  nodelock lockd\n" in text
