"""What to answer kubelet, decided from plain data: the node's lock, the holder pod, the progress.

kubelet's Allocate and GetPreferredAllocation calls carry device IDs but no pod identity.  The node
lock names the one pod in handoff; these functions check that pod against the lock and answer with
its assignment for its next GPU container, or refuse with a reason a person can act on.

Guarantees (each one unit-tested with plain data):
- An ``Allocation`` is returned only for the lock's holder, bound to this node, whose UID and
  token equal the Lease's, that is still in the handoff (``handoff.holder``: neither finished
  nor admitted by kubelet), whose pod annotation equals the Lease's copy of the assignment, whose
  spec requests exactly the assigned counts, and only for its next unserved GPU container (init
  containers first, then containers, in spec order) with kubelet's request of the same size.
  A container counts as served while kubelet's device checkpoint, when it can be read, records
  it too (``kubelet_confirmed``): one kubelet lost the record of (it died after the answer,
  before writing its checkpoint) is the one it asks for again, and gets its own assignment
  again.
  What it serves is always devices of the Lease's copy (written only by the extender): kubelet's
  own pick when it lies in the pod's pool (its devices not held by an earlier app container or
  sidecar — kubelet reuses init containers' devices in its own order), else, by policy, the
  container's expected devices from that pool.  Containers that run at the same time never get
  one device.
- ``Refusal.release`` is set only when the holder pod itself can never be served: it is gone, or
  its (or its Lease's) handoff data is malformed, forged or disagrees with its spec.  Refusals
  that may concern a different pod than the holder (kubelet asks for another count or other
  devices, or for a resource the holder does not ask for), or a lock that is not the holder's
  to lose (no holder, token mismatch, taken over), leave the lock alone.
- Nothing here does I/O, reads a clock or keeps state.

- While kubelet may be admitting another pod than the holder, nothing is served and nothing
  steered to the holder's devices: one rule (``another_pod_may_be_admitted``) for Allocate and
  GetPreferredAllocation, fed by kubelet's PodResources ``List`` (``kubelet_admitting``); a
  ``List`` that fails on a socket kubelet made refuses.  Only a plugin without a PodResources
  socket decides from the pods bound here and kubelet's device checkpoint (``bystanders``),
  which cannot see a static pod the API server does not know.
  A finished pod (Succeeded, Failed, rejected, or every container terminated for good) and a
  pod whose GPUs come from DRA never count; a pod the API server does not know counts for
  ``UNKNOWN_POD_WAIT_S`` only; a pod this plugin served counts unless kubelet records its
  devices (a kubelet restart may have lost them; it then calls Allocate for it again).
- A plugin serving several resources (whole GPUs and MIG instances, ``Context.others``) decides
  each call on the resource kubelet asked for: the assignment's devices of that resource, the
  containers asking for it, its own progress; the lock is released after the last container of
  every resource the pod asks for was served.

Not guaranteed: that the pod kubelet is admitting *is* the holder when the caller's view of the
node's pods lags (a pod bound around the extender a moment ago) — docs/deviceplugin.md, "Limits".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from handoff.audit import KubeletPod, PluginAnswer
from handoff.holder import Ended, HolderState, ended, pod_facts
from handoff.holder import holder_status as handoff_status
from handoff.request import container_needs
from handoff.wire import (
    DEFAULT_RESOURCE,
    LEASE_ASSIGNMENT,
    MAX_DEVICES_PER_CONTAINER,
    Assignment,
    ContainerName,
    DeviceID,
    Keys,
    MalformedAnnotation,
    format_assignment,
    parse_assignment,
    parse_token,
    valid_device_id,
)
from lockd.model import FencingToken, Holder, HolderKey, NodeLockView, NodeName

PodJSON = Mapping[str, Any]
# kubelet's device checkpoint: pod UID -> the containers it records devices of one resource for
KubeletRecords = Mapping[str, Collection[str]]
# resource -> the lock holder's containers kubelet holds devices of that resource for
OtherResources = Mapping[str, Collection[str]]


class MismatchPolicy(StrEnum):
    """What Allocate does when kubelet's device IDs differ from the assignment (same count)."""

    REFUSE = "refuse"  # fail the pod's admission; the pod's controller recreates it
    ASSIGNMENT = "assignment"  # serve the assignment anyway; kubelet's accounting then drifts


class RefusalKind(StrEnum):
    """Why a call was refused (also the ``result`` label of the Allocate metric)."""

    BAD_REQUEST = "bad-request"
    NO_HOLDER = "no-holder"
    TAKEN_OVER = "taken-over"
    POD_GONE = "pod-gone"
    NOT_BOUND = "not-bound"
    WRONG_NODE = "wrong-node"
    TOKEN_MISMATCH = "token-mismatch"
    MALFORMED = "malformed"
    FORGED = "forged"
    SPEC_MISMATCH = "spec-mismatch"
    UNKNOWN_DEVICE = "unknown-device"
    ALL_SERVED = "all-served"
    COUNT_MISMATCH = "count-mismatch"
    UNHEALTHY = "unhealthy"
    DEVICES_MISMATCH = "devices-mismatch"
    LEFT_HANDOFF = "left-handoff"  # the Lease names a holder kubelet rejected or admitted
    AMBIGUOUS = "ambiguous"  # another GPU pod bound here may be the one kubelet admits
    UNAVAILABLE = "unavailable"  # the API server could not be read (not decided here)
    INTERNAL = "internal"  # the plugin could not record its progress (not decided here)


@dataclass(frozen=True)
class HandoffProgress:
    """Which GPU containers of one handoff (holder UID + token) have been served, in order."""

    holder: HolderKey
    uid: str
    token: FencingToken
    served: tuple[ContainerName, ...] = ()
    # the devices each served container was given, parallel to ``served``; a container without
    # an entry (a checkpoint written before this was kept) was given its own assignment
    given: tuple[tuple[DeviceID, ...], ...] = ()
    # the resource each served container was served for, parallel to ``served``; empty while
    # every entry is ``DEFAULT_RESOURCE`` (so handoffs of whole GPUs only record nothing new)
    resources: tuple[str, ...] = ()

    def resource_at(self, index: int) -> str:
        """The resource served container ``index`` was served for."""
        return self.resources[index] if index < len(self.resources) else DEFAULT_RESOURCE

    def of_resource(self, resource: str) -> HandoffProgress:
        """The progress of ``resource`` alone (the entries served for it)."""
        if not self.resources and resource == DEFAULT_RESOURCE:
            return self
        keep = [i for i in range(len(self.served)) if self.resource_at(i) == resource]
        given = tuple(self.given[i] for i in keep if i < len(self.given))
        if len(given) != len(keep):  # an unrecorded ``given`` is only ever a trailing one
            given = ()
        return HandoffProgress(
            self.holder, self.uid, self.token, tuple(self.served[i] for i in keep), given
        )

    def after(
        self, container: ContainerName, devices: tuple[DeviceID, ...], resource: str
    ) -> HandoffProgress:
        """This progress plus ``container`` served ``devices`` of ``resource``; ``given`` must
        be complete (``_complete``)."""
        resources = self.resources
        if resources or resource != DEFAULT_RESOURCE:
            resources = (*self.resources, *[DEFAULT_RESOURCE] * (len(self.served) - len(resources)))
            resources = (*resources, resource)
        return HandoffProgress(
            self.holder,
            self.uid,
            self.token,
            (*self.served, container),
            (*self.given, devices),
            resources,
        )

    def keeping(self, indices: Sequence[int]) -> HandoffProgress:
        """This progress with only the served entries at ``indices`` (ascending)."""
        given = tuple(self.given[i] for i in indices if i < len(self.given))
        resources = tuple(self.resource_at(i) for i in indices) if self.resources else ()
        return replace(
            self, served=tuple(self.served[i] for i in indices), given=given, resources=resources
        )

    def same_handoff(self, holder: Holder, token: FencingToken) -> bool:
        return self.uid == holder.uid and self.token == token and self.holder == holder.key

    def devices_of(self, index: int) -> tuple[DeviceID, ...] | None:
        """What served container ``index`` was given, when recorded."""
        return self.given[index] if index < len(self.given) else None


