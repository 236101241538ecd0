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

from collections.abc import AsyncIterator

import grpc

from deviceplugin.admission import Admission, PreferenceAsk
from deviceplugin.answer import ContainerAnswer
from deviceplugin.decide import Refusal, RefusalKind
from deviceplugin.devices import DeviceState
from handoff.wire import GPU, resource_of
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


def options() -> pb.DevicePluginOptions:
    """What the plugin supports: GetPreferredAllocation yes, PreStartContainer not needed."""
    return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


def device_message(gpu: GPU) -> pb.Device:
    dev = pb.Device(ID=gpu.id, health=HEALTHY if gpu.healthy else UNHEALTHY)
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
    """kubelet's view of this plugin."""

    def __init__(self, admission: Admission, state: DeviceState, *, profile: str = "") -> None:
        self._admission = admission
        self._state = state
        self._profile = profile
        # None: the plugin's whole-GPU resource (``--resource-name``)
        self._resource = resource_of(profile) if profile else None

    def devices(self) -> list[GPU]:
        """The devices this servicer advertises: whole GPUs, or the instances of its profile."""
        return [g for g in self._state.gpus if g.profile == self._profile]

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.DevicePluginOptions]
    ) -> pb.DevicePluginOptions:
        return options()

    async def ListAndWatch(
        self,
        request: pb.Empty,
        context: grpc.aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse],
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        while True:
            version = self._state.version
            yield pb.ListAndWatchResponse(devices=[device_message(g) for g in self.devices()])
            await self._state.wait_newer(version)

    async def GetPreferredAllocation(
        self,
        request: pb.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[
            pb.PreferredAllocationRequest, pb.PreferredAllocationResponse
        ],
    ) -> pb.PreferredAllocationResponse:
        asks = [
            PreferenceAsk(
                available=list(r.available_deviceIDs),
                must_include=list(r.must_include_deviceIDs),
                size=r.allocation_size,
            )
            for r in request.container_requests
        ]
        prefs = await self._admission.preferred(asks, resource=self._resource)
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(deviceIDs=list(p.devices)) for p in prefs
            ]
        )

    async def Allocate(
        self,
        request: pb.AllocateRequest,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        result = await self._admission.allocate(
            [list(r.devices_ids) for r in request.container_requests], resource=self._resource
        )
        if isinstance(result, Refusal):
            await context.abort(status_code(result), result.message)
        _, answer = result
        return pb.AllocateResponse(container_responses=[container_response(answer)])

    async def PreStartContainer(
        self,
        request: pb.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[
            pb.PreStartContainerRequest, pb.PreStartContainerResponse
        ],
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()
