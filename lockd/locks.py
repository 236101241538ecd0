"""Node locks as Lease objects: the thin I/O around ``lockd.decide``.

Guarantees:
- Mutual exclusion: every write is a create or a PUT conditional on the observed
  ``resourceVersion``; a 409 means another writer won, and is answered by one re-read and a new
  decision, never by an unconditional write.  At most two writes per call.
- Fencing: the token (``spec.leaseTransitions``) grows by one on every acquisition, re-acquisition
  and takeover, and is kept across releases and API server restarts (it lives in etcd).  Release
  and renew write only while the Lease still carries the caller's token and holder; otherwise
  they change nothing and raise ``StaleToken`` (a newer token) or ``LockLost``.
- Expiry is judged on the injected local clock from when this process saw the record change
  (``lockd.observed``); an expired lock is taken over only when the caller's check says so.
- Request counts: acquire is one write when this process has a current observation (a watch, or
  an earlier response) and the lock is free; without one it tries a create, and on 409 reads and
  writes once more.  A refusal costs no request when a watch covers the node, else one GET.
  Release and renew are one PUT when the observation is current.

Not guaranteed: token monotonicity if someone deletes the Lease (a new one starts again at 1;
lockd never deletes Leases, ``break_lock`` keeps them), and freshness of refusals beyond the
watch's delay (a lock released a moment ago may still be reported held).
"""

from __future__ import annotations

import builtins
import collections
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kube.client import KubeClient, lease_path
from kube.errors import Conflict, NotFound
from kube.reflector import Reflector
from lockd.decide import (
    AskTakeover,
    Create,
    Read,
    Refuse,
    UpdateAction,
    Write,
    decide_acquire,
    decide_break,
    decide_release,
    decide_renew,
)
from lockd.errors import LockHeld, LockLost, StaleToken
from lockd.lease import LABEL_SELECTOR, LeaseFormat, MalformedLease
from lockd.metrics import LockMetrics, Operation
from lockd.microtime import microtime_from_epoch
from lockd.model import FencingToken, HeldLock, Holder, LockRecord, NodeLockView, NodeName, Outcome
from lockd.observed import Observations, Seen

JSON = dict[str, Any]
TakeoverCheck = Callable[[LockRecord], Awaitable[bool]]
OnChange = Callable[[NodeLockView | None, NodeName], None]

MAX_WRITES = 2
WATCH_TIMEOUT_S = 300
BACKOFF_MAX_S = 10.0

log = logging.getLogger(__name__)


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NAMESPACE = re.compile(rf"^{_DNS_LABEL}$")
_PREFIX = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*/$")
MAX_DURATION_S = 2**31 - 1  # spec.leaseDurationSeconds is an int32


def check_config(*, namespace: str, prefix: str, duration_s: int) -> None:
    """Refuse a configuration no Lease could carry, with a message naming the value, as client-go
    validates its leader elector's: ``namespace`` a DNS label (≤ 63 characters), ``prefix`` a DNS
    subdomain (≤ 253 characters) followed by ``/``, ``duration_s`` a whole number of seconds from
    1 to 2**31 - 1.  Raises ``ValueError``."""
    if not isinstance(namespace, str) or len(namespace) > 63 or not _NAMESPACE.match(namespace):
        raise ValueError(f"lock namespace {namespace!r} is not a Kubernetes namespace name")
    if not isinstance(prefix, str) or len(prefix) > 254 or not _PREFIX.match(prefix):
        raise ValueError(
            f"annotation prefix {prefix!r} must be a DNS subdomain followed by '/', "
            "e.g. nodelock.io/"
        )
    if isinstance(duration_s, bool) or not isinstance(duration_s, int):
        raise ValueError(f"lock duration {duration_s!r} must be a whole number of seconds")
    if not 1 <= duration_s <= MAX_DURATION_S:
        raise ValueError(f"lock duration {duration_s}s must be from 1 to {MAX_DURATION_S} seconds")


