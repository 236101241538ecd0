"""The handoff as a Hypothesis state machine: actors, faults, invariants (docs/model.md).

Every rule is one action of one actor (kube-scheduler, an extender replica, the API server, a
watch, a kubelet, a device plugin, the clock) or one fault.  After every action the safety
invariants are checked; the ``settle`` rule (and the end of every run) stops all faults, lets
every actor run to quiescence with time passing, and checks bounded liveness.

- S1: no device is in two live pods' kubelet allocations (what their containers were given), nor
  in two live bound pods' assignments (as the binding wrote them); on a sharing node, per GPU:
  none held whole holds another pod, and its slices stay within its split count, memory and
  cores.
- S2: every container kubelet admitted was served for its own pod, per resource, with its pod's
  assignment for that container (an app container that reused init containers' devices: within
  the pod's assignment); no answer releases the lock ``allocated`` while a container of its pod
  still awaits devices of some resource.
- S3: a lock whose holder left the handoff (gone, finished, admitted, bound elsewhere) is
  takeable (``takeover.judge`` on a fresh read, and ``handoff.holder`` agrees), and no protocol
  write hands a held lock to another pod while its holder is still in handoff.
- S4: no write with a stale token lands: a Lease's token never goes down except by hand, and a
  binding carrying token T lands only while the node's Lease is held by that pod with token T
  (unless the Lease was edited by hand since the bind took it).
- F1: each replica's picture of a node (what filter and Bind choose from) counts the lock
  holder's GPUs as taken, held whole on a sharing node, until its cache counts the holder.
- W1: a node's binds on one replica take their turns in the order they joined its queue.
- W2: a bind whose caller left (kube-scheduler gave up) sends no Lease write and no binding.
- R1: a lock whose holder kubelet rejected while its node's device plugin was not serving (no
  device reported) is not released at once (``rejected``, ``finished``, ``deleted``) while that
  plugin still does not serve: only its expiry (``expired``, ``taken-over``) frees it then, so
  a node whose plugin is down takes no further pod of a burst before the lock's duration
  (decision 0012, the brake).
- L1 (at ``settle``): in a run with no fault, no pod that went through the extender is refused
  at admission; after settling, every pending GPU pod that fits some node is bound and
  admitted, every bound pod is admitted or failed, and every held lock is takeable.

A violation raises ``Violation`` with the invariant's name and the run's trace (one line per
action: step, time, actor, what happened, the Lease versions).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from handoff.holder import holder_status
from handoff.sharing import WHOLE, BadShare, Slice, container_slice, physical_of
from handoff.wire import (
    GPU,
    LEASE_ASSIGNMENT,
    Assignment,
    DeviceID,
    parse_assignment,
    parse_token,
)
from lockd.model import NodeName, Outcome
from scheduler_ext.binder import keep_lock_after
from scheduler_ext.deadline import BindCancelled
from scheduler_ext.state import pod_state
from scheduler_ext.takeover import holder_accounted, judge
from tests.model.extender import BindFailed, BindTask, Replica, Stage
from tests.model.holes import KNOWN_HOLES, Hole
from tests.model.locks import DURATION_S, FMT, Clock, LockClient
from tests.model.node import Kubelet, Listing, Plugin, slot_text
from tests.model.world import (
    GPU_MEMORY_MIB,
    JSON,
    KEYS,
    MIG_RESOURCES,
    MIG_TEMPLATES,
    POD_NAMESPACE,
    RESOURCE,
    SLICE_TEMPLATES,
    SPLIT,
    TEMPLATES,
    BindingRequest,
    Store,
    gpu_id,
    mig_instances,
    pod_object,
    resource_of_device,
)

REPLICAS = ("E0", "E1")
_A_GPU = GPU(gpu_id(NodeName("n"), 0), 0, "model-a", GPU_MEMORY_MIB, 0, healthy=True)
PROCESSES = frozenset({*REPLICAS, "kubelet", "plugin"})
# the outcomes a lock is released with without its holder's handoff: a bind that failed (the
# bind's own release, or the sweep's of a holder bound elsewhere) and the sweep's of an expired
# lock; none may come while the holder may still be admitted on the node (S3)
LEFT_BEHIND_OUTCOMES = frozenset({Outcome.BIND_FAILED.value, Outcome.EXPIRED.value})
# the outcomes a lock is released with at once when its holder ended (``handoff.holder.ended``):
# ``finished`` and ``deleted`` by an extender's sweep or a device plugin, ``rejected`` by a
# serving device plugin only; none may come while the holder may still be admitted (S3), nor,
# for a holder rejected while its node's plugin did not serve, before that plugin serves (R1).
# A plugin also releases ``rejected`` for a holder it refused, a moment before kubelet fails
# it: that one is left to S2 and L1.
ENDED_OUTCOMES = frozenset({Outcome.REJECTED.value, Outcome.FINISHED.value, Outcome.DELETED.value})


class Fault(StrEnum):
    """Kinds of fault; each run enables a few (swarm testing), or none (a fault-free run)."""

    CRASH = "extender-crash"
    CANCEL = "bind-cancelled"
    GIVE_UP = "scheduler-gives-up"
    ANSWER_LOST = "answer-lost"
    PLUGIN_CRASH = "plugin-crash"
    KUBELET_RESTART = "kubelet-restart"
    LEASE_BY_HAND = "lease-by-hand"
    POD_DELETE = "pod-deleted"
    OWNER_EDIT = "owner-edit"
    BYPASS = "bypass-pod"
    RELEASE_FAILS = "release-fails"
    WATCH_STALL = "watch-stalls"
    ADMISSION_REJECT = "kubelet-rejects"
    LATE_READ = "read-answered-late"
    REJECT_AFTER_ALLOCATE = "kubelet-rejects-after-allocate"
    CHECKPOINT_LOST = "kubelet-checkpoint-lost"
    PODRESOURCES_DOWN = "podresources-list-fails"
    SLOW_API = "api-answers-slowly"


TICKS = (1.0, 4.0, float(DURATION_S + 1))
SETTLE_ROUNDS = 30
# settling stops after this many idle clock jumps (``DURATION_S + 1`` each): enough for a
# binding the server may still apply to time out (``binding_may_still_land``) and the lock to
# expire after it
SETTLE_IDLE_TICKS = 6


class Violation(AssertionError):
    """An invariant broke; ``invariant`` is its name (S1..S4, V1, F1, W1, W2, R1, L1)."""

    def __init__(self, invariant: str, message: str, trace: list[str]) -> None:
        lines = "\n".join(trace[-150:])
        super().__init__(f"{invariant} violated: {message}\n--- trace ---\n{lines}")
        self.invariant = invariant
        self.detail = message
        self.trace = list(trace)


@dataclass(frozen=True)
class ModelConfig:
    """What the model generates.  ``avoid``: holes whose triggers it does not generate."""

    avoid: frozenset[Hole] = KNOWN_HOLES
    nodes: tuple[tuple[str, int], ...] = (("n1", 2), ("n2", 2))
    max_pods: int = 6
    faults: bool = True
    # without the admission policy (deploy/), a pod's owner could edit its assignment annotation
    owner_edits: bool = False
    # the kinds of fault runs may enable; ``swarm``: each run enables a few of them (or none),
    # else every run enables all of them
    fault_kinds: frozenset[Fault] = frozenset(Fault)
    swarm: bool = True
    # the pod shapes users create (a subset of ``world.TEMPLATES``; a focused search uses few)
    templates: tuple[str, ...] = (
        *sorted(set(TEMPLATES) - SLICE_TEMPLATES),
        *sorted(SLICE_TEMPLATES),
    )
    # a search for one hole: once found, every later run ends at once with the same violation
    stop_after_first: bool = False
    # processes ("E0", "E1", "kubelet", "plugin") whose watches never lag: delivered before and
    # after every action.  A focused search sets it to leave only the lags that matter.
    prompt: frozenset[str] = frozenset()
    # what kubelet's PodResources List returns; each run draws one (``node.Listing``)
    listings: tuple[Listing, ...] = (Listing.ACTIVE_PODS, Listing.ALL_PODS)
    # nodes that share their GPUs (``--gpu-split SPLIT``): slice pods fit only there
    shared: frozenset[str] = frozenset({"n2"})
    # nodes with one more GPU, in MIG mode (``world.MIG_LAYOUT``): MIG pods fit only there
    mig: frozenset[str] = frozenset({"n1"})
    # nodes whose plugin has no PodResources socket while List fails (not mounted: it decides
    # from the API server's view); elsewhere the socket is there and a failing List refuses
    socketless: frozenset[str] = frozenset({"n2"})
    # the device plugin's release of a holder that ended as an action of its own (``EndedModel``):
    # only in the search for ``Hole.ENDED_UNSEEN``, so that the deep and CI profiles draw the
    # interleavings they were measured with (the extender's sweep makes the same release there)
    plugin_releases_ended: bool = False
    # a device plugin that stops serving (kubelet has no device of it) and serves again, as
    # actions of their own (``BrakeModel``): only in the search for
    # ``Hole.REJECTED_RELEASED_UNSERVED``, for the same reason
    plugin_stops_serving: bool = False


@dataclass
class Stats:
    """Across the runs of one machine class: how many, and when the first violation came."""

    runs: int = 0
    first_violation_run: int | None = None
    steps: int = 0
    violations: list[Violation] = field(default_factory=list)


class HandoffModel(RuleBasedStateMachine):
    """The whole handoff on a small cluster: two extender replicas, GPU nodes, faults."""

    config: ClassVar[ModelConfig] = ModelConfig()
    stats: ClassVar[Stats] = Stats()

    def __init__(self) -> None:
        super().__init__()
        type(self).stats.runs += 1
        self.store = Store()
        self.clock = Clock()
        self.trace: list[str] = []
        self.step_no = 0
        self.faults = 0
        self.broken = False
        self.nodes = [NodeName(n) for n, _ in self.config.nodes]
        for n, gpus in self.config.nodes:
            self.store.add_node(
                NodeName(n), gpus, self.split_of(NodeName(n)), mig=self.has_mig(NodeName(n))
            )
        self.store.on_binding = self._binding_landed
        self.store.on_lease_write = self._lease_written
        self.store.late_bindings = not self.avoids(Hole.LATE_BINDING)
        self.replicas: dict[str, Replica] = {}
        self.plugins: dict[NodeName, Plugin] = {}
        self.kubelets: dict[NodeName, Kubelet] = {}
        self.tasks: dict[int, BindTask] = {}
        self.waiting: dict[str, int] = {}  # pod uid -> the bind kube-scheduler waits for
        self.assigned: dict[str, Assignment] = {}  # pod uid -> assignment as bound
        self.bypass: set[str] = set()  # uids of pods created bound
        # uids of pods a fault rejected: their own refusal is excused, no other pod's
        self.excused: set[str] = set()
        # uids of pods kubelet rejected while their node's plugin did not serve -> the node (R1)
        self.rejected_unserved: dict[str, NodeName] = {}
        self.listing = Listing.ACTIVE_PODS
        self.hand_edits: dict[NodeName, int] = dict.fromkeys(self.nodes, 0)
        self.created = 0
        self.started = False
        self.enabled: frozenset[Fault] = frozenset()
        self.stalled: set[str] = set()  # watchers whose stream is down (``Fault.WATCH_STALL``)
        # GETs of a Lease served and not yet taken in: (process, its lock client, node, answer)
        self.reads: list[tuple[str, LockClient, NodeName, JSON]] = []

    # -- plumbing ------------------------------------------------------------------------------

    def may(self, fault: Fault) -> bool:
        """Whether this run generates ``fault`` (the config allows it and the run enabled it)."""
        if fault is Fault.OWNER_EDIT and not self.config.owner_edits:
            return False
        return self.started and self.config.faults and fault in self.enabled

    def avoids(self, hole: Hole) -> bool:
        return hole in self.config.avoid

    def split_of(self, node: NodeName) -> int:
        return SPLIT if node in self.config.shared else 1

    def has_mig(self, node: NodeName) -> bool:
        return node in self.config.mig and node not in self.config.shared

    def lease_line(self, node: NodeName) -> str:
        lease = self.store.leases.get(node)
        if lease is None:
            return f"{node}:none"
        record = FMT.parse(lease)
        who = record.holder.key.split("/", 1)[1] if record.holder is not None else "free"
        return f"{node}:rv{record.resource_version}/t{record.token}/{who}"

    def log(self, actor: str, text: str) -> None:
        leases = " ".join(self.lease_line(n) for n in self.nodes)
        line = f"{self.step_no:>3} t={self.clock.now:5.1f} {actor:<11} {text}  [{leases}]"
        self.trace.append(line)

    def fault(self, actor: str, text: str, *, excuses_refusals: bool = True) -> None:
        """Log a fault; unless ``excuses_refusals`` is False, L1 then no longer requires every
        pod the extender bound to be admitted."""
        self.faults += excuses_refusals
        self.log(actor, f"FAULT {text}")

    def violate(self, invariant: str, message: str) -> None:
        self.broken = True
        self.log("CHECK", f"{invariant} violated: {message}")
        err = Violation(invariant, message, self.trace)
        stats = type(self).stats
        if stats.first_violation_run is None:
            stats.first_violation_run = stats.runs
        stats.violations.append(err)
        raise err

    def begin_step(self) -> None:
        self.step_no += 1
        type(self).stats.steps += 1
        self.deliver_prompt()

    def deliver_prompt(self) -> None:
        """Deliver every watch of the ``config.prompt`` processes (quietly: no lag to show)."""
        if not self.config.prompt or not self.started:
            return
        for name, deliver in self.watchers().items():
            if name.split("/")[0].replace("plugin-pods", "plugin") in self.config.prompt:
                deliver(None)

    @invariant()
    def prompt_watches_delivered(self) -> None:
        """Not a check: after every action, the prompt processes' watches catch up."""
        self.deliver_prompt()

    def live_pods(self) -> dict[str, JSON]:
        """uid -> pod, for pods that exist and are not finished."""
        return {
            p["metadata"]["uid"]: p
            for p in self.store.pods.values()
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        }

    def key_of(self, uid: str) -> str:
        pod = self.store.pod_by_uid(uid)
        for kubelet in self.kubelets.values():
            pod = pod or kubelet.static.get(uid)
        if pod is None:
            return uid
        return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"

    def schedulable(self) -> list[JSON]:
        return [
            p
            for _, p in sorted(self.store.pods.items())
            if not p["spec"].get("nodeName")
            and (p.get("status") or {}).get("phase", "Pending") == "Pending"
            and p["metadata"]["uid"] not in self.waiting
            and not (self.avoids(Hole.DOUBLE_BIND) and self.binding_in_flight(p))
        ]

    def binding_in_flight(self, pod: JSON) -> bool:
        uid = pod["metadata"]["uid"]
        return any(r.uid == uid for r in self.store.live_requests(self.clock.now))

    def active_tasks(self, *stages: Stage) -> list[BindTask]:
        out = [
            t
            for r in self.replicas.values()
            for t in r.tasks
            if t.stage is not Stage.DONE and (not stages or t.stage in stages)
        ]
        return sorted(out, key=lambda t: t.tid)

    def steppable(self, *stages: Stage) -> list[BindTask]:
        """Binds that can take a step now (a parked wait only once woken or past its end)."""
        return [t for t in self.active_tasks(*stages) if self.replicas[t.replica].resumable(t)]

    def new_bind(self, replica: str, key: str, uid: str, node: NodeName) -> BindTask:
        """kube-scheduler's Bind call arrives at ``replica``; kube-scheduler waits for it."""
        task = BindTask(len(self.tasks) + 1, replica, key, uid, node)
        self.tasks[task.tid] = task
        self.replicas[replica].arrive(task)
        self.waiting[uid] = task.tid
        return task

    # -- hooks: S4 at the moment a write lands -------------------------------------------------

    def _binding_landed(self, request: BindingRequest, pod: JSON) -> None:
        raw = request.annotations.get(KEYS.assignment)
        if raw is not None:
            self.assigned[request.uid] = parse_assignment(raw)
        token = parse_token(request.annotations.get(KEYS.token, "0"))
        task = self.tasks.get(request.task)
        lease = self.store.leases.get(request.node)
        edited = task is not None and self.hand_edits[request.node] > task.hand_edit_seen
        record = FMT.parse(lease) if lease is not None else None
        self.log(
            "apiserver",
            f"binding #{request.rid} lands: {request.pod_key} -> {request.node} token {token}",
        )
        if edited:
            return
        if (
            record is None
            or record.holder is None
            or record.holder.uid != request.uid
            or record.token != token
        ):
            now = (
                "no Lease"
                if record is None
                else f"token {record.token}, holder "
                + (record.holder.key if record.holder is not None else "none")
            )
            self.violate(
                "S4",
                f"binding of {request.pod_key} with stale token {token} landed; the Lease of "
                f"{request.node} has {now}",
            )

    def _lease_written(
        self, node: NodeName, before: JSON | None, after: JSON | None, writer: str
    ) -> None:
        if writer == "hand":
            return
        old = FMT.parse(before) if before is not None else None
        new = FMT.parse(after) if after is not None else None
        if old is None or new is None:
            return
        if new.token < old.token:
            self.violate("S4", f"{writer} moved the Lease of {node} back to token {new.token}")
        if (
            old.holder is not None
            and new.holder is None
            and new.last is not None
            and (
                new.last.outcome in LEFT_BEHIND_OUTCOMES
                or (
                    new.last.outcome in ENDED_OUTCOMES
                    and not (
                        writer.startswith("plugin/") and new.last.outcome == Outcome.REJECTED.value
                    )
                )
            )
            and self.in_handoff(old.holder.uid, node)
        ):
            self.violate(
                "S3",
                f"{writer} released the lock of {node} as {new.last.outcome} while its holder "
                f"{old.holder.key} is still in handoff",
            )
        if (
            old.holder is not None
            and new.holder is None
            and new.last is not None
            and new.last.outcome in ENDED_OUTCOMES
            and self.rejected_unserved.get(old.holder.uid) == node
            and not self.plugins[node].serving
        ):
            self.violate(
                "R1",
                f"{writer} released the lock of {node} as {new.last.outcome} at once: its holder "
                f"{old.holder.key} was rejected while the node's device plugin does not serve, "
                "so the node's next pod would be rejected too",
            )
        if (
            old.holder is not None
            and new.holder is not None
            and old.holder.uid != new.holder.uid
            and self.in_handoff(old.holder.uid, node)
        ):
            self.violate(
                "S3",
                f"{writer} handed the lock of {node} from {old.holder.key} (still in handoff) "
                f"to {new.holder.key}",
            )

    def in_handoff(self, uid: str, node: NodeName) -> bool:
        """Ground truth: the pod may still be admitted on ``node`` with the lock's devices."""
        pod = self.store.pod_by_uid(uid)
        if pod is None:
            return False
        if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            return False
        bound = pod["spec"].get("nodeName")
        if bound:
            return bool(bound == node)
        # not bound: in handoff while a binding of it to this node may still land
        return any(
            r.uid == uid and r.node == node for r in self.store.live_requests(self.clock.now)
        )

    # -- setup ---------------------------------------------------------------------------------

    @initialize(
        skews=st.tuples(
            st.sampled_from([0.0, -90.0, 3600.0]), st.sampled_from([0.0, 2.5, -86_400.0])
        ),
        faults=st.one_of(
            st.just(frozenset[Fault]()), st.frozensets(st.sampled_from(Fault), max_size=3)
        ),
        listing=st.integers(0, 1),
    )
    def start(
        self, skews: tuple[float, float], faults: frozenset[Fault] = frozenset(), listing: int = 0
    ) -> None:
        """Two extender replicas and each node's plugin and kubelet, with skewed wall clocks;
        the kinds of fault this run may inject (none: a fault-free run, where L1 is strict);
        what kubelet's PodResources List returns (one of ``config.listings``)."""
        found = type(self).stats.violations
        if self.config.stop_after_first and found:
            self.broken = True
            raise found[0]
        self.enabled = (faults if self.config.swarm else frozenset(Fault)) & self.config.fault_kinds
        listings = self.config.listings
        if self.avoids(Hole.LISTED_REJECTED_POD):
            listings = (Listing.ACTIVE_PODS,)
        self.listing = listings[listing % len(listings)]
        for i, name in enumerate(REPLICAS):
            self.replicas[name] = Replica(name, self.store, self.clock, skews[i % 2])
            self.replicas[name].late_turns = not self.avoids(Hole.BINDING_PAST_DEADLINE)
        for n, gpus in self.config.nodes:
            node = NodeName(n)
            split = self.split_of(node)
            mig = self.has_mig(node)
            self.plugins[node] = Plugin(
                node, self.store, self.clock, skews[1], gpus, split, mig=mig
            )
            self.kubelets[node] = Kubelet(
                node, self.store, gpus, listing_mode=self.listing, split=split, mig=mig
            )
            self.plugins[node].kubelet_view = self.kubelets[node].listing
            self.plugins[node].kubelet_records = self.kubelets[node].records
            self.kubelets[node].socketless = node in self.config.socketless
            self.plugins[node].kubelet_socket = self.kubelets[node].podresources_socket
            self.plugins[node].kubelet_instance = self.kubelets[node].socket_instance
            self.kubelets[node].lose_only_final = self.avoids(Hole.PROGRESS_AHEAD_OF_KUBELET)
            self.kubelets[node].keep_multi_resource = self.avoids(Hole.MIG_PROGRESS_AHEAD)
        self.started = True
        kinds = ", ".join(sorted(f.value for f in self.enabled)) or "none"
        self.log(
            "world",
            f"nodes {dict(self.config.nodes)}, skews {skews}, faults: {kinds}, "
            f"PodResources List: {self.listing}",
        )

    # -- ordinary actions ----------------------------------------------------------------------

    @precondition(lambda self: self.started and self.created < self.config.max_pods)
    @rule(template=st.integers(0, len(TEMPLATES) - 1))
    def create_pod(self, template: int) -> None:
        self.begin_step()
        shapes = self.config.templates
        if self.avoids(Hole.HOLDER_SLICE) or self.avoids(Hole.SLICE_CAPACITY):
            shapes = tuple(s for s in shapes if s not in SLICE_TEMPLATES) or ("one",)
        if self.avoids(Hole.MIG_RELEASE):
            shapes = tuple(s for s in shapes if s != "mixed") or ("one",)
        if self.avoids(Hole.MIG_HOLDER) or not any(self.has_mig(n) for n in self.nodes):
            shapes = tuple(s for s in shapes if s not in MIG_TEMPLATES) or ("one",)
        shape = shapes[template % len(shapes)]
        self.created += 1
        name = f"{shape}-{self.created}"
        self.store.create_pod(pod_object(name, shape))
        self.log("user", f"creates pod {POD_NAMESPACE}/{name}")

    @precondition(lambda self: self.started and bool(self.schedulable()))
    @rule(pod=st.integers(0, 7), replica=st.sampled_from(REPLICAS), choice=st.integers(0, 1))
    def schedule(self, pod: int, replica: str, choice: int) -> None:
        """kube-scheduler: filter and prioritize through a replica, then Bind on it."""
        self.begin_step()
        pods = self.schedulable()
        obj = pods[pod % len(pods)]
        uid = obj["metadata"]["uid"]
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        rep = self.replicas[replica]
        nodes = rep.candidates(obj)
        if not nodes:
            self.log("scheduler", f"{key}: no node fits (per {replica})")
            return
        node = self.pick_node(uid, nodes, choice)
        if self.bind_under_way(replica, uid, node):
            self.log("scheduler", f"{key}: a bind to {node} is under way on {replica}; later")
            return
        task = self.new_bind(replica, key, uid, node)
        self.log("scheduler", f"Bind {key} -> {node} on {replica}: {task}")

    def bind_under_way(self, replica: str, uid: str, node: NodeName) -> bool:
        """Whether kube-scheduler holds back a bind to ``node`` on ``replica``: avoiding
        ``Hole.QUEUE_ORDER``, any bind to that node under way there; avoiding
        ``Hole.ABANDONED_RETRY``, one for the same pod."""
        for t in self.replicas[replica].tasks:
            if t.stage is Stage.DONE or t.node != node:
                continue
            if self.avoids(Hole.QUEUE_ORDER) or (
                self.avoids(Hole.ABANDONED_RETRY) and t.uid == uid
            ):
                return True
        return False

    def pick_node(self, uid: str, nodes: list[NodeName], choice: int) -> NodeName:
        """kube-scheduler's pick among the nodes that passed (see ``Hole.ORPHANED_LOCK``)."""
        if self.avoids(Hole.ORPHANED_LOCK):
            for node, lease in sorted(self.store.leases.items()):
                holder = FMT.parse(lease).holder
                if holder is not None and holder.uid == uid and node in nodes:
                    return node
        return nodes[choice % len(nodes)]

    def _finish(self, task: BindTask, result: str) -> None:
        task.stage, task.result = Stage.DONE, result
        self.replicas[task.replica].leave(task)
        if self.waiting.get(task.uid) == task.tid:
            del self.waiting[task.uid]

    def run_step(self, task: BindTask) -> str:
        rep = self.replicas[task.replica]
        stage = task.stage
        try:
            if task.stage is Stage.NEW:
                return rep.begin(task, hand_edits=self.hand_edits[task.node])
            if task.stage is Stage.WAITING:
                return rep.resume(task, hand_edits=self.hand_edits[task.node])
            if task.stage is Stage.ACQUIRED:
                return rep.confirm(task)
            if task.stage is Stage.CONFIRMED:
                return rep.send(task)
            text = rep.answer(task)
            self._finish(task, "ok")
            return text
        except BindFailed as exc:
            released = f"; {rep.release(task)}" if exc.release else ""
            self._finish(task, str(exc))
            return f"failed: {exc}{released}"
        except BindCancelled as exc:
            # ``_bind_holding``: a lock taken is released unless the binding may land
            keep = keep_lock_after(exc, binding_sent=stage is Stage.SENT)
            released = f"; {rep.release(task)}" if task.held is not None and not keep else ""
            task.kept_lock = task.held is not None and keep
            self._finish(task, f"cancelled: {exc}")
            return f"failed: {exc}{released}"

    @precondition(lambda self: bool(self.steppable()))
    @rule(task=st.integers(0, 3))
    def extender_step(self, task: int) -> None:
        """One step of one bind in flight (queue, wait, choose+acquire, confirm, send, answer)."""
        self.begin_step()
        tasks = self.steppable()
        t = tasks[task % len(tasks)]
        before = str(t)
        self.log(t.replica, f"{before}: {self.run_step(t)}")

    @precondition(lambda self: self.may(Fault.SLOW_API) and bool(self.steppable()))
    @rule(task=st.integers(0, 3), dt=st.sampled_from(TICKS[:2]))
    def slow_extender_step(self, task: int, dt: float) -> None:
        """One step of one bind whose first request is answered ``dt`` seconds late: time
        passes (locks may expire, binding requests time out), then the step runs."""
        self.begin_step()
        tasks = self.steppable()
        t = tasks[task % len(tasks)]
        self.clock.now += dt
        self.store.expire_requests(self.clock.now)
        before = str(t)
        self.fault(t.replica, f"the API server answers {dt:g}s late; {before}: {self.run_step(t)}")

    @precondition(lambda self: bool(self.store.live_requests(self.clock.now)))
    @rule(request=st.integers(0, 3))
    def server_applies(self, request: int) -> None:
        """The API server processes a binding request (its answer is not delivered yet)."""
        self.begin_step()
        live = self.store.live_requests(self.clock.now)
        r = live[request % len(live)]
        self.store.apply_binding(r)
        self.log("apiserver", f"binding #{r.rid} of {r.pod_key}: {r.result}")

    def watchers(self) -> dict[str, Callable[[int | None], int]]:
        out: dict[str, Callable[[int | None], int]] = {}
        for name, rep in self.replicas.items():
            out[name] = rep.deliver
        for node in self.nodes:
            out[f"plugin/{node}"] = self.plugins[node].deliver
            out[f"plugin-pods/{node}"] = self.plugins[node].deliver_pods
            out[f"kubelet/{node}"] = self.kubelets[node].deliver
        return out

    def backlogs(self) -> dict[str, int]:
        """Undelivered events per watcher whose stream is up."""
        out = {name: rep.backlog() for name, rep in self.replicas.items()}
        for node in self.nodes:
            out[f"plugin/{node}"] = self.plugins[node].leases.backlog()
            out[f"plugin-pods/{node}"] = self.plugins[node].pods.backlog()
            out[f"kubelet/{node}"] = self.kubelets[node].pods.backlog()
        return {name: n for name, n in out.items() if self.process_of(name) not in self.stalled}

    @staticmethod
    def process_of(watcher: str) -> str:
        """The process a watcher belongs to (the plugin's Lease and pod watches share one)."""
        return watcher.replace("plugin-pods/", "plugin/")

    @precondition(lambda self: self.started and any(self.backlogs().values()))
    @rule(watcher=st.integers(0, 5), everything=st.booleans())
    def deliver(self, watcher: int, everything: bool) -> None:
        """A watch delivers its next event (or all it has): late, never out of order."""
        self.begin_step()
        names = sorted(n for n, b in self.backlogs().items() if b)
        if names:
            self.deliver_to(names[watcher % len(names)], everything=everything)

    def deliver_to(self, name: str, *, everything: bool = True) -> None:
        n = self.watchers()[name](None if everything else 1)
        self.log(name, f"watch delivers {n} event{'s' if n != 1 else ''}")

    def kubelet_ready(self) -> list[NodeName]:
        return [n for n in self.nodes if self.kubelets[n].next_pod() is not None]

    def do_kubelet_step(
        self, node: NodeName, pick: int, *, crash_after_answer: bool = False
    ) -> str:
        if self.avoids(Hole.STALE_LEASE_VIEW):
            self.plugins[node].deliver(None)
        return self.kubelets[node].step(
            self.plugins[node],
            pick=pick,
            reuse_in_order=self.avoids(Hole.INIT_REUSE),
            crash_after_answer=crash_after_answer,
        )

    @precondition(lambda self: bool(self.kubelet_ready()))
    @rule(node=st.integers(0, 1), pick=st.integers(0, 5))
    def kubelet_step(self, node: int, pick: int) -> None:
        """kubelet admits its next pod by one container (GetPreferredAllocation, Allocate)."""
        self.begin_step()
        ready = self.kubelet_ready()
        n = ready[node % len(ready)]
        self.log(f"kubelet/{n}", self.do_kubelet_step(n, pick))

    @precondition(lambda self: self.may(Fault.RELEASE_FAILS))
    @rule(node=st.integers(0, 1))
    def plugin_loses_api(self, node: int) -> None:
        """The device plugin's next Lease write (a release) cannot reach the API server."""
        self.begin_step()
        n = self.nodes[node % len(self.nodes)]
        self.plugins[n].locks.fail_next_write = True
        self.fault(f"plugin/{n}", "release-fails: its next Lease write will not get through")

    @precondition(lambda self: any(p.cp.pending for p in self.plugins.values()))
    @rule(node=st.integers(0, 1))
    def plugin_retries_releases(self, node: int) -> None:
        self.begin_step()
        ready = [n for n in self.nodes if self.plugins[n].cp.pending]
        n = ready[node % len(ready)]
        self.log(f"plugin/{n}", "; ".join(self.plugins[n].retry_releases()))

    def running(self) -> list[tuple[NodeName, str]]:
        return [
            (n, uid)
            for n in self.nodes
            for uid in sorted(self.kubelets[n].admitted)
            if uid in self.live_pods()
        ]

    @precondition(lambda self: bool(self.running()))
    @rule(pod=st.integers(0, 7))
    def pod_completes(self, pod: int) -> None:
        self.begin_step()
        running = self.running()
        n, uid = running[pod % len(running)]
        self.log(f"kubelet/{n}", self.kubelets[n].complete(uid))

    @precondition(lambda self: self.started)
    @rule(dt=st.sampled_from(TICKS))
    def tick(self, dt: float) -> None:
        """Time passes (locks may expire; binding requests time out)."""
        self.begin_step()
        self.clock.now += dt
        dead = self.store.expire_requests(self.clock.now)
        text = f"+{dt:g}s"
        if dead:
            text += "; timed out: " + ", ".join(f"binding #{r.rid}" for r in dead)
        self.log("clock", text)

    # -- faults --------------------------------------------------------------------------------

    def orphan_risk(self) -> bool:
        """Avoiding ``Hole.ORPHANED_LOCK``: some Lease is held by a pod that no longer exists."""
        if not self.avoids(Hole.ORPHANED_LOCK):
            return False
        for lease in self.store.leases.values():
            holder = FMT.parse(lease).holder
            if holder is not None and self.store.pod_by_uid(holder.uid) is None:
                return True
        return False

    @precondition(lambda self: self.started and self.may(Fault.CRASH) and not self.orphan_risk())
    @rule(replica=st.sampled_from(REPLICAS))
    def extender_crashes(self, replica: str) -> None:
        """An extender replica dies after whatever step it was in, and restarts empty."""
        self.begin_step()
        lost = self.replicas[replica].crash()
        for task in lost:
            self._finish(task, "crashed")
        self.fault(replica, f"crash: lost {', '.join(map(str, lost)) or 'no bind'}; relisted")

    def cancellable(self) -> list[BindTask]:
        if self.avoids(Hole.CANCEL_AFTER_WRITE):
            return self.active_tasks(Stage.NEW, Stage.WAITING, Stage.ACQUIRED, Stage.CONFIRMED)
        return self.active_tasks()

    @precondition(lambda self: self.may(Fault.CANCEL) and bool(self.cancellable()))
    @rule(task=st.integers(0, 3))
    def bind_cancelled(self, task: int) -> None:
        """kube-scheduler's request is cancelled: the bind releases the lock unless its binding
        was sent (``keep_lock_after``)."""
        self.begin_step()
        tasks = self.cancellable()
        t = tasks[task % len(tasks)]
        text = f"cancel: {t}"
        if keep_lock_after(asyncio.CancelledError(), binding_sent=t.stage is Stage.SENT):
            text += "; the binding was sent: the lock is kept"
        elif t.stage is not Stage.NEW:
            text += f"; {self.replicas[t.replica].release(t)}"
        self._finish(t, "cancelled")
        self.fault(t.replica, text)

    def waited_tasks(self) -> list[BindTask]:
        tasks = [t for t in self.active_tasks() if self.waiting.get(t.uid) == t.tid]
        if self.avoids(Hole.ABANDONED_BIND_WRITES):
            tasks = [t for t in tasks if t.stage in (Stage.NEW, Stage.WAITING, Stage.SENT)]
        return tasks

    @precondition(
        lambda self: (
            self.may(Fault.GIVE_UP)
            and not self.avoids(Hole.DOUBLE_BIND)
            and bool(self.waited_tasks())
        )
    )
    @rule(task=st.integers(0, 3), mid_acquire=st.booleans())
    def scheduler_gives_up(self, task: int, mid_acquire: bool) -> None:
        """kube-scheduler's extender call times out and it disconnects: the bind is abandoned
        (``Binder.abandon``: it leaves its queue, sends no further Lease write or binding, and
        releases a lock it took); the pod is retried.  ``mid_acquire``: for a bind about to
        take its turn, the disconnect comes while its reads before the Lease write are in
        flight (the bind takes its step now)."""
        self.begin_step()
        tasks = self.waited_tasks()
        t = tasks[task % len(tasks)]
        del self.waiting[t.uid]
        rep = self.replicas[t.replica]
        mid_acquire = mid_acquire and not self.avoids(Hole.ABANDONED_BIND_WRITES)
        if mid_acquire and t.stage in (Stage.NEW, Stage.WAITING) and rep.resumable(t):
            t.abandon_at_write = True
            text = self.run_step(t)
            if t.abandon_at_write:  # no write came: the disconnect after the step
                t.abandon_at_write = False
                rep.abandon(t)
            self.fault("scheduler", f"gives up on {t} as it takes its turn: {text}; retried later")
            return
        rep.abandon(t)
        self.fault("scheduler", f"gives up waiting for {t}; {t.pod_key} may be scheduled again")

    @precondition(lambda self: self.may(Fault.ANSWER_LOST) and bool(self.active_tasks(Stage.SENT)))
    @rule(task=st.integers(0, 3), applied=st.booleans(), get_fails=st.booleans())
    def binding_answer_lost(self, task: int, applied: bool, get_fails: bool) -> None:
        """The binding's connection drops: applied (or not) but unanswered; the GET may fail."""
        self.begin_step()
        tasks = self.active_tasks(Stage.SENT)
        t = tasks[task % len(tasks)]
        r = t.request
        assert r is not None
        if applied and r.result is None and self.clock.now <= r.deadline:
            self.store.apply_binding(r)
        rep = self.replicas[t.replica]
        try:
            text = rep.answer(t, lost=True, get_fails=get_fails)
            self._finish(t, "ok")
        except BindFailed as exc:
            text = f"failed: {exc}"
            self._finish(t, str(exc))
        self.fault(
            t.replica, f"answer lost: {t} (applied={applied}, GET fails={get_fails}): {text}"
        )

    @precondition(
        lambda self: self.may(Fault.ANSWER_LOST) and bool(self.steppable(Stage.NEW, Stage.WAITING))
    )
    @rule(task=st.integers(0, 3))
    def acquire_answer_lost(self, task: int) -> None:
        """The bind's Lease write lands but its answer is lost."""
        self.begin_step()
        tasks = self.steppable(Stage.NEW, Stage.WAITING)
        t = tasks[task % len(tasks)]
        rep = self.replicas[t.replica]
        rep.locks.lose_next_answer = True
        text = self.run_step(t)
        rep.locks.lose_next_answer = False
        self.fault(t.replica, f"Lease write answer lost: {t}: {text}")

    @precondition(lambda self: self.may(Fault.WATCH_STALL) and self.config.prompt != PROCESSES)
    @rule(watcher=st.integers(0, 7))
    def watch_stalls(self, watcher: int) -> None:
        """A process's watch streams break (its reconnect is slow; the device plugin's Lease and
        pod watches together): nothing is delivered to them until they resume from where they
        were (a second pick of the same process, or settling)."""
        self.begin_step()
        names = sorted(
            {self.process_of(w) for w in self.watchers()}
            - {f"{p}/{n}" for p in self.config.prompt for n in self.nodes}
            - set(self.config.prompt)
        )
        name = names[watcher % len(names)]
        if name in self.stalled:
            self.stalled.discard(name)
            self.log(name, "watch reconnected (resumes where it was)")
        else:
            self.stalled.add(name)
            self.fault(name, "watch stalls: its stream is down, nothing is delivered")

    def lock_clients(self) -> dict[str, LockClient]:
        """Every process's ``NodeLocks``: the replicas' and the device plugins'."""
        out = {name: rep.locks for name, rep in self.replicas.items()}
        for n in self.nodes:
            out[f"plugin/{n}"] = self.plugins[n].locks
        return out

    @precondition(
        lambda self: (
            self.may(Fault.LATE_READ)
            and not self.avoids(Hole.LATE_READ)
            and bool(self.store.leases)
        )
    )
    @rule(process=st.integers(0, 3), node=st.integers(0, 1))
    def read_sent(self, process: int, node: int) -> None:
        """A process reads a node's Lease (one GET: after a lost race, before a refusal without
        a watch, ``nodelock locks``); the server answers now, and the answer is on its way while
        other steps happen (``read_answered`` takes it in)."""
        self.begin_step()
        clients = self.lock_clients()
        name = sorted(clients)[process % len(clients)]
        nodes = sorted(self.store.leases)
        n = nodes[node % len(nodes)]
        lease = self.store.get_lease(n)
        self.reads.append((name, clients[name], n, lease))
        rv = lease["metadata"]["resourceVersion"]
        self.fault(name, f"GET of Lease {n} served at rv{rv}; answer late", excuses_refusals=False)

    @precondition(lambda self: bool(self.reads))
    @rule(read=st.integers(0, 3))
    def read_answered(self, read: int) -> None:
        """A late GET's answer is taken in, after whatever its process's watch delivered since
        (dropped when the process restarted meanwhile)."""
        self.begin_step()
        name, client, n, lease = self.reads.pop(read % len(self.reads))
        self.take_answer(name, client, n, lease)

    def take_answer(self, name: str, client: LockClient, node: NodeName, lease: JSON) -> None:
        rv = lease["metadata"]["resourceVersion"]
        if self.lock_clients().get(name) is not client:
            self.log(name, f"answer of the GET of Lease {node} (rv{rv}) dropped: restarted")
            return
        client.take_answer(lease)
        self.log(name, f"takes in the answer of its GET of Lease {node} (rv{rv})")

    @precondition(lambda self: self.may(Fault.ADMISSION_REJECT) and bool(self.kubelet_ready()))
    @rule(node=st.integers(0, 1))
    def kubelet_rejects(self, node: int) -> None:
        """kubelet rejects its next pod at admission before any Allocate (an eviction or sysctl
        admit handler; or its device manager with no device reported, while the node's plugin
        does not serve, issue 52): the pod fails (``UnexpectedAdmissionError``) and no plugin is
        called; its lock is released by the node's plugin once it sees it Failed and serves
        (``Admission.release_ended``, in ``EndedModel``), else swept or taken over once expired
        (the extenders never release a rejected holder at once: R1)."""
        self.begin_step()
        ready = self.kubelet_ready()
        n = ready[node % len(ready)]
        kubelet = self.kubelets[n]
        uid = kubelet.next_pod()
        assert uid is not None
        if kubelet.allocated.get(uid):
            self.log(f"kubelet/{n}", f"{self.key_of(uid)} is being admitted; not rejected")
            return
        if not self.plugins[n].serving:
            self.rejected_unserved[uid] = n
            kubelet.reject(uid, "Allocate failed: no healthy devices present (admission)")
        else:
            kubelet.reject(uid, "Evicted: the node was low on memory (admission)")
        self.excused.add(uid)
        self.fault(
            f"kubelet/{n}",
            f"rejects {self.key_of(uid)} at admission before Allocate",
            excuses_refusals=False,
        )

    def rejectable_after_allocate(self) -> list[tuple[NodeName, str]]:
        """Pods kubelet is admitting with at least one Allocate answered."""
        out: list[tuple[NodeName, str]] = []
        for n in self.nodes:
            uid = self.kubelets[n].current
            if uid is not None and self.kubelets[n].allocated.get(uid):
                out.append((n, uid))
        return out

    @precondition(
        lambda self: (
            self.may(Fault.REJECT_AFTER_ALLOCATE) and bool(self.rejectable_after_allocate())
        )
    )
    @rule(which=st.integers(0, 1))
    def kubelet_rejects_after_allocate(self, which: int) -> None:
        """kubelet rejects the pod it is admitting after Allocate answered some of its
        containers (an admit handler after the device manager's: node affinity, resources,
        taints, AppArmor, node shutdown): the pod fails and kubelet frees its devices; the lock
        is released only if its last container was served.  Only that pod's failure is
        excused."""
        self.begin_step()
        pods = self.rejectable_after_allocate()
        n, uid = pods[which % len(pods)]
        self.kubelets[n].reject(uid, "NodeAffinity: rejected after Allocate (admission)")
        self.excused.add(uid)
        self.fault(
            f"kubelet/{n}",
            f"rejects {self.key_of(uid)} at admission after Allocate",
            excuses_refusals=False,
        )

    def may_lose_records(self) -> bool:
        return self.may(Fault.CHECKPOINT_LOST) and not self.avoids(
            Hole.SERVED_AFTER_CHECKPOINT_LOSS
        )

    @precondition(lambda self: self.may_lose_records() and bool(self.kubelet_ready()))
    @rule(node=st.integers(0, 1), pick=st.integers(0, 5))
    def kubelet_dies_after_answer(self, node: int, pick: int) -> None:
        """kubelet dies right after the plugin answered an Allocate, before writing its device
        checkpoint (it writes it after the answer), and restarts: the pod is admitted again in
        its batch and Allocate is called again for that container."""
        self.begin_step()
        ready = self.kubelet_ready()
        n = ready[node % len(ready)]
        text = self.do_kubelet_step(n, pick, crash_after_answer=True)
        self.fault(f"kubelet/{n}", f"crash after the answer armed: {text}")

    @precondition(lambda self: self.started and self.may_lose_records())
    @rule(node=st.integers(0, 1))
    def kubelet_restarts_losing_record(self, node: int) -> None:
        """kubelet restarts and its device checkpoint lacks the last record it wrote (a write
        that did not reach the disk): a running pod's container has no device record, so its
        pod worker asks Allocate again (``pod_worker_reallocates``)."""
        self.begin_step()
        n = self.nodes[node % len(self.nodes)]
        kubelet = self.kubelets[n]
        last = kubelet.last_record
        kubelet.start(lose_last_record=True)
        gone = last is not None and last[1] not in kubelet.allocated.get(last[0], {})
        lost = (
            f"{self.key_of(last[0])} {slot_text(last[1])}"
            if last is not None and gone
            else "nothing"
        )
        self.fault(f"kubelet/{n}", f"restart: relisted its pods; its checkpoint lost {lost}")

    def unrecorded(self) -> list[NodeName]:
        return [n for n in self.nodes if self.kubelets[n].unrecorded()]

    @precondition(lambda self: bool(self.unrecorded()))
    @rule(node=st.integers(0, 1), which=st.integers(0, 3), pick=st.integers(0, 5))
    def pod_worker_reallocates(self, node: int, which: int, pick: int) -> None:
        """A running pod's container with no device record is started: Allocate again."""
        self.begin_step()
        nodes = self.unrecorded()
        n = nodes[node % len(nodes)]
        self.plugins[n].deliver(None)
        self.log(f"kubelet/{n}", self.kubelets[n].reallocate(self.plugins[n], which, pick=pick))

    @precondition(lambda self: self.started and self.may(Fault.PODRESOURCES_DOWN))
    @rule(node=st.integers(0, 1))
    def podresources_fails(self, node: int) -> None:
        """kubelet's PodResources List starts or stops failing (kubelet starting, or a channel
        that cannot connect): where the socket is there the plugin refuses (a refusal this
        fault excuses); on a node whose plugin has no socket (``config.socketless``) it decides
        from a GET of the holder and a LIST of the node's pods."""
        self.begin_step()
        n = self.nodes[node % len(self.nodes)]
        kubelet = self.kubelets[n]
        kubelet.podresources_down = not kubelet.podresources_down
        if kubelet.podresources_down:
            self.fault(
                f"kubelet/{n}",
                "PodResources List fails" + (" (no socket)" if kubelet.socketless else ""),
                excuses_refusals=not kubelet.socketless,
            )
        else:
            self.log(f"kubelet/{n}", "PodResources List answers again")

    @precondition(lambda self: self.started and self.may(Fault.PLUGIN_CRASH))
    @rule(node=st.integers(0, 1))
    def plugin_crashes(self, node: int) -> None:
        """The device plugin restarts: its checkpoint is kept, its watch view and cache are not."""
        self.begin_step()
        n = self.nodes[node % len(self.nodes)]
        self.plugins[n].start()
        self.fault(f"plugin/{n}", f"crash: restarted with checkpoint {self.plugins[n].cp}")

    @precondition(lambda self: self.may(Fault.PLUGIN_CRASH) and bool(self.kubelet_ready()))
    @rule(node=st.integers(0, 1), pick=st.integers(0, 5))
    def plugin_crashes_in_allocate(self, node: int, pick: int) -> None:
        """The plugin dies after writing its checkpoint, before kubelet gets the answer."""
        self.begin_step()
        ready = self.kubelet_ready()
        n = ready[node % len(ready)]
        self.plugins[n].crash_after_checkpoint = True
        text = self.do_kubelet_step(n, pick)
        self.plugins[n].crash_after_checkpoint = False
        self.fault(f"kubelet/{n}", f"plugin crash armed: {text}")

    @precondition(lambda self: self.started and self.may(Fault.KUBELET_RESTART))
    @rule(node=st.integers(0, 1))
    def kubelet_restarts(self, node: int) -> None:
        self.begin_step()
        n = self.nodes[node % len(self.nodes)]
        self.kubelets[n].start()
        self.fault(f"kubelet/{n}", "restart: relisted its pods, kept its device checkpoint")

    @precondition(
        lambda self: (
            self.may(Fault.LEASE_BY_HAND)
            and not self.avoids(Hole.LEASE_RESET)
            and bool(self.store.leases)
        )
    )
    @rule(node=st.integers(0, 1), delete=st.booleans())
    def lease_edited_by_hand(self, node: int, delete: bool) -> None:
        """Someone deletes a node's Lease, or resets it to a fresh free one, by hand.

        The lock-guard admission policy (deploy/, installed with the chart) lets nobody but the
        extender and the node's device plugin delete a held lock or change a lock's holder or
        fencing token: such an edit is denied, and only a free Lease can be deleted by hand.
        (Without the policy, hole #12.3 comes back: ``make model MODEL_ARGS="--hole
        lease-reset"`` with this denial reverted finds it.)"""
        self.begin_step()
        nodes = sorted(self.store.leases)
        n = nodes[node % len(nodes)]
        before = self.lease_line(n)
        held = bool((self.store.leases[n].get("spec") or {}).get("holderIdentity"))
        if held or not delete:
            self.fault("admin", f"{'delete' if delete else 'reset'} of Lease {before} denied")
            return
        self.hand_edits[n] += 1
        if delete:
            self.store.delete_lease(n)
        else:
            fresh = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": n,
                    "namespace": FMT.namespace,
                    "resourceVersion": self.store.leases[n]["metadata"]["resourceVersion"],
                },
                "spec": {},
            }
            self.store.replace_lease(n, fresh, writer="hand")
        self.fault("admin", f"{'deletes' if delete else 'resets'} Lease {before}")

    def deletable(self) -> list[JSON]:
        return [p for _, p in sorted(self.store.pods.items())]

    @precondition(lambda self: self.may(Fault.POD_DELETE) and bool(self.deletable()))
    @rule(pod=st.integers(0, 7))
    def pod_deleted(self, pod: int) -> None:
        self.begin_step()
        pods = self.deletable()
        p = pods[pod % len(pods)]
        key = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        self.store.delete_pod(key)
        self.fault("user", f"deletes pod {key}")

    @precondition(
        lambda self: (
            self.may(Fault.OWNER_EDIT)
            and self.config.owner_edits
            and any(p["spec"].get("nodeName") for p in self.store.pods.values())
        )
    )
    @rule(pod=st.integers(0, 7))
    def owner_edits_assignment(self, pod: int) -> None:
        """A pod's owner rewrites its assignment annotation (no admission policy installed)."""
        self.begin_step()
        pods = [p for _, p in sorted(self.store.pods.items()) if p["spec"].get("nodeName")]
        p = pods[pod % len(pods)]
        key = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        node = p["spec"]["nodeName"]
        forged = {
            c: [f"{node}-g{i}" for i in range(len(ids))]
            for c, ids in self.assigned.get(p["metadata"]["uid"], {"main": [DeviceID("x")]}).items()
        }
        raw = ",".join(
            f'"{c}":[{",".join(chr(34) + d + chr(34) for d in ds)}]' for c, ds in forged.items()
        )
        self.store.edit_pod_annotations(key, {KEYS.assignment: "{" + raw + "}"})
        self.fault("owner", f"edits {key}'s assignment to {{{raw}}}")

    @precondition(
        lambda self: (
            self.started
            and self.may(Fault.BYPASS)
            and not self.avoids(Hole.BYPASS_POD)
            and self.created < self.config.max_pods
        )
    )
    @rule(node=st.integers(0, 1))
    def bypass_pod_created(self, node: int) -> None:
        """A GPU pod created with spec.nodeName set: it never goes through the extender."""
        self.begin_step()
        n = self.nodes[node % len(self.nodes)]
        self.created += 1
        name = f"bypass-{self.created}"
        stored = self.store.create_pod(pod_object(name, "one", node=n))
        self.bypass.add(stored["metadata"]["uid"])
        # kubelet's own view tells the plugin which pod it admits, so a bypass pod fails alone:
        # the holder it raced must still be admitted (L1 stays checked)
        self.fault(
            "user",
            f"creates {POD_NAMESPACE}/{name} bound to {n} (bypassing the extender)",
            excuses_refusals=False,
        )

    # -- invariants ----------------------------------------------------------------------------

    def claim_of(self, pod: JSON, container: str) -> Slice:
        """Ground truth: what ``container`` asks of each of its GPUs (``WHOLE``: all of it)."""
        for group in ("initContainers", "containers"):
            for c in pod["spec"].get(group) or []:
                if c.get("name") == container:
                    try:
                        return container_slice(c) or WHOLE
                    except BadShare:
                        return WHOLE
        return WHOLE

    def on_gpus(
        self, node: NodeName, per_pod: Mapping[str, Mapping[Any, Sequence[DeviceID]]]
    ) -> dict[DeviceID, dict[str, Slice]]:
        """Physical GPU or MIG instance -> live pod UID -> its claim there (the larger of its
        containers'); ``per_pod`` maps containers, or kubelet's (container, resource) slots, to
        device IDs."""
        live = self.live_pods()
        out: dict[DeviceID, dict[str, Slice]] = {}
        for uid, per in sorted(per_pod.items()):
            pod = live.get(uid)
            if pod is None:
                continue
            for where, ids in per.items():
                container = where[0] if isinstance(where, tuple) else where
                claim = self.claim_of(pod, container)
                for d in ids:
                    gpu = physical_of(d)
                    prev = out.setdefault(gpu, {}).get(uid)
                    if prev is None or _bigger(claim, prev):
                        out[gpu][uid] = claim
        return out

    def over_committed(
        self, node: NodeName, holders: dict[DeviceID, dict[str, Slice]], verb: str
    ) -> str | None:
        """Why a GPU of ``node`` holds more than it may (None: nothing does): two pods on a
        GPU of a node that does not share or on a GPU one of them holds whole; more slices
        than the split count, more memory or more cores than the GPU has."""
        split = self.split_of(node)
        for gpu, claims in sorted(holders.items()):
            if len(claims) < 2:
                continue
            names = " and ".join(self.key_of(u) for u in sorted(claims))
            if split <= 1 or any(c.exclusive for c in claims.values()):
                return f"{gpu} {verb} {names}"
            if len(claims) > split:
                return f"{gpu} holds {len(claims)} slices ({names}), more than its {split}"
            memory = sum(_memory(c) for c in claims.values())
            if memory > GPU_MEMORY_MIB:
                return (
                    f"{gpu} holds {memory} MiB of slices ({names}), more than its {GPU_MEMORY_MIB}"
                )
            cores = sum(c.cores for c in claims.values())
            if cores > 100:
                return f"{gpu} holds {cores}% cores of slices ({names})"
        return None

    @invariant()
    def s1_no_device_twice(self) -> None:
        live = self.live_pods()
        for n in self.nodes:
            given = self.on_gpus(n, self.kubelets[n].given)
            why = self.over_committed(n, given, "was given to")
            if why is not None:
                self.violate("S1", why)
        for n in self.nodes:
            bound = {
                uid: dict(a)
                for uid, a in self.assigned.items()
                if uid in live and live[uid]["spec"].get("nodeName") == n
            }
            why = self.over_committed(n, self.on_gpus(n, bound), "is assigned to live pods")
            if why is not None:
                self.violate("S1", why)

    @invariant()
    def s2_containers_get_their_assignment(self) -> None:
        live = self.live_pods()
        for n in self.nodes:
            kubelet = self.kubelets[n]
            for early in kubelet.early_releases:
                self.violate("S2", early)
            for uid, per in kubelet.given.items():
                if uid in kubelet.static:  # no lock names it: every device it got is another's
                    for slot, devices in per.items():
                        self.violate(
                            "S2",
                            f"static pod {self.key_of(uid)} container {slot_text(slot)} was "
                            f"given {list(devices)}, served as the handoff of "
                            f"{self.key_of(kubelet.served_holder[uid][slot])}",
                        )
                if uid not in live:
                    continue
                key = self.key_of(uid)
                assignment = self.assigned.get(uid)
                inits = {c["name"] for c in live[uid]["spec"].get("initContainers") or []}
                for slot, devices in per.items():
                    holder = kubelet.served_holder[uid][slot]
                    container, resource = slot
                    if holder != uid or assignment is None:
                        self.violate(
                            "S2",
                            f"{key} container {slot_text(slot)} was given {list(devices)}, served "
                            f"as the handoff of {self.key_of(holder)}",
                        )
                    assert assignment is not None
                    # per resource: the assignment names a container's GPUs and instances
                    want = {
                        d
                        for d in assignment.get(container, [])
                        if resource_of_device(d) == resource
                    }
                    pool = {
                        d
                        for ids in assignment.values()
                        for d in ids
                        if resource_of_device(d) == resource
                    }
                    if set(devices) != want and not (inits and set(devices) <= pool):
                        self.violate(
                            "S2",
                            f"{key} container {slot_text(slot)} was given {list(devices)}, its "
                            f"assignment is {sorted(want)}",
                        )

    @invariant()
    def s3_left_holders_are_takeable(self) -> None:
        for node, lease in sorted(self.store.leases.items()):
            record = FMT.parse(lease)
            if record.holder is None:
                continue
            uid = record.holder.uid
            obj = self.store.pod_or_none(record.holder.key)
            if obj is not None and obj["metadata"]["uid"] != uid:
                obj = None
            if self.in_handoff(uid, node):
                continue
            if obj is not None and not obj["spec"].get("nodeName"):
                continue  # never bound and no binding in flight: judged on a fresh read anyway
            state = pod_state(obj, keys=KEYS, resource=RESOURCE) if obj is not None else None
            verdict = judge(state, holder_uid=uid, node=node, fresh=True)
            status = holder_status(obj, uid=uid, node=node)
            if not verdict.allowed or status.in_handoff:
                self.violate(
                    "S3",
                    f"lock of {node} held by {record.holder.key}, which left the handoff, is not "
                    f"takeable (judge: {verdict.why}; nodelock locks: {status.why})",
                )

    @invariant()
    def v1_lease_views_never_go_back(self) -> None:
        for name, client in sorted(self.lock_clients().items()):
            for node, newest in sorted(client.newest.items()):
                seen = client.obs.get(node)
                if seen is not None and int(seen.record.resource_version) < newest:
                    holder = seen.record.holder
                    self.violate(
                        "V1",
                        f"{name} sees Lease {node} at rv{seen.record.resource_version} "
                        f"(token {seen.record.token}, "
                        f"{'held by ' + holder.key if holder else 'free'}) after taking in "
                        f"rv{newest}",
                    )

    @invariant()
    def f1_holder_counted(self) -> None:
        """Filter's and Bind's picture of a node counts each GPU of the lock holder's
        assignment (the Lease's copy) as taken -- held whole on a sharing node, where the copy
        names GPUs and not the size of the holder's slice -- until the replica's cache counts
        the holder's own binding (``holder_accounted``)."""
        for name, rep in sorted(self.replicas.items()):
            for node in self.nodes:
                view = rep.locks.view(node)
                holder = view.record.holder if view is not None else None
                if holder is None or holder_accounted(rep.cache, view)(holder.uid):
                    continue
                raw = holder.data.get(LEASE_ASSIGNMENT)
                if raw is None:
                    continue
                picture = rep.picture(node)
                if picture is None:
                    continue
                devices = {d for ids in parse_assignment(raw).values() for d in ids}
                held = {d for d, claim in picture.held if claim.exclusive}
                for d in sorted(devices):
                    whole = self.split_of(node) <= 1 or d in held
                    if d not in picture.taken or not whole:
                        self.violate(
                            "F1",
                            f"{name}'s picture of {node} leaves {d} of the lock holder "
                            f"{holder.key} (not yet counted by its cache) "
                            + ("free" if d not in picture.taken else "open to other slices"),
                        )

    @invariant()
    def w1_turns_in_order(self) -> None:
        for task in self.tasks.values():
            if task.out_of_turn:
                self.violate("W1", task.out_of_turn)

    @invariant()
    def w2_abandoned_binds_write_nothing(self) -> None:
        for task in self.tasks.values():
            if task.late_writes:
                self.violate(
                    "W2",
                    f"{task} sent {'; '.join(task.late_writes)} after kube-scheduler stopped "
                    "waiting for it",
                )

    def check_safety(self) -> None:
        """Every safety invariant now (Hypothesis does this after each rule; replays call it)."""
        self.s1_no_device_twice()
        self.s2_containers_get_their_assignment()
        self.s3_left_holders_are_takeable()
        self.v1_lease_views_never_go_back()
        self.f1_holder_counted()
        self.w1_turns_in_order()
        self.w2_abandoned_binds_write_nothing()

    # -- liveness ------------------------------------------------------------------------------

    def settle(self) -> None:
        """Faults stop; every actor runs until nothing changes (time passing); then L1."""
        self.begin_step()
        self.log("settle", "faults stop; every actor runs to quiescence")
        self.drain()
        self.check_liveness()

    def drain(self) -> None:
        for plugin in self.plugins.values():
            plugin.locks.fail_next_write = False
        for kubelet in self.kubelets.values():
            kubelet.podresources_down = False
        self.stalled.clear()
        for name, client, node, lease in self.reads:  # answers still on their way arrive
            self.take_answer(name, client, node, lease)
        self.reads.clear()
        idle_ticks = 0
        for _ in range(SETTLE_ROUNDS):
            moved = False
            for _name, deliver in self.watchers().items():
                if deliver(None):
                    moved = True
            for n in self.nodes:
                if self.plugins[n].cp.pending:
                    self.log(f"plugin/{n}", "; ".join(self.plugins[n].retry_releases()))
                    moved = True
            for t in self.active_tasks():
                if self.run_bind(t):
                    moved = True
            for n in self.nodes:
                for _step in range(12):
                    if self.kubelets[n].next_pod() is None:
                        break
                    self.plugins[n].deliver(None)
                    self.plugins[n].deliver_pods(None)
                    self.log(f"kubelet/{n}", self.do_kubelet_step(n, 0))
                    moved = True
            for obj in self.schedulable():
                self.replicas["E0"].deliver(None)
                uid = obj["metadata"]["uid"]
                if uid in self.bypass:
                    continue
                nodes = self.replicas["E0"].candidates(obj)
                if not nodes:
                    continue
                key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
                node = self.pick_node(uid, nodes, 0)
                if self.bind_under_way("E0", uid, node):
                    continue
                task = self.new_bind("E0", key, uid, node)
                self.log("scheduler", f"Bind {key} -> {node} on E0: {task}")
                self.run_bind(task)
                moved = moved or task.result == "ok"
            if not moved:
                if idle_ticks >= SETTLE_IDLE_TICKS:
                    return
                idle_ticks += 1
                self.clock.now += DURATION_S + 1
                self.store.expire_requests(self.clock.now)
                self.log("clock", f"+{DURATION_S + 1}s (settling)")
            else:
                idle_ticks = 0

    def run_bind(self, task: BindTask) -> bool:
        """Settling: run ``task`` until it is done or waits (parked, not woken); whether it
        took a step."""
        rep = self.replicas[task.replica]
        steps = 0
        while task.stage is not Stage.DONE and rep.resumable(task) and steps < 40:
            self.log(task.replica, f"{task}: {self.run_step(task)}")
            steps += 1
        return steps > 0

    def free_on(self, node: NodeName) -> int:
        """Ground truth: GPUs of ``node`` no live pod holds (assigned, given or unattributed)."""
        held, unattributed = self.held_on(node)
        whole = {d for d in held if resource_of_device(d) == RESOURCE}
        return dict(self.config.nodes)[node] - len(whole) - unattributed

    def free_instances(self, node: NodeName, resource: str) -> int:
        """Ground truth: MIG instances of ``resource`` on ``node`` no live pod holds."""
        if not self.has_mig(node):
            return 0
        held, _ = self.held_on(node)
        gpus = dict(self.config.nodes)[node]
        return sum(
            1 for g in mig_instances(node, gpus) if g.resource == resource and g.id not in held
        )

    def held_on(self, node: NodeName) -> tuple[set[DeviceID], int]:
        """Ground truth: the devices live pods of ``node`` hold (assigned or given), and how
        many GPUs pods bound without an assignment hold (a bypass pod asks for one GPU)."""
        live = self.live_pods()
        held: set[DeviceID] = set()
        unattributed = 0
        for uid, pod in live.items():
            if pod["spec"].get("nodeName") != node:
                continue
            if uid in self.assigned:
                held |= {d for ids in self.assigned[uid].values() for d in ids}
            else:
                unattributed += 1
        for uid, per in self.kubelets[node].given.items():
            if uid in live:
                held |= {d for ids in per.values() for d in ids}
        return held, unattributed

    def fits(self, node: NodeName, pod: JSON, total: int) -> bool:
        """Ground truth: whether ``pod`` (``total`` GPUs) fits ``node`` as it is now.  Slices fit
        only a sharing node, on a GPU with a slice free, its memory and cores; whole GPUs are
        GPUs nothing holds.  A sharing node with a pod bound to it without an assignment is
        not judged (False).  MIG instances fit only a MIG node, with enough of each profile
        free (the model's MIG pods have no init containers: a pod's count is its sum)."""
        instances: dict[str, int] = {}
        for c in pod["spec"]["containers"]:
            for resource, amount in c["resources"]["limits"].items():
                if resource in MIG_RESOURCES:
                    instances[resource] = instances.get(resource, 0) + int(amount)
        if instances:
            return (
                self.has_mig(node)
                and self.free_on(node) >= total
                and all(self.free_instances(node, r) >= n for r, n in instances.items())
            )
        claims = [
            self.claim_of(pod, c["name"])
            for group in ("initContainers", "containers")
            for c in pod["spec"].get(group) or []
        ]
        if all(c.exclusive for c in claims):
            return self.free_on(node) >= total
        split = self.split_of(node)
        if split <= 1 or len(claims) != 1 or total != 1:
            return False
        live = self.live_pods()
        if any(
            p["spec"].get("nodeName") == node and uid not in self.assigned
            for uid, p in live.items()
        ):
            return False
        held = self.on_gpus(node, self.kubelets[node].given)
        bound = {
            uid: dict(a)
            for uid, a in self.assigned.items()
            if uid in live and live[uid]["spec"].get("nodeName") == node
        }
        for gpu, on in self.on_gpus(node, bound).items():
            held.setdefault(gpu, {}).update(on)
        claim = claims[0]
        for i in range(dict(self.config.nodes)[node]):
            on = held.get(gpu_id(node, i), {})
            if (
                not any(c.exclusive for c in on.values())
                and len(on) < split
                and sum(_memory(c) for c in on.values()) + _memory(claim) <= GPU_MEMORY_MIB
                and sum(c.cores for c in on.values()) + claim.cores <= 100
            ):
                return True
        return False

    def check_liveness(self) -> None:
        if self.faults == 0:
            for n in self.nodes:
                for uid, why in self.kubelets[n].failed.items():
                    if uid not in self.bypass and uid not in self.excused:
                        self.violate(
                            "L1", f"{self.key_of(uid)} was refused at admission (no fault): {why}"
                        )
        for p in self.schedulable():
            uid = p["metadata"]["uid"]
            if uid in self.bypass:
                continue
            state = pod_state(p, keys=KEYS, resource=RESOURCE)
            assert state.need is not None
            fits = [n for n in self.nodes if self.fits(n, p, state.need.total)]
            if fits:
                seen = self.replicas["E0"].picture(fits[0], exclude_uid=uid)
                taken = sorted(seen.taken) if seen is not None else "unknown node"
                need_mig = {m.resource: m.total for m in state.need.mig}
                free_mig = "".join(
                    f", {self.free_instances(fits[0], r)} free {r}" for r in sorted(need_mig)
                )
                self.violate(
                    "L1",
                    f"{state.key} (needs {state.need.total} GPUs, MIG {need_mig}) is still "
                    f"pending after settling although {fits[0]} has {self.free_on(fits[0])} free "
                    f"GPUs{free_mig} (E0's filter counts {taken} taken)",
                )
        for uid, pod in self.live_pods().items():
            node = pod["spec"].get("nodeName")
            if node and pod.get("status", {}).get("phase", "Pending") == "Pending":
                self.violate("L1", f"{self.key_of(uid)} is bound to {node} but never admitted")
        for node, lease in sorted(self.store.leases.items()):
            record = FMT.parse(lease)
            if record.holder is None:
                continue
            obj = self.store.pod_or_none(record.holder.key)
            held = pod_state(obj, keys=KEYS, resource=RESOURCE) if obj is not None else None
            if not judge(held, holder_uid=record.holder.uid, node=node, fresh=True).allowed:
                self.violate(
                    "L1", f"lock of {node} held by {record.holder.key} is stuck after settling"
                )

    def teardown(self) -> None:
        if self.started and not self.broken:
            self.settle()


