"""The world the handoff's parts talk to, as plain data: an API server and its watches.

What is modelled, and nothing more:

- one ``resourceVersion`` counter for all objects; every change bumps it;
- Leases: create (409 if it exists), replace conditional on ``metadata.resourceVersion`` (409 on
  a stale one, 404 when gone), delete;
- Pods: create (a fresh UID; creation order is what kubelet sorts by), ``pods/binding`` with the
  UID as precondition (409 on another UID or an already bound pod, 404 when gone) whose
  ``metadata.annotations`` are merged onto the pod, status writes, owner edits, delete;
- Nodes: static, each with its GPU inventory annotation and ``status.allocatable``; a sharing
  node's inventory rows carry its split count S (``SPLIT``) and kubelet sees S virtual devices
  per GPU (``handoff.sharing``); a MIG node has one more GPU, in MIG mode: no row of its own,
  a row per instance (``MIG_LAYOUT``, with ``mig: {profile, parent}``) and one extended resource
  per profile (``docs/mig.md``);
- watches: one ordered log of every change; each subscriber reads it through its own cursor, so
  events arrive in order but as late as the model likes (``Watch.deliver``);
- a binding request in flight: sent at one step, applied by the server at a later one, answered
  at another.  The server may apply it after its client gave up: until ``REQUEST_TIMEOUT_S``
  after it was sent (kube-apiserver's ``--request-timeout``; a handler whose client went away
  still completes its storage write), as ``scheduler_ext.takeover.binding_may_still_land``
  assumes.

Not modelled: API server internals (admission chains, priority and fairness, etcd compaction and
410 Gone relists, bookmarks), object sizes, request latency beyond "late".
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from handoff.sharing import GPUMEM, virtual_id
from handoff.wire import GPU, DeviceID, Keys, format_inventory, resource_of
from kube.errors import Conflict, NotFound
from lockd.model import NodeName
from scheduler_ext.takeover import DEFAULT_REQUEST_TIMEOUT_S

JSON = dict[str, Any]

KEYS = Keys()
RESOURCE = "nvidia.com/gpu"
LEASE_NAMESPACE = "nodelock-system"
POD_NAMESPACE = "team"
REQUEST_TIMEOUT_S = DEFAULT_REQUEST_TIMEOUT_S  # kube-apiserver's --request-timeout default
GPU_MEMORY_MIB = 81_920
SPLIT = 2  # a sharing node's --gpu-split
# the instances of a MIG node's GPU in MIG mode: (profile, count, memory MiB of one)
MIG_LAYOUT: tuple[tuple[str, int, int], ...] = (("1g.10gb", 3, 10_240), ("2g.20gb", 2, 20_480))
MIG_RESOURCES = tuple(resource_of(profile) for profile, _, _ in MIG_LAYOUT)


class Kind:
    """Object kinds in the store (plain strings, for readable traces)."""

    POD = "Pod"
    LEASE = "Lease"
    NODE = "Node"


@dataclass(frozen=True)
class Event:
    """One watch event: what changed, as the object was after (or, deleted, before) the change."""

    seq: int
    kind: str
    type: str  # ADDED, MODIFIED, DELETED
    name: str  # pod key "namespace/name", or the Lease's / Node's name
    obj: JSON


@dataclass
class BindingRequest:
    """A ``pods/binding`` create sent by an extender and not answered yet.

    ``result`` is None until the server processes it: "ok", or the error it answered.
    ``deadline`` is the client's timeout: after it the client takes no answer (it reads the
    pod instead).  The server may still process the request until ``server_deadline``
    (``REQUEST_TIMEOUT_S`` after it was sent); after that it never lands.
    """

    rid: int
    pod_key: str
    uid: str
    node: NodeName
    annotations: dict[str, str]
    sent_at: float
    deadline: float
    task: int
    result: str | None = None
    error: Exception | None = None

    @property
    def server_deadline(self) -> float:
        return self.sent_at + REQUEST_TIMEOUT_S


def gpu_id(node: NodeName, index: int) -> DeviceID:
    return DeviceID(f"{node}-g{index}")


def kubelet_ids(node: NodeName, gpus: int, split: int) -> list[DeviceID]:
    """The device IDs kubelet sees: the GPUs, or ``split`` virtual devices of each."""
    if split <= 1:
        return [gpu_id(node, i) for i in range(gpus)]
    return [virtual_id(gpu_id(node, i), k) for i in range(gpus) for k in range(split)]


def mig_instances(node: NodeName, gpus: int) -> list[GPU]:
    """The instances of a MIG node's GPU in MIG mode (index ``gpus``, after its whole GPUs),
    as inventory rows: ``MIG-<node>-g<index>-<profile>-<k>``, in ``MIG_LAYOUT`` order."""
    parent = gpu_id(node, gpus)
    return [
        GPU(
            DeviceID(f"MIG-{parent}-{profile}-{k}"),
            gpus,
            "model-a",
            memory,
            0,
            healthy=True,
            profile=profile,
            parent=parent,
        )
        for profile, count, memory in MIG_LAYOUT
        for k in range(count)
    ]


def resource_of_device(device: str) -> str:
    """The resource a device ID of the model is advertised as (its MIG profile's, or GPUs')."""
    if not device.startswith("MIG-"):
        return RESOURCE
    return resource_of(device.rsplit("-", 2)[1])


def node_object(node: NodeName, gpus: int, split: int = 1, *, mig: bool = False) -> JSON:
    inventory = [
        GPU(gpu_id(node, i), i, "model-a", GPU_MEMORY_MIB, 0, healthy=True, split=split)
        for i in range(gpus)
    ]
    allocatable = {RESOURCE: str(gpus * max(split, 1))}
    if mig:
        instances = mig_instances(node, gpus)
        inventory += instances
        for resource in MIG_RESOURCES:
            allocatable[resource] = str(sum(1 for g in instances if g.resource == resource))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "annotations": {KEYS.gpus: format_inventory(inventory)}},
        "status": {"allocatable": allocatable},
    }


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    gpus: int
    init: bool = False
    memory_mib: int | None = None  # a slice of each GPU (``nvidia.com/gpumem``)
    mig: tuple[tuple[str, int], ...] = ()  # MIG instances: (profile, count)


# The pod shapes the model creates: name prefix -> containers (init containers first).
TEMPLATES: dict[str, tuple[ContainerSpec, ...]] = {
    "one": (ContainerSpec("main", 1),),
    "two": (ContainerSpec("main", 2),),
    "pair": (ContainerSpec("left", 1), ContainerSpec("right", 1)),
    # an init container with 2 GPUs and an app container with 1: kubelet hands the app container
    # one of the init container's devices, picked in arbitrary order (no GetPreferredAllocation)
    "init": (ContainerSpec("setup", 2, init=True), ContainerSpec("main", 1)),
    # slices of one GPU (sharing nodes only): two halves fit a GPU, two large ones do not
    "half": (ContainerSpec("main", 1, memory_mib=GPU_MEMORY_MIB // 2),),
    "large": (ContainerSpec("main", 1, memory_mib=GPU_MEMORY_MIB * 3 // 4),),
    # MIG instances (MIG nodes only): one instance; a whole GPU in one container and instances
    # of both profiles in the other (kubelet calls one Allocate per resource of a container)
    "mig": (ContainerSpec("main", 0, mig=(("1g.10gb", 1),)),),
    "mixed": (
        ContainerSpec("train", 1),
        ContainerSpec("side", 0, mig=(("1g.10gb", 1), ("2g.20gb", 1))),
    ),
}
SLICE_TEMPLATES = frozenset({"half", "large"})
MIG_TEMPLATES = frozenset({"mig", "mixed"})


def pod_object(name: str, template: str, *, node: NodeName | None = None) -> JSON:
    """A pod of ``template``; ``node`` set means created bound (it bypasses the scheduler)."""
    spec: JSON = {"containers": [], "schedulerName": "default-scheduler"}
    for c in TEMPLATES[template]:
        amounts = {RESOURCE: str(c.gpus)} if c.gpus else {}
        if c.memory_mib is not None:
            amounts[GPUMEM] = str(c.memory_mib)
        for profile, count in c.mig:
            amounts[resource_of(profile)] = str(count)
        container = {
            "name": c.name,
            "resources": {"limits": dict(amounts), "requests": dict(amounts)},
        }
        spec.setdefault("initContainers" if c.init else "containers", []).append(container)
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": POD_NAMESPACE, "annotations": {}},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


@dataclass
class Store:
    """The API server: objects, one resourceVersion counter, one ordered change log."""

    pods: dict[str, JSON] = field(default_factory=dict)
    leases: dict[NodeName, JSON] = field(default_factory=dict)
    nodes: dict[NodeName, JSON] = field(default_factory=dict)
    log: list[Event] = field(default_factory=list)
    version: int = 0
    uids: int = 0
    created: dict[str, int] = field(default_factory=dict)  # uid -> creation order
    inflight: list[BindingRequest] = field(default_factory=list)
    requests: int = 0
    # called with (request, pod after binding) when a binding lands: the S4 check hooks in here
    on_binding: Callable[[BindingRequest, JSON], None] | None = None
    # called with (node, lease before, lease after, writer) for every Lease write
    on_lease_write: Callable[[NodeName, JSON | None, JSON | None, str], None] | None = None
    # the server may apply a binding after its client gave up (False: dropped at the client's
    # timeout, as a search avoiding ``Hole.LATE_BINDING`` has it)
    late_bindings: bool = True

    # -- the one place that changes anything -------------------------------------------------

    def _commit(self, kind: str, type_: str, name: str, obj: JSON) -> JSON:
        self.version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.log.append(Event(len(self.log), kind, type_, name, copy.deepcopy(obj)))
        return copy.deepcopy(obj)

    # -- nodes -------------------------------------------------------------------------------

    def add_node(self, node: NodeName, gpus: int, split: int = 1, *, mig: bool = False) -> None:
        obj = node_object(node, gpus, split, mig=mig)
        self.nodes[node] = obj
        self._commit(Kind.NODE, "ADDED", node, obj)

    # -- leases ------------------------------------------------------------------------------

    def get_lease(self, node: NodeName) -> JSON:
        lease = self.leases.get(node)
        if lease is None:
            raise NotFound(404, "NotFound", f"leases {node} not found")
        return copy.deepcopy(lease)

    def list_leases(self) -> list[JSON]:
        return [copy.deepcopy(lease) for _, lease in sorted(self.leases.items())]

    def create_lease(self, body: JSON, *, writer: str) -> JSON:
        node = NodeName(str(body["metadata"]["name"]))
        if node in self.leases:
            raise Conflict(409, "AlreadyExists", f"leases {node} already exists")
        stored = copy.deepcopy(body)
        stored["metadata"].pop("resourceVersion", None)
        if self.on_lease_write is not None:
            self.on_lease_write(node, None, stored, writer)
        self.leases[node] = stored
        return self._commit(Kind.LEASE, "ADDED", node, stored)

    def replace_lease(self, node: NodeName, body: JSON, *, writer: str) -> JSON:
        current = self.leases.get(node)
        if current is None:
            raise NotFound(404, "NotFound", f"leases {node} not found")
        sent = body.get("metadata", {}).get("resourceVersion")
        if sent != current["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", f"leases {node}: resourceVersion {sent} is stale")
        stored = copy.deepcopy(body)
        if self.on_lease_write is not None:
            self.on_lease_write(node, current, stored, writer)
        self.leases[node] = stored
        return self._commit(Kind.LEASE, "MODIFIED", node, stored)

    def delete_lease(self, node: NodeName) -> None:
        lease = self.leases.pop(node, None)
        if lease is not None:
            if self.on_lease_write is not None:
                self.on_lease_write(node, lease, None, "hand")
            self._commit(Kind.LEASE, "DELETED", node, lease)

    # -- pods --------------------------------------------------------------------------------

    def create_pod(self, obj: JSON) -> JSON:
        meta = obj["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        if key in self.pods:
            raise Conflict(409, "AlreadyExists", f"pod {key} already exists")
        self.uids += 1
        uid = f"uid-{self.uids}"
        meta["uid"] = uid
        self.created[uid] = self.uids
        self.pods[key] = obj
        return self._commit(Kind.POD, "ADDED", key, obj)

    def get_pod(self, key: str) -> JSON:
        pod = self.pods.get(key)
        if pod is None:
            raise NotFound(404, "NotFound", f"pod {key} not found")
        return copy.deepcopy(pod)

    def pod_or_none(self, key: str) -> JSON | None:
        pod = self.pods.get(key)
        return copy.deepcopy(pod) if pod is not None else None

    def pod_by_uid(self, uid: str) -> JSON | None:
        for pod in self.pods.values():
            if pod["metadata"]["uid"] == uid:
                return pod
        return None

    def list_pods(self, *, node: NodeName | None = None) -> list[JSON]:
        return [
            copy.deepcopy(p)
            for _, p in sorted(self.pods.items())
            if node is None or p["spec"].get("nodeName") == node
        ]

    def send_binding(
        self,
        pod_key: str,
        uid: str,
        node: NodeName,
        annotations: Mapping[str, str],
        *,
        now: float,
        timeout_s: float,
        task: int,
    ) -> BindingRequest:
        self.requests += 1
        request = BindingRequest(
            self.requests, pod_key, uid, node, dict(annotations), now, now + timeout_s, task
        )
        self.inflight.append(request)
        return request

    def live_requests(self, now: float) -> list[BindingRequest]:
        """Binding requests the server may still process (sent, not processed, not past the
        server's request timeout: the client may have given up on them)."""
        return [r for r in self.inflight if r.result is None and now <= self._last_chance(r)]

    def _last_chance(self, request: BindingRequest) -> float:
        return request.server_deadline if self.late_bindings else request.deadline

    def apply_binding(self, request: BindingRequest) -> None:
        """The server processes a binding request (UID precondition, annotations merged)."""
        assert request.result is None
        self.inflight.remove(request)
        pod = self.pods.get(request.pod_key)
        if pod is None:
            request.result, request.error = "not-found", NotFound(404, "NotFound", "pod gone")
            return
        if pod["metadata"]["uid"] != request.uid:
            request.result = "conflict"
            request.error = Conflict(409, "Conflict", "Precondition failed: UID in precondition")
            return
        if pod["spec"].get("nodeName"):
            request.result = "conflict"
            request.error = Conflict(
                409,
                "Conflict",
                f"pod {request.pod_key} is already assigned to node {pod['spec']['nodeName']}",
            )
            return
        pod["spec"]["nodeName"] = request.node
        annotations = pod["metadata"].setdefault("annotations", {})
        annotations.update(request.annotations)
        request.result = "ok"
        if self.on_binding is not None:
            self.on_binding(request, pod)
        self._commit(Kind.POD, "MODIFIED", request.pod_key, pod)

    def expire_requests(self, now: float) -> list[BindingRequest]:
        """Drop requests the server did not process within its request timeout."""
        dead = [r for r in self.inflight if r.result is None and now > self._last_chance(r)]
        for r in dead:
            self.inflight.remove(r)
            r.result = "timed-out"
        return dead

    def write_pod_status(self, key: str, uid: str, status: JSON) -> bool:
        pod = self.pods.get(key)
        if pod is None or pod["metadata"]["uid"] != uid:
            return False
        pod["status"] = copy.deepcopy(status)
        self._commit(Kind.POD, "MODIFIED", key, pod)
        return True

    def edit_pod_annotations(self, key: str, annotations: Mapping[str, str]) -> bool:
        pod = self.pods.get(key)
        if pod is None:
            return False
        pod["metadata"].setdefault("annotations", {}).update(annotations)
        self._commit(Kind.POD, "MODIFIED", key, pod)
        return True

    def delete_pod(self, key: str) -> JSON | None:
        pod = self.pods.pop(key, None)
        if pod is not None:
            self._commit(Kind.POD, "DELETED", key, pod)
        return pod


@dataclass
class Watch:
    """One subscriber's view of the change log: in order, as late as the model says.

    ``kinds`` and ``only`` (a predicate on events) pick the events it wants; ``cursor`` is the
    position in the store's log up to which it has been delivered.  Subscribing (or
    resubscribing after a restart) starts from the end of the log: the subscriber LISTs first.
    """

    store: Store
    kinds: frozenset[str]
    only: Callable[[Event], bool] | None = None
    cursor: int = 0

    def restart(self) -> None:
        self.cursor = len(self.store.log)

    def wanted(self, event: Event) -> bool:
        return event.kind in self.kinds and (self.only is None or self.only(event))

    def backlog(self) -> int:
        return sum(1 for e in self.store.log[self.cursor :] if self.wanted(e))

    def deliver(self, limit: int | None = None) -> Iterator[Event]:
        """The next ``limit`` wanted events (all when None), advancing the cursor."""
        given = 0
        while self.cursor < len(self.store.log) and (limit is None or given < limit):
            event = self.store.log[self.cursor]
            self.cursor += 1
            if self.wanted(event):
                given += 1
                yield event