@dataclass(frozen=True)
class Refusal:
    """Refuse the call.  ``release`` names the lock to release with outcome ``rejected``."""

    kind: RefusalKind
    message: str
    release: tuple[Holder, FencingToken] | None = None


@dataclass(frozen=True)
class Allocation:
    """Serve ``container`` of the holder with ``devices`` (assignment order)."""

    holder: Holder
    token: FencingToken
    container: ContainerName
    devices: tuple[DeviceID, ...]
    progress: HandoffProgress  # after this container
    last: bool  # no GPU container is left: release the lock with outcome ``allocated``
    kubelet_differs: bool = False  # kubelet chose other IDs; served the assignment by policy
    pod: PodJSON | None = field(default=None, compare=False, repr=False)  # the holder's spec


@dataclass(frozen=True)
class Preference:
    """The answer to one GetPreferredAllocation container request."""

    devices: tuple[DeviceID, ...]
    hit: bool  # the holder's assignment (True) or a plain hint from the available set (False)
    reason: str = ""  # why it is a miss


@dataclass(frozen=True)
class _Plan:
    """A verified holder: its GPU containers in spec order and where its handoff stands."""

    holder: Holder
    token: FencingToken
    pod: str  # "namespace/name (uid …)" for messages
    order: tuple[tuple[ContainerName, tuple[DeviceID, ...]], ...]
    progress: HandoffProgress
    next_index: int  # index into order of the next container to serve
    reusing: frozenset[ContainerName] = frozenset()  # init containers whose devices are reused
    whole: HandoffProgress | None = None  # the progress of every resource (``progress``: ours)

    @property
    def next(self) -> tuple[ContainerName, tuple[DeviceID, ...]] | None:
        return self.order[self.next_index] if self.next_index < len(self.order) else None

    def pool(self) -> tuple[DeviceID, ...]:
        """The pod's devices not held by a served app container or sidecar, assignment order.

        kubelet gives a container devices from the pod's reuse pool (what its non-restartable
        init containers had) first, in its own order and without GetPreferredAllocation, and
        the rest from the free devices; app containers and sidecars keep theirs.  So any
        container may be given any devices of this pool, and no two containers that run at the
        same time share one.
        """
        assigned = dict(self.order)
        held: set[DeviceID] = set()
        for i, container in enumerate(self.progress.served):
            if container in self.reusing:
                continue
            given = self.progress.devices_of(i)
            held.update(given if given is not None else assigned.get(container, ()))
        out: list[DeviceID] = []
        for _, ids in self.order:
            out.extend(d for d in ids if d not in held and d not in out)
        return tuple(out)

    def expected(self) -> tuple[DeviceID, ...]:
        """What the next container should get: its own assigned devices that are still in the
        pool first, then other pool devices (assignment order); shorter than its count only
        when the pool ran out."""
        nxt = self.next
        if nxt is None:
            return ()
        pool = self.pool()
        own = [d for d in nxt[1] if d in pool]
        return tuple([*own, *(d for d in pool if d not in own)][: len(nxt[1])])


@dataclass(frozen=True)
class Context:
    """The fixed facts of one plugin: its node, resource, annotation keys and inventory."""

    node: NodeName
    devices: Mapping[DeviceID, bool] = field(default_factory=dict)  # ID -> healthy
    resource: str = DEFAULT_RESOURCE
    keys: Keys = field(default_factory=Keys)
    # the devices of the other resources this plugin serves (MIG instances, or whole GPUs for a
    # MIG resource's call), ID -> resource: an assignment names them too
    others: Mapping[DeviceID, str] = field(default_factory=dict)

    def resources(self) -> list[str]:
        """Every resource this plugin serves, this call's first."""
        return [self.resource, *sorted(set(self.others.values()) - {self.resource})]


def _pod_name(pod: PodJSON) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '?')}/{meta.get('name', '?')} (uid {meta.get('uid', '?')})"


def _holder_name(holder: Holder) -> str:
    return f"{holder.key} (uid {holder.uid})"


def gpu_containers(pod: PodJSON, resource: str) -> list[tuple[ContainerName, int]]:
    """The pod's containers that ask for ``resource``, init containers first, in spec order.

    The count is read by ``handoff.request`` (the extender's parser): the container's limit,
    kubelet's source, else its request.  Raises ``BadPod`` (a ``ValueError``) for a malformed pod
    or a count that is not a whole number.
    """
    return [(c.name, c.count) for c in container_needs(pod, resource) if c.count > 0]


def reusing_init_containers(pod: PodJSON) -> frozenset[ContainerName]:
    """The pod's non-restartable init containers: kubelet puts their devices in the pod's reuse
    pool for later containers (a restartable init container, a sidecar, keeps its own)."""
    spec = pod.get("spec") or {}
    return frozenset(
        ContainerName(str(c.get("name", "")))
        for c in spec.get("initContainers") or []
        if c.get("restartPolicy") != "Always"
    )


def check_request(
    requests: Sequence[Sequence[str]], ctx: Context
) -> tuple[DeviceID, ...] | Refusal:
    """Check the shape of an Allocate request: one container, known, distinct device IDs."""
    where = f"node {ctx.node}"
    if len(requests) != 1:
        return Refusal(
            RefusalKind.BAD_REQUEST,
            f"{where}: Allocate must carry exactly one container request (kubelet sends one per "
            f"container), got {len(requests)}",
        )
    ids = requests[0]
    if not ids:
        return Refusal(RefusalKind.BAD_REQUEST, f"{where}: Allocate asks for no devices")
    if len(ids) > min(MAX_DEVICES_PER_CONTAINER, max(len(ctx.devices), 1)):
        return Refusal(
            RefusalKind.BAD_REQUEST,
            f"{where}: Allocate asks for {len(ids)} devices; this node has {len(ctx.devices)}",
        )
    if len(set(ids)) != len(ids):
        return Refusal(RefusalKind.BAD_REQUEST, f"{where}: Allocate repeats a device ID")
    unknown = [d for d in ids if not valid_device_id(d) or DeviceID(d) not in ctx.devices]
    if unknown:
        shown = ", ".join(repr(d[:80]) for d in unknown[:3])
        return Refusal(
            RefusalKind.BAD_REQUEST,
            f"{where}: Allocate names devices this plugin does not have: {shown}",
        )
    return tuple(DeviceID(d) for d in ids)


