"""The generated modules are wire-identical to kubelet's APIs.

Every expectation below is copied from upstream kubelet (deviceplugin v1beta1, podresources v1):
proto package, services, RPC names with their message types and streaming, and each message's
fields with number, type and label.  A renumbered or retyped field would break kubelet on the
wire, so each one is pinned here.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor, FileDescriptor

from proto import deviceplugin_v1beta1_pb2 as dp
from proto import podresources_v1_pb2 as pr

T = FieldDescriptor
STR, BOOL, I32, I64, U64, MSG = (
    T.TYPE_STRING,
    T.TYPE_BOOL,
    T.TYPE_INT32,
    T.TYPE_INT64,
    T.TYPE_UINT64,
    T.TYPE_MESSAGE,
)
ONE, MANY = "one", "many"

# message -> {field name: (number, type, label, message type name or None)}
Fields = dict[str, tuple[int, int, str, str | None]]

DEVICEPLUGIN_MESSAGES: dict[str, Fields] = {
    "DevicePluginOptions": {
        "pre_start_required": (1, BOOL, ONE, None),
        "get_preferred_allocation_available": (2, BOOL, ONE, None),
    },
    "RegisterRequest": {
        "version": (1, STR, ONE, None),
        "endpoint": (2, STR, ONE, None),
        "resource_name": (3, STR, ONE, None),
        "options": (4, MSG, ONE, "v1beta1.DevicePluginOptions"),
    },
    "Empty": {},
    "ListAndWatchResponse": {"devices": (1, MSG, MANY, "v1beta1.Device")},
    "TopologyInfo": {"nodes": (1, MSG, MANY, "v1beta1.NUMANode")},
    "NUMANode": {"ID": (1, I64, ONE, None)},
    "Device": {
        "ID": (1, STR, ONE, None),
        "health": (2, STR, ONE, None),
        "topology": (3, MSG, ONE, "v1beta1.TopologyInfo"),
    },
    "PreStartContainerRequest": {"devices_ids": (1, STR, MANY, None)},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {
        "container_requests": (1, MSG, MANY, "v1beta1.ContainerPreferredAllocationRequest"),
    },
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": (1, STR, MANY, None),
        "must_include_deviceIDs": (2, STR, MANY, None),
        "allocation_size": (3, I32, ONE, None),
    },
    "PreferredAllocationResponse": {
        "container_responses": (1, MSG, MANY, "v1beta1.ContainerPreferredAllocationResponse"),
    },
    "ContainerPreferredAllocationResponse": {"deviceIDs": (1, STR, MANY, None)},
    "AllocateRequest": {
        "container_requests": (1, MSG, MANY, "v1beta1.ContainerAllocateRequest"),
    },
    "ContainerAllocateRequest": {"devices_ids": (1, STR, MANY, None)},
    "CDIDevice": {"name": (1, STR, ONE, None)},
    "AllocateResponse": {
        "container_responses": (1, MSG, MANY, "v1beta1.ContainerAllocateResponse"),
    },
    "ContainerAllocateResponse": {
        "envs": (1, MSG, MANY, "v1beta1.ContainerAllocateResponse.EnvsEntry"),
        "mounts": (2, MSG, MANY, "v1beta1.Mount"),
        "devices": (3, MSG, MANY, "v1beta1.DeviceSpec"),
        "annotations": (4, MSG, MANY, "v1beta1.ContainerAllocateResponse.AnnotationsEntry"),
        "cdi_devices": (5, MSG, MANY, "v1beta1.CDIDevice"),
    },
    "Mount": {
        "container_path": (1, STR, ONE, None),
        "host_path": (2, STR, ONE, None),
        "read_only": (3, BOOL, ONE, None),
    },
    "DeviceSpec": {
        "container_path": (1, STR, ONE, None),
        "host_path": (2, STR, ONE, None),
        "permissions": (3, STR, ONE, None),
    },
}

PODRESOURCES_MESSAGES: dict[str, Fields] = {
    "AllocatableResourcesRequest": {},
    "AllocatableResourcesResponse": {
        "devices": (1, MSG, MANY, "v1.ContainerDevices"),
        "cpu_ids": (2, I64, MANY, None),
        "memory": (3, MSG, MANY, "v1.ContainerMemory"),
    },
    "ListPodResourcesRequest": {},
    "ListPodResourcesResponse": {"pod_resources": (1, MSG, MANY, "v1.PodResources")},
    "PodResources": {
        "name": (1, STR, ONE, None),
        "namespace": (2, STR, ONE, None),
        "containers": (3, MSG, MANY, "v1.ContainerResources"),
        "cpu_ids": (4, I64, MANY, None),
        "memory": (5, MSG, MANY, "v1.ContainerMemory"),
    },
    "ContainerResources": {
        "name": (1, STR, ONE, None),
        "devices": (2, MSG, MANY, "v1.ContainerDevices"),
        "cpu_ids": (3, I64, MANY, None),
        "memory": (4, MSG, MANY, "v1.ContainerMemory"),
        "dynamic_resources": (5, MSG, MANY, "v1.DynamicResource"),
    },
    "ContainerMemory": {
        "memory_type": (1, STR, ONE, None),
        "size": (2, U64, ONE, None),
        "topology": (3, MSG, ONE, "v1.TopologyInfo"),
    },
    "ContainerDevices": {
        "resource_name": (1, STR, ONE, None),
        "device_ids": (2, STR, MANY, None),
        "topology": (3, MSG, ONE, "v1.TopologyInfo"),
    },
    "TopologyInfo": {"nodes": (1, MSG, MANY, "v1.NUMANode")},
    "NUMANode": {"ID": (1, I64, ONE, None)},
    "DynamicResource": {
        "claim_name": (2, STR, ONE, None),
        "claim_namespace": (3, STR, ONE, None),
        "claim_resources": (4, MSG, MANY, "v1.ClaimResource"),
    },
    "ClaimResource": {
        "cdi_devices": (1, MSG, MANY, "v1.CDIDevice"),
        "driver_name": (2, STR, ONE, None),
        "pool_name": (3, STR, ONE, None),
        "device_name": (4, STR, ONE, None),
        "share_id": (5, STR, ONE, None),
    },
    "CDIDevice": {"name": (1, STR, ONE, None)},
    "GetPodResourcesRequest": {
        "pod_name": (1, STR, ONE, None),
        "pod_namespace": (2, STR, ONE, None),
    },
    "GetPodResourcesResponse": {"pod_resources": (1, MSG, ONE, "v1.PodResources")},
}

# service -> {rpc: (input, output, server streaming)}
DEVICEPLUGIN_SERVICES = {
    "Registration": {"Register": ("v1beta1.RegisterRequest", "v1beta1.Empty", False)},
    "DevicePlugin": {
        "GetDevicePluginOptions": ("v1beta1.Empty", "v1beta1.DevicePluginOptions", False),
        "ListAndWatch": ("v1beta1.Empty", "v1beta1.ListAndWatchResponse", True),
        "GetPreferredAllocation": (
            "v1beta1.PreferredAllocationRequest",
            "v1beta1.PreferredAllocationResponse",
            False,
        ),
        "Allocate": ("v1beta1.AllocateRequest", "v1beta1.AllocateResponse", False),
        "PreStartContainer": (
            "v1beta1.PreStartContainerRequest",
            "v1beta1.PreStartContainerResponse",
            False,
        ),
    },
}
PODRESOURCES_SERVICES = {
    "PodResourcesLister": {
        "List": ("v1.ListPodResourcesRequest", "v1.ListPodResourcesResponse", False),
        "GetAllocatableResources": (
            "v1.AllocatableResourcesRequest",
            "v1.AllocatableResourcesResponse",
            False,
        ),
        "Get": ("v1.GetPodResourcesRequest", "v1.GetPodResourcesResponse", False),
    },
}


def _fields(file: FileDescriptor, name: str) -> Fields:
    msg = file.message_types_by_name[name]
    out: Fields = {}
    for f in msg.fields:
        label = MANY if f.is_repeated else ONE
        out[f.name] = (
            f.number,
            f.type,
            label,
            f.message_type.full_name if f.message_type is not None else None,
        )
    return out


def _services(file: FileDescriptor) -> dict[str, dict[str, tuple[str, str, bool]]]:
    return {
        svc.name: {
            m.name: (m.input_type.full_name, m.output_type.full_name, m.server_streaming)
            for m in svc.methods
        }
        for svc in file.services_by_name.values()
    }


def test_deviceplugin_package_and_syntax() -> None:
    assert dp.DESCRIPTOR.package == "v1beta1"
    assert dp.DESCRIPTOR.GetOptions().go_package == "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"


def test_deviceplugin_services_and_rpcs() -> None:
    assert _services(dp.DESCRIPTOR) == DEVICEPLUGIN_SERVICES
    for svc in dp.DESCRIPTOR.services_by_name.values():
        for m in svc.methods:
            assert not m.client_streaming


def test_deviceplugin_messages_and_fields() -> None:
    assert set(dp.DESCRIPTOR.message_types_by_name) == set(DEVICEPLUGIN_MESSAGES)
    for name, fields in DEVICEPLUGIN_MESSAGES.items():
        assert _fields(dp.DESCRIPTOR, name) == fields, name


def test_deviceplugin_maps_are_string_to_string() -> None:
    msg = dp.DESCRIPTOR.message_types_by_name["ContainerAllocateResponse"]
    for name in ("envs", "annotations"):
        entry = msg.fields_by_name[name].message_type
        assert entry is not None
        assert entry.GetOptions().map_entry
        assert entry.fields_by_name["key"].type == STR
        assert entry.fields_by_name["value"].type == STR


def test_podresources_package_services_and_fields() -> None:
    assert pr.DESCRIPTOR.package == "v1"
    assert _services(pr.DESCRIPTOR) == PODRESOURCES_SERVICES
    assert set(pr.DESCRIPTOR.message_types_by_name) == set(PODRESOURCES_MESSAGES)
    for name, fields in PODRESOURCES_MESSAGES.items():
        assert _fields(pr.DESCRIPTOR, name) == fields, name


def test_podresources_share_id_is_explicitly_optional() -> None:
    field = pr.DESCRIPTOR.message_types_by_name["ClaimResource"].fields_by_name["share_id"]
    assert field.has_presence
    assert field.containing_oneof is not None  # proto3 `optional` is a synthetic oneof


def test_grpc_method_paths() -> None:
    # The full method name kubelet dials is /<package>.<service>/<rpc>.
    svc = dp.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert svc.methods_by_name["Allocate"].full_name == "v1beta1.DevicePlugin.Allocate"
    reg = dp.DESCRIPTOR.services_by_name["Registration"]
    assert reg.full_name == "v1beta1.Registration"


def test_a_message_round_trips_on_the_wire() -> None:
    resp = dp.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": "GPU-a"})
    resp.cdi_devices.add(name="nvidia.com/gpu=GPU-a")
    raw = resp.SerializeToString()
    again = dp.ContainerAllocateResponse.FromString(raw)
    assert again.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    assert [d.name for d in again.cdi_devices] == ["nvidia.com/gpu=GPU-a"]
