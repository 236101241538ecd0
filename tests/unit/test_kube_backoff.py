"""``kube.backoff.Backoff``: capped exponential steps, jittered within each step."""

from __future__ import annotations

import itertools
import random

import pytest

from kube.backoff import Backoff


def test_steps_double_up_to_the_cap_and_reset() -> None:
    top = Backoff(0.5, 10.0, rand=lambda: 0.0)  # no jitter drawn: the steps themselves
    assert [top.next_s() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    top.reset()
    assert top.next_s() == 0.5


def test_jitter_takes_at_most_half_of_each_step() -> None:
    low = Backoff(0.5, 10.0, rand=lambda: 1.0)
    assert [low.next_s() for _ in range(6)] == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0]


def test_many_clients_do_not_retry_in_lockstep() -> None:
    rng = random.Random(7)
    clients = [Backoff(0.2, 10.0, rand=rng.random) for _ in range(1000)]
    for step in (0.2, 0.4, 0.8):
        delays = [c.next_s() for c in clients]
        assert all(step / 2 <= d <= step for d in delays)
        # spread over the step: no tenth of it holds more than a fifth of the clients
        buckets = [int((d - step / 2) / (step / 20)) for d in delays]
        counts = [sum(1 for b in buckets if b == i) for i in range(10)]
        assert max(counts) < 200, counts
        assert len(set(delays)) > 990


def test_never_exceeds_the_cap() -> None:
    backoff = Backoff(1.0, 3.0, factor=3.0, rand=itertools.cycle([0.0, 0.3, 0.9]).__next__)
    assert all(backoff.next_s() <= 3.0 for _ in range(50))


@pytest.mark.parametrize(
    ("first", "cap", "factor", "jitter"),
    [(0.0, 1.0, 2.0, 0.5), (2.0, 1.0, 2.0, 0.5), (1.0, 2.0, 0.5, 0.5), (1.0, 2.0, 2.0, 1.5)],
)
def test_unusable_settings_are_refused(
    first: float, cap: float, factor: float, jitter: float
) -> None:
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(first, cap, factor=factor, jitter=jitter)
