"""What /proc says of a process (CPU seconds, a status field) and of the machine (load average),
for the benchmarks that measure the processes a devcluster runs."""

from __future__ import annotations

import os
import time


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds ``pid`` has used (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_rate(pid: int, seconds: float) -> float:
    """``pid``'s CPU seconds per second over the next ``seconds`` (this call sleeps that long)."""
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def status_kib(pid: int, field: str) -> int:
    """A kB field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``), or RuntimeError."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def rss_mib(pid: int) -> float:
    """``pid``'s resident set size in MiB."""
    return status_kib(pid, "VmRSS") / 1024


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, to two decimals."""
    return [round(x, 2) for x in os.getloadavg()]
