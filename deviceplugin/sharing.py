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

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import grpc

from deviceplugin.admission import Admission, PreferenceAsk
from deviceplugin.answer import ContainerAnswer
from deviceplugin.decide import Allocation, Refusal, RefusalKind
from deviceplugin.devices import DeviceState
from deviceplugin.servicer import (
    HEALTHY,
    UNHEALTHY,
    DevicePluginServicer,
    container_response,
    status_code,
)
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
    out: list[pb.Device] = []
    for g in gpus:
        for k in range(max(g.split, 1)):
            dev = pb.Device(ID=virtual_id(g.id, k), health=HEALTHY if g.healthy else UNHEALTHY)
            if g.numa is not None:
                dev.topology.nodes.add(ID=g.numa)
            out.append(dev)
    return out


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

    def __init__(self, admission: Admission, state: DeviceState) -> None:
        super().__init__(admission, state)  # whole GPUs only: MIG instances are never shared
        self._admission = admission
        self._state = state

    async def ListAndWatch(
        self,
        request: pb.Empty,
        context: grpc.aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse],
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        while True:
            version = self._state.version
            yield pb.ListAndWatchResponse(devices=virtual_devices(self.devices()))
            await self._state.wait_newer(version)

    async def GetPreferredAllocation(
        self,
        request: pb.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[
            pb.PreferredAllocationRequest, pb.PreferredAllocationResponse
        ],
    ) -> pb.PreferredAllocationResponse:
        reqs = list(request.container_requests)
        asks = [
            PreferenceAsk(
                available=list(fold(r.available_deviceIDs)),
                must_include=list(fold(r.must_include_deviceIDs)),
                size=r.allocation_size,
            )
            for r in reqs
        ]
        prefs = await self._admission.preferred(asks)
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=virtual_choice(
                        p.devices, list(r.available_deviceIDs), list(r.must_include_deviceIDs)
                    )
                )
                for p, r in zip(prefs, reqs, strict=True)
            ]
        )

    async def Allocate(
        self,
        request: pb.AllocateRequest,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        phys = physical_request([list(r.devices_ids) for r in request.container_requests])
        if isinstance(phys, Refusal):
            await context.abort(status_code(phys), phys.message)
        result = await self._admission.allocate(phys)
        if isinstance(result, Refusal):
            await context.abort(status_code(result), result.message)
        alloc, answer = result
        answer = with_limits(answer, alloc, self._state)
        return pb.AllocateResponse(container_responses=[container_response(answer)])