def _memory(claim: Slice) -> int:
    return claim.memory_on(_A_GPU)


def _bigger(a: Slice, b: Slice) -> bool:
    return (a.exclusive, _memory(a), a.cores) > (b.exclusive, _memory(b), b.cores)


SWEEP_HOLES = frozenset(
    {
        Hole.SWEEP_IN_HANDOFF,
        Hole.SWEEP_BOUND_HERE,
        Hole.ENDED_UNSEEN,
        Hole.REJECTED_RELEASED_UNSERVED,
    }
)


class SweepingModel(HandoffModel):
    """The model with the extender's sweep of locks left behind (``Binder.sweep``: those whose
    holder is bound elsewhere, and expired ones whose holder left the handoff) as one more
    action.  A class of its own, so that a search that avoids both ``SWEEP_HOLES`` draws the
    same interleavings from its seed as it did before the sweep existed (a rule that is never
    enabled still changes Hypothesis's draws)."""

    @precondition(lambda self: self.started)
    @rule(replica=st.sampled_from(REPLICAS))
    def extender_sweeps(self, replica: str) -> None:
        """One pass of ``Binder.sweep``: locks whose holder is bound elsewhere, then expired
        locks whose holder left the handoff."""
        self.begin_step()
        done = self.replicas[replica].sweep()
        if done:
            self.log(replica, "sweep: " + "; ".join(done))


