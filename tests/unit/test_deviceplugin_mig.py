"""MIG-aware inventory from recorded NVML answers of an A100-80GB in MIG mode (deviceplugin.mig).

The answers are what NVML reports for a GPU partitioned as 3g.40gb + 2g.20gb + 1g.10gb x 2 (one
slot empty), next to a GPU without MIG; the fake stands in for the ``pynvml`` module.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from deviceplugin.mig import mig_inventory, profile_name
from deviceplugin.nvml import NvmlBackend, WaitOutcome
from deviceplugin.nvml_health import HealthBook, Reason
from handoff.wire import DeviceID

MIB = 1024 * 1024
A100 = "GPU-a100a100-0000-0000-0000-000000000000"
H100 = "GPU-h100h100-0000-0000-0000-000000000000"

# (uuid, gpu instance slices, compute instance slices, memory MB); None: an empty slot
MIG_DEVICES: list[tuple[str, int, int, int] | None] = [
    ("MIG-00000000-0000-0000-0000-000000000003", 3, 3, 40192),
    ("MIG-00000000-0000-0000-0000-000000000002", 2, 2, 19968),
    None,
    ("MIG-00000000-0000-0000-0000-000000000010", 1, 1, 9728),
    ("MIG-00000000-0000-0000-0000-000000000011", 1, 1, 9728),
]


class RecordedMigNvml(SimpleNamespace):
    def __init__(self, *, broken: int | None = None) -> None:
        super().__init__(
            NVMLError=pynvml.NVMLError,
            NVML_ERROR_NOT_SUPPORTED=pynvml.NVML_ERROR_NOT_SUPPORTED,
            NVML_ERROR_FUNCTION_NOT_FOUND=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        )
        self.broken = broken

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return ("gpu", index)

    def nvmlDeviceGetUUID(self, handle: tuple[str, int]) -> bytes:
        kind, k = handle
        if kind == "gpu":
            return (A100 if k == 0 else H100).encode()
        record = MIG_DEVICES[k]
        assert record is not None
        return record[0].encode()

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        if handle == ("gpu", 1):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, k: int) -> Any:
        if k >= len(MIG_DEVICES) or MIG_DEVICES[k] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", k)

    def nvmlDeviceGetAttributes(self, handle: Any) -> SimpleNamespace:
        _, k = handle
        if k == self.broken:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        record = MIG_DEVICES[k]
        assert record is not None
        return SimpleNamespace(
            gpuInstanceSliceCount=record[1],
            computeInstanceSliceCount=record[2],
            memorySizeMB=record[3],
        )

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> SimpleNamespace:
        kind, k = handle
        if kind == "gpu":
            return SimpleNamespace(total=81920 * MIB)
        record = MIG_DEVICES[k]
        assert record is not None
        return SimpleNamespace(total=record[3] * MIB)

    # for the whole-GPU backend's listing
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return int(handle[1])

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return "NVIDIA A100-SXM4-80GB" if handle[1] == 0 else "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        return 0


def test_profile_names_follow_nvidias_rule() -> None:
    a100_80 = 81920 * MIB
    assert profile_name(1, 1, 9728, a100_80) == "1g.10gb"
    assert profile_name(2, 2, 19968, a100_80) == "2g.20gb"
    assert profile_name(3, 3, 40192, a100_80) == "3g.40gb"
    assert profile_name(7, 7, 80896, a100_80) == "7g.80gb"
    assert profile_name(4, 1, 40192, a100_80) == "1c.4g.40gb"
    a100_40 = 40960 * MIB
    assert profile_name(1, 1, 4864, a100_40) == "1g.5gb"


def test_mig_instances_are_devices_of_their_profiles_resources() -> None:
    inv = mig_inventory(RecordedMigNvml())
    assert inv.mig_gpus == [A100]
    assert inv.problems == []
    assert sorted(inv.by_resource) == [
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
    ]
    small = inv.by_resource["nvidia.com/mig-1g.10gb"]
    assert [d.id for d in small] == [
        "MIG-00000000-0000-0000-0000-000000000010",
        "MIG-00000000-0000-0000-0000-000000000011",
    ]
    assert all(d.parent == A100 and d.memory_mib == 9728 for d in small)
    assert [d.index for d in small] == [3, 4]


def test_the_mig_gpu_is_never_a_whole_gpu_but_its_instances_are_served(tmp_path: Path) -> None:
    backend = NvmlBackend(nvml=RecordedMigNvml(), dev_root=tmp_path)
    gpus = backend._list()
    assert [g.id for g in gpus if not g.profile] == [H100]
    assert backend.skipped_mig == [A100]
    mig = [g for g in gpus if g.profile]
    assert [(g.id, g.profile, g.memory_mib) for g in mig] == [
        (d[0], p, d[3])
        for d, p in zip(
            [d for d in MIG_DEVICES if d is not None],
            ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
            strict=True,
        )
    ]
    assert all(g.parent == A100 and g.index == 0 and g.healthy for g in mig)
    assert {g.model for g in mig} == {"NVIDIA A100-SXM4-80GB"}
    # a container given an instance gets its parent's device node (CDI mode names the instance)
    assert backend.device_nodes([mig[0].id, mig[2].id]) == ["/dev/nvidia0"]


class WatchedMigNvml(RecordedMigNvml):
    """``RecordedMigNvml`` plus what the health watch asks: handles by UUID, event
    registration (recorded), and a MIG mode that can be switched off."""

    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self) -> None:
        super().__init__()
        self.registered: list[Any] = []
        self.mig_on = True

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        if uuid in (A100, H100):
            return ("gpu", 0 if uuid == A100 else 1)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)  # MIG handles are never asked

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return int(pynvml.nvmlEventTypeXidCriticalError)

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, event_set: Any) -> None:
        self.registered.append(handle)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        if handle == ("gpu", 0) and not self.mig_on:
            return [0, 0]
        return super().nvmlDeviceGetMigMode(handle)


def test_instances_health_follows_their_gpu() -> None:
    fake = WatchedMigNvml()
    backend = NvmlBackend(nvml=fake, environ={})
    gpus = backend._list()
    mig = [g.id for g in gpus if g.profile]
    backend.book = HealthBook(g.id for g in gpus)
    # events: the MIG GPU is registered once, for all its instances
    assert backend._register(backend.book.ids, object()) == []
    assert fake.registered == [("gpu", 1), ("gpu", 0)]
    # an XID on the GPU marks every instance of it, not the other GPU
    xid = WaitOutcome(
        event_type=int(fake.nvmlEventTypeXidCriticalError), xid=79, device=DeviceID(A100)
    )
    backend._judge(xid, 0)
    assert [backend.book.healthy(d) for d in mig] == [False] * 4
    assert backend.book.healthy(DeviceID(H100))
    backend.book.clear(mig, Reason.XID)
    # the GPU leaves MIG mode: its instances no longer exist
    fake.mig_on = False
    backend._poll([])
    assert [backend.book.reasons(d) for d in mig] == [frozenset({Reason.MIG})] * 4
    fake.mig_on = True
    backend._poll([])
    assert all(backend.book.healthy(d) for d in mig)


def test_an_instance_nvml_cannot_describe_is_left_out_and_named() -> None:
    inv = mig_inventory(RecordedMigNvml(broken=1))
    assert "nvidia.com/mig-2g.20gb" not in inv.by_resource
    assert len(inv.problems) == 1
    assert "MIG device 1" in inv.problems[0]