class NodeLocks:
    """Acquire, release, renew and inspect node locks in one namespace.

    One instance per process (per event loop) is meant to be shared by all its tasks: it keeps
    the observations that expiry and one-request writes rely on.  Run ``watch()`` as a task to keep
    them current.
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        namespace: str,
        prefix: str,
        duration_s: int = 15,
        clock: Callable[[], float] = time.monotonic,
        metrics: LockMetrics | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        check_config(namespace=namespace, prefix=prefix, duration_s=duration_s)
        self._kube = kube
        self.format = LeaseFormat(namespace=namespace, prefix=prefix)
        self.duration_s = duration_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._metrics = metrics if metrics is not None else LockMetrics.default()
        self._metrics.add_view_source(self.views)
        self._obs = Observations()
        self._live_all = 0
        self._live_nodes: collections.Counter[NodeName] = collections.Counter()

    @property
    def namespace(self) -> str:
        return self.format.namespace

    @property
    def prefix(self) -> str:
        return self.format.prefix

    # -- observations ------------------------------------------------------------------------

    def observe(self, lease: JSON) -> NodeLockView:
        """Take in a Lease seen elsewhere (a watch, another response); returns the view."""
        now = self._clock()
        seen = self._obs.observe(self.format.parse(lease), lease, now)
        return self._view(seen, now)

    def view(self, node: NodeName) -> NodeLockView | None:
        """The last observation of ``node`` as of now on the local clock; sends no request."""
        seen = self._obs.get(node)
        return self._view(seen, self._clock()) if seen is not None else None

    def holders(self) -> dict[NodeName, Holder]:
        """Node -> holder of its last observation, for every node seen held (expired or not,
        as ``view(node).record.holder`` says); sends no request and costs the number of held
        locks, not of nodes, so a filter over thousands of nodes can ask it once."""
        return self._obs.holders()

    def held_ages(self) -> dict[NodeName, float]:
        """Node -> seconds its current holder has held it as this process saw it (the
        ``held_for_s`` of its view), for every node ``holders()`` names; sends no request and
        builds no views (prioritize asks it for every held lock on every request)."""
        return self._obs.held_ages(self._clock())

    def expired(self, node: NodeName) -> bool:
        """Whether ``view(node).expired`` (held and unchanged for its whole duration), without
        building the view or counting the expiry in the metrics; sends no request."""
        return self._obs.expired(node, self._clock())

    def views(self) -> list[NodeLockView]:
        """Every node's last observation, sorted by node; sends no request."""
        now = self._clock()
        out: list[NodeLockView] = []
        for node in self._obs.nodes():
            seen = self._obs.get(node)
            if seen is not None:
                out.append(self._view(seen, now))
        return out

    def _view(self, seen: Seen, now: float) -> NodeLockView:
        view = seen.view(now)
        if view.expired and self._obs.report_expiry(view.node, now):
            self._metrics.expired(view.node)
        return view

    def _live(self, node: NodeName) -> bool:
        return self._live_all > 0 or self._live_nodes[node] > 0

    def _microtime(self) -> str:
        return microtime_from_epoch(self._wall_clock())

    def _path(self, node: NodeName | None = None) -> str:
        return lease_path(self.namespace, node)

    async def _read(self, node: NodeName) -> Seen | None:
        try:
            lease = await self._kube.get(self._path(node))
        except NotFound:
            self._obs.forget(node)
            return None
        return self._obs.observe(self.format.parse(lease), lease, self._clock(), replace=True)

    def _took(self, lease: JSON) -> Seen:
        return self._obs.observe(self.format.parse(lease), lease, self._clock(), replace=True)

    # -- the lock operations -----------------------------------------------------------------

    async def acquire(
        self,
        node: NodeName,
        holder: Holder,
        *,
        may_take_over: TakeoverCheck | None = None,
        reacquire: bool = True,
    ) -> HeldLock:
        """Take ``node``'s lock for ``holder`` with a new fencing token.

        Raises ``LockHeld`` when another holder has it (also when it is expired but
        ``may_take_over`` is absent or says no), ``ApiUnavailable`` when the API server cannot be
        reached, ``ValueError`` for holder data that cannot be annotations.  ``reacquire`` False:
        the same holder's lock counts as another holder's (``decide_acquire``).
        """
        try:
            self.format.check_data(holder)
            lock, takeover = await self._acquire(node, holder, may_take_over, reacquire)
        except LockHeld:
            self._metrics.contended(node, holder.uid, self._clock())
            raise
        except Exception:
            self._metrics.failed(node)
            raise
        self._metrics.acquired(node, holder.uid, self._clock(), takeover=takeover)
        return lock

    async def _acquire(
        self,
        node: NodeName,
        holder: Holder,
        may_take_over: TakeoverCheck | None,
        reacquire: bool = True,
    ) -> tuple[HeldLock, bool]:
        seen = self._obs.get(node)
        fresh = False  # `seen` was read by this call
        asked: tuple[str, bool] | None = None  # (resourceVersion checked, the check's answer)
        writes = 0
        cause: Exception | None = None
        while True:
            now = self._clock()
            view = self._view(seen, now) if seen is not None else None
            allowed = None
            if asked is not None and view is not None:
                allowed = asked[1] if asked[0] == view.record.resource_version else None
            action = decide_acquire(
                node,
                view,
                seen.lease if seen is not None else None,
                holder,
                fmt=self.format,
                duration_s=self.duration_s,
                now=self._microtime(),
                takeover_allowed=allowed,
                reacquire=reacquire,
            )
            if isinstance(action, Refuse | AskTakeover) and not fresh and not self._live(node):
                seen, fresh = await self._read(node), True
                continue
            if isinstance(action, Refuse):
                raise action.error from cause
            if isinstance(action, AskTakeover):
                answer = may_take_over is not None and await may_take_over(action.record)
                asked = (action.record.resource_version, answer)
                continue
            if writes == MAX_WRITES:
                token = seen.record.token if seen is not None else 0
                raise LockHeld(node, "(another holder: lost the race twice)", 0.0, token) from cause
            writes += 1
            try:
                if isinstance(action, Create):
                    lease = await self._kube.create(self._path(), action.body)
                else:
                    lease = await self._kube.replace(self._path(node), action.body)
            except Conflict as exc:  # another writer won: read again and decide again
                cause = exc
                seen, fresh = await self._read(node), True
                continue
            except NotFound as exc:
                if isinstance(action, Create):
                    raise  # the namespace is missing: a configuration error
                cause = exc
                self._obs.forget(node)
                seen, fresh = None, True
                continue
            got = self._took(lease)
            taken = isinstance(action, Write) and action.taken_from is not None
            return HeldLock(node, holder, action.token, got.record.resource_version), taken

    async def release(self, lock: HeldLock, *, outcome: Outcome) -> None:
        """Free ``lock``, keeping the Lease (and its token) and recording the last handoff.

        Raises ``StaleToken`` when the Lease has a newer token (taken over), ``LockLost`` when it
        was already released; neither changes anything.
        """
        before = self._obs.get(lock.node)
        held_for = 0.0
        if before is not None and before.record.token == lock.token:
            held_for = before.view(self._clock()).held_for_s
        await self._update(
            lock,
            Operation.RELEASE,
            lambda view, lease: decide_release(
                view, lease, lock, fmt=self.format, outcome=outcome, now=self._microtime()
            ),
        )
        self._metrics.released(outcome, held_for)

    async def renew(self, lock: HeldLock) -> HeldLock:
        """Refresh ``lock``'s renew time and rewrite its holder's data from ``lock.holder``.

        Returns the lock with the new resourceVersion; raises like ``release``.
        """
        seen = await self._update(
            lock,
            Operation.RENEW,
            lambda view, lease: decide_renew(
                view, lease, lock, fmt=self.format, now=self._microtime()
            ),
        )
        return HeldLock(lock.node, lock.holder, lock.token, seen.record.resource_version)

    async def _update(
        self,
        lock: HeldLock,
        operation: Operation,
        decide: Callable[[NodeLockView | None, JSON | None], UpdateAction],
    ) -> Seen:
        seen = self._obs.get(lock.node)
        fresh = False
        writes = 0
        cause: Exception | None = None
        while True:
            view = self._view(seen, self._clock()) if seen is not None else None
            action = decide(view, seen.lease if seen is not None else None)
            if isinstance(action, Read):
                if fresh:
                    what = "no longer exists" if seen is None else "was deleted and created again"
                    raise LockLost(lock.node, f"the Lease {what}") from cause
                seen, fresh = await self._read(lock.node), True
                continue
            if isinstance(action, Refuse):
                if isinstance(action.error, StaleToken):
                    self._metrics.stale(operation)
                raise action.error from cause
            if writes == MAX_WRITES:
                raise LockLost(lock.node, "the Lease kept changing under the write") from cause
            writes += 1
            try:
                lease = await self._kube.replace(self._path(lock.node), action.body)
            except Conflict as exc:
                cause = exc
                seen, fresh = await self._read(lock.node), True
                continue
            except NotFound as exc:
                self._obs.forget(lock.node)
                raise LockLost(lock.node, "the Lease was deleted") from exc
            return self._took(lease)

    async def break_lock(
        self, node: NodeName, *, token: FencingToken | None = None
    ) -> LockRecord | None:
        """Release ``node``'s lock whoever holds it (outcome ``broken``); returns what was broken.

        None when the lock is free or has no Lease.  Reads first, so it never acts on an old view.
        With ``token``, breaks only the lock with that token (the one a person was shown) and
        raises ``LockLost`` if the lock has changed hands since.
        """
        cause: Exception | None = None
        for _ in range(MAX_WRITES):
            seen = await self._read(node)
            if seen is None:
                return None
            view = self._view(seen, self._clock())
            if token is not None and view.record.holder is not None and view.record.token != token:
                raise LockLost(
                    node,
                    f"the lock changed hands (now token {view.record.token}, held by "
                    f"{view.record.holder.key}); nothing was broken",
                )
            action = decide_break(view, seen.lease, fmt=self.format, now=self._microtime())
            if action is None:
                return None
            try:
                lease = await self._kube.replace(self._path(node), action.body)
            except Conflict as exc:
                cause = exc
                continue
            self._took(lease)
            self._metrics.released(Outcome.BROKEN, view.held_for_s)
            return view.record
        raise LockLost(node, "the Lease kept changing; nothing was broken") from cause

    async def inspect(self, node: NodeName) -> NodeLockView | None:
        """Read ``node``'s Lease (one GET); None when it has none."""
        seen = await self._read(node)
        return self._view(seen, self._clock()) if seen is not None else None

    async def list(self) -> list[NodeLockView]:
        """Read every node lock in the namespace (one LIST), sorted by node."""
        answer = await self._kube.list(self._path(), label_selector=LABEL_SELECTOR)
        return self._take_list(answer, None)

    def _take_list(self, answer: JSON, only: NodeName | None) -> builtins.list[NodeLockView]:
        now = self._clock()
        views: builtins.list[NodeLockView] = []
        present: set[NodeName] = set()
        for lease in answer.get("items") or []:
            try:
                record = self.format.parse(lease)
            except MalformedLease as exc:
                log.warning("ignoring malformed Lease %s: %s", lease.get("metadata", {}), exc)
                continue
            present.add(record.node)
            views.append(self._view(self._obs.observe(record, lease, now, replace=True), now))
        for node in self._obs.nodes():
            if node not in present and (only is None or node == only):
                self._obs.forget(node)
        return sorted(views, key=lambda v: v.node)

    # -- keeping observations current --------------------------------------------------------

    async def watch(
        self, *, node: NodeName | None = None, on_change: OnChange | None = None
    ) -> None:
        """List and watch the node locks (all, or only ``node``) until cancelled.

        Runs the list-then-watch loop of ``kube.reflector``: relists on 410 Gone and after any
        error, retries connection errors with capped exponential backoff, and calls
        ``on_change(view, node)`` for every change (``view`` None when a Lease is deleted).
        While the watch is established (from a successful list until the next error), refusals
        from this process's observations need no request.
        """
        live = False

        def replace(items: builtins.list[JSON]) -> None:
            nonlocal live
            known = set(self._obs.nodes()) if node is None else {node}
            views = self._take_list({"items": items}, node)
            if not live:
                self._set_live(node, +1)
                live = True
            if on_change is not None:
                for view in views:
                    on_change(view, view.node)
                for gone in sorted(known - {v.node for v in views}):
                    on_change(None, gone)

        def apply(kind: str, lease: Mapping[str, Any]) -> None:
            name = NodeName(str((lease.get("metadata") or {}).get("name", "")))
            if kind == "DELETED":
                self._obs.forget(name)
                if on_change is not None:
                    on_change(None, name)
                return
            try:
                view = self.observe(dict(lease))
            except MalformedLease as exc:
                log.warning("ignoring malformed Lease %s: %s", name, exc)
                return
            if on_change is not None:
                on_change(view, name)

        def broken() -> None:
            nonlocal live
            if live:
                self._set_live(node, -1)
                live = False

        reflector = Reflector(
            self._kube,
            self._path(),
            name="lease watch",
            replace=replace,
            apply=apply,
            alive=lambda: None,
            on_broken=broken,
            relist_when_silent=False,
            relist_after_error=True,
            field_selector=f"metadata.name={node}" if node is not None else None,
            label_selector=LABEL_SELECTOR,
            watch_timeout_s=WATCH_TIMEOUT_S,
            max_backoff_s=BACKOFF_MAX_S,
        )
        try:
            await reflector.run()
        finally:
            broken()

    def _set_live(self, node: NodeName | None, delta: int) -> None:
        if node is None:
            self._live_all += delta
        else:
            self._live_nodes[node] += delta
