"""The demo reads lock waits from the extender's histogram the way Prometheus does."""

from __future__ import annotations

import math

import pytest

from nodelock.measure import histogram, metric_samples

SCRAPE = """\
# TYPE nodelock_extender_bind_queue_wait_seconds histogram
nodelock_extender_bind_queue_wait_seconds_bucket{le="0.0"} 10.0
nodelock_extender_bind_queue_wait_seconds_bucket{le="0.5"} 30.0
nodelock_extender_bind_queue_wait_seconds_bucket{le="1.5"} 39.0
nodelock_extender_bind_queue_wait_seconds_bucket{le="+Inf"} 40.0
nodelock_extender_bind_queue_wait_seconds_count 40.0
nodelock_extender_bind_queue_wait_seconds_sum 12.0
"""


def test_quantiles_interpolate_within_the_bucket_and_count_what_waited() -> None:
    h = histogram(metric_samples(SCRAPE), "nodelock_extender_bind_queue_wait_seconds")
    assert h.count == 40
    assert h.at_most(0.0) == 10  # binds that found the lock free and nobody queued
    assert h.at_most(1.5) == 39
    assert h.quantile(0.5) == pytest.approx(0.25)  # rank 20: halfway through (0, 0.5]
    assert h.quantile(0.95) == pytest.approx(0.5 + 1.0 * (38 - 30) / 9)
    assert h.quantile(0.99) == 1.5  # rank 39.6 falls in +Inf: the last finite edge
    assert math.isnan(histogram([], "x").quantile(0.5))