class EndedModel(SweepingModel):
    """The sweeping model with the device plugin's release of a holder that ended
    (``Admission.release_ended``, issue 52) as one more action: in production it runs on every
    change of the node's pod watch or Lease watch; here the search places it anywhere.  A class
    of its own, so that the searches of ``SWEEP_IN_HANDOFF`` and ``SWEEP_BOUND_HERE`` draw the
    interleavings they were tuned on."""

    @precondition(lambda self: self.started)
    @rule(node=st.integers(0, 1))
    def plugin_releases_ended(self, node: int) -> None:
        """One look of a device plugin at its lock's holder: released at once if it ended."""
        self.begin_step()
        n = self.nodes[node % len(self.nodes)]
        done = self.plugins[n].release_ended()
        if done:
            self.log(f"plugin/{n}", done)


class BrakeModel(EndedModel):
    """The model with the device plugin's release of a holder that ended, and a plugin that
    stops serving (kubelet has none of its devices: a pod it admits is rejected,
    ``kubelet_rejects``) and serves again: the brake of decision 0012, checked by R1.  A class
    of its own for the same reason as ``EndedModel``."""

    @precondition(lambda self: self.started)
    @rule(node=st.integers(0, 1), serving=st.booleans())
    def plugin_serving(self, node: int, serving: bool) -> None:
        """The node's plugin stops serving (its ListAndWatch stream closed: a kubelet restart,
        the plugin down), or serves again (its devices sent)."""
        self.begin_step()
        n = self.nodes[node % len(self.nodes)]
        self.plugins[n].serving = serving
        if serving:
            self.log(f"plugin/{n}", "serves: ListAndWatch sent kubelet the devices")
        else:
            self.fault(f"plugin/{n}", "not serving: kubelet has none of its devices")


