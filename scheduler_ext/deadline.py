"""A bind's deadline: one instant from the request's arrival, carried through every step.

kube-scheduler gives a bind call at most the extender's ``httpTimeout``: its HTTP extender client
is an ``http.Client`` whose ``Timeout`` is that setting (``NewHTTPExtender`` in
``pkg/scheduler/extender.go``, Kubernetes v1.31.9 and v1.37.2).  An answer after that reaches
nobody, and a binding written after it binds a pod the scheduler has already given up on and
will try again.

``BindDeadline`` is that instant, less ``ANSWER_SLACK_S`` for the answer's way back, on the
extender's monotonic clock.  The bind checks it at its named steps (after its wait, before and
after taking the lock, before the binding), and ``DeadlineClient`` — the API client the binder
and its ``NodeLocks`` use — checks it before every request a bind sends, its own or lockd's
(the pod GET, the check that the pod does not already hold the lock, the takeover GET, the
acquire's 409 re-read and second write, the confirm LIST and Lease rewrite, the binding and the
GET that checks a lost answer), and gives each request no more time than is left.

Guarantees: once the deadline has passed, no request of the bind is sent; once the caller is
gone (``cancel``: kube-scheduler disconnected), no write of the bind is sent — no Lease write,
no binding.  A request already sent is not recalled: a Lease write in flight when the caller
leaves may land, and the bind then releases that lock (``unguarded``: the release of a lock the
bind took is the one write a gone caller still causes).  Not guaranteed: that a bind ends
before ``httpTimeout`` when the event loop itself stalls longer than the slack.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kube.client import JSON, Body, KubeClient, Query
from scheduler_ext.config import ANSWER_SLACK_S

READS = frozenset({"GET"})


class BindCancelled(Exception):
    """A bind stopped before a step because its caller left or its deadline passed; nothing of
    that step was sent."""

    def __init__(self, step: str, why: str) -> None:
        super().__init__(f"{why}; stopped before {step}")
        self.step = step
        self.why = why


@dataclass
class BindDeadline:
    """The instant ``at`` (on ``clock``) by which a bind must have answered, and whether its
    caller is gone."""

    at: float
    clock: Callable[[], float]
    http_timeout_s: float
    cancelled: bool = False
    _started: float = field(init=False)

    def __post_init__(self) -> None:
        self._started = self.clock()

    @classmethod
    def from_arrival(
        cls, arrived_at: float, *, http_timeout_s: float, clock: Callable[[], float]
    ) -> BindDeadline:
        """The deadline of a bind request that arrived at ``arrived_at``."""
        return cls(arrived_at + http_timeout_s - ANSWER_SLACK_S, clock, http_timeout_s)

    def left_s(self) -> float:
        return self.at - self.clock()

    def cancel(self) -> None:
        """The caller stopped waiting: no further write of this bind may be sent."""
        self.cancelled = True

    def check(self, step: str, *, write: bool = True) -> float:
        """Raise ``BindCancelled`` unless ``step`` may still run; else the seconds left."""
        if self.cancelled and write:
            raise BindCancelled(step, "the scheduler stopped waiting for this bind")
        left = self.left_s()
        if left <= 0:
            raise BindCancelled(
                step,
                f"the bind ran {self.clock() - self._started:.1f}s, past its deadline "
                f"(kube-scheduler's httpTimeout of {self.http_timeout_s:g}s less "
                f"{ANSWER_SLACK_S:g}s for the answer)",
            )
        return left


class CallDeadlines:
    """The deadlines of the bind calls under way, per (node, pod UID): every call, also a
    second call for a pod and node whose first is still under way (kube-scheduler gave up on the
    first and tried again before it ended).

    Guarantee: ``cancel`` reaches every call under way for the pod and node, so a caller that
    left never has a bind of its that goes on to write; a call's deadline is forgotten only when
    that call ends (``end``), never when another one does.
    """

    def __init__(self) -> None:
        self._calls: dict[tuple[str, str], list[BindDeadline]] = {}

    def begin(self, node: str, uid: str, deadline: BindDeadline) -> None:
        self._calls.setdefault((node, uid), []).append(deadline)

    def end(self, node: str, uid: str, deadline: BindDeadline) -> None:
        calls = self._calls.get((node, uid), [])
        if deadline in calls:
            calls.remove(deadline)
        if not calls:
            self._calls.pop((node, uid), None)

    def cancel(self, node: str, uid: str) -> int:
        """The caller of the pod's bind to the node left: cancel every call under way for them;
        returns how many."""
        calls = self._calls.get((node, uid), [])
        for deadline in calls:
            deadline.cancel()
        return len(calls)


_CURRENT: contextvars.ContextVar[BindDeadline | None] = contextvars.ContextVar(
    "nodelock_bind_deadline", default=None
)


@contextlib.contextmanager
def bind_deadline(deadline: BindDeadline | None) -> Iterator[None]:
    """Every request sent from this task (and tasks it starts) inside the block is held to
    ``deadline``; None: to none (``unguarded``)."""
    token = _CURRENT.set(deadline)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def unguarded() -> contextlib.AbstractContextManager[None]:
    """Requests inside the block are held to no bind deadline: the release of a lock the bind
    took, which must happen even after its caller left."""
    return bind_deadline(None)


def current() -> BindDeadline | None:
    return _CURRENT.get()


class DeadlineClient(KubeClient):
    """``inner`` with every request checked against the current bind's deadline (if any) and
    given at most the time left; outside a bind it is ``inner`` unchanged.  Shares ``inner``'s
    connection pool (closing it closes ``inner``'s)."""

    def __init__(self, inner: KubeClient) -> None:
        super().__init__(inner._api, timeout_s=inner._timeout_s)
        self._inner = inner

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Body | None = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
    ) -> JSON:
        deadline = _CURRENT.get()
        if deadline is not None:
            left = deadline.check(f"{method} {path}", write=method not in READS)
            own = timeout_s if timeout_s is not None else self._timeout_s
            timeout_s = min(own, left)
        return await self._inner.request(
            method, path, query=query, body=body, content_type=content_type, timeout_s=timeout_s
        )
