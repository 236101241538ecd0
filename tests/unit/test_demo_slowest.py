"""The demo report's slowest pods: what a missed creation -> running target is made of."""

from __future__ import annotations

from nodelock.demo import slowest
from nodelock.measure import Timeline


def test_slowest_pods_come_first_with_their_wait_to_bind_and_their_handoff() -> None:
    tl = Timeline()
    tl.first_seen = {"ns/a": 1.0, "ns/b": 1.0, "ns/c": 2.0, "ns/d": 2.0, "ns/e": 3.0}
    tl.bound = {"ns/a": 1.1, "ns/b": 2.2, "ns/c": 2.05}
    tl.running = {"ns/a": 1.5, "ns/b": 2.6, "ns/c": 2.25, "ns/d": 4.0}  # e never ran
    got = slowest(tl, ["ns/a", "ns/b", "ns/c", "ns/d", "ns/e"], n=3)
    assert got == [
        "ns/d 2000 ms",  # seen running but never seen bound: no split
        "ns/b 1600 ms (bound after 1200 ms, running 400 ms later)",
        "ns/a 500 ms (bound after 100 ms, running 400 ms later)",
    ]
    assert slowest(tl, ["ns/c"]) == ["ns/c 250 ms (bound after 50 ms, running 200 ms later)"]
    assert slowest(tl, ["ns/e", "ns/x"]) == []
