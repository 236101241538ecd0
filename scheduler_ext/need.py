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

MIG instances (``nvidia.com/mig-<profile>``) are planned the same way, one walk per profile
(``PodNeed.mig``, ``scheduler_ext.mig``): kubelet keeps a reuse pool per resource.

Each container's count is read by ``handoff.request`` (the parser the device plugin uses too).
Guarantee: deterministic for equal inputs; every malformed resource value raises ``BadPod`` with
a message naming the container and the value.
Non-guarantee: when a container needs fewer devices than the reuse pool holds, kubelet takes an
arbitrary subset of the pool (Go map order, no GetPreferredAllocation call); the plan takes the
lowest slots, so the device plugin must accept any subset of the pod's own reuse pool there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from handoff.placement import NO_WISHES, Wishes, parse_wishes
from handoff.request import BadPod, ContainerKind, ContainerNeed, container_needs
from handoff.sharing import BadShare, Slice, pod_slices, shares, slot_slices
from handoff.wire import MIG_RESOURCE_PREFIX, ContainerName, Keys, mig_profile_of
from scheduler_ext.mig import MigNeed


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
    mig: tuple[MigNeed, ...] = ()  # MIG instances, per profile (``scheduler_ext.mig``)

    @property
    def wants_gpus(self) -> bool:
        """Whether the pod asks for GPUs of any kind (whole, slices or MIG instances)."""
        return self.total > 0 or bool(self.problem) or bool(self.mig)


NO_GPUS = PodNeed(containers=(), total=0, plan=())


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
    mig = mig_needs(pod)
    try:  # shared GPUs: memory/core slices per slot; a bad request fails the pod's filter
        slices = pod_slices(pod, resource=resource)
    except BadShare as exc:  # (not BadPod: kube-scheduler shows a filter's reasons, not a 400's)
        return replace(plan_slots(needs), problem=str(exc))
    if not any(c.count for c in needs) and not mig:
        return NO_GPUS
    need = replace(plan_slots(needs), mig=mig)
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


NEED_MEMO_SIZE = 4096  # distinct (containers, init containers, annotations) kept by a NeedMemo


class NeedMemo:
    """``pod_need`` for one resource and one set of keys, remembered by what it reads: the
    pod's ``spec.initContainers``, ``spec.containers`` and ``metadata.annotations``.

    A pod's watch events mostly change its status or its node, never its containers, so the
    extender parses each pod's need once rather than once per event; pods made from one
    template share an entry.  Guarantees: the same result (or the same ``BadPod`` message) as
    ``pod_need`` on the same object; at most ``size`` entries, the least recently used dropped
    first; a pod whose parts do not serialize as JSON is parsed every time.  Not thread-safe.
    """

    def __init__(self, resource: str, keys: Keys, *, size: int = NEED_MEMO_SIZE) -> None:
        self.resource = resource
        self.keys = keys
        self._size = size
        self._kept: OrderedDict[bytes, PodNeed | str] = OrderedDict()  # str: BadPod's message
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._kept)

    def __call__(self, pod: Mapping[str, Any]) -> PodNeed:
        key = _need_inputs(pod)
        if key is None:
            return pod_need(pod, self.resource, self.keys)
        kept = self._kept.get(key)
        if kept is not None:
            self.hits += 1
            self._kept.move_to_end(key)
        else:
            self.misses += 1
            try:
                kept = pod_need(pod, self.resource, self.keys)
            except BadPod as exc:
                kept = str(exc)
            self._kept[key] = kept
            if len(self._kept) > self._size:
                self._kept.popitem(last=False)
        if isinstance(kept, str):
            raise BadPod(kept)
        return kept


def _need_inputs(pod: Mapping[str, Any]) -> bytes | None:
    """Everything ``pod_need`` reads of ``pod``, as JSON; None when it cannot be serialized (or
    has no spec or metadata object: ``pod_need`` then says what is wrong)."""
    spec, meta = pod.get("spec"), pod.get("metadata")
    if not isinstance(spec, Mapping) or not isinstance(meta, Mapping):
        return None
    try:
        return orjson.dumps(
            (spec.get("initContainers"), spec.get("containers"), meta.get("annotations"))
        )
    except TypeError:
        return None


def mig_needs(pod: Mapping[str, Any]) -> tuple[MigNeed, ...]:
    """The pod's MIG requests, one per profile it asks for (sorted); raises ``BadPod`` for a
    ``nvidia.com/mig-`` resource whose name is no MIG profile."""
    spec = pod.get("spec")
    names: set[str] = set()
    if isinstance(spec, Mapping):
        for group in ("initContainers", "containers"):
            for c in spec.get(group) or []:
                resources = c.get("resources") if isinstance(c, Mapping) else None
                if not isinstance(resources, Mapping):
                    continue
                for kind in ("limits", "requests"):
                    asked = resources.get(kind)
                    if isinstance(asked, Mapping):
                        names.update(
                            str(r) for r in asked if str(r).startswith(MIG_RESOURCE_PREFIX)
                        )
    out: list[MigNeed] = []
    for resource in sorted(names):
        profile = mig_profile_of(resource)
        if profile is None:
            raise BadPod(
                f"{resource} names no MIG profile (nvidia.com/mig-<g>g.<m>gb, e.g. "
                "nvidia.com/mig-1g.10gb)"
            )
        planned = plan_slots(container_needs(pod, resource))
        if planned.total:
            out.append(MigNeed(profile, resource, planned.total, planned.plan))
    return tuple(out)
