"""How many GPUs a pod needs, and which of its devices each container gets (pure).

A pod's GPU need is what kubelet's device manager will actually hand out, not only the sum of
requests: non-restartable init containers run one after another and their devices are put in a
per-pod *reuse pool* that later containers draw from first; restartable init containers
(sidecars) keep their devices for the pod's life; app containers run together and each takes
devices of its own.  ``plan_slots`` replays that walk on abstract device *slots* (0, 1, 2, …), so
the slot count is the number of distinct GPUs the pod occupies (for plain pods this is Kubernetes'
effective request, max(largest init request, sum of app requests)), and mapping slots to real
device IDs gives an assignment kubelet can reproduce: init containers get a subset of the devices
that app containers get, app containers get disjoint sets.

Guarantee: deterministic for equal inputs; every malformed resource value raises ``BadPod`` with
a message naming the container and the value.
Non-guarantee: when a container needs fewer devices than the reuse pool holds, kubelet takes an
arbitrary subset of the pool (Go map order, no GetPreferredAllocation call); the plan takes the
lowest slots, so the device plugin must accept any subset of the pod's own reuse pool there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

from handoff.placement import NO_WISHES, Wishes, parse_wishes
from handoff.sharing import BadShare, Slice, pod_slices, shares, slot_slices
from handoff.wire import ContainerName, Keys

_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
MAX_GPUS_PER_CONTAINER = 1024


class BadPod(ValueError):
    """The pod object is not shaped like a v1.Pod, or a GPU request is not a whole number."""


class ContainerKind(StrEnum):
    """Where a container runs in the pod's life, which decides how kubelet reuses its devices."""

    INIT = "init"  # runs to completion before the next; its devices go to the reuse pool
    SIDECAR = "sidecar"  # restartable init container: keeps its devices while the pod runs
    APP = "app"


@dataclass(frozen=True)
class ContainerNeed:
    """One container's GPU request."""

    name: ContainerName
    count: int
    kind: ContainerKind


@dataclass(frozen=True)
class PodNeed:
    """A pod's GPU requests and the device slots kubelet will give each container.

    ``total`` is the number of distinct GPUs the pod occupies; ``plan`` lists, for every
    container that requests GPUs, in kubelet's order (init containers first), its slots;
    ``wishes`` are the pod's placement annotations (``handoff.placement``).
    """

    containers: tuple[ContainerNeed, ...]
    total: int
    plan: tuple[tuple[ContainerName, tuple[int, ...]], ...]
    wishes: Wishes = NO_WISHES
    slices: tuple[Slice, ...] = ()  # per slot, when the pod asks for slices (handoff.sharing)
    problem: str = ""  # a sharing request no node can honour: every node fails with this reason

    @property
    def wants_gpus(self) -> bool:
        return self.total > 0 or bool(self.problem)


NO_GPUS = PodNeed(containers=(), total=0, plan=())


