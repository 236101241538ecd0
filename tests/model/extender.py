"""An extender replica: its watch-fed cache, its node locks, and its binds as explicit steps.

A bind (``scheduler_ext.binder.Binder._bind``) is cut at the points where the real one awaits
the API server, so faults can land between them:

1. ``begin``: read the pod (cache, else GET), refuse a bound pod, choose devices from the cache
   plus the lock holder's assignment, refuse when this pod already holds the lock and is bound,
   acquire the node lock (the ``NodeLocks.acquire`` loop, with ``Binder.may_take_over``).
2. ``confirm``: the complete view (cache once the previous holder is seen bound or gone, else a
   LIST of the node, also when the Lease has no last holder), conflicts/fit, choose again and
   renew the Lease's copy when needed.
3. ``send``: the time budget check (``duration / 3`` since acquiring), the last look at the
   Lease (``_still_ours``), then the one ``pods/binding`` create, which stays in flight until
   the server processes it.
4. ``answer``: the binding's answer: bound; a 409 or a lost answer answered by a GET
   (``_bound_anyway``); an unknown outcome keeps the lock, every other failure releases it.

GLUE (replicated from ``scheduler_ext/binder.py``, which mixes these reads into its decisions):
``_pod`` (cache or GET), ``_not_holding_already`` (a GET decides), ``may_take_over``
(a GET when the cache cannot answer, then ``binding_may_still_land``),
``_complete_view``/``_listed_view`` (a LIST decides which view the choice is proven against),
``_post_binding``/``_bound_anyway`` (a GET decides success).
The decisions are the project's: ``choose``, ``conflicts``, ``fit``, ``with_lock_holder``,
``judge``, ``pod_state``, ``node_gpus``, ``ClusterCache``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from handoff.wire import LEASE_ASSIGNMENT, Assignment, format_assignment
from kube.errors import ApiUnavailable, Conflict, NotFound
from lockd.errors import LockError, LockHeld
from lockd.model import HeldLock, Holder, HolderKey, LockRecord, NodeName, Outcome
from scheduler_ext import takeover
from scheduler_ext.binder import MIN_BINDING_BUDGET_S, PROVEN_OUTCOMES
from scheduler_ext.cache import ClusterCache, node_gpus
from scheduler_ext.choose import Fit, NodeGPUs, NoFit, Policy, choose, conflicts, fit
from scheduler_ext.need import PodNeed
from scheduler_ext.state import PodState, pod_state
from scheduler_ext.takeover import holder_accounted, judge
from scheduler_ext.verbs import filter_nodes, prioritize_nodes, with_lock_holder
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


class Stage(StrEnum):
    NEW = "new"
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

    def __post_init__(self) -> None:
        self.objects = Watch(self.store, frozenset({Kind.POD, Kind.NODE}))
        self.leases = Watch(self.store, frozenset({Kind.LEASE}))
        self.start()

    # -- life --------------------------------------------------------------------------------

    def start(self) -> None:
        """(Re)start: an empty cache and no observations, then LIST everything and watch."""
        self.cache = ClusterCache(keys=KEYS, resource=RESOURCE, clock=lambda: self.clock.now)
        self.locks = LockClient(self.store, self.clock, name=self.name, skew=self.skew)
        self.cache.replace_nodes([n for _, n in sorted(self.store.nodes.items())])
        self.cache.replace_pods(self.store.list_pods())
        self.locks.relist()
        self.objects.restart()
        self.leases.restart()

    def crash(self) -> list[BindTask]:
        """The process dies: every bind stops where it is (no release), memory is lost."""
        lost, self.tasks = self.tasks, []
        self.start()
        return lost

    def deliver(self, limit: int | None) -> int:
        n = 0
        for event in self.objects.deliver(limit):
            self._take(event)
            n += 1
        for event in self.leases.deliver(limit):
            self.locks.take_event(event)
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

    def may_take_over(self, record: LockRecord) -> bool:
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

    # -- the bind steps -----------------------------------------------------------------------

    def _pod(self, task: BindTask) -> PodState:
        pod = self.cache.pod(task.uid)
        if pod is not None and pod.key == task.pod_key:
            return pod
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
        pod = self._pod(task)
        if pod.node is not None:
            raise BindFailed(f"pod {task.pod_key} is already bound to {pod.node}", release=False)
        assert pod.need is not None
        picture = self.picture(task.node, exclude_uid=task.uid)
        if picture is None:
            raise BindFailed(f"node {task.node} not in cache", release=False)
        try:
            assignment = choose(picture, pod.need)
        except NoFit as exc:
            raise BindFailed(f"no fit: {exc}", release=False) from exc
        # _not_holding_already
        view = self.locks.view(task.node)
        holder = view.record.holder if view is not None else None
        if view is not None and holder is not None and holder.uid == task.uid:
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
        try:
            held, taken = self.locks.acquire(
                task.node,
                self._holder(task, assignment),
                may_take_over=self.may_take_over,
                reacquire=False,
            )
        except LockHeld as exc:
            raise BindFailed(f"contended: {exc}", release=False) from exc
        except (LockError, ApiUnavailable) as exc:
            raise BindFailed(f"cannot take the lock: {exc}", release=False) from exc
        task.held, task.assignment, task.need = held, assignment, pod.need
        task.acquired_at = self.clock.now
        task.hand_edit_seen = hand_edits
        task.stage = Stage.ACQUIRED
        how = "took over" if taken else "acquired"
        return f"{how} {task.node} token {held.token} for {format_assignment(assignment)}"

    def _complete_view(self, held: HeldLock, uid: str) -> tuple[NodeGPUs, str]:
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
        pods = [pod_state(o, keys=KEYS, resource=RESOURCE) for o in self.store.list_pods(node=node)]
        return node_gpus(state, [p for p in pods if p.uid != uid]), "LIST of the node"

    def confirm(self, task: BindTask) -> str:
        assert task.held is not None
        assert task.assignment is not None
        assert task.need is not None
        gpus, source = self._complete_view(task.held, task.uid)
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
        try:
            task.held = self.locks.renew(rewritten)
        except (LockError, ApiUnavailable) as exc:
            raise BindFailed(
                f"could not rewrite the lock's assignment: {exc}", release=True
            ) from exc
        task.assignment = again
        task.stage = Stage.CONFIRMED
        return f"chose again against {source}: {format_assignment(again)}"

    def send(self, task: BindTask) -> str:
        assert task.held is not None
        assert task.assignment is not None
        left = DURATION_S / 3 - (self.clock.now - task.acquired_at)
        if left < MIN_BINDING_BUDGET_S:
            raise BindFailed("took too long after taking the lock", release=True)
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
        return f"released token {task.held.token} bind-failed"
