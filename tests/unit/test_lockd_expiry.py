"""Expiry on the observer's own clock (client-go's rule), under a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX
from lockd.lease import LeaseFormat
from lockd.model import FencingToken, Holder, HolderKey, NodeName, Outcome
from lockd.observed import Observations

FMT = LeaseFormat(namespace=DEFAULT_LOCK_NAMESPACE, prefix=DEFAULT_PREFIX)
NODE = NodeName("gpu-1")
POD = Holder(HolderKey("ns/a"), "uid-a")


def lease(*, renew: str = "2024-05-01T12:00:00.000000Z", token: int = 1, rv: str = "1") -> Any:
    body = FMT.acquired(
        {"metadata": {"name": NODE, "resourceVersion": rv}},
        POD,
        token=FencingToken(token),
        duration_s=10,
        now="2024-05-01T12:00:00.000000Z",
    )
    body["spec"]["renewTime"] = renew
    return body


def see(obs: Observations, body: Any, now: float, *, replace: bool = False) -> None:
    obs.observe(FMT.parse(body), body, now, replace=replace)


def test_a_record_unchanged_for_its_duration_is_expired() -> None:
    obs = Observations()
    see(obs, lease(), 100.0)
    view = obs.view(NODE, 109.9)
    assert view is not None
    assert not view.expired
    view = obs.view(NODE, 110.0)
    assert view is not None
    assert view.expired
    assert view.unchanged_for_s == pytest.approx(10.0)


def test_seeing_the_same_record_again_does_not_restart_the_clock() -> None:
    obs = Observations()
    see(obs, lease(rv="1"), 100.0)
    see(obs, lease(rv="2"), 105.0)  # e.g. someone labelled the Lease: record unchanged
    view = obs.view(NODE, 110.0)
    assert view is not None
    assert view.expired


def test_a_renewal_restarts_the_clock_and_keeps_held_for() -> None:
    obs = Observations()
    see(obs, lease(), 100.0)
    see(obs, lease(renew="2024-05-01T12:00:05.000000Z", rv="2"), 108.0)
    view = obs.view(NODE, 115.0)
    assert view is not None
    assert not view.expired
    assert view.unchanged_for_s == pytest.approx(7.0)
    assert view.held_for_s == pytest.approx(15.0)


@pytest.mark.parametrize(
    "renew",
    ["1970-01-01T00:00:00.000000Z", "2999-12-31T23:59:59.999999Z"],
    ids=["renewTime-far-past", "renewTime-far-future"],
)
def test_remote_timestamps_are_ignored(renew: str) -> None:
    """Clock skew: only how long this process has seen the record unchanged counts."""
    obs = Observations()
    see(obs, lease(renew=renew), 100.0)
    view = obs.view(NODE, 100.0 + 9.0)
    assert view is not None
    assert not view.expired
    view = obs.view(NODE, 100.0 + 10.0)
    assert view is not None
    assert view.expired


def test_a_process_that_just_started_waits_a_full_duration() -> None:
    """A new observer first sees an old record at 500: nothing is expired before 510."""
    fresh = Observations()
    see(fresh, lease(renew="2024-05-01T11:00:00.000000Z"), 500.0)
    view = fresh.view(NODE, 509.0)
    assert view is not None
    assert not view.expired


def test_a_free_lock_is_never_expired() -> None:
    obs = Observations()
    free = FMT.released(lease(), outcome=Outcome.ALLOCATED, now="2024-05-01T12:00:01.000000Z")
    see(obs, free, 0.0)
    view = obs.view(NODE, 1e6)
    assert view is not None
    assert not view.expired


def test_an_older_observation_arriving_late_is_ignored() -> None:
    obs = Observations()
    held = lease(token=4, rv="10")
    free = FMT.released(held, outcome=Outcome.ALLOCATED, now="2024-05-01T12:00:01.000000Z")
    free["metadata"]["resourceVersion"] = "11"
    see(obs, free, 100.0)
    see(obs, held, 101.0)  # a trailing watch event of the acquisition
    see(obs, lease(token=3, rv="9"), 102.0)
    view = obs.view(NODE, 103.0)
    assert view is not None
    assert view.record.holder is None
    assert view.record.resource_version == "11"


def test_a_held_lease_reset_by_hand_to_a_lower_token_is_seen() -> None:
    """A hand edit (no lock-guard policy) resets a held Lease to token 0: a later write, so a
    higher resourceVersion; watchers that saw token 5 take it in as the change it is."""
    obs = Observations()
    see(obs, lease(token=5, rv="10"), 100.0)
    reset = lease(token=0, rv="11")
    reset["spec"] = {}
    see(obs, reset, 101.0)  # a watch event, not an authoritative read
    view = obs.view(NODE, 101.0)
    assert view is not None
    assert view.record.token == 0
    assert view.record.holder is None
    assert view.record.resource_version == "11"


def test_a_lower_token_under_another_holder_is_seen_when_written_later() -> None:
    """The Lease deleted and created again (token 1, another pod): a later resourceVersion."""
    obs = Observations()
    see(obs, lease(token=5, rv="10"), 100.0)
    other = lease(token=1, rv="12")
    other["spec"]["holderIdentity"] = "ns/b"
    see(obs, other, 101.0)
    view = obs.view(NODE, 101.0)
    assert view is not None
    assert view.record.token == 1
    assert view.unchanged_for_s == 0.0


def test_without_integer_resource_versions_the_token_orders() -> None:
    obs = Observations()
    see(obs, lease(token=5, rv="b"), 100.0)
    see(obs, lease(token=4, rv="c"), 101.0)
    view = obs.view(NODE, 101.0)
    assert view is not None
    assert view.record.token == 5


def test_replace_takes_an_older_token_after_the_lease_was_recreated() -> None:
    obs = Observations()
    see(obs, lease(token=9, rv="10"), 100.0)
    see(obs, lease(token=1, rv="20"), 101.0, replace=True)
    view = obs.view(NODE, 101.0)
    assert view is not None
    assert view.record.token == 1


def test_expiry_is_reported_once_per_record() -> None:
    obs = Observations()
    see(obs, lease(), 0.0)
    assert not obs.report_expiry(NODE, 5.0)
    assert obs.report_expiry(NODE, 10.0)
    assert not obs.report_expiry(NODE, 20.0)
    see(obs, lease(renew="2024-05-01T12:00:30.000000Z", rv="2"), 30.0)
    assert obs.report_expiry(NODE, 40.0)


def test_forget() -> None:
    obs = Observations()
    see(obs, lease(), 0.0)
    obs.forget(NODE)
    assert obs.view(NODE, 1.0) is None
    assert obs.nodes() == []


def test_a_read_answered_before_a_newer_watch_event_does_not_bring_the_holder_back() -> None:
    """A GET after a lost race is answered (held, rv 10); the holder releases (rv 11) and the
    watch delivers that first; the GET's answer, taken in last, must not undo the release."""
    obs = Observations()
    see(obs, lease(token=4, rv="9"), 100.0)  # held, as the lost race's write found it
    released = FMT.released(
        lease(token=4, rv="11"), outcome=Outcome.ALLOCATED, now="2024-05-01T12:00:01.000000Z"
    )
    see(obs, released, 100.2)  # the watch event of the release
    see(obs, lease(token=4, rv="10"), 100.3, replace=True)  # the GET's answer, read earlier
    view = obs.view(NODE, 100.3)
    assert view is not None
    assert view.record.holder is None
    assert view.record.resource_version == "11"
