"""``bench.handoff --profile``: a cProfile of each of nodelock's processes per phase.

The cluster's Python components run under ``devcluster.processes``' profile hook when
``NODELOCK_PROFILE_DIR`` is set as the cluster starts; ``start`` sends each of them ``SIGUSR1``
(a fresh profile) as a burst begins and ``collect`` sends ``SIGUSR2`` (stop and write) after it,
then moves each process's file to ``<dest>/<component>.pstats`` and writes ``<dest>/top.txt``:
per kind of component (all device plugins together), where its main thread's time went by kind
of code (``shares``: nodelock's own modules, the asyncio event loop, each library, the rest of
the standard library) and the functions that used the most time.

Profiling slows what it profiles (every Python call is recorded): the CPU figures of a
``--profile`` run are not comparable with those of a plain run, only its shares are.
"""

from __future__ import annotations

import io
import os
import pstats
import re
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from devcluster.cluster import Cluster
from devcluster.processes import PROFILE_DIR_ENV

PROFILED_KINDS = ("extender", "deviceplugin", "stockplugin")  # nodelock's processes, and stock's
REPO = Path(__file__).resolve().parent.parent
# the asyncio event loop's own work: scheduling, polling, and the C code a callback runs without
# a Python frame of its own (``Context.run``'s own time: grpc's Cython among it)
EVENT_LOOP_BUILTINS = ("select.epoll", "_contextvars.Context")
FuncKey = tuple[str, int, str]  # pstats' (file, line, function)


def kind_of(name: str) -> str:
    """``deviceplugin-gpu-node-3`` -> ``deviceplugin``; ``extender-1`` -> ``extender``."""
    return re.sub(r"-(gpu-node-\d+|\d+)$", "", name)


