"""The device plugin on a node that shares its GPUs (``--gpu-split S``, ``handoff.sharing``).

kubelet sees S virtual devices per GPU, ``<uuid>::<k>`` (k = 0..S-1), so it admits at most S
containers' slices per GPU; the scheduler extender's assignment names *physical* GPUs.  This
module translates at kubelet's edge and nowhere else: every decision (``deviceplugin.decide``)
is taken on physical GPUs, exactly as on a node without sharing.

- ListAndWatch: S virtual devices per GPU, each with its GPU's health and NUMA node.
- GetPreferredAllocation: kubelet's available virtual IDs are folded to their GPUs, the holder's
  assignment is decided on those, and the answer is a free virtual ID of exactly each assigned
  GPU (one kubelet must include first).
- Allocate: kubelet's virtual IDs are folded to their GPUs (two of one GPU in one container is
  refused: a container's N GPUs are distinct); the answer is the physical GPU(s), as without
  sharing, plus the container's limits as environment (``handoff.sharing.limit_envs``).

Guarantee: a container is never answered with a GPU other than its assignment's (the decision is
``decide_allocate``'s), and its limits are read from its pod's spec, which its owner cannot
change after creation (resources of extended resources are immutable).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from deviceplugin.answer import ContainerAnswer
from deviceplugin.decide import Allocation, Refusal, RefusalKind
from deviceplugin.devices import DeviceState
from deviceplugin.servicer import DevicePluginServicer, device_message
from handoff.sharing import (
    BadShare,
    check_split,
    container_slice,
    limit_envs,
    physical_of,
    virtual_id,
)
from handoff.wire import GPU, DeviceID
from proto import deviceplugin_v1beta1_pb2 as pb


class SplitDeviceState(DeviceState):
    """A ``DeviceState`` whose whole GPUs all carry the node's split count (so the published
    inventory says the node shares, and with which S); MIG instances are never split."""

    def __init__(self, split: int, gpus: Sequence[GPU] = ()) -> None:
        self.split = check_split(split)
        super().__init__(self._split(gpus))

    def _split(self, gpus: Sequence[GPU]) -> list[GPU]:
        return [g if g.profile else replace(g, split=self.split) for g in gpus]

    async def update(self, gpus: Sequence[GPU]) -> bool:
        return await super().update(self._split(gpus))


def virtual_devices(gpus: Sequence[GPU]) -> list[pb.Device]:
    """What kubelet is told: ``split`` virtual devices per GPU, in index order."""
    return [device_message(g, virtual_id(g.id, k)) for g in gpus for k in range(max(g.split, 1))]


def fold(ids: Sequence[str]) -> list[DeviceID]:
    """The distinct physical GPUs of ``ids``, first appearance first."""
    return list(dict.fromkeys(physical_of(d) for d in ids))


def physical_request(requests: Sequence[Sequence[str]]) -> list[list[str]] | Refusal:
    """kubelet's Allocate request on physical GPUs; refused when one container's virtual
    devices name one GPU twice."""
    out: list[list[str]] = []
    for ids in requests:
        phys = fold(ids)
        if len(phys) != len(ids):
            return Refusal(
                RefusalKind.BAD_REQUEST,
                f"Allocate gives one container several slices of one GPU ({sorted(ids)}); a "
                "container's GPUs must be distinct GPUs",
            )
        out.append(list(phys))
    return out


def virtual_choice(
    physical: Sequence[DeviceID], available: Sequence[str], must_include: Sequence[str]
) -> list[DeviceID]:
    """For each chosen GPU one of kubelet's virtual IDs of it: one kubelet must include first,
    else the lowest available; GPUs kubelet offers no slice of are left out."""
    out: list[DeviceID] = []
    for gpu in physical:
        mine = [d for d in must_include if physical_of(d) == gpu and d not in out]
        mine += sorted(d for d in available if physical_of(d) == gpu and d not in out)
        if mine:
            out.append(DeviceID(mine[0]))
    return out


def with_limits(answer: ContainerAnswer, alloc: Allocation, state: DeviceState) -> ContainerAnswer:
    """``answer`` plus the container's limit environment (none for a whole GPU)."""
    pod = alloc.pod or {}
    spec = pod.get("spec") or {}
    for group in ("initContainers", "containers"):
        for c in spec.get(group) or []:
            if c.get("name") != alloc.container:
                continue
            try:
                claim = container_slice(c)
            except BadShare:
                return answer  # the extender refuses such pods; nothing to limit here
            if claim is None:
                return answer
            by_id = {g.id: g for g in state.gpus}
            gpus = [by_id[d] for d in alloc.devices if d in by_id]
            return replace(answer, envs={**answer.envs, **limit_envs(claim, gpus)})
    return answer


class SharingServicer(DevicePluginServicer):
    """``DevicePluginServicer`` for a node that shares its GPUs (see the module docstring)."""

    def _devices(self) -> list[pb.Device]:
        return virtual_devices(self.devices())  # whole GPUs only: MIG instances are never shared

    def _physical_ids(self, ids: Sequence[str]) -> list[str]:
        return list(fold(ids))

    def _kubelet_ids(
        self, gpus: Sequence[DeviceID], request: pb.ContainerPreferredAllocationRequest
    ) -> list[str]:
        return list(
            virtual_choice(
                gpus, list(request.available_deviceIDs), list(request.must_include_deviceIDs)
            )
        )

    def _allocate_request(self, requests: list[list[str]]) -> list[list[str]] | Refusal:
        return physical_request(requests)

    def _container_answer(self, alloc: Allocation, answer: ContainerAnswer) -> ContainerAnswer:
        return with_limits(answer, alloc, self._state)
