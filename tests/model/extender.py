"""An extender replica: its watch-fed cache, its node locks, and its binds as explicit steps.

A bind (``scheduler_ext.binder.Binder._bind``) is cut at the points where the real one awaits
the API server or its node's wait queue, so faults can land between them.  Every bind has one
deadline from its arrival (``scheduler_ext.deadline.BindDeadline``, kube-scheduler's
``httpTimeout`` less the answer's slack), checked where the real bind checks it and before every
request it sends (``_request``: what ``DeadlineClient`` does); kube-scheduler's giving up is
``abandon`` (the caller's disconnect).

1. ``begin``: read the pod (cache, else GET), refuse a bound pod, join the node's queue
   (``BindQueues.turn``, this replica's own), then ``resume``.
   ``resume``: run ``Turn.ready`` (the project's loop, its sleep parked for the model: it
   resumes when the waiter was woken -- the Lease watch's ``lock_changed``, the head leaving,
   ``abandon`` -- or its wait deadline passed); a refusal (budget, fail fast, abandoned) fails
   the bind; once ready: the deadline, the cache's view of the pod (bound meanwhile?), refuse
   when this pod already holds the lock, choose devices from the cache plus the lock holder's
   assignment, acquire the node lock (the ``NodeLocks.acquire`` loop, with
   ``Binder.may_take_over``); a lost race (``LockHeld``) is ``Turn.lost`` and the bind waits
   again.
2. ``confirm``: the complete view (cache once the previous holder is seen bound or gone, else a
   LIST of the node, also when the Lease has no last holder), conflicts/fit, choose again and
   renew the Lease's copy when needed.
3. ``send``: the time budget check (``duration / 3`` since acquiring, and the bind's deadline),
   the last look at the Lease (``_still_ours``), then the one ``pods/binding`` create, which
   stays in flight until the server processes it.
4. ``answer``: the binding's answer: bound; a 409 or a lost answer answered by a GET
   (``_bound_anyway``); an unknown outcome keeps the lock, every other failure releases it.

GLUE (replicated from ``scheduler_ext/binder.py``, which mixes these reads into its decisions):
``_pod`` (cache or GET), ``_not_holding_already`` (a GET decides), ``may_take_over``
(a GET when the cache cannot answer, then ``binding_may_still_land``),
``_complete_view``/``_listed_view`` (a LIST decides which view the choice is proven against),
``_post_binding``/``_bound_anyway`` (a GET decides success), ``_bind``'s loop around the queue
(``Turn.ready``, the checks after it, ``acquire``, ``Turn.lost``), ``Binder.bind``/``abandon``
(each call's deadline in a ``CallDeadlines``), ``DeadlineClient.request`` (``_request``), and
``BindQueues.sleep`` (``ModelQueues``: the wait parked, resumed by the model).
The decisions are the project's: ``choose``, ``conflicts``, ``fit``, ``with_lock_holder``,
``judge``, ``pod_state``, ``node_gpus``, ``ClusterCache``, ``BindQueues`` and ``Turn`` (the
queue, ``ready``'s loop, ``give_up_reason``, ``expected_wait_s``, ``lock_changed``),
``BindDeadline``, ``CallDeadlines``, ``BindPath``.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from handoff.wire import LEASE_ASSIGNMENT, Assignment, format_assignment
from kube.errors import ApiUnavailable, Conflict, NotFound
from lockd.errors import LockError, LockHeld
from lockd.model import HeldLock, Holder, HolderKey, LockRecord, NodeName, Outcome
from scheduler_ext import takeover
from scheduler_ext.binder import DEFAULT_WAIT_BUDGET_S, MIN_BINDING_BUDGET_S, PROVEN_OUTCOMES
from scheduler_ext.cache import ClusterCache, node_gpus
from scheduler_ext.choose import Fit, NodeGPUs, NoFit, Policy, choose, conflicts, fit
from scheduler_ext.config import DEFAULT_HTTP_TIMEOUT_S, BindPath
from scheduler_ext.deadline import BindCancelled, BindDeadline, CallDeadlines
from scheduler_ext.need import PodNeed
from scheduler_ext.state import PodState, pod_state
from scheduler_ext.takeover import holder_accounted, judge
from scheduler_ext.verbs import filter_nodes, prioritize_nodes, with_lock_holder
from scheduler_ext.waiting import BindQueues, Turn, WaitRefused
from tests.model.locks import DURATION_S, Clock, LockClient
from tests.model.world import (
    JSON,
    KEYS,
    REQUEST_TIMEOUT_S,
    RESOURCE,
    BindingRequest,
    Event,
    Kind,
    Store,
    Watch,
)

# ``Binder._bound_anyway``'s exceptions that answer "not bound" besides a failed GET (the model's
# GET fails by ``get_fails``): a plant of ``Hole.BINDING_PAST_DEADLINE`` empties it
UNKNOWN_WHEN: tuple[type[Exception], ...] = (BindCancelled,)

WAIT_BUDGET_S = DEFAULT_WAIT_BUDGET_S  # --bind-wait-budget
HTTP_TIMEOUT_S = DEFAULT_HTTP_TIMEOUT_S  # kube-scheduler's httpTimeout for the extender
PATH = BindPath(WAIT_BUDGET_S, DURATION_S)


class _Park:
    """What a parked wait yields to the model (``ModelQueues.sleep``)."""

    def __await__(self) -> Generator[_Park, None, None]:
        yield self


class ModelQueues(BindQueues):
    """``BindQueues`` with its one timed wait parked for the model.

    GLUE (``BindQueues.sleep``: an ``asyncio.timeout`` around the waiter's wake-up, with its
    deadline as the timeout): the coroutine parks, and the model resumes it once the waiter was
    woken or its deadline passed (``Replica.resumable``); resumed without a wake-up, it timed
    out.  Everything else is the project's ``BindQueues``."""

    async def sleep(self, waiter: Any) -> None:
        if waiter.deadline - self.clock() <= 0:
            return
        await _Park()
        if not waiter.wake.is_set() and self.clock() >= waiter.deadline:
            waiter.timed_out = True