def parse_quantity(raw: object, *, what: str) -> int:
    """Parse a Kubernetes quantity that must be a non-negative whole number (extended resources)."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise BadPod(f"{what}: quantity must be a string, got {raw!r}")
    text = str(raw)
    match = _QUANTITY.match(text)
    if match is None:
        raise BadPod(f"{what}: {text!r} is not a Kubernetes quantity")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            value = Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        else:
            value = Decimal(number) * _SUFFIX[suffix]
    except (InvalidOperation, ValueError, OverflowError) as exc:
        raise BadPod(f"{what}: {text!r} is not a Kubernetes quantity") from exc
    if value < 0 or value != value.to_integral_value():
        raise BadPod(f"{what}: {text!r} must be a non-negative whole number")
    if value > MAX_GPUS_PER_CONTAINER:
        raise BadPod(f"{what}: {text!r} is more than {MAX_GPUS_PER_CONTAINER} devices")
    return int(value)


def _container_count(container: Mapping[str, Any], resource: str, *, where: str) -> int:
    resources = container.get("resources")
    resources = {} if resources is None else resources
    if not isinstance(resources, Mapping):
        raise BadPod(f"{where}: resources must be an object")
    requests = resources.get("requests")
    limits = resources.get("limits")
    requests = {} if requests is None else requests
    limits = {} if limits is None else limits
    if not isinstance(requests, Mapping) or not isinstance(limits, Mapping):
        raise BadPod(f"{where}: resources.requests and resources.limits must be objects")
    # The API server defaults requests to limits for extended resources and requires them to be
    # equal when both are set; fall back to limits for objects that were never defaulted.
    if resource in requests:
        return parse_quantity(requests[resource], what=f"{where} requests[{resource}]")
    if resource in limits:
        return parse_quantity(limits[resource], what=f"{where} limits[{resource}]")
    return 0


def _containers(spec: Mapping[str, Any], field: str) -> Sequence[Mapping[str, Any]]:
    items = spec.get(field)
    items = [] if items is None else items
    if not isinstance(items, list):
        raise BadPod(f"spec.{field} must be a list")
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise BadPod(f"spec.{field}[{i}] must be an object")
        if not isinstance(item.get("name"), str) or not item.get("name"):
            raise BadPod(f"spec.{field}[{i}].name must be a non-empty string")
    return items


def container_needs(pod: Mapping[str, Any], resource: str) -> tuple[ContainerNeed, ...]:
    """Every container's request of ``resource`` in kubelet's order: init containers, then apps."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise BadPod("pod has no spec object")
    out: list[ContainerNeed] = []
    for c in _containers(spec, "initContainers"):
        kind = ContainerKind.SIDECAR if c.get("restartPolicy") == "Always" else ContainerKind.INIT
        name = str(c["name"])
        count = _container_count(c, resource, where=f"init container {name!r}")
        out.append(ContainerNeed(ContainerName(name), count, kind))
    apps = _containers(spec, "containers")
    if not apps:
        raise BadPod("spec.containers must list at least one container")
    for c in apps:
        name = str(c["name"])
        count = _container_count(c, resource, where=f"container {name!r}")
        out.append(ContainerNeed(ContainerName(name), count, ContainerKind.APP))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise BadPod("container names must be unique across initContainers and containers")
    return tuple(out)


def plan_slots(containers: Sequence[ContainerNeed]) -> PodNeed:
    """Replay kubelet's device manager on abstract slots (see the module docstring)."""
    pool: list[int] = []  # reuse pool, kept sorted
    next_slot = 0
    plan: list[tuple[ContainerName, tuple[int, ...]]] = []
    for c in containers:
        if c.count == 0:
            continue
        reused = pool[: c.count]
        fresh = list(range(next_slot, next_slot + c.count - len(reused)))
        next_slot += len(fresh)
        slots = tuple(reused + fresh)
        plan.append((c.name, slots))
        if c.kind is ContainerKind.INIT:
            pool = sorted(set(pool) | set(slots))
        else:
            pool = [s for s in pool if s not in slots]
    return PodNeed(containers=tuple(containers), total=next_slot, plan=tuple(plan))


def pod_need(pod: Mapping[str, Any], resource: str, keys: Keys | None = None) -> PodNeed:
    """The pod's GPU need for ``resource`` (``NO_GPUS`` when no container asks for it), with its
    placement wishes read from annotations under ``keys`` (a malformed one raises ``BadPod``)."""
    needs = container_needs(pod, resource)
    try:  # shared GPUs: memory/core slices per slot; a bad request fails the pod's filter
        slices = pod_slices(pod, resource=resource)
    except BadShare as exc:  # (not BadPod: kube-scheduler shows a filter's reasons, not a 400's)
        return replace(plan_slots(needs), problem=str(exc))
    if not any(c.count for c in needs):
        return NO_GPUS
    need = plan_slots(needs)
    if shares(slices.values()):
        need = replace(need, slices=slot_slices(slices, need.plan))
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping) or not annotations:
        return need
    try:
        wishes = parse_wishes(annotations, keys or Keys())
    except ValueError as exc:
        raise BadPod(str(exc)) from exc
    return need if wishes == NO_WISHES else replace(need, wishes=wishes)