MAX_STATIC_PODS = 2
STATIC_NAMESPACE = "kube-system"


class StaticPodModel(HandoffModel):
    """The model with static pods (issue 51): a manifest written to a node kubelet's
    ``staticPodPath`` is a pod kubelet admits that the API server does not know (no mirror
    pod), admitted first after a kubelet restart (``Kubelet.start``); a kubelet restart after
    which its PodResources ``List`` fails for a while (the channel the review traced); and the
    plugin's ``List`` between calls, which times the listed pods the API server does not know
    (``Plugin.sight``).  Static pods are written only on nodes whose plugin has kubelet's
    socket: without one the plugin cannot see them (docs/deviceplugin.md, "Limits").  A class
    of its own, so that a search avoiding ``Hole.STATIC_POD_FALLBACK`` draws the interleavings
    it was tuned on."""

    def __init__(self) -> None:
        super().__init__()
        self.statics = 0

    def static_nodes(self) -> list[NodeName]:
        return [n for n in self.nodes if n not in self.config.socketless]

    @precondition(
        lambda self: self.started and self.statics < MAX_STATIC_PODS and bool(self.static_nodes())
    )
    @rule(node=st.integers(0, 1), template=st.integers(0, 3))
    def static_pod_written(self, node: int, template: int) -> None:
        """A static pod's manifest is written on a node: kubelet admits it (its own batch);
        no lock names it, so it must get no device.  Its own refusal is expected (L1 skips
        it); where kubelet lists rejected pods (``Listing.ALL_PODS``) it is listed, unknown to
        the API server, and holders are refused for ``UNKNOWN_POD_WAIT_S`` after (excused)."""
        self.begin_step()
        nodes = self.static_nodes()
        n = nodes[node % len(nodes)]
        shapes = [
            t
            for t in self.config.templates
            if t not in SLICE_TEMPLATES and (t not in MIG_TEMPLATES or self.has_mig(n))
        ]
        if not shapes:
            return
        self.statics += 1
        shape = shapes[template % len(shapes)]
        name = f"static-{self.statics}"
        pod = pod_object(name, shape, node=n)
        pod["metadata"]["namespace"] = STATIC_NAMESPACE
        pod["metadata"]["uid"] = f"uid-{name}-{n}"
        self.kubelets[n].add_static(pod)
        self.bypass.add(pod["metadata"]["uid"])
        text = f"static pod {STATIC_NAMESPACE}/{name} ({shape}) written to staticPodPath"
        if self.listing is Listing.ALL_PODS:
            self.fault(f"kubelet/{n}", f"{text}; List keeps it once rejected")
        else:
            self.log(f"kubelet/{n}", text)

    @precondition(lambda self: self.started and self.may(Fault.PODRESOURCES_DOWN))
    @rule(node=st.integers(0, 1))
    def kubelet_restarts_list_failing(self, node: int) -> None:
        """kubelet restarts, and the plugin's PodResources ``List`` fails from then on for a
        while (a channel that cannot connect to the new kubelet yet), until
        ``podresources_fails`` or settling brings it back: the static pods are admitted first."""
        self.begin_step()
        n = self.nodes[node % len(self.nodes)]
        kubelet = self.kubelets[n]
        kubelet.start()
        kubelet.podresources_down = True
        self.fault(
            f"kubelet/{n}",
            "restart: relisted its pods, static pods first; PodResources List fails"
            + (" (no socket)" if kubelet.socketless else ""),
            excuses_refusals=not kubelet.socketless,
        )

    @precondition(lambda self: self.started)
    @rule(node=st.integers(0, 1))
    def plugin_sights(self, node: int) -> None:
        """The plugin's ``List`` between calls (``Admission.run_sightings``, every second)."""
        self.begin_step()
        n = self.nodes[node % len(self.nodes)]
        self.log(f"plugin/{n}", self.plugins[n].sight())