def kubelet_confirmed(
    progress: HandoffProgress,
    recorded: KubeletRecords | None,
    resource: str,
    *,
    held_other: OtherResources | None = None,
) -> HandoffProgress:
    """The holder's ``progress`` as far as kubelet's device checkpoint (``recorded``, of
    ``resource``) confirms it: a container served for ``resource`` that kubelet has no record
    of is dropped, so it is the one served next.

    kubelet records a container's devices, and writes its checkpoint, after the plugin answered and
    before it asks for the pod's next container (cm/devicemanager/manager.go
    ``allocateContainerResources``: ``podDevices.insert``, then ``writeCheckpoint``, v1.31.9 lines
    915, 919; v1.37.2 lines 955, 959).  It calls Allocate only for a container it has no record of
    (``devicesToAllocate``, v1.31.9 lines 577, 629; v1.37.2 lines 611, 663), init containers first,
    then containers, in spec order (cm/topologymanager/scope.go, v1.31.9 line 139, v1.37.2 line
    140).  So a served container kubelet has no record of is one it asks for again (it died before
    writing its checkpoint): the first such container in spec order is the one asking, and no
    container after it was recorded.  ``recorded`` None (kubelet's checkpoint could not be read)
    confirms everything: the progress stands as it is (a kubelet asking again for a container it
    lost then gets the next container's devices, or a device-mismatch refusal; never another pod's
    devices).

    Entries of other resources count while kubelet holds the holder's container's devices of
    that resource (``held_other``: resource -> containers, from kubelet's checkpoint and its
    PodResources ``List``).  kubelet writes its checkpoint once per container, after the
    Allocate of each of its resources (``allocateContainerResources``: the loop over the
    container's resources, then ``writeCheckpoint``, v1.31.9 lines 836 and 919, v1.37.2 lines
    871 and 959), but records each resource's devices in memory, which ``List`` reports, as soon
    as the plugin answered (``podDevices.insert``, v1.31.9 line 915, v1.37.2 line 955).  So a
    container's other resource answered to this kubelet is held; one answered to a kubelet that
    died before writing is held by neither, and kubelet asks for it again.  ``held_other`` None
    (``List`` could not be read) keeps every entry of another resource as it stands."""
    mine = (recorded.get(progress.uid) or ()) if recorded is not None else None
    keep = []
    for i, container in enumerate(progress.served):
        of = progress.resource_at(i)
        if of == resource:
            if mine is None or container in mine:
                keep.append(i)
        elif held_other is None or container in held_other.get(of, ()):
            keep.append(i)
    return progress if len(keep) == len(progress.served) else progress.keeping(keep)


def _verify(
    view: NodeLockView | None,
    pod: PodJSON | None,
    progress: HandoffProgress | None,
    ctx: Context,
    *,
    recorded: KubeletRecords | None = None,
    held_other: OtherResources | None = None,
) -> _Plan | Refusal:
    """Check the holder pod against the lock; the shared first half of every decision.  The
    holder's progress counts as far as kubelet's records confirm it (``kubelet_confirmed``)."""
    node = ctx.node
    record = view.record if view is not None else None
    if record is None or record.holder is None:
        last = ""
        if record is not None and record.last is not None:
            last = (
                f" (last holder {record.last.holder}, token {record.last.token}, "
                f"{record.last.outcome})"
            )
        return Refusal(
            RefusalKind.NO_HOLDER,
            f"node {node}: no pod holds the node lock{last}; GPU pods on this node must be "
            "bound by the nodelock scheduler extender",
        )
    holder, token = record.holder, record.token
    who = _holder_name(holder)
    if progress is not None and progress.served and not progress.same_handoff(holder, token):
        return Refusal(
            RefusalKind.TAKEN_OVER,
            f"node {node}: the handoff of {progress.holder} (uid {progress.uid}, token "
            f"{progress.token}) was interrupted after containers {list(progress.served)}; the "
            f"lock now belongs to {who} with token {token}",
        )
    release = (holder, token)
    if pod is None:
        return Refusal(
            RefusalKind.POD_GONE,
            f"node {node}: lock holder {who} no longer exists",
            release=release,
        )
    meta = pod.get("metadata") or {}
    if str(meta.get("uid", "")) != holder.uid:
        return Refusal(
            RefusalKind.POD_GONE,
            f"node {node}: lock holder {who} no longer exists (pod {_pod_name(pod)} has its name)",
            release=release,
        )
    name = _pod_name(pod)
    bound = str((pod.get("spec") or {}).get("nodeName") or "")
    where = handoff_status(pod, uid=holder.uid, node=node)
    if where.state is HolderState.FINISHED or where.state is HolderState.ADMITTED:
        # kubelet is done with the holder: the pod asking now is another one.  The view may be
        # stale (a takeover while the watch reconnected); the caller re-reads it.  The lock is
        # not released here: whoever holds it now is not known from this view.
        return Refusal(
            RefusalKind.LEFT_HANDOFF,
            f"node {node}: lock holder {name} left the handoff ({where.why}); kubelet is "
            "admitting another pod",
        )
    if not bound:
        return Refusal(RefusalKind.NOT_BOUND, f"pod {name}: not bound yet (node {node})")
    if bound != node:
        return Refusal(
            RefusalKind.WRONG_NODE,
            f"pod {name}: holds the lock of node {node} but is bound to node {bound}",
        )
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    keys = ctx.keys
    try:
        pod_token = parse_token(annotations.get(keys.token), key=keys.token)
    except MalformedAnnotation as exc:
        return Refusal(RefusalKind.MALFORMED, f"pod {name} on node {node}: {exc}", release)
    if pod_token != token:
        return Refusal(
            RefusalKind.TOKEN_MISMATCH,
            f"pod {name} on node {node}: its {keys.token} is {pod_token} but the node lock is at "
            f"token {token}",
        )
    try:
        leased = parse_assignment(
            holder.data.get(LEASE_ASSIGNMENT), key=f"{keys.assignment} (on the Lease)"
        )
        own = parse_assignment(annotations.get(keys.assignment), key=keys.assignment)
    except MalformedAnnotation as exc:
        return Refusal(RefusalKind.MALFORMED, f"pod {name} on node {node}: {exc}", release)
    if own != leased:
        return Refusal(
            RefusalKind.FORGED,
            f"pod {name} on node {node}: its {keys.assignment} {format_assignment(own)} differs "
            f"from the lock's copy {format_assignment(leased)}; only the extender may assign",
            release,
        )
    plan = _order(leased, pod, name, ctx)
    if isinstance(plan, Refusal):
        # COUNT_MISMATCH: the holder asks for none of this resource, so the caller is another pod
        keep = plan.kind is RefusalKind.COUNT_MISMATCH
        return Refusal(plan.kind, plan.message, None if keep else release)
    whole = HandoffProgress(holder.key, holder.uid, token)
    if progress is not None and progress.same_handoff(holder, token):
        whole = kubelet_confirmed(progress, recorded, ctx.resource, held_other=held_other)
    mine = whole.of_resource(ctx.resource)
    done = set(mine.served)
    next_index = next((i for i, (c, _) in enumerate(plan) if c not in done), len(plan))
    return _Plan(
        holder=holder,
        token=token,
        pod=name,
        order=tuple(plan),
        progress=mine,
        next_index=next_index,
        reusing=reusing_init_containers(pod),
        whole=whole,
    )