def _hooked(cluster: Cluster) -> dict[str, int]:
    """The components running under the profile hook, by name: pid."""
    out = {}
    for name, proc in cluster.state.procs().items():
        if kind_of(name) not in PROFILED_KINDS:
            continue
        try:
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--profiled" in cmdline:
            out[name] = proc.pid
    return out


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of each thread of ``pid``, by thread name (threads of one name
    summed; the main thread is named after the program)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        name = "main" if task.name == str(pid) else re.sub(r"[_-]?\d+$", "", name)
        fields = stat[stat.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


_threads_at_start: dict[int, dict[str, float]] = {}


def start(cluster: Cluster) -> int:
    """A fresh profile in every hooked component (and a reading of its threads' CPU); how
    many."""
    hooked = _hooked(cluster)
    _threads_at_start.clear()
    for pid in hooked.values():
        _threads_at_start[pid] = thread_cpu(pid)
        os.kill(pid, signal.SIGUSR1)
    return len(hooked)


def thread_lines(deltas: dict[str, dict[str, float]]) -> str:
    """Per kind of component, the CPU seconds its threads used between ``start`` and
    ``collect`` (cProfile sees the main thread only; this says what it missed)."""
    out = []
    for kind, threads in sorted(deltas.items()):
        cells = "  ".join(
            f"{k} {v:.2f}" for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v > 0
        )
        out.append(f"threads' CPU s, {kind}: {cells}\n")
    return "".join(out)


def collect(cluster: Cluster, dest: Path, *, timeout_s: float = 20.0) -> list[Path]:
    """Stop every hooked component's profile, move the files to ``dest`` and summarise them in
    ``dest/top.txt``; returns the files (a component that wrote none in ``timeout_s`` is left
    out, and named in ``top.txt``)."""
    source = Path(os.environ[PROFILE_DIR_ENV])
    hooked = _hooked(cluster)
    before = {p: p.stat().st_mtime for p in source.glob("*.pstats")}
    deltas: dict[str, dict[str, float]] = {}
    for name, pid in hooked.items():
        now, then = thread_cpu(pid), _threads_at_start.get(pid, {})
        mine = deltas.setdefault(kind_of(name), {})
        for thread, used in now.items():
            mine[thread] = mine.get(thread, 0.0) + used - then.get(thread, 0.0)
        os.kill(pid, signal.SIGUSR2)
    dest.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    deadline = time.monotonic() + timeout_s
    while len(found) < len(hooked) and time.monotonic() < deadline:
        for name, pid in hooked.items():
            if name in found:
                continue
            fresh = [p for p in source.glob(f"{name}.{pid}.*.pstats") if p not in before]
            if fresh:
                target = dest / f"{name}.pstats"
                os.replace(max(fresh, key=lambda p: p.stat().st_mtime), target)
                found[name] = target
        time.sleep(0.1)
    missing = sorted(set(hooked) - set(found))
    text = thread_lines(deltas) + summary(list(found.values()), missing=missing)
    (dest / "top.txt").write_text(text)
    return sorted(found.values())


def place(key: FuncKey, *, repo: Path = REPO) -> str:
    """The kind of code a profiled function is: ``nodelock <package>`` (this repository's
    modules), ``event loop`` (asyncio, selectors, epoll and the C code run by callbacks),
    ``library <name>`` (an installed package), ``stdlib <module>`` or ``C <name>`` (another
    function with no Python source)."""
    file, _, func = key
    if file == "~":
        if any(name in func for name in EVENT_LOOP_BUILTINS):
            return "event loop"
        method = re.search(r"method '(\w+)' of '([\w.]+)' objects", func)
        if method:
            return f"C {method[2]}.{method[1]}"
        builtin = re.search(r"built-in method ([\w.]+)", func)
        return f"C {builtin[1] if builtin else func.strip('{}<>')}"
    path = Path(file)
    if "site-packages" in path.parts:
        return "library " + path.parts[path.parts.index("site-packages") + 1]
    if path.is_relative_to(repo):
        return "nodelock " + path.relative_to(repo).parts[0]
    if "asyncio" in path.parts or path.name == "selectors.py":
        return "event loop"
    return "stdlib " + (path.parent.name if path.name == "__init__.py" else path.stem)


def shares(stats: Mapping[FuncKey, tuple[object, ...]], *, repo: Path = REPO) -> dict[str, float]:
    """Each kind of code's share (0-1) of the profiled time (functions' own time, pstats'
    ``tottime``), largest first; ``{}`` when nothing was profiled."""
    own: dict[str, float] = {}
    for key, row in stats.items():
        tottime = row[2]
        assert isinstance(tottime, float)
        kind = place(key, repo=repo)
        own[kind] = own.get(kind, 0.0) + tottime
    total = sum(own.values())
    if total <= 0:
        return {}
    return {k: v / total for k, v in sorted(own.items(), key=lambda kv: -kv[1])}


def share_lines(by_kind: Mapping[str, float], *, top: int = 12) -> str:
    """``shares`` grouped (nodelock, event loop, libraries, stdlib, C) and then the largest
    kinds one by one."""
    groups: dict[str, float] = {}
    for kind, share in by_kind.items():
        group = "event loop" if kind == "event loop" else kind.split(" ")[0]
        groups[group] = groups.get(group, 0.0) + share
    head = "  ".join(f"{g} {v:.0%}" for g, v in sorted(groups.items(), key=lambda kv: -kv[1]))
    rows = "".join(f"  {share:5.1%}  {kind}\n" for kind, share in list(by_kind.items())[:top])
    return f"where the time went: {head}\n{rows}"


def summary(files: list[Path], *, missing: list[str], top: int = 25) -> str:
    """Per kind of component: the ``top`` functions by their own time and by cumulative time."""
    out = io.StringIO()
    kinds: dict[str, list[Path]] = {}
    for f in files:
        kinds.setdefault(kind_of(f.name.split(".")[0]), []).append(f)
    for kind, paths in sorted(kinds.items()):
        stats = pstats.Stats(*map(str, paths), stream=out)
        total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
        out.write(f"===== {kind}: {len(paths)} process(es), {total:.3f} s of CPU\n")
        out.write(share_lines(shares(stats.stats)))  # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
    if missing:
        out.write(f"no profile written by: {', '.join(missing)}\n")
    return out.getvalue()