def machine(config: ModelConfig, name: str) -> type[HandoffModel]:
    """A ``HandoffModel`` class for ``config`` with its own ``Stats``; with the sweep unless
    the config avoids all of its holes (``SWEEP_HOLES``); with a plugin that stops serving and
    serves again (``BrakeModel``) where the config asks for it and does not avoid
    ``Hole.REJECTED_RELEASED_UNSERVED``; else with the plugin's release of a holder that ended
    where the config asks for it and does not avoid ``Hole.ENDED_UNSEEN``; and with static pods
    unless it avoids ``Hole.STATIC_POD_FALLBACK``."""
    base: type[HandoffModel]
    if config.avoid >= SWEEP_HOLES:
        base = HandoffModel
    elif config.plugin_stops_serving and Hole.REJECTED_RELEASED_UNSERVED not in config.avoid:
        base = BrakeModel
    elif Hole.ENDED_UNSEEN in config.avoid or not config.plugin_releases_ended:
        base = SweepingModel
    else:
        base = EndedModel
    bases = (base,) if Hole.STATIC_POD_FALLBACK in config.avoid else (StaticPodModel, base)
    return type(name, bases, {"config": config, "stats": Stats()})


def with_settings(cls: type[HandoffModel], **kwargs: Any) -> type[HandoffModel]:
    cls.TestCase.settings = settings(**kwargs)
    return cls
