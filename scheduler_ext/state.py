"""Compact, typed state of the Kubernetes objects the extender caches (pure).

A watch delivers whole Node and Pod objects; the cache keeps only what filter, prioritize, bind and
the takeover check read, parsed once.  A malformed annotation never makes an object disappear:
the parse error is kept and shown (a node with a bad inventory takes no GPU pods, a pod with a bad
assignment is counted as holding unknown devices).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any

from handoff.holder import PodFacts, pod_facts
from handoff.request import BadPod, parse_quantity
from handoff.topology import NumaPolicy
from handoff.wire import (
    GPU,
    Assignment,
    Keys,
    MalformedAnnotation,
    parse_assignment,
    parse_inventory,
    parse_token,
)
from lockd.model import FencingToken, HolderKey, NodeName
from scheduler_ext.need import PodNeed, pod_need


class BadObject(ValueError):
    """An object from the API server lacks what identifies it (name, namespace, uid)."""


class PodPhase(StrEnum):
    """``status.phase`` of a pod."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"

    @property
    def terminal(self) -> bool:
        return self in (PodPhase.SUCCEEDED, PodPhase.FAILED)


@dataclass(frozen=True)
class PodState:
    """What the extender knows of one pod."""

    uid: str
    key: HolderKey  # namespace/name
    node: NodeName | None  # spec.nodeName; None until bound
    phase: PodPhase
    facts: PodFacts  # what ``handoff.holder`` classifies a lock holder by
    need: PodNeed | None  # None when the spec is malformed (``need_error`` says why)
    need_error: str | None
    assignment: Assignment | None
    assignment_error: str | None
    token: FencingToken | None
    resource_version: str

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[1]

    @property
    def quiet(self) -> bool:
        """Bound (or terminal), asks for no GPU of any kind (whole, slices, MIG; its spec
        parsed), names no device and carries no fencing token: a placed CPU pod, which no
        decision of the extender reads.  A pod not bound yet is never quiet, whatever it asks:
        kube-scheduler may still send it to the extender, and it may hold a node's lock."""
        return (
            (self.node is not None or self.phase.terminal)
            and self.need is not None
            and not self.need.wants_gpus
            and self.assignment is None
            and self.assignment_error is None
            and self.token is None
        )

    @property
    def holds_gpus(self) -> bool:
        """Bound, not terminal, and either assigned devices or asks for GPUs."""
        if self.node is None or self.phase.terminal:
            return False
        return (
            self.assignment is not None
            or self.assignment_error is not None
            or (self.need is not None and self.need.wants_gpus)
        )


@dataclass(frozen=True)
class NodeState:
    """What the extender knows of one node's GPUs."""

    name: NodeName
    devices: tuple[GPU, ...]
    allocatable: int | None  # kubelet's status.allocatable count; None when unreadable
    problem: str | None  # set when the node cannot take GPU pods (no or bad inventory)
    resource_version: str
    numa_policy: NumaPolicy = NumaPolicy.NONE  # label <prefix>topology-manager-policy

    @cached_property
    def whole(self) -> tuple[GPU, ...]:
        """The whole GPUs of ``devices`` (MIG instances are not GPUs): one tuple for the
        state's life, so the node pictures rebuilt from it share it (``topology._layout``
        computes the layout once per tuple)."""
        return (
            self.devices
            if all(not g.profile for g in self.devices)
            else tuple(g for g in self.devices if not g.profile)
        )

    @cached_property
    def instances(self) -> tuple[GPU, ...]:
        """The MIG instances of ``devices``."""
        return tuple(g for g in self.devices if g.profile)


def pod_state(
    obj: Mapping[str, Any],
    *,
    keys: Keys,
    resource: str,
    need_of: Callable[[Mapping[str, Any]], PodNeed] | None = None,
) -> PodState:
    """Parse a Pod object; raises ``BadObject`` only when it lacks name, namespace or uid.
    ``need_of`` (a ``NeedMemo`` for ``resource`` and ``keys``) stands for ``pod_need``."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise BadObject("pod has no metadata object")
    name, namespace, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
    if not (isinstance(name, str) and name and isinstance(namespace, str) and namespace):
        raise BadObject("pod metadata must carry name and namespace")
    if not isinstance(uid, str):
        raise BadObject("pod metadata must carry a uid")
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        annotations = {}
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    assert isinstance(spec, Mapping)
    assert isinstance(status, Mapping)
    node_name = spec.get("nodeName")
    try:
        phase = PodPhase(status.get("phase") or "Pending")
    except ValueError:
        phase = PodPhase.UNKNOWN
    need: PodNeed | None = None
    need_error: str | None = None
    try:
        need = need_of(obj) if need_of is not None else pod_need(obj, resource, keys)
    except BadPod as exc:
        need_error = str(exc)
    assignment: Assignment | None = None
    assignment_error: str | None = None
    raw = annotations.get(keys.assignment)
    if raw is not None:
        try:
            assignment = parse_assignment(str(raw), key=keys.assignment)
        except MalformedAnnotation as exc:
            assignment_error = str(exc)
    token: FencingToken | None = None
    raw_token = annotations.get(keys.token)
    if raw_token is not None:
        try:
            token = parse_token(str(raw_token), key=keys.token)
        except MalformedAnnotation:
            token = None
    return PodState(
        uid=uid,
        key=HolderKey(f"{namespace}/{name}"),
        node=NodeName(node_name) if isinstance(node_name, str) and node_name else None,
        phase=phase,
        facts=pod_facts(obj),
        need=need,
        need_error=need_error,
        assignment=assignment,
        assignment_error=assignment_error,
        token=token,
        resource_version=str(meta.get("resourceVersion", "")),
    )


def node_state(obj: Mapping[str, Any], *, keys: Keys, resource: str) -> NodeState:
    """Parse a Node object's GPU inventory and allocatable count."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise BadObject("node has no metadata.name")
    name = NodeName(str(meta["name"]))
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        annotations = {}
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    # kubelet reports a device plugin's resource only once the plugin registered: none means 0
    allocatable: int | None = 0
    alloc_map = status.get("allocatable")
    problem: str | None = None
    if isinstance(alloc_map, Mapping) and resource in alloc_map:
        try:
            allocatable = parse_quantity(alloc_map[resource], what=f"allocatable[{resource}]")
        except BadPod as exc:
            problem = f"node status: {exc}"
    devices: tuple[GPU, ...] = ()
    raw = annotations.get(keys.gpus)
    if raw is None:
        problem = problem or f"node has no GPU inventory (annotation {keys.gpus})"
    else:
        try:
            devices = tuple(
                sorted(parse_inventory(str(raw), key=keys.gpus), key=lambda g: (g.index, g.id))
            )
        except MalformedAnnotation as exc:
            problem = f"node's GPU inventory does not parse: {exc}"
        else:
            if len({g.id for g in devices}) != len(devices):
                problem = f"node's GPU inventory ({keys.gpus}) repeats a device ID"
                devices = ()
    numa_policy = NumaPolicy.NONE
    labels = meta.get("labels") or {}
    raw_policy = labels.get(keys.numa_policy) if isinstance(labels, Mapping) else None
    if raw_policy is not None:
        try:
            numa_policy = NumaPolicy(str(raw_policy))
        except ValueError:
            problem = problem or (
                f"node label {keys.numa_policy}={raw_policy!r} is not a topology manager policy "
                f"({', '.join(p.value for p in NumaPolicy)})"
            )
    return NodeState(
        name=name,
        devices=devices,
        allocatable=allocatable,
        problem=problem,
        resource_version=str(meta.get("resourceVersion", "")),
        numa_policy=numa_policy,
    )
