"""Bind: choose the pod's GPUs, take the node lock, prove the choice, bind with one write.

The steps (docs/design.md, "Bind"):

1. *Choose* devices from the cache plus the lock holder's assignment (pure, ``choose``).
2. *Wait its turn, then acquire* the node's lock for the pod, its assignment in the Lease.
   Binds to one node queue in FIFO order (``scheduler_ext.waiting``): only the head tries, woken
   by the Lease watch when the lock is released, and choosing happens after the wait, from the
   view that includes the previous holder.  A bind that cannot get its turn within the wait
   budget (or is expected not to) fails with the holder, its age and the queue depth;
   kube-scheduler backs the pod off and retries.  A second bind of a pod that already holds the
   lock fails instead of taking a new token.
3. *Confirm* against a view of the node that cannot miss a finished handoff: the Lease names the
   previous holder; once the cache has seen that pod bound (or deleted), the watch's ordering
   means it has seen every earlier binding on the node.  When the previous holder never bound
   (bind-failed, broken, taken over), is not seen within ``confirm_wait_s`` (0.2 s for a previous
   holder this cache has no record of: deleted before this replica started), or the Lease names
   no previous holder at all (a new Lease — or one deleted or reset by hand mid-handoff), the
   node's pods are listed instead (one consistent LIST of that node).  A conflicting choice is
   made again and the Lease's copy rewritten (conditional on our token), or the bind fails.
4. *Bind* with one ``pods/binding`` create carrying the assignment, token and bind time as
   annotations and the pod UID as precondition.
   Just before the write, the Lease as last seen must still carry our token and pod.
5. Any failure after acquiring releases the lock (conditional on our token) — except when the
   binding's outcome is unknown (the API server did not answer, or the bind was interrupted
   after the write was sent); then the lock is kept, since the pod may be bound, and is taken
   over later only once its holder is seen not bound here.

Guarantees: no device is given to two live pods by binds that all go through node locks (two
extender replicas included), provided the inventory's device IDs are stable.  A bind is never
written more than ``duration_s / 3`` after the acquire was sent, so a bind that stalls cannot
land after another holder took the lock over (takeover needs ``duration_s`` of no change).

Every bind has one deadline from its arrival (``scheduler_ext.deadline``): kube-scheduler's
``httpTimeout`` less a slack.  Every request it sends — its own and lockd's — is checked against
it and given no more than the time left; it is checked again after the wait, before and after
taking the lock, and before the binding.  A bind past its deadline, or whose caller left
(``abandon``), sends no further Lease write and no binding; one that took the lock by then
releases it.  After its wait a bind also looks at the cache once more: a pod seen bound
meanwhile (a retry bound it elsewhere) fails without a Lease write.  The configuration check
(``config.check_bind_timing``) keeps the worst-case path of a bind that waits its whole budget
inside that deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from handoff.holder import Ended
from handoff.wire import LEASE_ASSIGNMENT, Assignment, format_assignment, format_token
from kube import failpoints
from kube.client import KubeClient, pod_path
from kube.errors import ApiError, ApiUnavailable, Conflict, NotFound
from lockd.errors import LockError, LockHeld
from lockd.locks import NodeLocks
from lockd.microtime import now_microtime
from lockd.model import FencingToken, HeldLock, Holder, HolderKey, LockRecord, NodeName, Outcome
from scheduler_ext.cache import ClusterCache, node_gpus
from scheduler_ext.choose import Fit, NodeGPUs, NoFit, choose, conflicts, fit
from scheduler_ext.config import DEFAULT_HTTP_TIMEOUT_S, BindPath
from scheduler_ext.deadline import (
    BindCancelled,
    BindDeadline,
    CallDeadlines,
    bind_deadline,
    unguarded,
)
from scheduler_ext.metrics import ExtenderMetrics, Result
from scheduler_ext.need import PodNeed
from scheduler_ext.protocol import BindingArgs
from scheduler_ext.state import BadObject, PodState
from scheduler_ext.takeover import (
    DEFAULT_REQUEST_TIMEOUT_S,
    binding_may_still_land,
    bound_elsewhere,
    cached_ended,
    cached_judgement,
    ended_holders,
    expired_and_left,
    holder_accounted,
    judge,
)
from scheduler_ext.verbs import with_lock_holder
from scheduler_ext.waiting import BindQueues, WaitRefused

log = logging.getLogger(__name__)

CONFIRM_WAIT_S = 2.0
UNKNOWN_HOLDER_WAIT_S = 0.2
DEFAULT_WAIT_BUDGET_S = 4.0
SWEEP_S = 2.0  # how often locks left behind (holder bound elsewhere, expired and left) are sought
MIN_BINDING_BUDGET_S = 0.5
PROVEN_OUTCOMES = frozenset({Outcome.ALLOCATED.value, Outcome.REJECTED.value})


@dataclass(frozen=True)
class BindOutcome:
    """What a bind call ended with: ``error`` empty when bound."""

    result: Result
    error: str = ""
    assignment: Assignment | None = None
    token: int | None = None


def keep_lock_after(exc: BaseException, *, binding_sent: bool) -> bool:
    """Whether a bind that failed with ``exc`` after taking the lock must keep it.

    Before the binding was sent, the pod cannot be bound: release.  After it was sent, only an
    answer from the API server proves it was not applied (a refusal: ``ApiError``, or
    ``BindFailed`` after checking); a cancellation or any other interruption leaves the outcome
    unknown, and a released lock could go to a second pod while kubelet admits this one.
    """
    if not binding_sent:
        return False
    return not isinstance(exc, BindFailed | ApiError | LockError | BindCancelled)


class BindFailed(Exception):
    """A bind step failed; the message goes to kube-scheduler (and the pod's events)."""

    def __init__(self, result: Result, message: str) -> None:
        super().__init__(message)
        self.result = result


class Binder:
    """Carries out bind calls against one cache, one ``NodeLocks`` and one API client."""

    def __init__(
        self,
        kube: KubeClient,
        cache: ClusterCache,
        locks: NodeLocks,
        metrics: ExtenderMetrics,
        *,
        duration_s: int,
        wait_budget_s: float = DEFAULT_WAIT_BUDGET_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        confirm_wait_s: float = CONFIRM_WAIT_S,
        http_timeout_s: float = DEFAULT_HTTP_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        on_takeover: Callable[[LockRecord, str], None] | None = None,
        on_ended: Callable[[NodeName, Holder, FencingToken, Ended], None] | None = None,
    ) -> None:
        """``kube`` and ``locks`` should send through a ``deadline.DeadlineClient``: then every
        request of a bind, lockd's included, is held to the bind's deadline."""
        self._on_takeover = on_takeover  # an Event: the expired lock is about to be taken over
        self._on_ended = on_ended  # an Event: the lock of a holder that ended was released
        self._kube = kube
        self._cache = cache
        self._locks = locks
        self._metrics = metrics
        self._duration_s = duration_s
        # the confirm wait must leave most of the binding's budget (duration / 3) to the write
        self._confirm_wait_s = min(confirm_wait_s, duration_s / 6)
        self._clock = clock
        self._request_timeout_s = request_timeout_s
        self._http_timeout_s = http_timeout_s
        self._path = BindPath(wait_budget_s, duration_s)
        # (node, pod UID) -> the deadline of that bind under way here
        self._deadlines = CallDeadlines()
        self.queues = BindQueues(budget_s=wait_budget_s, clock=clock, on_refused=metrics.refused)
        metrics.follow_queues(self.queues.depths)

    # ---- the takeover check (docs/design.md, "Expiry and takeover") ------------------------

    async def may_take_over(self, record: LockRecord) -> bool:
        """True only when the expired lock's holder has left the handoff (``takeover.judge``)."""
        holder = record.holder
        if holder is None:
            return True
        cached = self._cache.pod(holder.uid)
        verdict = judge(
            cached,
            holder_uid=holder.uid,
            node=record.node,
            fresh=False,
            known_gone=self._cache.is_gone(holder.uid),
        )
        if verdict.allowed is None:
            namespace, _, name = holder.key.partition("/")
            fresh: PodState | None
            try:
                obj = await self._kube.get(pod_path(namespace, name))
                fresh = self._cache.pod_state(obj)
            except NotFound:
                fresh = None
            except (ApiError, ApiUnavailable, BadObject) as exc:
                log.warning("node %s: cannot read lock holder %s: %s", record.node, holder.key, exc)
                return False
            verdict = judge(fresh, holder_uid=holder.uid, node=record.node, fresh=True)
        view = self._locks.view(record.node)
        held_for = view.held_for_s if view is not None and view.record == record else 0.0
        if verdict.allowed and binding_may_still_land(
            verdict.state,
            held_for_s=held_for,
            duration_s=self._duration_s,
            request_timeout_s=self._request_timeout_s,
        ):
            log.info(
                "node %s: expired lock of %s (token %d) not taken over: not bound yet, but a "
                "binding its bind sent may still be applied (held %.1fs)",
                record.node,
                holder.key,
                record.token,
                held_for,
            )
            return False
        log.info(
            "node %s: expired lock of %s (token %d): takeover %s: %s",
            record.node,
            holder.key,
            record.token,
            "allowed" if verdict.allowed else "refused",
            verdict.why,
        )
        if verdict.allowed and self._on_takeover is not None:
            self._on_takeover(record, verdict.why)
        return bool(verdict.allowed)

    # ---- locks left behind --------------------------------------------------------------------

    async def release_bound_elsewhere(self) -> int:
        """Release every held lock whose holder this cache saw bound to another node (see
        ``takeover.bound_elsewhere``); returns how many it released."""

        def node_of(uid: str) -> NodeName | None:
            pod = self._cache.pod(uid)
            return pod.node if pod is not None else None

        released = 0
        for node, holder in bound_elsewhere(self._locks.holders(), node_of):
            why = f"its holder {holder.key} is bound to {node_of(holder.uid)}"
            released += await self._release_left(node, holder, Outcome.BIND_FAILED, why) is not None
        return released

    def ended_now(self) -> set[tuple[NodeName, str]]:
        """(node, holder UID) of every held lock whose holder this cache saw end (sends
        nothing)."""
        ended = ended_holders(self._locks.holders(), cached_ended(self._cache))
        return {(node, holder.uid) for node, holder, _ in ended}

    def _newly_ended(self, tried: set[tuple[NodeName, str]]) -> Callable[[], bool]:
        return lambda: bool(self.ended_now() - tried)

    async def release_ended(self) -> int:
        """Release, at once, every held lock whose holder this cache saw Succeed or deleted
        (``takeover.ended_holders``), expired or not, fenced by its token; returns how many.  A
        holder seen Failed is left to its node's serving device plugin, or to expiry
        (``release_expired_left``)."""
        released = 0
        for node, holder, end in ended_holders(self._locks.holders(), cached_ended(self._cache)):
            token = await self._release_left(node, holder, end.outcome, end.why)
            if token is None:
                continue
            released += 1
            if self._on_ended is not None:
                self._on_ended(node, holder, token, end)
        return released

    async def release_expired_left(self) -> int:
        """Release every expired lock whose holder this cache saw leave the handoff for good
        (``takeover.expired_and_left``: gone, finished, admitted); returns how many."""
        released = 0
        for node, holder, why in expired_and_left(
            self._locks.holders(),
            expired=self._locks.expired,
            cached_judgement=cached_judgement(self._cache),
        ):
            released += await self._release_left(node, holder, Outcome.EXPIRED, why) is not None
        return released

    async def _release_left(
        self, node: NodeName, holder: Holder, outcome: Outcome, why: str
    ) -> FencingToken | None:
        """Release ``node``'s lock if ``holder`` still holds it, fenced by the token (a lock
        that changed hands meanwhile is left alone); the released token, None if not."""
        view = self._locks.view(node)
        if view is None or view.record.holder is None or view.record.holder.uid != holder.uid:
            return None
        held = HeldLock(node, view.record.holder, view.record.token, view.record.resource_version)
        try:
            await self._locks.release(held, outcome=outcome)
        except (LockError, ApiError, ApiUnavailable) as exc:
            log.info("lock of %s left by %s not released: %s", node, holder.key, exc)
            return None
        self.queues.notify(node)
        log.info("released the lock of %s (token %d, %s): %s", node, held.token, outcome, why)
        return held.token

    async def sweep(self, *, every_s: float = SWEEP_S) -> None:
        """Release locks left behind, forever.  Once the cache shows a lock's holder ended
        (Succeeded, deleted; not Failed), at once: the pod watch's event wakes the sweep
        (``release_ended``).  Every ``every_s``: those again (a release that failed is retried
        then), those whose holder is bound elsewhere (``release_bound_elsewhere``) and expired
        ones whose holder left the handoff (``release_expired_left``)."""
        loop = asyncio.get_running_loop()  # the pace is real time, whatever ``clock`` is
        tried: set[tuple[NodeName, str]] = set()
        full_at = loop.time() + every_s
        while True:
            left = max(0.0, full_at - loop.time())
            await self._cache.wait_until(self._newly_ended(tried), timeout_s=left)
            try:
                tried = self.ended_now()
                await self.release_ended()
                if loop.time() >= full_at:
                    full_at = loop.time() + every_s
                    await self.release_bound_elsewhere()
                    await self.release_expired_left()
            except Exception:  # a sweep must never stop the extender
                log.exception("releasing locks left behind failed")
                full_at = loop.time() + every_s
                await asyncio.sleep(min(every_s, 0.5))

    # ---- bind -------------------------------------------------------------------------------

    async def bind(self, args: BindingArgs, *, arrived_at: float | None = None) -> BindOutcome:
        """Bind the pod of ``args`` to its node, within the deadline of a request that arrived at
        ``arrived_at`` (this binder's clock; default: now); never raises for expected failures.
        """
        arrived = self._clock() if arrived_at is None else arrived_at
        deadline = BindDeadline.from_arrival(
            arrived, http_timeout_s=self._http_timeout_s, clock=self._clock
        )
        self._deadlines.begin(args.node, args.pod_uid, deadline)
        try:
            with bind_deadline(deadline):
                return await self._bind(args, deadline)
        except BindFailed as exc:
            return BindOutcome(exc.result, str(exc))
        except BindCancelled as exc:
            return BindOutcome(Result.ERROR, f"bind of {args.key} to {args.node}: {exc}")
        finally:
            self._deadlines.end(args.node, args.pod_uid, deadline)

    def abandon(self, node: NodeName, uid: str) -> None:
        """The caller of ``uid``'s bind stopped waiting (kube-scheduler's timeout, a disconnect):
        a queued bind leaves its queue, and from now on the bind sends no Lease write and no
        binding; a lock it took is released.  Every call under way for the pod and node is
        cancelled, also a retry that arrived while an earlier call still ran."""
        self._deadlines.cancel(node, uid)
        self.queues.abandon(node, uid)

    async def _pod(self, args: BindingArgs) -> PodState:
        pod = self._cache.pod(args.pod_uid)
        if pod is not None and pod.key == args.key:
            return pod
        try:
            obj = await self._kube.get(pod_path(args.pod_namespace, args.pod_name))
            pod = self._cache.pod_state(obj)
        except NotFound as exc:
            raise BindFailed(Result.ERROR, f"pod {args.key} not found") from exc
        except (ApiError, ApiUnavailable, BadObject) as exc:
            raise BindFailed(Result.ERROR, f"cannot read pod {args.key}: {exc}") from exc
        if pod.uid != args.pod_uid:
            raise BindFailed(Result.ERROR, f"pod {args.key} has UID {pod.uid}, not {args.pod_uid}")
        return pod

    def _picture(self, node: NodeName, uid: str) -> NodeGPUs:
        gpus = self._cache.node_gpus(node, exclude_uid=uid)
        if gpus is None:
            raise BindFailed(Result.ERROR, f"node {node} is not in the GPU extender's cache")
        view = self._locks.view(node)
        return with_lock_holder(
            gpus,
            view,
            pod_uid=uid,
            keys=self._cache.keys,
            finished=holder_accounted(self._cache, view),
        )

    async def _bind(self, args: BindingArgs, deadline: BindDeadline) -> BindOutcome:
        node = args.node
        pod = await self._pod(args)
        if pod.node is not None:
            raise BindFailed(Result.ERROR, f"pod {args.key} is already bound to {pod.node}")
        if pod.need is None:
            raise BindFailed(Result.ERROR, f"pod {args.key}: {pod.need_error}")
        if not pod.need.wants_gpus:
            await self._post_binding(args, annotations={})
            self._metrics.bound(args.pod_uid)
            return BindOutcome(Result.OK)
        # the wait ends early enough for every step after it to fit before the deadline
        give_up_at = deadline.at - self._path.after_wait_s
        try:
            async with self.queues.turn(
                node, args.pod_uid, args.key, give_up_at=give_up_at
            ) as turn:
                while True:
                    await turn.ready(lambda: self._locks.view(node))
                    deadline.check("taking the lock")
                    self._not_bound_meanwhile(args)
                    await self._not_holding_already(args)
                    try:
                        assignment = choose(self._picture(node, args.pod_uid), pod.need)
                    except NoFit as exc:
                        raise BindFailed(Result.NO_FIT, f"pod {args.key}: {exc}") from exc
                    holder = self._holder(args, assignment)
                    deadline.check("taking the lock")
                    acquire_sent = self._clock()
                    try:
                        # never a new token for a pod that holds the lock already: its earlier
                        # bind's binding may still land (this replica's view may not show it)
                        held = await self._locks.acquire(
                            node, holder, may_take_over=self.may_take_over, reacquire=False
                        )
                    except LockHeld:
                        turn.lost(self._locks.view(node))  # a race lost: stay head, wait again
                        continue
                    except (LockError, ApiError, ApiUnavailable, ValueError) as exc:
                        raise BindFailed(
                            Result.ERROR, f"cannot take the lock of node {node}: {exc}"
                        ) from exc
                    self._metrics.queue_wait.observe(turn.waited_s)
                    return await self._bind_holding(
                        args, pod.need, held, assignment, deadline, acquire_sent
                    )
        except WaitRefused as exc:
            self._metrics.contended(args.pod_uid)
            raise BindFailed(Result.CONTENDED, str(exc)) from exc

    async def _bind_holding(
        self,
        args: BindingArgs,
        need: PodNeed,
        held: HeldLock,
        assignment: Assignment,
        deadline: BindDeadline,
        acquired_at: float,
    ) -> BindOutcome:
        """Steps 3-5 with the lock held: confirm, the one binding write, release on failure.
        ``acquired_at``: when the acquire was sent (the Lease write cannot be older)."""
        node = args.node
        sent = False  # whether the binding write may have reached the API server
        failpoints.hit("bind.after-acquire")  # e2e: an extender crash with the lock held, unbound
        try:
            deadline.check("confirming its choice, with the lock held")
            held, assignment = await self._confirm(held, args, need, assignment)
            annotations = {
                self._cache.keys.assignment: format_assignment(assignment),
                self._cache.keys.token: format_token(held.token),
                self._cache.keys.bound_at: now_microtime(),
            }
            left = self._duration_s / 3 - (self._clock() - acquired_at)
            if left < MIN_BINDING_BUDGET_S:  # too little time left to send it safely
                raise BindFailed(
                    Result.ERROR,
                    f"bind of {args.key} to {node} took longer than {self._duration_s / 3:.1f}s "
                    "after taking the lock; released it",
                )
            left = min(left, deadline.check("the binding"))
            if left < MIN_BINDING_BUDGET_S:
                raise BindFailed(
                    Result.ERROR,
                    f"bind of {args.key} to {node}: {left:.2f}s left before kube-scheduler's "
                    f"httpTimeout, too little to send the binding; released the lock",
                )
            self._still_ours(held)
            sent = True
            await self._post_binding(args, annotations=annotations, timeout_s=left)
            failpoints.hit("bind.after-binding")  # e2e: bound, but kube-scheduler never hears so
        except _Unknown as exc:
            log.warning("%s; keeping the lock of %s (token %d)", exc, node, held.token)
            raise BindFailed(Result.ERROR, str(exc)) from exc
        except BaseException as exc:
            if keep_lock_after(exc, binding_sent=sent):
                # cancelled (or broken) with the binding on its way: it may land, so the lock
                # stays; it is taken over only once its holder is seen not bound here
                log.warning(
                    "bind of %s to %s interrupted after its binding was sent (%r); keeping "
                    "the lock (token %d)",
                    args.key,
                    node,
                    exc,
                    held.token,
                )
                raise
            await self._release(held, args)
            if isinstance(exc, BindFailed):
                raise
            if isinstance(exc, BindCancelled):
                raise BindFailed(
                    Result.ERROR, f"bind of {args.key} to {node}: {exc}; released the lock"
                ) from exc
            if isinstance(exc, (ApiError, ApiUnavailable, LockError)):
                raise BindFailed(Result.ERROR, f"bind of {args.key} failed: {exc}") from exc
            raise
        self._metrics.bound(args.pod_uid)
        log.info("bound %s to %s with token %d: %s", args.key, node, held.token, assignment)
        return BindOutcome(Result.OK, assignment=assignment, token=held.token)

    def _still_ours(self, held: HeldLock) -> None:
        """The last look before the binding write: the node's Lease, as the watch last showed
        it, must still carry our token and pod (a Lease deleted, reset or broken by hand
        mid-bind fails the bind instead of binding against a lock nobody holds)."""
        view = self._locks.view(held.node)
        holder = view.record.holder if view is not None else None
        if (
            view is None
            or view.record.token != held.token
            or holder is None
            or (holder.uid != held.holder.uid)
        ):
            seen = "gone" if view is None else f"token {view.record.token}"
            raise BindFailed(
                Result.CONFLICT,
                f"node {held.node}'s lock changed under the bind of {held.holder.key} "
                f"(ours: token {held.token}; now {seen}); not bound",
            )

    def _not_bound_meanwhile(self, args: BindingArgs) -> None:
        """After its wait, the bind's pod must still be unbound as the cache shows it: a retry
        of it may have been bound elsewhere (or here) while this bind queued.  Refused without a
        Lease write: a token for a bound pod would only end in a 409 and a ``bind-failed``
        release, which makes the next bind on the node list its pods."""
        pod = self._cache.pod(args.pod_uid)
        if pod is not None and pod.node is not None:
            raise BindFailed(
                Result.ERROR,
                f"pod {args.key} was bound to {pod.node} while this bind waited its turn on "
                f"{args.node}; not bound again",
            )

    async def _not_holding_already(self, args: BindingArgs) -> None:
        """Refuse a second bind of a pod that already holds the node's lock: an earlier call for
        it bound it after kube-scheduler stopped waiting, or is still binding.  Acquiring again
        would give the lock a new token that the first call's binding does not carry.  Once
        that lock has expired and the pod is still not bound, it may be acquired again."""
        view = self._locks.view(args.node)
        holder = view.record.holder if view is not None else None
        if view is None or holder is None or holder.uid != args.pod_uid:
            return
        try:
            obj = await self._kube.get(pod_path(args.pod_namespace, args.pod_name))
        except (ApiError, ApiUnavailable) as exc:
            raise BindFailed(Result.ERROR, f"cannot read pod {args.key}: {exc}") from exc
        bound_to = (obj.get("spec") or {}).get("nodeName")
        if bound_to:
            raise BindFailed(Result.ERROR, f"pod {args.key} is already bound to {bound_to}")
        if not view.expired:
            raise BindFailed(
                Result.ERROR,
                f"pod {args.key} already holds the lock of {args.node} (token "
                f"{view.record.token}, {view.held_for_s:.1f}s): another bind of it is under way",
            )

    def _holder(self, args: BindingArgs, assignment: Assignment) -> Holder:
        return Holder(
            key=HolderKey(args.key),
            uid=args.pod_uid,
            data={LEASE_ASSIGNMENT: format_assignment(assignment)},
        )

    async def _release(self, held: HeldLock, args: BindingArgs) -> None:
        try:
            with unguarded():  # the lock this bind took goes back even after its caller left
                await self._locks.release(held, outcome=Outcome.BIND_FAILED)
            self.queues.notify(held.node)
        except (LockError, ApiError, ApiUnavailable) as exc:
            log.warning(
                "could not release the lock of %s for %s (token %d): %s; it will expire",
                held.node,
                args.key,
                held.token,
                exc,
            )

    # ---- step 3: confirm --------------------------------------------------------------------

    async def _complete_view(self, held: HeldLock, uid: str) -> NodeGPUs:
        """The node's GPUs from a view that includes every finished handoff before ours."""
        node = held.node
        view = self._locks.view(node)
        last = view.record.last if view is not None and view.record.token == held.token else None
        if last is not None and last.outcome in PROVEN_OUTCOMES and last.uid:
            # The wait covers a watch a moment behind.  A previous holder this cache has no
            # record of at all is most likely one deleted before this replica started, which
            # will never appear: it gets a short wait, then the node is listed.
            known = self._cache.pod(last.uid) is not None or self._cache.is_gone(last.uid)
            started = self._clock()
            seen = await self._cache.wait_until(
                lambda: self._cache.seen_bound_or_gone(last.uid),
                timeout_s=self._confirm_wait_s if known else UNKNOWN_HOLDER_WAIT_S,
            )
            self._metrics.confirm_wait.observe(self._clock() - started)
            if seen:
                gpus = self._cache.node_gpus(node, exclude_uid=uid)
                if gpus is not None:
                    return gpus
        # No proven previous handoff: it never bound, or the Lease has no last holder at all — a
        # new node, or a Lease deleted or reset by hand, possibly under a holder that is bound
        # and not yet admitted.  Nothing proves the cache complete then: list the node.
        return await self._listed_view(node, uid)

    async def _listed_view(self, node: NodeName, uid: str) -> NodeGPUs:
        self._metrics.confirm_fallbacks.inc()
        state = self._cache.node(node)
        if state is None:
            raise BindFailed(Result.ERROR, f"node {node} is not in the GPU extender's cache")
        answer = await self._kube.list(pod_path(), field_selector=f"spec.nodeName={node}")
        pods: list[PodState] = []
        for obj in answer.get("items") or []:
            try:
                pods.append(self._cache.pod_state(obj))
            except BadObject:
                continue
        return node_gpus(state, [p for p in pods if p.uid != uid])

    async def _confirm(
        self, held: HeldLock, args: BindingArgs, need: PodNeed, assignment: Assignment
    ) -> tuple[HeldLock, Assignment]:
        gpus = await self._complete_view(held, args.pod_uid)
        problems = conflicts(assignment, gpus, need)  # need: slices on sharing nodes
        if not problems and fit(gpus, need).fit is Fit.FITS:
            return held, assignment
        log.info(
            "node %s: choice for %s conflicts with a handoff the cache had not seen (%s); "
            "choosing again",
            held.node,
            args.key,
            "; ".join(problems) or "too few free GPUs",
        )
        try:
            again = choose(gpus, need)
        except NoFit as exc:
            raise BindFailed(
                Result.CONFLICT, f"pod {args.key}: {exc} (seen after taking the lock)"
            ) from exc
        rewritten = HeldLock(
            held.node, self._holder(args, again), held.token, held.resource_version
        )
        try:
            renewed = await self._locks.renew(rewritten)
        except (LockError, ApiError, ApiUnavailable) as exc:
            raise BindFailed(
                Result.CONFLICT, f"pod {args.key}: could not rewrite the lock's assignment: {exc}"
            ) from exc
        return renewed, again

    # ---- step 4: the one write --------------------------------------------------------------

    async def _post_binding(
        self, args: BindingArgs, *, annotations: dict[str, str], timeout_s: float | None = None
    ) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": args.pod_name,
                "namespace": args.pod_namespace,
                "uid": args.pod_uid,
                "annotations": annotations,
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        }
        path = pod_path(args.pod_namespace, args.pod_name, subresource="binding")
        try:
            await self._kube.request("POST", path, body=body, timeout_s=timeout_s)
        except ApiUnavailable as exc:
            if await self._bound_anyway(args, annotations):
                return
            if annotations:  # it may still land: keep the lock (see the module docstring)
                raise _Unknown(
                    f"binding {args.key} to {args.node}: the API server did not answer ({exc}); "
                    "the pod may or may not be bound"
                ) from exc
            raise
        except Conflict as exc:
            if await self._bound_anyway(args, annotations):
                return
            raise BindFailed(Result.ERROR, f"binding {args.key} refused: {exc}") from exc

    async def _bound_anyway(self, args: BindingArgs, annotations: dict[str, str]) -> bool:
        """Whether the pod is bound to the node with exactly our annotations (a lost answer).
        False also when the check cannot be made, past the bind's deadline included: the caller
        then keeps a lock whose binding may still land (an unknown outcome)."""
        try:
            obj = await self._kube.get(pod_path(args.pod_namespace, args.pod_name))
        except (ApiError, ApiUnavailable, BindCancelled):
            return False
        meta = obj.get("metadata") or {}
        on_pod = meta.get("annotations") or {}
        return (
            meta.get("uid") == args.pod_uid
            and (obj.get("spec") or {}).get("nodeName") == args.node
            and all(on_pod.get(k) == v for k, v in annotations.items())
        )


class _Unknown(Exception):
    """The binding may or may not have happened: keep the lock."""