def drive(coro: Coroutine[Any, Any, Any]) -> tuple[bool, Any]:
    """Run ``coro`` until it parks (False, None) or returns (True, its value); it raises what
    the coroutine raises."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return True, stop.value
    return False, None


class Stage(StrEnum):
    NEW = "new"
    WAITING = "waiting"
    ACQUIRED = "acquired"
    CONFIRMED = "confirmed"
    SENT = "sent"
    DONE = "done"


@dataclass
class BindTask:
    """One bind call in flight on a replica."""

    tid: int
    replica: str
    pod_key: str
    uid: str
    node: NodeName
    stage: Stage = Stage.NEW
    held: HeldLock | None = None
    assignment: Assignment | None = None
    need: PodNeed | None = None
    acquired_at: float = 0.0
    request: BindingRequest | None = None
    result: str = ""  # "ok" or why it failed, once DONE
    kept_lock: bool = False  # failed with the lock kept (unknown binding outcome)
    hand_edit_seen: int = 0  # the Lease hand-edit counter when the lock was taken
    deadline: BindDeadline | None = None  # from the call's arrival (``Binder.bind``)
    # the node's queue: the ``turn`` context entered, the turn, ``Turn.ready`` under way
    queue_cm: Any = None
    turn: Turn | None = None
    ready: Coroutine[Any, Any, None] | None = None
    parked: bool = False  # ``ready`` waits for a wake-up or its deadline
    # the model's own record, for W1 and W2 (not the bind's state)
    abandoned: bool = False  # kube-scheduler stopped waiting for this call (it disconnected)
    abandon_at_write: bool = False  # a fault: the disconnect comes as the next write is sent
    late_writes: list[str] = field(default_factory=list)  # writes sent after it was abandoned
    out_of_turn: str = ""  # why it took its turn with an earlier bind ahead of it (W1)

    def __str__(self) -> str:
        token = f" token {self.held.token}" if self.held is not None else ""
        return f"bind#{self.tid}[{self.replica} {self.pod_key}->{self.node} {self.stage}{token}]"


class BindFailed(Exception):
    """A bind step failed (``release``: give the lock back first)."""

    def __init__(self, message: str, *, release: bool) -> None:
        super().__init__(message)
        self.release = release


@dataclass
class Replica:
    """One extender process: cache, node locks, watches and its bind tasks."""

    name: str
    store: Store
    clock: Clock
    skew: float
    cache: ClusterCache = field(init=False)
    locks: LockClient = field(init=False)
    objects: Watch = field(init=False)
    leases: Watch = field(init=False)
    tasks: list[BindTask] = field(default_factory=list)
    queues: ModelQueues = field(init=False)
    # ``Binder._deadlines``: every call under way, per (node, pod UID)
    deadlines: CallDeadlines = field(default_factory=lambda: CallDeadlines())
    # the model's record of each node's queue (task ids in the order they joined), for W1
    order: dict[NodeName, list[int]] = field(default_factory=dict)
    # False while the model avoids ``Hole.BINDING_PAST_DEADLINE``: a head ready only after its
    # wait's end gives up instead of taking the lock
    late_turns: bool = True
    # the instant a request is sent at, when not the model's now (``_bound_anyway``)
    pinned: float | None = None

    def __post_init__(self) -> None:
        self.objects = Watch(self.store, frozenset({Kind.POD, Kind.NODE}))
        self.leases = Watch(self.store, frozenset({Kind.LEASE}))
        self.start()

    # -- life --------------------------------------------------------------------------------

    def start(self) -> None:
        """(Re)start: an empty cache and no observations, then LIST everything and watch."""
        self.cache = ClusterCache(keys=KEYS, resource=RESOURCE, clock=lambda: self.clock.now)
        self.locks = LockClient(self.store, self.clock, name=self.name, skew=self.skew)
        self.queues = ModelQueues(budget_s=WAIT_BUDGET_S, clock=lambda: self.clock.now)
        self.deadlines = CallDeadlines()
        self.order = {}
        self.cache.replace_nodes([n for _, n in sorted(self.store.nodes.items())])
        self.cache.replace_pods(self.store.list_pods())
        self.locks.relist()
        self.objects.restart()
        self.leases.restart()

    def crash(self) -> list[BindTask]:
        """The process dies: every bind stops where it is (no release), memory is lost."""
        lost, self.tasks = self.tasks, []
        for task in lost:
            self.leave(task)
        self.start()
        return lost

    def deliver(self, limit: int | None) -> int:
        n = 0
        for event in self.objects.deliver(limit):
            self._take(event)
            n += 1
        for event in self.leases.deliver(limit):
            self.locks.take_event(event)
            # ``NodeLocks.watch(on_change=queues.lock_changed)``: wakes the node's head
            node = NodeName(event.name)
            self.queues.lock_changed(
                None if event.type == "DELETED" else self.locks.view(node), node
            )
            n += 1
        return n

    def _take(self, event: Event) -> None:
        if event.kind == Kind.POD:
            self.cache.apply_pod(event.type, event.obj)
        else:
            self.cache.apply_node(event.type, event.obj)

    def backlog(self) -> int:
        return self.objects.backlog() + self.leases.backlog()

    # -- filter / prioritize (what kube-scheduler asks before Bind) ---------------------------

    def picture(self, node: NodeName, *, exclude_uid: str | None = None) -> NodeGPUs | None:
        gpus = self.cache.node_gpus(node, exclude_uid=exclude_uid)
        if gpus is None:
            return None
        view = self.locks.view(node)
        return with_lock_holder(
            gpus, view, pod_uid=exclude_uid, keys=KEYS, finished=holder_accounted(self.cache, view)
        )

    def candidates(self, obj: JSON) -> list[NodeName]:
        """Nodes that pass filter for the pod kube-scheduler sends, best score first."""
        pod = pod_state(obj, keys=KEYS, resource=RESOURCE)
        if pod.need is None or pod.node is not None:
            return []
        uid = pod.uid
        names = sorted(self.store.nodes)
        passed = filter_nodes(pod.need, names, lambda n: self.picture(n, exclude_uid=uid)).passed
        scores = prioritize_nodes(
            pod.need,
            passed,
            lambda n: self.picture(n, exclude_uid=uid),
            policy=Policy.BINPACK,
        )
        ranked = sorted(zip(passed, scores, strict=True), key=lambda ns: (-ns[1], ns[0]))
        return [n for n, _ in ranked]

    # -- the takeover check -------------------------------------------------------------------

    def may_take_over(self, record: LockRecord, task: BindTask | None = None) -> bool:
        """``Binder.may_take_over``: the cache's verdict, else one GET and a fresh one; a holder
        seen not bound is not taken over while its binding may still land
        (``binding_may_still_land``, on how long this replica has seen the lock held)."""
        holder = record.holder
        if holder is None:
            return True
        verdict = judge(
            self.cache.pod(holder.uid),
            holder_uid=holder.uid,
            node=record.node,
            fresh=False,
            known_gone=self.cache.is_gone(holder.uid),
        )
        if verdict.allowed is None:
            if task is not None:
                self._request(task, f"GET pod {holder.key}", write=False)
            obj = self.store.pod_or_none(holder.key)
            fresh = pod_state(obj, keys=KEYS, resource=RESOURCE) if obj is not None else None
            verdict = judge(fresh, holder_uid=holder.uid, node=record.node, fresh=True)
        view = self.locks.view(record.node)
        held_for = view.held_for_s if view is not None and view.record == record else 0.0
        if verdict.allowed and takeover.binding_may_still_land(
            verdict.state,
            held_for_s=held_for,
            duration_s=DURATION_S,
            request_timeout_s=REQUEST_TIMEOUT_S,
        ):
            return False
        return bool(verdict.allowed)

    # -- the call: its deadline, its caller leaving ------------------------------------------

    def arrive(self, task: BindTask) -> None:
        """``Binder.bind``: the call's deadline from its arrival, kept with every other call
        under way for the same (node, pod), all of which ``abandon`` reaches."""
        task.deadline = BindDeadline.from_arrival(
            self.clock.now, http_timeout_s=HTTP_TIMEOUT_S, clock=self._now
        )
        self.deadlines.begin(task.node, task.uid, task.deadline)
        self.tasks.append(task)

    def _now(self) -> float:
        return self.clock.now if self.pinned is None else self.pinned

    def abandon(self, task: BindTask) -> None:
        """kube-scheduler stopped waiting for ``task``'s call (it disconnected):
        ``Binder.abandon``."""
        task.abandoned = True
        self.deadlines.cancel(task.node, task.uid)
        self.queues.abandon(task.node, task.uid)

    def leave(self, task: BindTask) -> None:
        """The call ended (or the process died): out of its queue (the ``turn`` block left),
        its deadline forgotten."""
        if task.ready is not None:
            task.ready.close()
            task.ready = None
        if task.queue_cm is not None:
            drive(task.queue_cm.__aexit__(None, None, None))
            task.queue_cm = None
            queue = self.order.get(task.node, [])
            if task.tid in queue:
                queue.remove(task.tid)
        if task.deadline is not None:
            self.deadlines.end(task.node, task.uid, task.deadline)

    def _request(self, task: BindTask, what: str, *, write: bool) -> None:
        """``DeadlineClient.request``'s check before each request a bind sends (its own and
        lockd's): none past the deadline, no write once the caller left."""
        assert task.deadline is not None
        if write and task.abandon_at_write:
            task.abandon_at_write = False
            self.abandon(task)  # the disconnect arrives while the bind's reads were in flight
        task.deadline.check(what, write=write)
        if write and task.abandoned:
            task.late_writes.append(what)

    def resumable(self, task: BindTask) -> bool:
        """Whether the bind can take a step: a parked wait only once woken or past its
        deadline (``ModelQueues.sleep``)."""
        if task.stage is not Stage.WAITING or not task.parked or task.turn is None:
            return task.stage is not Stage.DONE
        waiter = task.turn._waiter
        return waiter.wake.is_set() or self.clock.now >= waiter.deadline

    # -- the bind steps -----------------------------------------------------------------------

    def _pod(self, task: BindTask) -> PodState:
        pod = self.cache.pod(task.uid)
        if pod is not None and pod.key == task.pod_key:
            return pod
        self._request(task, f"GET pod {task.pod_key}", write=False)
        obj = self.store.pod_or_none(task.pod_key)
        if obj is None:
            raise BindFailed(f"pod {task.pod_key} not found", release=False)
        fresh = pod_state(obj, keys=KEYS, resource=RESOURCE)
        if fresh.uid != task.uid:
            raise BindFailed(f"pod {task.pod_key} has UID {fresh.uid}", release=False)
        return fresh

    def _holder(self, task: BindTask, assignment: Assignment) -> Holder:
        return Holder(
            key=HolderKey(task.pod_key),
            uid=task.uid,
            data={LEASE_ASSIGNMENT: format_assignment(assignment)},
        )

    def begin(self, task: BindTask, *, hand_edits: int) -> str:
        """``_bind`` up to the queue: the pod, then its place in the node's queue."""
        assert task.deadline is not None
        pod = self._pod(task)
        if pod.node is not None:
            raise BindFailed(f"pod {task.pod_key} is already bound to {pod.node}", release=False)
        assert pod.need is not None
        task.need = pod.need
        give_up_at = task.deadline.at - PATH.after_wait_s
        cm = self.queues.turn(task.node, task.uid, task.pod_key, give_up_at=give_up_at)
        try:
            _, turn = drive(cm.__aenter__())
        except WaitRefused as exc:
            raise BindFailed(f"contended: {exc}", release=False) from exc
        task.queue_cm, task.turn = cm, turn
        self.order.setdefault(task.node, []).append(task.tid)
        task.stage = Stage.WAITING
        return f"queued ({self.queues.depth(task.node)} deep); " + self.resume(
            task, hand_edits=hand_edits
        )

    def resume(self, task: BindTask, *, hand_edits: int) -> str:
        """``Turn.ready`` until it parks, refuses, or gives the bind its turn; then take it."""
        assert task.turn is not None
        node = task.node
        if task.ready is None:
            task.ready = task.turn.ready(lambda: self.locks.view(node))
        try:
            done, _ = drive(task.ready)
        except WaitRefused as exc:
            task.ready = None
            raise BindFailed(f"contended: {exc}", release=False) from exc
        if not done:
            task.parked = True
            waiter = task.turn._waiter
            ahead = self.queues.position(node, waiter)
            return f"waits its turn ({ahead} ahead, until t={waiter.deadline:g})"
        task.ready, task.parked = None, False
        waiter = task.turn._waiter
        if not self.late_turns and self.clock.now > waiter.deadline:
            raise BindFailed("contended: (model) ready only after its wait's end", release=False)
        queue = self.order.get(node, [])
        if queue and queue[0] != task.tid:
            task.out_of_turn = (
                f"{task} took its turn with bind#{queue[0]} ahead of it in {self.name}'s queue "
                f"for {node} ({queue})"
            )
        return self._take_turn(task, hand_edits=hand_edits)

    def _take_turn(self, task: BindTask, *, hand_edits: int) -> str:
        """After ``ready``: the checks of ``_bind``'s loop, then the acquire."""
        assert task.deadline is not None
        assert task.need is not None
        assert task.turn is not None
        task.deadline.check("taking the lock")
        # _not_bound_meanwhile
        cached = self.cache.pod(task.uid)
        if cached is not None and cached.node is not None:
            raise BindFailed(
                f"pod {task.pod_key} was bound to {cached.node} while this bind waited its turn",
                release=False,
            )
        # _not_holding_already
        view = self.locks.view(task.node)
        holder = view.record.holder if view is not None else None
        if view is not None and holder is not None and holder.uid == task.uid:
            self._request(task, f"GET pod {task.pod_key}", write=False)
            obj = self.store.pod_or_none(task.pod_key)
            bound_to = (obj or {}).get("spec", {}).get("nodeName")
            if bound_to:
                raise BindFailed(
                    f"pod {task.pod_key} is already bound to {bound_to}", release=False
                )
            if not view.expired:
                raise BindFailed(
                    f"pod {task.pod_key} already holds the lock of {task.node}", release=False
                )
        picture = self.picture(task.node, exclude_uid=task.uid)
        if picture is None:
            raise BindFailed(f"node {task.node} not in cache", release=False)
        try:
            assignment = choose(picture, task.need)
        except NoFit as exc:
            raise BindFailed(f"no fit: {exc}", release=False) from exc
        task.deadline.check("taking the lock")
        self.locks.guard = lambda what, write: self._request(task, what, write=write)
        try:
            held, taken = self.locks.acquire(
                task.node,
                self._holder(task, assignment),
                may_take_over=lambda record: self.may_take_over(record, task),
                reacquire=False,
            )
        except LockHeld as exc:
            task.turn.lost(self.locks.view(task.node))  # a race lost: stay head, wait again
            return f"lost the race ({exc}); waits again"
        except (LockError, ApiUnavailable) as exc:
            raise BindFailed(f"cannot take the lock: {exc}", release=False) from exc
        finally:
            self.locks.guard = None
        task.held, task.assignment = held, assignment
        task.acquired_at = self.clock.now
        task.hand_edit_seen = hand_edits
        task.stage = Stage.ACQUIRED
        how = "took over" if taken else "acquired"
        return f"{how} {task.node} token {held.token} for {format_assignment(assignment)}"

    def _complete_view(self, task: BindTask, held: HeldLock, uid: str) -> tuple[NodeGPUs, str]:
        node = held.node
        view = self.locks.view(node)
        last = view.record.last if view is not None and view.record.token == held.token else None
        # (the real bind waits up to confirm_wait_s for the cache; here the wait is the
        # interleaving: watch deliveries before this step)
        proven = last is not None and last.outcome in PROVEN_OUTCOMES and bool(last.uid)
        if last is not None and proven and self.cache.seen_bound_or_gone(last.uid):
            gpus = self.cache.node_gpus(node, exclude_uid=uid)
            if gpus is not None:
                return gpus, f"cache (saw last holder {last.holder})"
        state = self.cache.node(node)
        if state is None:
            raise BindFailed(f"node {node} not in cache", release=True)
        self._request(task, f"LIST pods on {node}", write=False)
        pods = [pod_state(o, keys=KEYS, resource=RESOURCE) for o in self.store.list_pods(node=node)]
        return node_gpus(state, [p for p in pods if p.uid != uid]), "LIST of the node"

    def confirm(self, task: BindTask) -> str:
        assert task.held is not None
        assert task.assignment is not None
        assert task.need is not None
        assert task.deadline is not None
        task.deadline.check("confirming its choice, with the lock held")
        gpus, source = self._complete_view(task, task.held, task.uid)
        if not conflicts(task.assignment, gpus) and fit(gpus, task.need).fit is Fit.FITS:
            task.stage = Stage.CONFIRMED
            return f"confirmed against {source}"
        try:
            again = choose(gpus, task.need)
        except NoFit as exc:
            raise BindFailed(f"conflict: {exc} (seen after taking the lock)", release=True) from exc
        rewritten = HeldLock(
            task.held.node, self._holder(task, again), task.held.token, task.held.resource_version
        )
        self.locks.guard = lambda what, write: self._request(task, what, write=write)
        try:
            task.held = self.locks.renew(rewritten)
        except (LockError, ApiUnavailable) as exc:
            raise BindFailed(
                f"could not rewrite the lock's assignment: {exc}", release=True
            ) from exc
        finally:
            self.locks.guard = None
        task.assignment = again
        task.stage = Stage.CONFIRMED
        return f"chose again against {source}: {format_assignment(again)}"

    def send(self, task: BindTask) -> str:
        assert task.held is not None
        assert task.assignment is not None
        assert task.deadline is not None
        left = DURATION_S / 3 - (self.clock.now - task.acquired_at)
        if left < MIN_BINDING_BUDGET_S:
            raise BindFailed("took too long after taking the lock", release=True)
        left = min(left, task.deadline.check("the binding"))
        if left < MIN_BINDING_BUDGET_S:
            raise BindFailed(f"{left:.2f}s left before the deadline; released", release=True)
        # _still_ours: the Lease as last seen must still carry our token and pod
        view = self.locks.view(task.held.node)
        holder = view.record.holder if view is not None else None
        if (
            view is None
            or view.record.token != task.held.token
            or holder is None
            or (holder.uid != task.uid)
        ):
            raise BindFailed("the lock changed under the bind; not bound", release=True)
        annotations = {
            KEYS.assignment: format_assignment(task.assignment),
            KEYS.token: str(task.held.token),
            KEYS.bound_at: self.clock.wall(self.skew),
        }
        self._request(task, f"POST binding of {task.pod_key}", write=True)
        task.request = self.store.send_binding(
            task.pod_key,
            task.uid,
            task.node,
            annotations,
            now=self.clock.now,
            timeout_s=left,
            task=task.tid,
        )
        task.stage = Stage.SENT
        return f"sent binding request #{task.request.rid} (token {task.held.token})"

    def _bound_anyway(self, task: BindTask, *, get_fails: bool) -> bool:
        """The GET after a 409 or a lost answer, through the bind's deadline check; a GET
        that cannot be sent (past the deadline: ``BindCancelled``, caught as in
        ``Binder._bound_anyway``; ``UNKNOWN_WHEN`` is what a plant narrows) answers "not
        bound"."""
        try:
            self._request(task, f"GET pod {task.pod_key}", write=False)
        except UNKNOWN_WHEN:
            return False
        if get_fails:
            return False
        assert task.request is not None
        obj = self.store.pod_or_none(task.pod_key)
        if obj is None:
            return False
        on_pod = obj["metadata"].get("annotations") or {}
        return (
            obj["metadata"].get("uid") == task.uid
            and obj["spec"].get("nodeName") == task.node
            and all(on_pod.get(k) == v for k, v in task.request.annotations.items())
        )

    def answer(self, task: BindTask, *, lost: bool = False, get_fails: bool = False) -> str:
        """The binding's answer: processed (the server answered), or ``lost`` (no answer)."""
        request = task.request
        assert request is not None
        if not lost and request.result is None:
            if self.clock.now <= request.deadline:
                self.store.apply_binding(request)
            else:  # the client gave up; the server may still apply it (``server_applies``)
                lost = True
        if lost:  # the client saw no answer by its timeout at the latest: the GET goes then
            self.pinned = min(self.clock.now, request.deadline)
        try:
            return self._answered(task, lost=lost, get_fails=get_fails)
        finally:
            self.pinned = None

    def _answered(self, task: BindTask, *, lost: bool, get_fails: bool) -> str:
        request = task.request
        assert request is not None
        if not lost and request.result == "ok":
            task.stage, task.result = Stage.DONE, "ok"
            return "bound"
        if not lost and request.result == "conflict":
            if self._bound_anyway(task, get_fails=get_fails):
                task.stage, task.result = Stage.DONE, "ok"
                return "409, but bound with our annotations"
            raise BindFailed(f"binding refused: {request.error}", release=True)
        if not lost:  # not found: an ApiError, the generic failure path releases
            raise BindFailed(f"binding failed: {request.error}", release=True)
        if self._bound_anyway(task, get_fails=get_fails):
            task.stage, task.result = Stage.DONE, "ok"
            return "no answer, but bound with our annotations"
        task.kept_lock = True
        raise BindFailed(
            "no answer: the pod may or may not be bound; keeping the lock", release=False
        )

    def release(self, task: BindTask) -> str:
        """``Binder._release``: give the lock back ``bind-failed``; errors are only logged."""
        if task.held is None:
            return "nothing to release"
        try:
            self.locks.release(task.held, outcome=Outcome.BIND_FAILED)
        except (LockError, ApiUnavailable, NotFound, Conflict) as exc:
            return f"release failed ({type(exc).__name__})"
        self.queues.notify(task.held.node)
        return f"released token {task.held.token} bind-failed"

    # -- locks left behind ----------------------------------------------------------------------

    def sweep(self) -> list[str]:
        """``Binder.sweep``'s one pass: ``release_ended`` (each held lock whose holder this
        replica's cache saw end: Failed, Succeeded, deleted; ``takeover.ended_holders``, expired
        or not), ``release_bound_elsewhere`` (each held lock whose holder this replica's cache
        saw bound to another node, ``takeover.bound_elsewhere``), then ``release_expired_left``
        (each expired lock whose holder the cache saw leave the handoff for good,
        ``takeover.expired_and_left``).  In production the first also runs at once on every pod
        watch event; here the search places the pass anywhere."""
        done: list[str] = []
        obs, now = self.locks.obs, self.clock.now
        for node, holder, end in takeover.ended_holders(
            obs.holders(), takeover.cached_ended(self.cache)
        ):
            done.append(self._release_left(node, holder, end.outcome, end.why))

        def node_of(uid: str) -> NodeName | None:
            pod = self.cache.pod(uid)
            return pod.node if pod is not None else None

        for node, holder in takeover.bound_elsewhere(obs.holders(), node_of):
            why = f"its holder {holder.key} is bound to {node_of(holder.uid)}"
            done.append(self._release_left(node, holder, Outcome.BIND_FAILED, why))
        for node, holder, why in takeover.expired_and_left(
            obs.holders(),
            expired=lambda node: obs.expired(node, now),
            cached_judgement=takeover.cached_judgement(self.cache),
        ):
            done.append(self._release_left(node, holder, Outcome.EXPIRED, why))
        return [line for line in done if line]

    def _release_left(self, node: NodeName, holder: Holder, outcome: Outcome, why: str) -> str:
        """``Binder._release_left``: release ``node``'s lock if ``holder`` still holds it in this
        replica's view, fenced by the token; what happened ("" when the lock changed hands)."""
        view = self.locks.view(node)
        if view is None or view.record.holder is None or view.record.holder.uid != holder.uid:
            return ""
        lock = HeldLock(node, view.record.holder, view.record.token, view.record.resource_version)
        try:
            self.locks.release(lock, outcome=outcome)
        except (LockError, ApiUnavailable, NotFound, Conflict) as exc:
            return f"{node}: release failed ({type(exc).__name__})"
        self.queues.notify(node)
        return f"{node}: released token {lock.token} {outcome.value} ({why})"
