"""The DevicePlugin gRPC service: translates between kubelet's messages and ``Admission``.

One servicer serves one resource: whole GPUs (``profile`` "") or the MIG instances of one
profile (``nvidia.com/mig-<profile>``); every servicer of a plugin shares its ``Admission``, so
all of them follow the one node lock.

No decisions here.  Refusals become gRPC errors: ``INVALID_ARGUMENT`` for a malformed request,
``UNAVAILABLE`` when the API server could not be read, ``INTERNAL`` when the plugin could not
record its progress, ``FAILED_PRECONDITION`` for everything about the cluster's state; the
message names the pod (when known), the node and what is wrong.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc

from deviceplugin.admission import Admission, PreferenceAsk
from deviceplugin.answer import ContainerAnswer
from deviceplugin.decide import Allocation, Refusal, RefusalKind
from deviceplugin.devices import DeviceState
from handoff.wire import GPU, DeviceID, resource_of
from proto import deviceplugin_v1beta1_pb2 as pb
from proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

_CODES = {
    RefusalKind.BAD_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    RefusalKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    RefusalKind.INTERNAL: grpc.StatusCode.INTERNAL,
}


def status_code(refusal: Refusal) -> grpc.StatusCode:
    """The gRPC status of a refusal."""
    return _CODES.get(refusal.kind, grpc.StatusCode.FAILED_PRECONDITION)


def options(*, pre_start_required: bool = False) -> pb.DevicePluginOptions:
    """What a plugin supports: GetPreferredAllocation yes; PreStartContainer as asked (nodelock's
    servicer asks for it: ``DevicePluginServicer.GetDevicePluginOptions``)."""
    return pb.DevicePluginOptions(
        pre_start_required=pre_start_required, get_preferred_allocation_available=True
    )


def device_message(gpu: GPU, device_id: str | None = None) -> pb.Device:
    """kubelet's device ``device_id`` (default: the GPU's own ID) with the GPU's health and NUMA
    node."""
    dev = pb.Device(ID=device_id or gpu.id, health=HEALTHY if gpu.healthy else UNHEALTHY)
    if gpu.numa is not None:
        dev.topology.nodes.add(ID=gpu.numa)
    return dev


def container_response(answer: ContainerAnswer) -> pb.ContainerAllocateResponse:
    resp = pb.ContainerAllocateResponse(envs=answer.envs)
    for node in answer.device_nodes:
        resp.devices.add(
            container_path=node.path, host_path=node.path, permissions=node.permissions
        )
    for name in answer.cdi_devices:
        resp.cdi_devices.add(name=name)
    return resp


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    """kubelet's view of this plugin.

    kubelet's device IDs are the GPUs' own here; a node that shows kubelet other IDs (a shared
    GPU's slices: ``deviceplugin.sharing``) overrides the five translation methods below and
    nothing else, so every RPC's flow stays in this class.
    """

    def __init__(self, admission: Admission, state: DeviceState, *, profile: str = "") -> None:
        self._admission = admission
        self._state = state
        self._profile = profile
        # None: the plugin's whole-GPU resource (``--resource-name``)
        self._resource = resource_of(profile) if profile else None
        self._listing = 0  # ListAndWatch streams open that have sent kubelet the devices

    @property
    def listed(self) -> bool:
        """Whether a ListAndWatch stream is open and has sent kubelet the devices: until then
        kubelet's device manager counts none of them healthy, and a pod it admits fails with
        "no healthy devices present" (``/readyz`` waits for this)."""
        return self._listing > 0

    def devices(self) -> list[GPU]:
        """The devices this servicer advertises: whole GPUs, or the instances of its profile."""
        return [g for g in self._state.gpus if g.profile == self._profile]

    def _devices(self) -> list[pb.Device]:
        """What ListAndWatch tells kubelet: one device per GPU (or MIG instance)."""
        return [device_message(g) for g in self.devices()]

    def _physical_ids(self, ids: Sequence[str]) -> list[str]:
        """The GPUs that kubelet's device IDs ``ids`` name, each once, first appearance first."""
        return list(ids)

    def _kubelet_ids(
        self, gpus: Sequence[DeviceID], request: pb.ContainerPreferredAllocationRequest
    ) -> list[str]:
        """kubelet's device IDs for the preferred ``gpus`` of one container's ``request``."""
        return list(gpus)

    def _allocate_request(self, requests: list[list[str]]) -> list[list[str]] | Refusal:
        """kubelet's Allocate request (device IDs per container) on GPUs, or why not."""
        return requests

    def _container_answer(self, alloc: Allocation, answer: ContainerAnswer) -> ContainerAnswer:
        """The container's answer as sent to kubelet (here: as decided)."""
        return answer

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.DevicePluginOptions]
    ) -> pb.DevicePluginOptions:
        """GetPreferredAllocation and PreStartContainer.  With PreStartContainer required,
        kubelet fails the start of a container it has no device record of (a restart that lost
        its checkpoint) instead of calling Allocate for it from the pod worker
        (``cm/devicemanager/manager.go`` ``GetDeviceRunContainerOptions`` calls
        ``callPreStartContainerIfNeeded`` first, which errs without a record: v1.31.9 lines
        949, 994; v1.37.2 lines 990, 1037).  So kubelet calls Allocate only while admitting a
        pod, which ``decide.admitted_before`` relies on."""
        return options(pre_start_required=True)

    async def ListAndWatch(
        self,
        request: pb.Empty,
        context: grpc.aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse],
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        sent = False
        try:
            while True:
                version = self._state.version
                yield pb.ListAndWatchResponse(devices=self._devices())
                if not sent:
                    sent = True
                    self._listing += 1
                    # kubelet can admit pods now: a rejected holder's lock may be released
                    self._admission.holder_changed.set()
                await self._state.wait_newer(version)
        finally:
            if sent:
                self._listing -= 1

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
                available=self._physical_ids(r.available_deviceIDs),
                must_include=self._physical_ids(r.must_include_deviceIDs),
                size=r.allocation_size,
            )
            for r in reqs
        ]
        prefs = await self._admission.preferred(asks, resource=self._resource)
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(deviceIDs=self._kubelet_ids(p.devices, r))
                for p, r in zip(prefs, reqs, strict=True)
            ]
        )

    async def Allocate(
        self,
        request: pb.AllocateRequest,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        phys = self._allocate_request([list(r.devices_ids) for r in request.container_requests])
        if isinstance(phys, Refusal):
            await context.abort(status_code(phys), phys.message)
        result = await self._admission.allocate(phys, resource=self._resource)
        if isinstance(result, Refusal):
            await context.abort(status_code(result), result.message)
        alloc, answer = result
        return pb.AllocateResponse(
            container_responses=[container_response(self._container_answer(alloc, answer))]
        )

    async def PreStartContainer(
        self,
        request: pb.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[
            pb.PreStartContainerRequest, pb.PreStartContainerResponse
        ],
    ) -> pb.PreStartContainerResponse:
        """Nothing to prepare: the answer to Allocate carried everything."""
        return pb.PreStartContainerResponse()