def _order(
    assignment: Assignment, pod: PodJSON, name: str, ctx: Context
) -> list[tuple[ContainerName, tuple[DeviceID, ...]]] | Refusal:
    """The assignment in spec order, checked against the spec's counts and this node's devices."""
    where = f"pod {name} on node {ctx.node}"
    try:
        wanted = gpu_containers(pod, ctx.resource)
    except ValueError as exc:
        return Refusal(RefusalKind.SPEC_MISMATCH, f"{where}: {exc}")
    names = [c for c, _ in wanted]
    everything = assignment
    # the devices of other resources are checked when kubelet asks for those
    assignment = {c: [d for d in ids if d not in ctx.others] for c, ids in assignment.items()}
    extra = [c for c, ids in assignment.items() if ids and c not in names]
    if extra:
        return Refusal(
            RefusalKind.SPEC_MISMATCH,
            f"{where}: the assignment names containers that request no {ctx.resource}: {extra}",
        )
    out: list[tuple[ContainerName, tuple[DeviceID, ...]]] = []
    for container, count in wanted:
        ids = assignment.get(container)
        if ids is None or len(ids) != count:
            got = "nothing" if ids is None else f"{len(ids)}"
            return Refusal(
                RefusalKind.SPEC_MISMATCH,
                f"{where}: container {container!r} requests {count} {ctx.resource} but is "
                f"assigned {got}",
            )
        out.append((container, tuple(ids)))
    if not out:
        if _asks_other(pod, ctx):
            return Refusal(
                RefusalKind.COUNT_MISMATCH,
                f"{where}: the lock holder asks for no {ctx.resource}, only for other resources "
                "this plugin serves; kubelet is admitting another pod",
            )
        return Refusal(RefusalKind.SPEC_MISMATCH, f"{where}: no container requests {ctx.resource}")
    shared = _shared_while_running(out, reusing_init_containers(pod))
    if shared:
        return Refusal(
            RefusalKind.SPEC_MISMATCH,
            f"{where}: the assignment gives containers that run at the same time the same "
            f"devices: {shared}",
        )
    unknown = sorted(
        {d for ids in everything.values() for d in ids if d not in ctx.devices} - set(ctx.others)
    )
    if unknown:
        return Refusal(
            RefusalKind.UNKNOWN_DEVICE,
            f"{where}: assigned devices this node does not have: {unknown}",
        )
    return out


def _asks_other(pod: PodJSON, ctx: Context) -> bool:
    """Whether the pod asks for another resource this plugin serves (MIG instances, or whole
    GPUs for a MIG resource's call)."""
    for resource in ctx.resources()[1:]:
        try:
            if gpu_containers(pod, resource):
                return True
        except ValueError:
            return True  # asks for it, malformed: refused when kubelet asks for that resource
    return False


def _shared_while_running(
    order: Sequence[tuple[ContainerName, tuple[DeviceID, ...]]], reusing: Collection[ContainerName]
) -> list[str]:
    """Devices an assignment gives two containers that kubelet runs side by side: app containers
    and sidecars keep theirs for the pod's life; an init container runs alongside the sidecars
    started before it."""
    kept: dict[DeviceID, ContainerName] = {}
    problems: list[str] = []
    for container, ids in order:
        for dev in ids:
            if dev in kept:
                problems.append(f"{dev} ({kept[dev]} and {container})")
        if container not in reusing:
            kept.update(dict.fromkeys(ids, container))
    return problems


def decide_allocate(
    view: NodeLockView | None,
    pod: PodJSON | None,
    requested: Sequence[DeviceID],
    progress: HandoffProgress | None,
    ctx: Context,
    *,
    policy: MismatchPolicy = MismatchPolicy.REFUSE,
    bound_here: Sequence[PodJSON] = (),
    served_pods: Collection[str] = (),
    kubelet: KubeletAdmission | KubeletUnreadable | None = None,
    recorded: KubeletRecords | None = None,
    held_other: OtherResources | None = None,
) -> Allocation | Refusal:
    """Answer kubelet's Allocate for one container that asked for ``requested``.

    ``view`` is the node's lock, ``pod`` the lock holder's pod as read from the API server (None
    when it was not found), ``progress`` the checkpointed progress of the current handoff.
    Who kubelet may be admitting is ``another_pod_may_be_admitted``'s question, asked before
    anything about the holder's containers: from ``kubelet`` (its PodResources view, see
    ``kubelet_admitting``; ``KubeletUnreadable``: its socket is there and did not answer) or,
    on a node whose plugin has no PodResources socket, from ``bound_here`` and ``recorded``
    (``bystanders``).  ``served_pods`` is accepted for callers and
    no longer trusted alone.  ``progress`` counts a container of ``ctx.resource`` as served
    only while ``recorded`` holds it for the holder (``kubelet_confirmed``; None: as it stands):
    a container kubelet lost the record of is the one it asks for again, and gets its own
    assignment again; a container of another resource only while kubelet holds its devices
    (``held_other``, ``kubelet_confirmed``); the lock is released (``last``) only with the last
    container of every resource answered.
    """
    plan = _verify(view, pod, progress, ctx, recorded=recorded, held_other=held_other)
    if isinstance(plan, Refusal):
        return plan
    where = f"pod {plan.pod} on node {ctx.node}"
    # first who kubelet admits: if it may be another pod, nothing about the holder applies
    another = another_pod_may_be_admitted(
        plan.pod,
        plan.holder.uid,
        ctx,
        kubelet=kubelet,
        bound_here=bound_here,
        recorded=recorded,
        served_pods=served_pods,
    )
    if another is not None:
        return another
    nxt = plan.next
    if nxt is None:
        return Refusal(
            RefusalKind.ALL_SERVED,
            f"{where}: every GPU container ({[c for c, _ in plan.order]}) was already served; "
            "kubelet asked for one more",
        )
    container, assigned = nxt
    if len(requested) != len(assigned):
        return Refusal(
            RefusalKind.COUNT_MISMATCH,
            f"{where}: kubelet asks for {len(requested)} devices but the next GPU container "
            f"{container!r} is assigned {len(assigned)}",
        )
    pool = plan.pool()
    differs = not set(requested) <= set(pool)
    # kubelet's pick from the pod's own devices (init container reuse) is served as it is
    devices = plan.expected() if differs else tuple(d for d in pool if d in set(requested))
    sick = [d for d in devices if not ctx.devices.get(d, False)]
    if sick:
        return Refusal(
            RefusalKind.UNHEALTHY,
            f"{where}: container {container!r} is assigned unhealthy devices {sick}",
        )
    if differs and (policy is MismatchPolicy.REFUSE or len(devices) != len(assigned)):
        return Refusal(
            RefusalKind.DEVICES_MISMATCH,
            f"{where}: kubelet chose {sorted(requested)} for container {container!r} but the "
            f"assignment is {list(assigned)} and the pod's devices not held by its other "
            f"containers are {list(pool)}; kubelet picks among the devices it counts free (and "
            "its topology manager aligned), so it did not count the assigned ones free: a "
            "finished pod it had not finished tearing down (as just after a kubelet restart), a "
            "pod placed without the extender, or a NUMA policy the extender was not told of; a "
            "Job or Deployment replaces the pod, a bare pod must be created again",
        )
    progress = _complete(plan).after(container, devices, ctx.resource)
    return Allocation(
        holder=plan.holder,
        token=plan.token,
        container=container,
        devices=devices,
        progress=progress,
        last=_all_served(pod, progress, ctx),
        kubelet_differs=differs,
        pod=pod,
    )


