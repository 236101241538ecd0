"""``bench.call_cost``'s sums and block sizes: one handoff's calls, each counted as often as a
handoff makes it, per gap."""

from __future__ import annotations

import argparse
import os

from bench.call_cost import GAP_BLOCK_S, HANDOFF, calls_for, cpu_ns, handoff_ms, report


def per_call(scale: float) -> dict[str, float]:
    return {
        "wake": 0.01 * scale,  # not a call of the handoff: each call includes its wake
        "served": 0.3 * scale,
        "made": 0.2 * scale,
        "save": 0.1 * scale,
        "save durable": 9.0,  # not part of a one-container handoff
        "put": 0.4 * scale,
        "event": 0.05 * scale,
    }


def test_the_handoff_line_adds_each_call_as_often_as_a_handoff_makes_it() -> None:
    # kubelet calls GetPreferredAllocation, Allocate and PreStartContainer; the plugin writes
    # its checkpoint once (the release is written with the next handoff's write)
    assert HANDOFF == {"served": 3, "made": 1, "save": 1, "put": 1, "event": 5}
    assert abs(handoff_ms(per_call(1)) - 1.85) < 1e-9  # 0.9 + 0.2 + 0.1 + 0.4 + 0.25


def test_the_report_has_a_column_per_gap_and_the_sum_of_each() -> None:
    args = argparse.Namespace(blocks=3)
    out = report({0.1: per_call(2), 0.0: per_call(1)}, args).splitlines()
    assert out[1].split() == ["gap", "0", "ms", "gap", "100", "ms"]
    assert out[2].split()[-2:] == ["0.010", "0.020"]  # the wake alone, back to back first
    assert out[3].split()[-2:] == ["0.300", "0.600"]  # served
    assert out[-1].split() == ["1.85", "3.70"]


def test_a_block_with_a_gap_spans_about_the_same_time_whatever_the_gap() -> None:
    assert calls_for(2000, 0.0) == 2000
    assert calls_for(2000, 0.01) == int(GAP_BLOCK_S / 0.01)
    assert calls_for(2000, 1.0) == 10  # at least 10
    assert calls_for(50, 0.001) == 50  # never more than asked


def test_cpu_is_read_from_the_scheduler_and_grows_with_work() -> None:
    before = cpu_ns(os.getpid())
    sum(i * i for i in range(200_000))
    assert cpu_ns(os.getpid()) > before
