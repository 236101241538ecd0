"""A bind's deadline from its arrival, and the start-up check of the whole worst-case path.

The clock is injected (plain numbers); nothing here reaches an API server: a request the
deadline refuses is refused before it is sent, which the client without a connection shows.
"""

from __future__ import annotations

import pytest

from kube.client import KubeClient
from scheduler_ext.config import (
    ANSWER_SLACK_S,
    BIND_REQUESTS,
    REQUEST_ALLOWANCE_S,
    BindPath,
    check_bind_timing,
)
from scheduler_ext.deadline import (
    BindCancelled,
    BindDeadline,
    CallDeadlines,
    DeadlineClient,
    bind_deadline,
    current,
    unguarded,
)
from scheduler_ext.service import ConfigError, Settings, check_settings


class Clock:
    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


def test_the_worst_case_path_is_every_step_of_a_bind_with_slack() -> None:
    path = BindPath(wait_budget_s=4.0, lease_duration_s=15)
    assert len(BIND_REQUESTS) == 7  # pod GET, holder GET, takeover GET, 2 writes, re-read, GET
    assert path.total_s == pytest.approx(4.0 + 5.0 + 7 * REQUEST_ALLOWANCE_S + ANSWER_SLACK_S)
    assert path.after_wait_s == pytest.approx(5.0 + 6 * REQUEST_ALLOWANCE_S)
    assert ANSWER_SLACK_S > 0
    check_bind_timing(wait_budget_s=4.0, lease_duration_s=15, http_timeout_s=10.0)  # defaults
    check_settings(Settings())


def test_a_configuration_that_cannot_fit_is_refused_with_the_arithmetic() -> None:
    with pytest.raises(ValueError, match="a bind may take up to") as caught:
        check_bind_timing(wait_budget_s=4.5, lease_duration_s=15, http_timeout_s=10.0)
    message = str(caught.value)
    assert "a bind may take up to 10.45s" in message
    assert "wait budget 4.5s" in message
    assert "lease duration 15s / 3 = 5s holding the lock" in message
    assert "7 API requests outside that window x 0.1s" in message
    assert "0.25s for the answer" in message
    assert "httpTimeout of 10s" in message
    assert "use a wait budget of at most 4.05s, or raise httpTimeout to at least 10.45s" in message
    with pytest.raises(ValueError, match=r"raise httpTimeout to at least 21\.95s or shorten"):
        check_bind_timing(wait_budget_s=1.0, lease_duration_s=60, http_timeout_s=10.0)
    with pytest.raises(ValueError, match="cannot be negative"):
        check_bind_timing(wait_budget_s=-1.0, lease_duration_s=15, http_timeout_s=10.0)
    with pytest.raises(ConfigError, match=r"--scheduler-http-timeout: a bind may take up to"):
        check_settings(Settings(wait_budget_s=5.0))
    check_settings(Settings(wait_budget_s=9.0, scheduler_http_timeout_s=15.0))
    check_bind_timing(wait_budget_s=0.0, lease_duration_s=15, http_timeout_s=10.0)


def test_the_deadline_is_the_timeout_from_arrival_less_the_slack() -> None:
    clock = Clock()
    deadline = BindDeadline.from_arrival(clock.t, http_timeout_s=10.0, clock=clock)
    assert deadline.at == pytest.approx(500.0 + 10.0 - ANSWER_SLACK_S)
    clock.t += 9.0
    assert deadline.check("the binding") == pytest.approx(1.0 - ANSWER_SLACK_S)
    clock.t += 0.8
    with pytest.raises(BindCancelled) as caught:
        deadline.check("the binding", write=False)
    assert "past its deadline" in str(caught.value)
    assert "httpTimeout of 10s" in str(caught.value)
    assert "stopped before the binding" in str(caught.value)


def test_a_gone_caller_stops_every_write_but_not_the_reads() -> None:
    clock = Clock()
    deadline = BindDeadline.from_arrival(clock.t, http_timeout_s=10.0, clock=clock)
    deadline.cancel()
    assert deadline.check("GET /api/v1/pods", write=False) > 0
    with pytest.raises(BindCancelled, match="the scheduler stopped waiting"):
        deadline.check("the Lease write")


def test_a_caller_leaving_reaches_a_retry_that_arrived_while_the_first_call_ran() -> None:
    """kube-scheduler gave up on a bind and tried the pod again on the same node before the
    first call ended: the caller of the retry leaving cancels the retry, also once the first
    call ended (found by the model: ``abandoned-retry``)."""
    clock = Clock()
    calls = CallDeadlines()
    first = BindDeadline.from_arrival(clock.t, http_timeout_s=10.0, clock=clock)
    retry = BindDeadline.from_arrival(clock.t + 1, http_timeout_s=10.0, clock=clock)
    calls.begin("n1", "uid-1", first)
    calls.begin("n1", "uid-1", retry)
    calls.end("n1", "uid-1", first)
    assert calls.cancel("n1", "uid-1") == 1
    assert retry.cancelled
    assert not first.cancelled
    with pytest.raises(BindCancelled, match="the scheduler stopped waiting"):
        retry.check("the Lease write")


def test_call_deadlines_forget_a_call_when_it_ends() -> None:
    clock = Clock()
    calls = CallDeadlines()
    deadline = BindDeadline.from_arrival(clock.t, http_timeout_s=10.0, clock=clock)
    calls.begin("n1", "uid-1", deadline)
    calls.end("n1", "uid-1", deadline)
    assert calls.cancel("n1", "uid-1") == 0
    assert not deadline.cancelled


async def test_the_client_refuses_a_bind_request_before_sending_it() -> None:
    """No connection at all behind the client: a request that got past the deadline check
    would fail with something other than ``BindCancelled``."""
    clock = Clock()
    client = DeadlineClient(KubeClient(api_client=None))
    deadline = BindDeadline.from_arrival(clock.t, http_timeout_s=10.0, clock=clock)
    deadline.cancel()
    lease = "/apis/coordination.k8s.io/v1/namespaces/nodelock-system/leases/n1"
    with bind_deadline(deadline):
        assert current() is deadline
        with pytest.raises(BindCancelled, match=f"stopped before PUT {lease}"):
            await client.replace(lease, {})
        with pytest.raises(BindCancelled, match="stopped before POST"):
            await client.create("/api/v1/namespaces/ns/pods/p/binding", {})
        with unguarded():
            assert current() is None
    assert current() is None
    late = BindDeadline.from_arrival(clock.t, http_timeout_s=10.0, clock=clock)
    clock.t += 10.0
    with bind_deadline(late), pytest.raises(BindCancelled, match="past its deadline"):
        await client.get(lease)