def another_pod_may_be_admitted(
    holder_pod: str,
    holder_uid: str,
    ctx: Context,
    *,
    kubelet: KubeletAdmission | KubeletUnreadable | None,
    bound_here: Sequence[PodJSON] = (),
    recorded: KubeletRecords | None = None,
    served_pods: Collection[str] = (),
) -> Refusal | None:
    """Whether kubelet may be admitting another pod than the lock's holder (``holder_pod``, for
    messages, of ``holder_uid``): a refusal without a release if it may, else None.  Allocate
    and GetPreferredAllocation ask this one question, with the same sources.

    The sources, strongest first:
    - ``KubeletAdmission``: kubelet's PodResources ``List``, read after kubelet called
      (``kubelet_admitting``): it names every pod kubelet admits, static pods the API server
      does not know included.  The holder must be listed and no other pod may be waiting.
    - ``KubeletUnreadable``: kubelet's PodResources socket is there (a kubelet made it) but
      ``List`` failed.  A pod the API server does not know (a static pod whose mirror pod is
      denied or not written yet) can be the one kubelet admits, and no other source shows it:
      refused (kubelet fails that pod's admission; a controller makes a new pod), never served
      by a weaker rule.
    - None: this plugin has no PodResources socket (not configured, or not mounted): the pods
      bound here and kubelet's device checkpoint (``bystanders``).  This source cannot see a
      pod the API server does not know: docs/deviceplugin.md, "Limits".

    ``served_pods`` (the pods this plugin served) is passed on and not trusted alone.
    """
    if isinstance(kubelet, KubeletUnreadable):
        return Refusal(
            RefusalKind.UNAVAILABLE,
            f"node {ctx.node}: kubelet's PodResources List could not be read ({kubelet.reason}); "
            f"without it the pod kubelet admits cannot be told from the lock holder "
            f"{holder_pod} (it may be a static pod the API server does not know), so nothing "
            "is served; the holder keeps the lock",
        )
    if kubelet is not None:
        if not kubelet.holder_listed:
            waiting = f"; awaiting devices: {', '.join(kubelet.others)}" if kubelet.others else ""
            return Refusal(
                RefusalKind.AMBIGUOUS,
                f"node {ctx.node}: kubelet is admitting another pod than the node lock's holder "
                f"{holder_pod} (kubelet does not list the holder among the pods it admits or "
                f"runs{waiting}); the holder keeps the lock and its devices. GPU pods on this "
                "node must be bound by the nodelock scheduler extender",
            )
        others = list(kubelet.others)
    else:
        others = bystanders(bound_here, holder_uid, served_pods, ctx, recorded=recorded)
    if others:
        return Refusal(
            RefusalKind.AMBIGUOUS,
            f"pod {holder_pod} on node {ctx.node}: kubelet may be admitting another GPU pod "
            f"bound to this node without the node lock ({', '.join(others)}); refusing rather "
            f"than guessing which pod gets {holder_pod}'s devices. GPU pods on this node must "
            "be bound by the nodelock scheduler extender",
        )
    return None


def bystanders(
    bound_here: Sequence[PodJSON],
    holder_uid: str,
    served_pods: Collection[str],
    ctx: Context,
    *,
    recorded: KubeletRecords | None = None,
) -> list[str]:
    """The pods (``namespace/name (uid …)``) that make an Allocate call ambiguous when kubelet's
    PodResources ``List`` could not be read: bound to this node, not the lock holder, asking
    for ``ctx.resource`` (not through DRA), not finished, and not shown by kubelet's device
    checkpoint (``recorded``) with devices for every GPU container.

    Of the pods the API server knows, one counts here whenever ``List`` could list it with a
    GPU container without devices; a pod the API server does not know (a static pod without a
    mirror pod) is not seen at all, so only a plugin without a PodResources socket decides by
    this (``another_pod_may_be_admitted``).  An admitted (Running) pod counts unless the
    checkpoint records its devices: kubelet admits it again after a restart that lost its
    checkpoint, and the API server's view cannot tell whether it did so before the holder's
    admission (``admitted_before`` needs kubelet's ``List``); a pod this plugin served counts
    likewise (``served_pods`` is not trusted
    alone: kubelet may have died before recording what it was given).  ``recorded`` None
    (the checkpoint is unreadable) counts every such pod.  kubelet does not say which pod it
    admits; extender-bound pods never wait bound here beside the holder (the lock serializes
    binds), so a pod counted here was bound around the extender or lost its devices."""
    del served_pods  # kubelet's own record decides (docstring)
    out: list[str] = []
    for other in bound_here:
        meta = other.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid or uid == holder_uid:
            continue
        if str((other.get("spec") or {}).get("nodeName") or "") != ctx.node:
            continue
        if _done_with_devices(other):
            continue
        try:
            wanted = _device_plugin_containers(other, ctx.resource)
        except ValueError:
            out.append(_pod_name(other))  # a count kubelet cannot parse: stay on the safe side
            continue
        if not wanted:
            continue
        mine = recorded.get(uid) if recorded is not None else None
        if mine is not None and all(c in mine for c in wanted):
            continue
        out.append(_pod_name(other))
    return sorted(out)


@dataclass(frozen=True)
class KubeletAdmission:
    """Who kubelet may be admitting, by its own view (``kubelet_admitting``)."""

    holder_listed: bool  # kubelet holds the lock holder, and it may still await devices
    others: tuple[str, ...]  # other pods it holds that may still be waiting for devices
    # listed pods unknown to the API server for longer than ``UNKNOWN_POD_WAIT_S``: left out
    ignored_unknown: tuple[str, ...] = ()
    # listed pods without device records that kubelet admitted before it held the holder
    # (``admitted_before``): left out
    admitted_before: tuple[str, ...] = ()


@dataclass(frozen=True)
class KubeletUnreadable:
    """kubelet's PodResources socket is there but ``List`` failed (``reason``): kubelet is (or
    was) running, and who it admits is not known."""

    reason: str


