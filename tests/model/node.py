"""One GPU node: the device plugin's admission steps and a kubelet that drives them.

``Plugin`` replays ``deviceplugin.admission.Admission`` around the project's decisions
(``check_request``, ``kubelet_admitting``, ``decide_allocate``, ``decide_preferred``,
``handoff_abandoned``, the ``Checkpoint`` value type), called through ``deviceplugin.decide`` so
that a planted bug (``holes.PLANTS``) reaches them. GLUE (replicated, since ``Admission`` reads
the API server between decisions): Allocate reads kubelet's PodResources List and kubelet's
device checkpoint afresh, the holder pod and the listed pods' specs from the node pod watch (else
a GET), the Lease from its watch, and decides again with a fresh Lease GET (and fresh GETs of
the listed pods that count) whenever that refuses; when List fails, it decides from one GET of
the holder and one LIST of the node's pods; GetPreferredAllocation tries the watch-fed views
first (the Lease watch, the node pod watch's copy of the holder, else the pod read for the same
holder and token before), then fresh reads; a ``TAKEN_OVER`` refusal reads the interrupted pod
and drops its progress; serving writes the checkpoint before answering and then releases after
the last container; a refusal that names a lock releases it ``rejected``; a release that fails
stays pending in the checkpoint and is retried; a finished release is dropped from the
checkpoint in memory only, the file gets it with the next write, and a restart reads the file.
GLUE (``deviceplugin.sharing.SharingServicer``): on a sharing node kubelet's virtual IDs are
folded to their GPUs before the decisions (``physical_request``, ``fold``) and
GetPreferredAllocation's answer is mapped back to one of kubelet's virtual IDs per GPU
(``virtual_choice``).  GLUE (``Admission._context``): on a MIG
node every call is decided for the resource of the endpoint kubelet called, that resource's
devices in the ``Context`` and the other resources' in ``others``; kubelet's List and
checkpoint are read for that resource.

``Kubelet`` is the part of kubelet that the handoff depends on (docs/model.md, "kubelet", names
the source of each fact): pods admitted one at a time, batches in arrival order and each batch
by creation time; its PodResources List per ``Listing`` (all pods in its pod manager, or active
ones only); per GPU container: devices of earlier init containers reused first in *arbitrary*
order with no GetPreferredAllocation call (one reuse pool per resource), then
GetPreferredAllocation over the free devices, its answer taken where available, the rest from
the free devices; Allocate, one per resource of a container, its resources in an order the
search picks; any refusal fails the pod (UnexpectedAdmissionError) and frees its devices;
rejection by another admit handler,
before or after Allocate; its device checkpoint, written after each answer, kept across a
restart unless the restart lost its last record, and then Allocate again at re-admission or
from the pod worker. Not modelled: container start and runtime, probes, eviction,
NUMA/topology alignment, sidecar init containers, DRA.  Static pods: a manifest in its
``staticPodPath`` (``add_static``), a pod the API server does not know, admitted first after a
restart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from deviceplugin import decide
from deviceplugin.checkpoint import Checkpoint, PendingRelease
from deviceplugin.decide import (
    Allocation,
    Context,
    KubeletAdmission,
    MismatchPolicy,
    PodJSON,
    Preference,
    Refusal,
    RefusalKind,
    gpu_containers,
)
from deviceplugin.kubeletview import KubeletViewError
from deviceplugin.sharing import fold, physical_request, virtual_choice
from handoff import holder as handoff_holder
from handoff.audit import KubeletPod
from handoff.wire import ContainerName, DeviceID
from kube.errors import ApiUnavailable
from lockd.errors import LockLost, StaleToken
from lockd.model import FencingToken, HeldLock, Holder, HolderKey, NodeLockView, NodeName, Outcome
from tests.model.locks import Clock, LockClient
from tests.model.world import (
    JSON,
    KEYS,
    MIG_RESOURCES,
    RESOURCE,
    Event,
    Kind,
    Store,
    Watch,
    gpu_id,
    kubelet_ids,
    mig_instances,
)

# what kubelet keeps per container and resource: (container, resource)
Slot = tuple[ContainerName, str]


def slot_text(slot: Slot) -> str:
    """A slot for traces: the container, with its resource when not whole GPUs."""
    container, resource = slot
    return container if resource == RESOURCE else f"{container}[{resource.rsplit('-', 1)[1]}]"


class PluginCrashed(Exception):
    """The plugin died after writing its checkpoint, before kubelet got the answer."""


@dataclass
class Plugin:
    """The device plugin of one node: its Lease view, its checkpoint, its pod cache."""

    node: NodeName
    store: Store
    clock: Clock
    skew: float
    gpus: int
    split: int = 1  # > 1: a sharing node; kubelet's IDs are virtual (``deviceplugin.sharing``)
    mig: bool = False  # a MIG node: one more GPU, in MIG mode (``world.mig_instances``)
    cp: Checkpoint = field(init=False)  # the plugin's checkpoint, in memory
    saved: Checkpoint = field(init=False)  # what its file holds: a restart reads this
    locks: LockClient = field(init=False)
    leases: Watch = field(init=False)
    pods: Watch = field(init=False)
    # the node pod watch (``deviceplugin.podwatch.NodePods``): key -> pod bound here, as seen
    bound: dict[str, JSON] = field(default_factory=dict)
    # UIDs the pod watch saw deleted (``NodePods.gone``), and of those, the ones last seen
    # Failed (``NodePods.gone_failed``)
    gone: set[str] = field(default_factory=set)
    gone_failed: set[str] = field(default_factory=set)
    # ``DevicePlugin.serving``: its ListAndWatch has sent kubelet the devices (a restart starts
    # serving at once here; ``BrakeModel`` turns it off and on)
    serving: bool = True
    pod_cache: tuple[tuple[HolderKey, str, FencingToken], PodJSON] | None = None
    crash_after_checkpoint: bool = False  # a fault armed for the next serve
    # kubelet's PodResources List on this node, with the devices of one resource
    kubelet_view: Callable[[str], list[KubeletPod]] = lambda _resource: []
    # kubelet's device checkpoint on this node: pod UID -> containers it records devices of one
    # resource for
    kubelet_records: Callable[[str], dict[str, set[str]]] = lambda _resource: {}
    # whether kubelet's PodResources socket is there (``PodResources.exists``)
    kubelet_socket: Callable[[], bool] = lambda: True
    # ``Admission._unknown_since``: listed pods the API server does not know, first seen when
    unknown_since: dict[str, float] = field(default_factory=dict)
    # which kubelet answers List now (``Kubelet.instance``: its socket file), and the one
    # ``unknown_since`` was timed on (``Admission._unknown_instance``)
    kubelet_instance: Callable[[], int] = lambda: 0
    unknown_instance: int = 0

    def __post_init__(self) -> None:
        self.write(Checkpoint(self.node))
        node = self.node
        self.leases = Watch(self.store, frozenset({Kind.LEASE}), only=lambda e: e.name == node)
        self.pods = Watch(
            self.store,
            frozenset({Kind.POD}),
            only=lambda e: e.obj.get("spec", {}).get("nodeName") == node,
        )
        self.start()

    def start(self) -> None:
        """(Re)start: the checkpoint file is read, everything else is new."""
        self.cp = self.saved
        self.locks = LockClient(self.store, self.clock, name=f"plugin/{self.node}", skew=self.skew)
        self.locks.relist(only=self.node)
        self.leases.restart()
        self.bound = {
            f"{p['metadata']['namespace']}/{p['metadata']['name']}": p
            for p in self.store.list_pods(node=self.node)
        }
        self.pods.restart()
        self.gone = set()
        self.gone_failed = set()
        self.serving = True
        self.pod_cache = None
        self.unknown_since = {}
        self.unknown_instance = 0
        self.crash_after_checkpoint = False

    def write(self, cp: Checkpoint) -> None:
        """Write the checkpoint file (``Admission._save``) and adopt it."""
        self.cp = cp
        self.saved = cp

    def deliver(self, limit: int | None) -> int:
        n = 0
        for event in self.leases.deliver(limit):
            self.locks.take_event(event)
            n += 1
        return n

    def deliver_pods(self, limit: int | None) -> int:
        """The node pod watch (``NodePods._apply``): in order, late."""
        n = 0
        for event in self.pods.deliver(limit):
            if event.type == "DELETED":
                last = self.bound.pop(event.name, None)
                uid = event.obj["metadata"]["uid"]
                self.gone.add(uid)
                if any(
                    (p or {}).get("status", {}).get("phase") == "Failed" for p in (last, event.obj)
                ):
                    self.gone_failed.add(uid)
            else:
                self.bound[event.name] = event.obj
            n += 1
        return n

    def context(self, resource: str = RESOURCE) -> Context:
        """``Admission._context``: the devices of ``resource`` and the other resources' devices
        (a MIG node's instances, or its whole GPUs for a MIG resource's call)."""
        every = {gpu_id(self.node, i): RESOURCE for i in range(self.gpus)}
        if self.mig:
            every.update({g.id: g.resource for g in mig_instances(self.node, self.gpus)})
        devices = {d: True for d, r in every.items() if r == resource}
        others = {d: r for d, r in every.items() if r != resource}
        return Context(node=self.node, devices=devices, resource=resource, keys=KEYS, others=others)

    # -- reads -------------------------------------------------------------------------------

    def _view(self, *, fresh: bool) -> NodeLockView | None:
        return self.locks.inspect(self.node) if fresh else self.locks.view(self.node)

    def _pod(self, key: HolderKey) -> PodJSON | None:
        namespace, _, name = key.partition("/")
        if not namespace or not name:
            return None
        return self.store.pod_or_none(key)

    def _holder_pod(self, view: NodeLockView | None, *, fresh: bool) -> PodJSON | None:
        if view is None or view.record.holder is None:
            return None
        holder = view.record.holder
        if not fresh:
            watched = self.bound.get(holder.key)
            if watched is not None and watched["metadata"]["uid"] == holder.uid:
                return watched
        key = (holder.key, holder.uid, view.record.token)
        if not fresh and self.pod_cache is not None and self.pod_cache[0] == key:
            return self.pod_cache[1]
        pod = self._pod(holder.key)
        if pod is not None:
            self.pod_cache = (key, pod)
        return pod

    # -- GetPreferredAllocation ----------------------------------------------------------------

    def preferred(
        self,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        resource: str = RESOURCE,
    ) -> Preference:
        """``GetPreferredAllocation`` on ``resource``'s endpoint; on a sharing node kubelet's
        virtual IDs are folded to their GPUs and the answer is one of kubelet's virtual IDs of
        each GPU chosen (``SharingServicer``: ``fold`` and ``virtual_choice``)."""
        if self.split <= 1 or resource != RESOURCE:
            return self._preferred(available, must_include, size, resource)
        pref = self._preferred(fold(available), fold(must_include), size, resource)
        return Preference(
            tuple(virtual_choice(pref.devices, available, must_include)), pref.hit, pref.reason
        )

    def _preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int, resource: str
    ) -> Preference:
        ctx = self.context(resource)
        pref = Preference((), hit=False)
        for fresh in (False, True):
            view = self._view(fresh=fresh)
            if fresh:
                self._drop_abandoned_progress(view)
            pod, kubelet, bound_here, recorded = self._who_admits(view, ctx, fresh=fresh)
            pref = decide.decide_preferred(
                view,
                pod,
                available,
                must_include,
                size,
                self.cp.progress,
                ctx,
                recorded=recorded,
                kubelet=kubelet,
                bound_here=bound_here,
            )
            if pref.hit:
                break
        return pref

    def _drop_abandoned_progress(self, view: NodeLockView | None) -> None:
        old = self.cp.progress
        if old is None or view is None:
            return
        holder = view.record.holder
        if holder is not None and holder.key == old.holder and view.record.token == old.token:
            return
        if decide.handoff_abandoned(self._pod(old.holder), old, self.node):
            self.write(self.cp.with_progress(None))

    # -- Allocate ------------------------------------------------------------------------------

    def allocate(self, ids: Sequence[str], resource: str = RESOURCE) -> Allocation | Refusal:
        """``Allocate`` on ``resource``'s endpoint (``Admission.allocate(resource=...)``)."""
        if self.split > 1 and resource == RESOURCE:  # ``SharingServicer``: virtual IDs folded
            physical = physical_request([ids])
            if isinstance(physical, Refusal):
                return physical
            ids = physical[0]
        ctx = self.context(resource)
        checked = decide.check_request([ids], ctx)
        if isinstance(checked, Refusal):
            return checked
        result = self._decide(checked, ctx, fresh_lease=False)
        if isinstance(result, Refusal):
            result = self._decide(checked, ctx, fresh_lease=True)
        if isinstance(result, Refusal) and result.kind is RefusalKind.TAKEN_OVER:
            result = self._interrupted(checked, ctx, result)
        if isinstance(result, Refusal):
            if result.release is not None:
                self._reject(result.release)
            return result
        return self._serve(result)

    def _decide(
        self, ids: Sequence[DeviceID], ctx: Context, *, fresh_lease: bool
    ) -> Allocation | Refusal:
        view = self._view(fresh=fresh_lease)
        holder = view.record.holder if view is not None else None
        pod, kubelet, bound_here, recorded = self._who_admits(view, ctx, fresh=fresh_lease)
        held_other = self._held_other(ctx.resource, holder)
        return decide.decide_allocate(
            view,
            pod,
            ids,
            self.cp.progress,
            ctx,
            policy=MismatchPolicy.REFUSE,
            bound_here=bound_here,
            served_pods=self._served(),
            kubelet=kubelet,
            recorded=recorded,
            held_other=held_other,
        )

    def _who_admits(
        self, view: NodeLockView | None, ctx: Context, *, fresh: bool
    ) -> tuple[
        PodJSON | None,
        KubeletAdmission | decide.KubeletUnreadable | None,
        Sequence[PodJSON],
        dict[str, set[str]],
    ]:
        """``Admission._who_admits``: the holder's pod and who kubelet may be admitting, the
        same reads for Allocate and GetPreferredAllocation.  kubelet's List, with the listed
        pods' specs from the node pod watch (else a GET); a List that fails on kubelet's socket
        is ``KubeletUnreadable``, which refuses; without a socket (``Kubelet.socketless``), one GET
        of the holder and one LIST of the node's pods.  On that
        path the model also reads the node's pods (production does not: the rule ignores them),
        so that a planted revert of the rule (``Hole.STATIC_POD_FALLBACK``) decides by them as
        the old fallback did."""
        holder = view.record.holder if view is not None else None
        recorded = self.kubelet_records(ctx.resource)
        try:
            listed = self.kubelet_view(ctx.resource)
        except KubeletViewError as exc:
            # no socket: one GET of the holder and one LIST of the pods bound here
            unreadable = decide.KubeletUnreadable(str(exc)) if self.kubelet_socket() else None
            pod = self._holder_pod(view, fresh=True)
            return pod, unreadable, self.store.list_pods(node=self.node), recorded
        # the second try (``fresh``) reads the holder afresh too: a copy read for another pod's
        # call may be from before its binding landed
        pod = self._holder_pod(view, fresh=fresh)
        if holder is None:
            return pod, None, (), recorded
        specs = {
            e.key: self.bound.get(e.key) or self._pod(HolderKey(e.key))
            for e in listed
            if e.key != holder.key
        }
        kubelet = self._admitting(listed, specs, holder.key, pod, recorded, ctx)
        if fresh and kubelet.others:
            # the pods that count are read afresh before the call is refused for them
            for key in kubelet.others:
                name = key.split(" ", 1)[0]
                if specs.get(name) is not None:
                    specs[name] = self._pod(HolderKey(name))
            kubelet = self._admitting(listed, specs, holder.key, pod, recorded, ctx)
        return pod, kubelet, (), recorded

    def _held_other(self, resource: str, holder: Holder | None) -> dict[str, set[str]] | None:
        """``Admission._held_other``: for each other resource the holder's progress has served
        containers of, the holder's containers kubelet's List or checkpoint holds devices of it
        for; None when there is none or the List fails."""
        progress = self.cp.progress
        if progress is None or holder is None or progress.uid != holder.uid:
            return None
        others = {progress.resource_at(i) for i in range(len(progress.served))} - {resource}
        if not others:
            return None
        out: dict[str, set[str]] = {}
        for other in sorted(others):
            try:
                listed = self.kubelet_view(other)
            except KubeletViewError:
                return None
            held = {
                c for e in listed if e.key == holder.key for c, ids in e.containers.items() if ids
            }
            out[other] = held | set(self.kubelet_records(other).get(holder.uid, ()))
        return out

    def _admitting(
        self,
        listed: Sequence[KubeletPod],
        specs: Mapping[str, PodJSON | None],
        holder: HolderKey,
        held: PodJSON | None,
        recorded: Mapping[str, set[str]],
        ctx: Context,
    ) -> KubeletAdmission:
        """``Admission._admitting``: how long each listed pod unknown to the API server has
        been seen listed, from the first List that showed it."""
        unknown = {e.key for e in listed if e.key != holder and specs.get(e.key) is None}
        ages = self._time_unknown(unknown)
        return decide.kubelet_admitting(
            listed,
            specs,
            holder,
            self._served(),
            ctx,
            holder_pod=held,
            recorded=recorded,
            unknown_for_s=ages,
        )

    def _time_unknown(self, unknown: set[str]) -> dict[str, float]:
        """``Admission._time_unknown``: how long each listed pod unknown to the API server has
        been listed by the kubelet that answers now; another kubelet starts them anew."""
        instance = self.kubelet_instance()
        same = instance == self.unknown_instance
        self.unknown_instance = instance
        self.unknown_since, ages = decide.unknown_listed(
            self.unknown_since, unknown, self.clock.now, same_kubelet=same
        )
        return ages

    def sight(self) -> str:
        """``Admission.run_sightings``: kubelet's List between calls (every second), which times
        the listed pods the API server does not know (``_sight``)."""
        try:
            listed = self.kubelet_view(RESOURCE)
        except KubeletViewError as exc:
            return f"List between calls: {exc}"
        # production times the listed pods its node pod watch does not have (``_sight``)
        unknown = {e.key for e in listed if e.key not in self.bound}
        ages = self._time_unknown(unknown)
        shown = ", ".join(f"{k} {a:.0f}s" for k, a in sorted(ages.items())) or "none"
        return f"List between calls: {len(listed)} pods; unknown to the API server: {shown}"

    def _served(self) -> set[str]:
        """``Admission._served``: pods this plugin served (their statuses may lag)."""
        uids = set(self.cp.served_pods)
        uids.update(p.uid for p in self.cp.pending)
        if self.cp.progress is not None:
            uids.add(self.cp.progress.uid)
        return uids

    def _interrupted(
        self, ids: Sequence[DeviceID], ctx: Context, refusal: Refusal
    ) -> Allocation | Refusal:
        old = self.cp.progress
        assert old is not None
        pod = self._pod(old.holder)
        self.write(self.cp.with_progress(None))
        if decide.handoff_abandoned(pod, old, self.node):
            return self._decide(ids, ctx, fresh_lease=True)
        return refusal

    def _serve(self, alloc: Allocation) -> Allocation:
        cp = self.cp.with_progress(None if alloc.last else alloc.progress)
        cp = cp.with_served(alloc.holder.uid)
        pending = None
        if alloc.last:
            pending = PendingRelease.of(alloc.holder, alloc.token, Outcome.ALLOCATED)
            cp = cp.with_pending(pending)
        self.write(cp)  # before kubelet gets the answer
        if self.crash_after_checkpoint:
            self.crash_after_checkpoint = False
            raise PluginCrashed(f"plugin/{self.node} crashed after checkpointing {alloc.container}")
        if pending is not None:
            self.release(pending)
        return alloc

    def _reject(
        self, release: tuple[Holder, FencingToken], outcome: Outcome = Outcome.REJECTED
    ) -> str:
        holder, token = release
        pending = PendingRelease.of(holder, token, outcome)
        cp = self.cp.with_pending(pending)
        if cp.progress is not None and cp.progress.token == token:
            cp = cp.with_progress(None)
        self.write(cp)
        return self.release(pending)

    def release_ended(self) -> str:
        """GLUE ``Admission.release_ended``: ``decide.holder_ended`` on the watched Lease and the
        node pod watch (the holder's pod as last seen, and whether its deletion was seen); a
        holder that ended gets its lock released at once, recorded as pending first — a
        rejected one only while the plugin serves (``handoff.holder.released_by_plugin``).
        What happened ("" when nothing ended)."""
        view = self.locks.view(self.node)
        holder = view.record.holder if view is not None else None
        found = decide.holder_ended(
            view,
            None if holder is None else self.bound.get(holder.key),
            seen_gone=holder is not None and holder.uid in self.gone,
            failed_before_gone=holder is not None and holder.uid in self.gone_failed,
            pending_tokens={p.token for p in self.cp.pending},
        )
        if found is None:
            return ""
        if not handoff_holder.released_by_plugin(found.end, serving=self.serving):
            return f"holder {found.holder.key} ended ({found.end.outcome.value}): not serving"
        done = self._reject((found.holder, found.token), found.end.outcome)
        return f"holder {found.holder.key} ended ({found.end.why}): {done}"

    def release(self, pending: PendingRelease) -> str:
        lock = HeldLock(self.node, Holder(pending.holder, pending.uid), pending.token, "")
        try:
            self.locks.release(lock, outcome=pending.outcome)
            result = f"released token {pending.token} {pending.outcome.value}"
        except (StaleToken, LockLost) as exc:
            result = f"token {pending.token} needs no release ({type(exc).__name__})"
        except ApiUnavailable:
            return f"release of token {pending.token} failed; kept pending"
        self.cp = self.cp.without_pending(pending.token)  # in memory: the next write carries it
        return result

    def retry_releases(self) -> list[str]:
        return [self.release(p) for p in list(self.cp.pending)]


