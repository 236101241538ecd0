"""Start, track and stop the processes of a devcluster, surviving the command that started them.

Each component runs in its own session (process group) with its output in ``<state>/logs``; its
pid and kernel start time are recorded in ``<state>/state.json``, so ``stop`` never signals a
process that merely reused the pid.  ``stop`` sends SIGTERM to the whole group, waits, then
SIGKILLs what is left: no process of ours outlives ``down``.

Profiling (off unless asked): with ``NODELOCK_PROFILE_DIR`` set in the environment of ``spawn``,
every Python component (this interpreter, or a script beside it such as ``nodelock``) runs under
``python -m devcluster.processes --profiled``, which installs two signal handlers and then runs
the program unchanged: ``SIGUSR1`` starts a fresh cProfile of the main thread (where the
component's event loop runs), timed by that thread's CPU clock, ``SIGUSR2`` stops it and writes
``$NODELOCK_PROFILE_DIR/<name>.<pid>.<n>.pstats`` (``n`` counts the dumps of that process).  The
recorded command line stays the unwrapped one, so a restart wraps it afresh.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devcluster.errors import DevclusterError


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Inside the block, SIGTERM raises ``SystemExit(143)`` in the main thread, so ``finally``
    blocks and context managers run (a cluster is stopped) as they do on Ctrl-C; the previous
    handler comes back after it.  Outside the main thread it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class Proc:
    """A started component: how it was started and how to find it again."""

    name: str
    argv: list[str]
    pid: int
    start_ticks: int
    log: str
    env: dict[str, str] = field(default_factory=dict)


def _start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces; fields after the last ')' are fixed
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def alive(proc: Proc) -> bool:
    """Whether the recorded process still runs (same pid and same start time)."""
    return _start_ticks(proc.pid) == proc.start_ticks


def process_table() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of ``/proc/<pid>/stat`` after the command name: state, ppid, pgid, ...)
    of every process this moment; one that ends while read is left out."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        yield int(entry.name), stat[stat.rindex(")") + 2 :].split()


def in_private_mounts(script: str, *args: str) -> list[str]:
    """``sh -c script args...`` in a mount namespace of its own whose mounts propagate nowhere
    (``unshare --mount --propagation private``): what a node harness binds there stays its own."""
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, *args]


def group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes in process group ``pgid``."""
    return [pid for pid, f in process_table() if f[0] != "Z" and int(f[2]) == pgid]


PROFILE_DIR_ENV = "NODELOCK_PROFILE_DIR"  # set: Python components run under the profile hook
PROFILE_NAME_ENV = "NODELOCK_PROFILE_NAME"  # the component's name, for its profile files


def _is_python(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs a module with this interpreter (``-m``), or a script installed
    beside it (``nodelock``)."""
    exe = Path(sys.executable)
    first = Path(argv[0]) if argv else Path()
    if first == exe:
        return len(argv) >= 3 and argv[1] == "-m"
    return first.parent == exe.parent and not first.name.startswith("python")


def profiled_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` run under the profile hook (``run_profiled``)."""
    return [sys.executable, "-m", "devcluster.processes", "--profiled", *argv]


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """Start ``argv`` in a new session, output appended to ``<log_dir>/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    full_env = dict(os.environ)
    full_env.update(env or {})
    command = list(argv)
    if full_env.get(PROFILE_DIR_ENV) and _is_python(command):
        command = profiled_argv(command)
        full_env[PROFILE_NAME_ENV] = name
    with log_path.open("ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {name}\n".encode())
        log.flush()
        try:
            popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise DevclusterError(f"could not start {name} ({argv[0]}): {exc}") from exc
    ticks = _start_ticks(popen.pid) or 0
    return Proc(name, list(argv), popen.pid, ticks, str(log_path), dict(env or {}))


def stop(proc: Proc, *, timeout_s: float = 15.0) -> None:
    """Stop a component and everything in its process group; SIGKILL after ``timeout_s``."""
    if alive(proc):
        pgid = proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap()
        if not group_members(proc.pid):
            return
        time.sleep(0.05)
    for pid in group_members(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        _reap()
        if not group_members(proc.pid):
            return
        time.sleep(0.05)


def _reap() -> None:
    """Collect exited children of this process, if any (they would stay zombies otherwise)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def log_tail(proc: Proc, lines: int = 20) -> str:
    """The last lines of a component's log."""
    try:
        text = Path(proc.log).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


_RECENT_PORTS = 256
_handed_ports: collections.deque[int] = collections.deque(maxlen=_RECENT_PORTS)
_handed_lock = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that this process has not
    handed out among its last 256 answers.

    The kernel may give the port it just freed again (seen on Linux: two calls in a row, before
    the first port's component listened, returned the same port), so answers are remembered and
    a repeat is held bound while the kernel is asked for another."""
    with _handed_lock, contextlib.ExitStack() as held:
        while True:
            s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
            if port not in _handed_ports:
                _handed_ports.append(port)
                return port


def check_port_free(port: int, what: str) -> None:
    """Raise a DevclusterError naming the port when something already listens on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise DevclusterError(
                f"port {port} on 127.0.0.1, asked for {what}, is already in use ({exc.strerror}); "
                "choose another port or leave it out to pick a free one"
            ) from exc


class StateFile:
    """``<state>/state.json``: the components of one devcluster and its settings."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"components": {}, "settings": {}}
        except ValueError as exc:
            raise DevclusterError(
                f"{self.path} is not valid JSON ({exc}); stop any leftover processes and remove it"
            ) from exc
        data.setdefault("components", {})
        data.setdefault("settings", {})
        return data

    def save(self, data: Mapping[str, Any]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)

    def procs(self) -> dict[str, Proc]:
        return {n: Proc(**p) for n, p in self.load()["components"].items()}

    def put(self, proc: Proc) -> None:
        data = self.load()
        data["components"][proc.name] = asdict(proc)
        self.save(data)

    def remove(self, name: str) -> None:
        data = self.load()
        data["components"].pop(name, None)
        self.save(data)


def run_profiled(argv: Sequence[str]) -> None:
    """Run the Python program ``argv`` (a script path, or this interpreter with ``-m MODULE``)
    in this process, profiled between ``SIGUSR1`` and ``SIGUSR2`` (module docstring)."""
    import cProfile
    import runpy

    out_dir = Path(os.environ.get(PROFILE_DIR_ENV) or ".")
    name = os.environ.get(PROFILE_NAME_ENV) or Path(argv[0]).name
    current: list[cProfile.Profile] = []
    dumps = 0

    def start(_signum: int, _frame: object) -> None:
        if current:
            current.pop().disable()
        profile = cProfile.Profile(time.thread_time)  # CPU time: waiting counts nothing
        current.append(profile)
        profile.enable()

    def dump(_signum: int, _frame: object) -> None:
        nonlocal dumps
        if not current:
            return
        profile = current.pop()
        profile.disable()
        dumps += 1
        target = out_dir / f"{name}.{os.getpid()}.{dumps}.pstats"
        tmp = target.with_suffix(".tmp")
        profile.dump_stats(tmp)
        os.replace(tmp, target)  # whoever waits for the file sees it whole

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, dump)
    if len(argv) >= 3 and Path(argv[0]) == Path(sys.executable) and argv[1] == "-m":
        sys.argv = [argv[2], *argv[3:]]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--profiled":
        raise SystemExit("usage: python -m devcluster.processes --profiled PROGRAM [ARGS...]")
    run_profiled(sys.argv[2:])