@dataclass(frozen=True)
class KubeletSightings:
    """Which pods one kubelet instance listed, from which of the plugin's ``List`` reads on.

    ``instance`` names the kubelet that answered (its PodResources socket file: a restarted
    kubelet makes a new one); ``first`` maps each listed pod (``namespace/name``) to the first
    read of its present, unbroken listing; ``known`` maps it to the UID the plugin knew for it
    and the first read of its listing under that UID.  Reads are numbered from 1 per instance.
    """

    instance: str = ""
    reads: int = 0
    first: Mapping[str, int] = field(default_factory=dict)
    known: Mapping[str, tuple[str, int]] = field(default_factory=dict)


def sight(
    before: KubeletSightings, instance: str, listed: Collection[str], uids: Mapping[str, str]
) -> KubeletSightings:
    """``before`` updated with one more ``List`` read: ``listed`` the pods it returned,
    ``uids`` the UID the plugin knew for each then (missing or "": not known), ``instance``
    the kubelet that answered ("" when not known for sure: everything is forgotten).  A pod no
    longer listed is forgotten, so listed again it starts anew; so is a pod whose UID changed.
    Another instance starts from nothing (kubelet's pod manager starts empty)."""
    if not instance or instance != before.instance:
        before = KubeletSightings(instance=instance)
    if not instance:
        return before
    read = before.reads + 1
    first: dict[str, int] = {}
    known: dict[str, tuple[str, int]] = {}
    for key in listed:
        first[key] = before.first.get(key, read)
        uid = uids.get(key, "")
        if not uid:
            continue
        was = before.known.get(key)
        known[key] = was if was is not None and was[0] == uid else (uid, read)
    return KubeletSightings(instance, read, first, known)


def admitted_before(sightings: KubeletSightings, holder: HolderKey) -> dict[str, str]:
    """The pods (``namespace/name`` -> UID) kubelet listed in a read that did not list the
    ``holder``, as far as its present listing goes back: kubelet admitted each of them before
    it held the holder.

    kubelet adds a pod to its pod manager, then admits it, one pod after the other in its sync
    loop (``kubelet.go`` ``HandlePodAdditions``: ``podManager.AddPod`` then ``canAdmitPod``,
    v1.31.9 lines 2547, 2583-2594; v1.37.2 lines 2893, 2923), and ``List`` answers from the pod
    manager (``apis/podresources/server_v1.go``, v1.31.9 line 58, v1.37.2 lines 68-72).  A pod
    listed while the holder was not had been added, so its admission ended before the holder
    was added; it is not the pod in admission while the holder is listed.  Empty while the
    holder was never listed by this instance."""
    since = sightings.first.get(holder)
    if since is None:
        return {}
    return {
        key: uid for key, (uid, read) in sightings.known.items() if read < since and key != holder
    }


def _calls_no_more(spec: PodJSON, uid: str | None) -> bool:
    """Whether a pod kubelet admitted earlier (``admitted_before``: its UID then) makes no more
    Allocate calls: the same pod (UID) and a spec never changed since its creation
    (``metadata.generation`` 1, which the API server counts up on every spec change from 1.33,
    ``pkg/registry/core/pod/strategy.go`` ``updatePodGeneration``, v1.33.13 line 1042,
    v1.37.2 line 1033; absent at v1.31.9), so kubelet has no resize of it to admit (an in-place
    resize is admitted through the admit handlers again, device plugin Allocate included, from
    the pod worker: ``kubelet.go`` ``canResizePod``, v1.31.9 line 2795 with the alpha gate on,
    v1.33.13 line 2912; from 1.37 the device manager ignores it,
    ``cm/devicemanager/manager.go`` ``Allocate``, v1.37.2 line 394).  kubelet's pod worker does
    not call Allocate either: the plugin registers with ``PreStartRequired`` and kubelet then
    fails the start of a container without a device record before it would call Allocate
    (``GetDeviceRunContainerOptions``: ``callPreStartContainerIfNeeded`` before
    ``needsReAllocate``, v1.31.9 lines 949, 963, 994; v1.37.2 lines 990, 1004, 1037).

    The API server raises ``metadata.generation`` once more when it first sets a pod's
    ``deletionTimestamp`` (a graceful deletion; a shorter grace period later does not raise it
    again): ``BeforeDelete`` in ``staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go``,
    v1.37.2 lines 166-172 (it raises any ``generation`` above 0, so pods from 1.33).  So a
    Terminating pod is unchanged at generation 2.

    A pod without ``metadata.generation`` (an API server before 1.33 sets none:
    ``strategy.go`` at v1.31.9 and v1.32.9 has no ``Generation``) counts as unchanged only while
    kubelet shows it admits no resize (``_kubelet_resizes_nothing``)."""
    meta = spec.get("metadata") or {}
    if not uid or str(meta.get("uid") or "") != uid:
        return False
    generation = meta.get("generation")
    if generation is None:
        return _kubelet_resizes_nothing(spec)
    # the first graceful deletion raises it once more (``BeforeDelete``, docstring)
    unchanged = 2 if meta.get("deletionTimestamp") else 1
    return bool(generation == unchanged)


