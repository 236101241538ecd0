"""The benches' /proc readers, read on this test's own process."""

from __future__ import annotations

import os
import time

import pytest

from bench.procstat import cpu_rate, cpu_seconds, load_average, rss_mib, status_kib


def test_cpu_seconds_grow_with_work_and_an_idle_process_has_a_low_rate() -> None:
    pid = os.getpid()
    before = cpu_seconds(pid)
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert cpu_seconds(pid) - before >= 0.2
    assert 0.0 <= cpu_rate(pid, 0.3) < 0.5  # this process sleeps through it


def test_status_fields_and_their_absence() -> None:
    pid = os.getpid()
    assert status_kib(pid, "VmHWM") >= status_kib(pid, "VmRSS") > 0
    assert rss_mib(pid) == pytest.approx(status_kib(pid, "VmRSS") / 1024, rel=0.2)
    with pytest.raises(RuntimeError, match="no NoSuchField"):
        status_kib(pid, "NoSuchField")
    assert len(load_average()) == 3