class Listing(StrEnum):
    """What kubelet's PodResources ``List`` returns.

    Source: ``pkg/kubelet/apis/podresources/server_v1.go`` (``List``).

    ``ALL_PODS``: every pod in kubelet's pod manager, rejected and finished pods included, until
    the pod is deleted from the API server; their containers are listed with no devices once
    kubelet freed them.  Kubernetes 1.31-1.33, and 1.34+ with the feature gate
    ``KubeletPodResourcesListUseActivePods`` off.  ``ACTIVE_PODS``: only active pods (not
    rejected, not finished): 1.34+ with that gate on (its default there).
    """

    ALL_PODS = "all-pods"
    ACTIVE_PODS = "active-pods"


@dataclass
class Kubelet:
    """kubelet's device manager for one node, driving the plugin (see the module docstring)."""

    node: NodeName
    store: Store
    gpus: int
    listing_mode: Listing = Listing.ACTIVE_PODS
    split: int = 1  # > 1: kubelet sees ``split`` virtual devices per GPU
    mig: bool = False  # a MIG node: one more GPU, in MIG mode, one resource per profile
    pods: Watch = field(init=False)
    seen: dict[str, JSON] = field(default_factory=dict)  # uid -> pod as kubelet last saw it
    # the admission queue: uids in arrival order, each arriving batch sorted by creation
    # (``HandlePodAdditions`` sorts the pods of one update by creation time, pkg/kubelet/kubelet.go)
    order: list[str] = field(default_factory=list)
    # per pod UID and (container, resource): the devices kubelet chose, those the plugin's answer
    # named, and the pod whose handoff the answer served
    allocated: dict[str, dict[Slot, tuple[DeviceID, ...]]] = field(default_factory=dict)
    given: dict[str, dict[Slot, tuple[DeviceID, ...]]] = field(default_factory=dict)
    served_holder: dict[str, dict[Slot, str]] = field(default_factory=dict)
    admitted: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)  # uid -> why admission failed
    finished: set[str] = field(default_factory=set)  # uids whose containers all exited
    current: str | None = None
    # the last container whose Allocate was answered: kubelet writes its device checkpoint
    # after the plugin's answer, so a crash just then loses this record
    last_record: tuple[str, Slot] | None = None
    # PodResources List fails (kubelet starting, a channel that cannot connect)
    podresources_down: bool = False
    # while it fails, the plugin finds no socket (not mounted) rather than one that errors
    socketless: bool = False
    # answers that released the lock ``allocated`` while a container of the pod still awaited
    # devices of some resource (S2 reads them)
    early_releases: list[str] = field(default_factory=list)
    # a lost record is only ever one that completed its pod's GPU containers (``_losable``)
    lose_only_final: bool = False
    # a lost record is never one of a container that asks for several resources
    # (``_losable``; a search avoiding ``Hole.MIG_PROGRESS_AHEAD``)
    keep_multi_resource: bool = False
    # static pods (manifests in its ``staticPodPath``): uid -> pod; the API server knows none of
    # them (no mirror pod: the chart's policy denies it, or it is not written yet)
    static: dict[str, JSON] = field(default_factory=dict)
    # which kubelet process this is, counted up at every start: a new one makes a new
    # PodResources socket file, which the plugin tells apart (``socket_identity``)
    instance: int = 0

    def __post_init__(self) -> None:
        node = self.node
        self.pods = Watch(
            self.store,
            frozenset({Kind.POD}),
            only=lambda e: e.obj.get("spec", {}).get("nodeName") == node,
        )
        self.start()

    @property
    def resources(self) -> tuple[str, ...]:
        """The device plugin resources registered here (one endpoint each)."""
        return (RESOURCE, *MIG_RESOURCES) if self.mig else (RESOURCE,)

    def healthy(self, resource: str) -> list[DeviceID]:
        """The devices kubelet sees for ``resource``: the GPUs (or their virtual devices), or
        the instances of one MIG profile."""
        if resource == RESOURCE:
            return kubelet_ids(self.node, self.gpus, self.split)
        if not self.mig:
            return []
        return [g.id for g in mig_instances(self.node, self.gpus) if g.resource == resource]

    def slots(self, pod: JSON) -> list[tuple[Slot, int]]:
        """What kubelet allocates for ``pod``, in its order: containers init first, each in
        spec order (``gpu_containers``); a container's resources as one group, walked in no
        fixed order (``step`` lets the search pick)."""
        counts: dict[Slot, int] = {}
        for resource in (RESOURCE, *MIG_RESOURCES):
            for container, n in gpu_containers(pod, resource):
                counts[(container, resource)] = n
        spec = pod["spec"]
        order = [c["name"] for c in spec.get("initContainers") or []] + [
            c["name"] for c in spec["containers"]
        ]
        return sorted(counts.items(), key=lambda sn: (order.index(sn[0][0]), sn[0][1]))

    def start(self, *, lose_last_record: bool = False) -> None:
        """(Re)start: LIST the node's pods (one batch); device accounting is kept (kubelet's
        checkpoint), except, with ``lose_last_record``, the record of the last Allocate
        answered (the crash came before kubelet wrote its checkpoint)."""
        self.instance += 1
        listed = {p["metadata"]["uid"]: p for p in self.store.list_pods(node=self.node)}
        self.seen = {**self.static, **listed}
        self.order = []
        # the static pods first: kubelet's file source reads its staticPodPath at once, its API
        # server source waits for the node informer to sync (``makePodSourceConfig``,
        # ``config.NewSourceFile``, ``config.NewSourceApiserver``: pkg/kubelet/kubelet.go
        # v1.31.9 lines 304, 315, v1.37.2 lines 390, 401; pkg/kubelet/config/apiserver.go).  A
        # static pod this kubelet's predecessor rejected is admitted again: its status lived in
        # that process's memory only (no mirror pod)
        for uid in self.static:
            self.failed.pop(uid, None)
        self._arrive(list(self.static))
        self._arrive(list(listed))
        self.pods.restart()
        self.current = None
        if lose_last_record and self.last_record is not None and self._losable():
            uid, slot = self.last_record
            self.allocated.get(uid, {}).pop(slot, None)
            self.given.get(uid, {}).pop(slot, None)
            self.served_holder.get(uid, {}).pop(slot, None)
        self.last_record = None
        for uid in list(self.allocated):
            if uid not in self.seen:
                self._free(uid)

    def _losable(self) -> bool:
        """Whether the last record may be lost: with ``lose_only_final`` (a search avoiding
        ``Hole.PROGRESS_AHEAD_OF_KUBELET``) only when it completed its pod's GPU containers;
        with ``keep_multi_resource`` (avoiding ``Hole.MIG_PROGRESS_AHEAD``) never one of a
        container that asks for several resources."""
        if self.last_record is None:
            return True
        uid, (container, _) = self.last_record
        pod = self.seen.get(uid) or self.store.pod_by_uid(uid)
        if pod is None:
            return True
        if self.keep_multi_resource and sum(s[0] == container for s, _ in self.slots(pod)) > 1:
            return False
        if not self.lose_only_final:
            return True
        mine = self.allocated.get(uid, {})
        return all(slot in mine for slot, _ in self.slots(pod))

    def _arrive(self, uids: list[str]) -> None:
        """A batch of pods arrives: queued after the earlier batches, sorted by creation."""
        fresh = [u for u in uids if u not in self.order]
        self.order.extend(sorted(fresh, key=lambda u: self.store.created.get(u, 0)))

    def add_static(self, pod: JSON) -> None:
        """A static pod's manifest appears in kubelet's ``staticPodPath``: a batch of its own
        from the file source."""
        uid = pod["metadata"]["uid"]
        self.static[uid] = pod
        self.seen[uid] = pod
        self._arrive([uid])

    def _status(self, key: str, uid: str, status: JSON) -> None:
        """kubelet's status manager: the pod's status written to the API server (none for a
        static pod without a mirror pod)."""
        if uid not in self.static:
            self.store.write_pod_status(key, uid, status)

    def deliver(self, limit: int | None) -> int:
        n = 0
        batch: list[str] = []
        for event in self.pods.deliver(limit):
            self._take(event)
            if event.type != "DELETED":
                batch.append(event.obj["metadata"]["uid"])
            n += 1
        self._arrive(batch)
        return n

    def _take(self, event: Event) -> None:
        uid = event.obj["metadata"]["uid"]
        if event.type == "DELETED":
            self.seen.pop(uid, None)
            self._free(uid)
            if uid in self.order:
                self.order.remove(uid)
            if self.current == uid:
                self.current = None
        else:
            self.seen[uid] = event.obj

    def _free(self, uid: str) -> None:
        self.allocated.pop(uid, None)
        self.given.pop(uid, None)
        self.served_holder.pop(uid, None)

    def next_pod(self) -> str | None:
        if self.current is not None:
            return self.current
        for uid in self.order:
            pod = self.seen.get(uid)
            if (
                pod is not None
                and uid not in self.admitted
                and uid not in self.failed
                and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
            ):
                return uid
        return None

    def in_pod_manager(self, uid: str) -> bool:
        """kubelet adds a pod to its pod manager just before admitting it; it stays there, also
        rejected or finished, until the pod is deleted from the API server."""
        return (
            uid in self.admitted
            or uid == self.current
            or uid in self.failed
            or uid in self.finished
        )

    def listing(self, resource: str = RESOURCE) -> list[KubeletPod]:
        """The PodResources List (``listing_mode``): the pods in kubelet's pod manager, with
        each listed container's devices of ``resource`` (app containers and sidecars; a
        container's devices are recorded once its Allocate was answered; a rejected or finished
        pod's were freed).  The plugin reads the devices of the resource it decides for
        (``Admission._kubelet_list``)."""
        if self.podresources_down:
            raise KubeletViewError(f"kubelet/{self.node}: PodResources List failed (model)")
        out: list[KubeletPod] = []
        for uid, pod in self.seen.items():
            if not self.in_pod_manager(uid):
                continue
            terminal = uid in self.failed or uid in self.finished
            if terminal and self.listing_mode is Listing.ACTIVE_PODS:
                continue
            spec = pod["spec"]
            names = [
                c["name"]
                for c in spec.get("initContainers") or []
                if c.get("restartPolicy") == "Always"
            ] + [c["name"] for c in spec["containers"]]
            mine = self.allocated.get(uid, {})
            meta = pod["metadata"]
            out.append(
                KubeletPod(
                    meta["namespace"],
                    meta["name"],
                    {n: frozenset(mine.get((ContainerName(n), resource), ())) for n in names},
                )
            )
        return out

    def socket_instance(self) -> int:
        """Which kubelet made the PodResources socket file the plugin reads (``instance``)."""
        return self.instance

    def podresources_socket(self) -> bool:
        """Whether the plugin finds kubelet's PodResources socket (``PodResources.exists``)."""
        return not (self.podresources_down and self.socketless)

    def records(self, resource: str = RESOURCE) -> dict[str, set[str]]:
        """kubelet's device checkpoint: pod UID -> the containers it records devices of
        ``resource`` for."""
        out: dict[str, set[str]] = {}
        for uid, per in self.allocated.items():
            mine = {c for c, r in per if r == resource}
            if mine:
                out[uid] = set(mine)
        return out

    def _in_use(self) -> set[DeviceID]:
        return {d for per in self.allocated.values() for ids in per.values() for d in ids}

    def _fail(self, uid: str, why: str) -> None:
        pod = self.seen[uid]
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        self.failed[uid] = why
        self._free(uid)
        self.current = None
        self._status(
            key, uid, {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": why}
        )

    def reject(self, uid: str, why: str) -> None:
        """An admit handler other than the device manager's refuses the pod: before any
        Allocate (eviction, sysctl), or after some were answered (node affinity, resources,
        taints, AppArmor, node shutdown: the device manager's handler is not the last one)."""
        self._fail(uid, why)

    def _choose(
        self,
        plugin: Plugin,
        uid: str,
        resource: str,
        required: int,
        *,
        pick: int,
        reuse_in_order: bool,
    ) -> tuple[list[DeviceID], str] | None:
        """The devices of ``resource`` kubelet asks Allocate for (reused first from that
        resource's pool, then GetPreferredAllocation over the free ones); None when too few are
        free."""
        pod = self.seen[uid]
        inits = {c["name"] for c in pod["spec"].get("initContainers") or []}
        mine = {c: ids for (c, r), ids in self.allocated.get(uid, {}).items() if r == resource}
        pool: list[DeviceID] = []
        for c, ids in mine.items():
            if c in inits:
                pool.extend(d for d in ids if d not in pool)
        for c, ids in mine.items():
            if c not in inits:
                pool = [d for d in pool if d not in ids]
        pool = sorted(pool) if reuse_in_order else _shuffled(sorted(pool), pick)
        chosen: list[DeviceID] = pool[:required]
        how = "reused" if chosen else ""
        if len(chosen) < required:
            in_use = self._in_use()
            available = [d for d in self.healthy(resource) if d not in in_use]
            needed = required - len(chosen)
            if len(available) < needed:
                return None
            pref = plugin.preferred([*available, *chosen], list(chosen), required, resource)
            for d in pref.devices:
                if d in available and d not in chosen and len(chosen) < required:
                    chosen.append(d)
            for d in _shuffled(available, pick):
                if d not in chosen and len(chosen) < required:
                    chosen.append(d)
            how = "preferred hit" if pref.hit else f"preferred miss ({pref.reason[:60]})"
        return chosen, how

    def _record(self, uid: str, slot: Slot, chosen: list[DeviceID], result: Allocation) -> None:
        self.allocated.setdefault(uid, {})[slot] = tuple(chosen)
        self.given.setdefault(uid, {})[slot] = result.devices
        self.served_holder.setdefault(uid, {})[slot] = result.holder.uid
        self.last_record = (uid, slot)
        if result.last and result.holder.uid == uid:
            pod = self.seen[uid]
            waiting = [slot_text(s) for s, _ in self.slots(pod) if s not in self.allocated[uid]]
            if waiting:
                meta = pod["metadata"]
                self.early_releases.append(
                    f"{meta['namespace']}/{meta['name']}: the answer for {slot_text(slot)} "
                    f"released the lock allocated while {', '.join(waiting)} still await devices"
                )

    def step(
        self, plugin: Plugin, *, pick: int, reuse_in_order: bool, crash_after_answer: bool = False
    ) -> str:
        """Admit the next pod by one Allocate (or finish its admission): its next container's
        resources one at a time, ``pick`` choosing which of them goes first (kubelet walks a
        container's limits, a Go map, in no fixed order: ``allocateContainerResources``,
        pkg/kubelet/cm/devicemanager/manager.go, v1.31.9 line 836, v1.37.2 line 871).  With
        ``crash_after_answer`` kubelet dies right after the plugin's answer, before recording it
        (its checkpoint is written after the answer), and restarts."""
        uid = self.next_pod()
        if uid is None:
            return "nothing to admit"
        self.current = uid
        pod = self.seen[uid]
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        mine = self.allocated.setdefault(uid, {})
        todo = [(slot, n) for slot, n in self.slots(pod) if slot not in mine]
        if not todo:
            self.current = None
            self.admitted.add(uid)
            statuses = [
                {
                    "name": c["name"],
                    "containerID": f"cri://{uid}-{c['name']}",
                    "state": {"running": {}},
                }
                for c in pod["spec"]["containers"]
            ]
            self._status(key, uid, {"phase": "Running", "containerStatuses": statuses})
            return f"admitted {key}"
        group = [(slot, n) for slot, n in todo if slot[0] == todo[0][0][0]]
        slot, required = group[pick % len(group)]
        pick //= len(group)
        container, resource = slot
        picked = self._choose(
            plugin, uid, resource, required, pick=pick, reuse_in_order=reuse_in_order
        )
        if picked is None:
            self._fail(uid, f"requested {required} {resource}, too few available")
            return f"{key}: {slot_text(slot)}: too few free devices; pod failed"
        chosen, how = picked
        container = ContainerName(slot_text(slot))  # for the trace
        try:
            result = plugin.allocate(list(chosen), resource)
        except PluginCrashed as exc:
            self._fail(uid, str(exc))
            plugin.start()
            return f"{key}: {container}: Allocate({','.join(chosen)}): {exc}; pod failed"
        if isinstance(result, Refusal):
            self._fail(uid, f"{result.kind.value}: {result.message}")
            return (
                f"{key}: {container}: Allocate({','.join(chosen)}) refused "
                f"{result.kind.value}; pod failed"
            )
        self._record(uid, slot, chosen, result)
        text = (
            f"{key}: {container}: Allocate({','.join(chosen)}) [{how}] -> served "
            f"{','.join(result.devices)} as {result.holder.key} token {result.token}"
            + (" (last; released)" if result.last else "")
        )
        if crash_after_answer:
            self.start(lose_last_record=True)
            text += "; kubelet died before writing its checkpoint and restarted"
        return text

    def unrecorded(self) -> list[tuple[str, Slot, int]]:
        """Running pods' containers with no device record of a resource (the record was
        lost)."""
        out: list[tuple[str, Slot, int]] = []
        for uid in sorted(self.admitted):
            pod = self.seen.get(uid)
            if pod is None or uid in self.finished or uid in self.failed:
                continue
            mine = self.allocated.get(uid, {})
            out.extend((uid, slot, n) for slot, n in self.slots(pod) if slot not in mine)
        return out

    def reallocate(self, plugin: Plugin, which: int, *, pick: int) -> str:
        """A running pod's pod worker starts a container that has no device record: the device
        manager calls Allocate for it again (``GetDeviceRunContainerOptions``,
        pkg/kubelet/cm/devicemanager/manager.go).  A refusal fails that container's start; the
        pod keeps running."""
        todo = self.unrecorded()
        uid, slot, required = todo[which % len(todo)]
        pod = self.seen[uid]
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        container, resource = slot
        picked = self._choose(plugin, uid, resource, required, pick=pick, reuse_in_order=True)
        container = ContainerName(slot_text(slot))  # for the trace
        if picked is None:
            return f"{key}: {container}: re-Allocate: too few free devices; container not started"
        chosen, how = picked
        try:
            result = plugin.allocate(list(chosen), resource)
        except PluginCrashed as exc:
            plugin.start()
            return f"{key}: {container}: re-Allocate: {exc}"
        if isinstance(result, Refusal):
            return f"{key}: {container}: re-Allocate refused {result.kind.value}; not started"
        self._record(uid, slot, chosen, result)
        return (
            f"{key}: {container}: re-Allocate({','.join(chosen)}) [{how}] -> served "
            f"{','.join(result.devices)} as {result.holder.key} token {result.token}"
        )

    def complete(self, uid: str) -> str:
        """A running pod's containers all exit: Succeeded, its devices freed."""
        pod = self.seen[uid]
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        self._status(key, uid, {"phase": "Succeeded"})
        self.finished.add(uid)
        self._free(uid)
        return f"{key} succeeded"


def _shuffled(items: list[DeviceID], pick: int) -> list[DeviceID]:
    """A permutation of ``items`` chosen by ``pick`` (kubelet's Go map order, made drawable)."""
    out = list(items)
    rest: list[DeviceID] = []
    while out:
        i = pick % len(out)
        pick //= len(out)
        rest.append(out.pop(i))
    return rest
