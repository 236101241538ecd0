"""``bench.call_cost``'s sum: one handoff's calls, each counted as often as a handoff makes it."""

from __future__ import annotations

import argparse

from bench.call_cost import HANDOFF, report


def test_the_handoff_line_adds_each_call_as_often_as_a_handoff_makes_it() -> None:
    per_call = {
        "served": 0.3,
        "made": 0.2,
        "save": 0.1,
        "save durable": 9.0,  # not part of a one-container handoff
        "put": 0.4,
        "event": 0.05,
    }
    args = argparse.Namespace(calls=2000, writes=400, blocks=3)
    out = report(per_call, args).splitlines()
    assert HANDOFF == {"served": 2, "made": 1, "save": 2, "put": 1, "event": 5}
    assert out[-1].endswith(": 1.65 ms"), out[-1]  # 0.6 + 0.2 + 0.2 + 0.4 + 0.25
    assert out[2].split()[-2:] == ["0.300", "2000"]