def _kubelet_resizes_nothing(pod: PodJSON) -> bool:
    """Whether the kubelet that reported ``pod``'s container statuses admits no in-place resize:
    it reports every container's ``resources`` in its status exactly when its
    ``InPlacePodVerticalScaling`` gate is on (``kubelet_pods.go``
    ``convertToAPIContainerStatuses``, v1.32.9 lines 2346-2347; at 1.31 only a running
    container's, v1.31.9 lines 2303-2305), and with the gate off it never resizes a pod
    (``kubelet.go`` ``SyncPod``: v1.31.9 line 1943 checks the gate; v1.32.9 line 1881 through
    ``kuberuntime.IsInPlacePodVerticalScalingAllowed``, ``kuberuntime_manager.go`` line 551).
    The gate is alpha and off by default up to 1.32 (``pkg/features/kube_features.go``, v1.31.9
    line 1240; ``pkg/features/versioned_kube_features.go``, v1.32.9 line 409).  False without
    container statuses (nothing reported yet)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all(
        isinstance(status, dict) and "resources" not in status for status in statuses
    )


# How long a pod kubelet lists but the API server does not know (a static pod without a mirror
# pod, or one whose mirror pod is not written yet) may count as a pod kubelet is admitting.
# kubelet admits a pod right after adding it to its pod manager (kubelet.go HandlePodAdditions,
# v1.31.9 lines 2547-2594, v1.37.2 lines 2893-2923); its first Allocate comes to this plugin,
# which answers within ``deviceplugin.admission`` API_RETRY_S + RELEASE_INLINE_S (35 s), and a
# refusal ends the admission.  60 s covers that with margin; after it, the pod is one kubelet
# already admitted or rejected (it is never the holder, whose spec is known).
UNKNOWN_POD_WAIT_S = 60.0


def kubelet_admitting(
    listed: Sequence[KubeletPod],
    specs: Mapping[str, PodJSON | None],
    holder: HolderKey,
    served_pods: Collection[str],
    ctx: Context,
    *,
    holder_pod: PodJSON | None = None,
    recorded: KubeletRecords | None = None,
    unknown_for_s: Mapping[str, float] | None = None,
    earlier: Mapping[str, str] | None = None,
) -> KubeletAdmission:
    """Read kubelet's PodResources ``List`` for the pods it may be admitting.

    kubelet adds a pod to its pod manager just before admitting it (kubelet.go
    HandlePodAdditions), and a container's devices are listed once its Allocate was answered
    (cm/devicemanager/manager.go, ``podDevices.insert``).  Which pods ``List`` returns depends on
    the kubelet: from 1.34 with the default gate ``KubeletPodResourcesListUseActivePods`` only
    active pods; on 1.32/1.33, and on 1.34+ with the gate off, every pod in the pod manager,
    rejected and finished ones included, with their containers listed without devices
    (apis/podresources/server_v1.go).  The rule below holds for both, so it does not read the
    kubelet version.  ``listed`` is kubelet's answer, ``specs`` each listed pod by
    ``namespace/name`` as this plugin knows it (None: the API server has no such pod),
    ``holder`` the lock holder, ``recorded`` kubelet's device checkpoint (pod UID -> containers
    it records devices of ``ctx.resource`` for; None: not read).

    A listed pod counts as possibly waiting (``others``) unless it is finished (phase Succeeded
    or Failed, which covers a pod kubelet rejected, or every container terminated), asks for
    no ``ctx.resource`` from the device plugin (none, or all of it through DRA), or kubelet
    records devices for each of its GPU containers (``List`` or ``recorded``).  GPUs only in
    init containers (which ``List`` leaves out) count while the pod's status shows it in
    handoff.  A pod this plugin served counts like any other (``served_pods`` is not trusted
    alone: a kubelet that restarted without its checkpoint calls Allocate for it again).  An
    unknown pod counts for ``UNKNOWN_POD_WAIT_S`` after the plugin first saw it listed
    (``unknown_for_s``; absent: just now), then it is left out (``ignored_unknown``).  This errs
    towards refusing, never towards serving another pod the holder's devices.  The holder
    counts as listed only while it may still await devices by ``holder_pod`` (its spec) too:
    a holder kubelet already gave all its GPUs is not the pod it asks about now.

    A pod that kubelet admitted before it held the holder (``earlier``, from
    ``admitted_before``: ``namespace/name`` -> UID) and that makes no more Allocate calls
    (``_calls_no_more``: the same UID, its spec never changed) does not count either, with or
    without device records (``admitted_before`` in the answer): it is a pod whose devices a
    kubelet restarted without its checkpoint lost, still running on them.  Its spec must have
    been read after kubelet called (a spec changed before the call shows).
    """
    del served_pods  # kubelet's own record decides (docstring)
    holder_listed = False
    others: list[str] = []
    ignored: list[str] = []
    before: list[str] = []
    earlier = earlier or {}
    ages = unknown_for_s or {}
    for entry in listed:
        if entry.key == holder:
            holder_listed = holder_pod is None or _may_await(
                entry, holder_pod, ctx, recorded=recorded
            )
            continue
        spec = specs.get(entry.key)
        if spec is None:
            age = ages.get(entry.key, 0.0)
            if age >= UNKNOWN_POD_WAIT_S:
                ignored.append(entry.key)
            else:
                others.append(
                    f"{entry.key} (unknown to the API server, listed by kubelet for {age:.0f} s; "
                    f"counted for at most {UNKNOWN_POD_WAIT_S:.0f} s)"
                )
            continue
        if _may_await(entry, spec, ctx, recorded=recorded):
            if entry.key in earlier and _calls_no_more(spec, earlier[entry.key]):
                before.append(entry.key)
            else:
                others.append(entry.key)
    return KubeletAdmission(
        holder_listed, tuple(sorted(others)), tuple(sorted(ignored)), tuple(sorted(before))
    )


def unknown_listed(
    first_seen: Mapping[str, float],
    unknown: Collection[str],
    now: float,
    *,
    same_kubelet: bool = True,
) -> tuple[dict[str, float], dict[str, float]]:
    """When each listed pod unknown to the API server was first seen, and for how long, at
    ``now``: ``first_seen`` keeps the earlier sightings of pods still unknown and listed;
    a pod known again or no longer listed is forgotten (listed unknown again, it starts anew).
    Another kubelet instance (``same_kubelet`` False: its socket file changed, or is not known
    for sure) starts from nothing, as ``sight`` does: a restarted kubelet admits its static
    pods again, so one listed for minutes by the kubelet before is new to this one.
    Returns the new ``first_seen`` and the ages for ``kubelet_admitting``'s ``unknown_for_s``."""
    if not same_kubelet:
        first_seen = {}
    seen = {key: first_seen.get(key, now) for key in unknown}
    return seen, {key: max(0.0, now - since) for key, since in seen.items()}


def kubelet_records(answers: Sequence[PluginAnswer]) -> dict[str, set[str]]:
    """kubelet's device checkpoint entries of one resource as ``KubeletRecords``: pod UID ->
    the containers it records devices for (an entry without devices records none)."""
    out: dict[str, set[str]] = {}
    for answer in answers:
        if answer.kubelet_devices:
            out.setdefault(answer.pod_uid, set()).add(answer.container)
    return out


def _done_with_devices(spec: PodJSON) -> bool:
    """Whether kubelet is done with the pod's devices for good: phase Succeeded or Failed (a
    pod kubelet rejected is Failed, kubelet.go ``rejectPod``), or every container status (init
    containers included) is terminated and the restart policy starts none again (``Never``, or
    ``OnFailure`` with every exit code 0).  kubelet does not admit a
    pod of a terminal phase again (kubelet.go HandlePodAdditions, ``IsPodPhaseTerminal``)."""
    status = spec.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    statuses = [
        s
        for key in ("initContainerStatuses", "containerStatuses")
        for s in status.get(key) or []
        if isinstance(s, Mapping)
    ]
    if not statuses or len(status.get("containerStatuses") or []) == 0:
        return False
    ended = [s["state"]["terminated"] for s in statuses if _terminated(s)]
    if len(ended) != len(statuses):
        return False
    policy = str((spec.get("spec") or {}).get("restartPolicy") or "Always")
    if policy == "Never":
        return True
    # OnFailure restarts a failed container, Always every one: kubelet may start them again
    return policy == "OnFailure" and all(
        isinstance(t, Mapping) and t.get("exitCode") == 0 for t in ended
    )


def _terminated(status: Mapping[str, Any]) -> bool:
    state = status.get("state")
    return isinstance(state, Mapping) and isinstance(state.get("terminated"), Mapping)


def _device_plugin_containers(spec: PodJSON, resource: str) -> list[ContainerName]:
    """The pod's containers that get ``resource`` from a device plugin: those asking for it,
    less those whose request kubelet leaves to a DRA driver (``status.extendedResourceClaimStatus
    .requestMappings``, cm/devicemanager/manager.go ``isDRAExtendedResource``, v1.37.2).
    Raises ``ValueError`` for a request that does not parse."""
    wanted = [c for c, _ in gpu_containers(spec, resource)]
    claim = (spec.get("status") or {}).get("extendedResourceClaimStatus") or {}
    mappings = claim.get("requestMappings") if isinstance(claim, Mapping) else None
    dra = {
        str(m.get("containerName"))
        for m in mappings or []
        if isinstance(m, Mapping) and m.get("resourceName") == resource
    }
    return [c for c in wanted if c not in dra]


