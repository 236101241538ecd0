"""Promises: the best node of a pod in flight counts as one more bind there for other pods,
briefly."""

from __future__ import annotations

from lockd.model import NodeName
from scheduler_ext.promises import Promises

A, B, C = NodeName("a"), NodeName("b"), NodeName("c")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_best_node_is_promised_to_the_pod_and_steers_others() -> None:
    p = Promises(ttl_s=1.0, clock=Clock())
    assert p.promise([A, B, C], [3, 9, 9], "uid-1") == B  # first of the best
    assert p.promised_to_others("uid-2") == {B: 1}
    assert p.promised_to_others("uid-1") == {}  # never steers the pod from its own choice
    p.promise([A, B], [3, 9], "uid-3")
    assert p.promised_to_others("uid-2") == {B: 2}  # every bind on its way counts


def test_promise_ends_on_bind_or_expiry() -> None:
    clock = Clock()
    p = Promises(ttl_s=1.0, clock=clock)
    p.promise([A], [5], "uid-1")
    p.forget("uid-1")
    assert p.promised_to_others("uid-2") == {}
    p.promise([A], [5], "uid-1")
    clock.t += 1.0
    assert p.promised_to_others("uid-2") == {}


def test_nothing_fits_promises_nothing_and_a_new_score_replaces_the_old() -> None:
    p = Promises(ttl_s=1.0, clock=Clock())
    assert p.promise([A, B], [0, 0], "uid-1") is None
    assert p.promise([], [], "uid-1") is None
    p.promise([A], [5], "uid-1")
    p.promise([B], [5], "uid-1")  # prioritized again (a retry): only the latest counts
    assert p.promised_to_others("uid-2") == {B: 1}
    p.promise([A], [0], "uid-1")  # and a retry that fits nowhere withdraws it
    assert p.promised_to_others("uid-2") == {}