def _may_await(
    entry: KubeletPod, spec: PodJSON, ctx: Context, *, recorded: KubeletRecords | None = None
) -> bool:
    """Whether a pod kubelet lists may still be waiting for devices of ``ctx.resource``
    (``kubelet_admitting`` states the rule)."""
    if _done_with_devices(spec):
        return False
    try:
        names = _device_plugin_containers(spec, ctx.resource)
    except ValueError:
        return True  # kubelet parses it its own way
    if not names:
        return False
    uid = str((spec.get("metadata") or {}).get("uid") or "")
    mine = recorded.get(uid) if recorded is not None and uid else None
    if mine is not None and all(c in mine for c in names):
        return False
    if any(c in entry.containers and not entry.containers[c] for c in names):
        return True
    init_only = not any(c in entry.containers for c in names)
    return init_only and handoff_status(spec, uid=uid, node=ctx.node).in_handoff


def _complete(plan: _Plan) -> HandoffProgress:
    """The whole progress with the devices of every served container, filled in from the
    assignment where unrecorded (only checkpoints of whole GPUs written before ``given`` was
    kept lack them)."""
    whole = plan.whole if plan.whole is not None else plan.progress
    assigned = dict(plan.order)
    given = tuple(
        g if (g := whole.devices_of(i)) is not None else tuple(assigned.get(c, ()))
        for i, c in enumerate(whole.served)
    )
    return replace(whole, given=given)


def _all_served(pod: PodJSON | None, progress: HandoffProgress, ctx: Context) -> bool:
    """Whether ``progress`` served every container of the pod that asks for any resource this
    plugin serves (the lock is released then)."""
    served = {(c, progress.resource_at(i)) for i, c in enumerate(progress.served)}
    for resource in ctx.resources():
        try:
            wanted = gpu_containers(pod or {}, resource)
        except ValueError:
            continue  # refused when kubelet asks for it
        if any((c, resource) not in served for c, _ in wanted):
            return False
    return True


def decide_preferred(
    view: NodeLockView | None,
    pod: PodJSON | None,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    progress: HandoffProgress | None,
    ctx: Context,
    *,
    recorded: KubeletRecords | None = None,
    kubelet: KubeletAdmission | KubeletUnreadable | None = None,
    bound_here: Sequence[PodJSON] = (),
) -> Preference:
    """Answer one GetPreferredAllocation container request.

    A hit is the holder's next GPU container's assignment when its size equals ``size``, every
    assigned device is available to kubelet, and kubelet is admitting no other pod than the
    holder by the rule Allocate follows (``another_pod_may_be_admitted``, same sources:
    ``kubelet``, or ``bound_here`` and ``recorded`` without a PodResources socket); anything
    else gets a hint from the available set (``must_include`` first, then the rest in sorted
    order), which kubelet may use as it likes, so kubelet is never steered to the holder's
    devices for another pod.  The next container is judged as in ``decide_allocate``:
    ``recorded`` is kubelet's device checkpoint (``kubelet_confirmed``).
    """
    plan = _verify(view, pod, progress, ctx, recorded=recorded)
    reason = ""
    if not isinstance(plan, Refusal):
        another = another_pod_may_be_admitted(
            plan.pod,
            plan.holder.uid,
            ctx,
            kubelet=kubelet,
            bound_here=bound_here,
            recorded=recorded,
        )
        plan = another if another is not None else plan
    if isinstance(plan, Refusal):
        reason = plan.message
    elif plan.next is None:
        reason = f"every GPU container of {plan.pod} was already served"
    else:
        container, assigned = plan.next
        pool = plan.pool()
        offered = set(available) | set(must_include)
        outside = sorted(set(must_include) - set(pool))
        # kubelet already took ``must_include`` from the pod's reuse pool; fill up from the pool
        choice = [d for d in pool if d in set(must_include)]
        choice += [d for d in plan.expected() if d in offered and d not in choice]
        choice += [d for d in pool if d in offered and d not in choice]
        if len(assigned) != size:
            reason = (
                f"asked for {size} devices, container {container!r} is assigned {len(assigned)}"
            )
        elif outside:
            reason = f"kubelet must include {outside}, which are not the pod's devices to reuse"
        elif len(choice) < size:
            reason = (
                f"the pod's devices {list(pool)} not held by its other containers are not "
                f"available (available: {sorted(offered)})"
            )
        else:
            return Preference(devices=tuple(choice[:size]), hit=True)
    return Preference(devices=hint(available, must_include, size), hit=False, reason=reason)


def hint(available: Sequence[str], must_include: Sequence[str], size: int) -> tuple[DeviceID, ...]:
    """``must_include`` then the other available devices in sorted order, at most ``size``."""
    out: list[DeviceID] = []
    for dev in [*must_include, *sorted(available)]:
        if len(out) >= max(size, 0):
            break
        if dev not in out:
            out.append(DeviceID(dev))
    return tuple(out)


def handoff_abandoned(pod: PodJSON | None, progress: HandoffProgress, node: NodeName) -> bool:
    """Whether the pod of an interrupted handoff can no longer ask for its next container.

    ``handoff.holder`` decides: True when the pod has left the handoff (gone or replaced under
    its name, bound elsewhere or never bound, admitted by kubelet, finished).  A pod still
    Pending on this node and not admitted may yet ask (kubelet restarted mid-admission, or it
    admits a pod being deleted before stopping it), and so may one of phase Unknown: False.
    """
    return not handoff_status(pod, uid=progress.uid, node=node).in_handoff


@dataclass(frozen=True)
class EndedHolder:
    """The node lock's holder, seen ended: release its lock with ``end.outcome``."""

    holder: Holder
    token: FencingToken
    end: Ended


def holder_ended(
    view: NodeLockView | None,
    pod: PodJSON | None,
    *,
    seen_gone: bool,
    pending_tokens: Collection[FencingToken],
    failed_before_gone: bool = False,
) -> EndedHolder | None:
    """Whether the lock in ``view`` is held by a pod that has ended for good
    (``handoff.holder.ended``: Failed, Succeeded, or deleted), from the holder's pod as the
    node's pod watch shows it (``pod``; None: not there), whether the watch saw that UID
    deleted, and Failed before (``failed_before_gone``).  None when the lock is free, when a
    release of its token is already pending (``pending_tokens``: this plugin decided it
    already), or when the holder may still be admitted.  Whether the plugin may release it now
    is ``handoff.holder.released_by_plugin``'s to say.  Such a holder is never served, so no
    handoff would release its lock before expiry (issue 52: kubelet rejects the holder it
    admits before the plugin has reported its devices after a kubelet restart).  The release
    is fenced by ``token``: a lock that moved on meanwhile changes nothing.
    """
    if view is None or view.record.holder is None:
        return None
    token = view.record.token
    if token in pending_tokens:
        return None
    holder = view.record.holder
    end = ended(
        None if pod is None else pod_facts(pod),
        uid=holder.uid,
        seen_gone=seen_gone,
        failed_before_gone=failed_before_gone,
    )
    return None if end is None else EndedHolder(holder, token, end)
