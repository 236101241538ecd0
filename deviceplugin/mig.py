"""MIG-aware inventory: the MIG instances of GPUs in MIG mode, read from NVML.

A GPU in MIG mode is never advertised as a whole GPU (``deviceplugin.nvml`` leaves it out).  Its
MIG instances are devices of their own, one resource per profile, named as the NVIDIA device
plugin's *mixed* strategy names them: ``nvidia.com/mig-<profile>``, e.g. ``nvidia.com/mig-1g.10gb``
for an instance of one GPU slice (compute and memory) with 10 GB.

``mig_inventory(pynvml)`` reads, for every GPU whose current MIG mode is on, each MIG device's
UUID, its GPU instance and compute instance slice counts and its memory, and returns the
instances grouped by resource.  The profile name follows NVIDIA's rule: ``<g>g.<m>gb`` where g is
the GPU instance's slice count and m its memory in GB as a rounded share of its parent
(``profile_name``); ``<c>c.<g>g.<m>gb`` when the compute instance uses fewer slices than its GPU
instance.

Guarantees: deterministic (by parent index, then MIG device index); a MIG device NVML cannot
describe is left out and named in ``problems``, never guessed.
The NVML backend serves these (``deviceplugin.nvml``), the plugin one endpoint per profile
through the one node lock (``deviceplugin.plugin``, docs/mig.md); the simulated backend has
MIG layouts of its own (``deviceplugin.simulated``).  Tested against recorded NVML answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from handoff.wire import DeviceID

MIG_ENABLED = 1
MIB = 1024 * 1024
GIB = 1024 * MIB
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG instance."""

    id: DeviceID  # the MIG device's UUID (MIG-…)
    parent: DeviceID  # the GPU's UUID
    parent_index: int
    index: int  # the MIG device's index on its parent
    profile: str  # e.g. 1g.10gb
    memory_mib: int

    @property
    def resource(self) -> str:
        return f"{MIG_RESOURCE_PREFIX}{self.profile}"


@dataclass
class MigInventory:
    """The MIG instances by resource, and what could not be read."""

    by_resource: dict[str, list[MigDevice]] = field(default_factory=dict)
    mig_gpus: list[DeviceID] = field(default_factory=list)  # parents in MIG mode
    problems: list[str] = field(default_factory=list)


def profile_name(gi_slices: int, ci_slices: int, memory_mb: int, parent_bytes: int) -> str:
    """NVIDIA's MIG profile name from slice counts, the instance's memory (MB as NVML reports
    it) and its parent GPU's memory (bytes): the instance's share of the parent rounded up to
    eighths, times the parent's size in whole GB (rounded up), rounded to the nearest GB."""
    eighths = -(-(memory_mb * MIB * 8) // parent_bytes)
    parent_gb = -(-parent_bytes // GIB)
    gb = (2 * eighths * parent_gb + 8) // 16  # eighths/8 * parent_gb, half rounded up
    base = f"{gi_slices}g.{gb}gb"
    return base if ci_slices == gi_slices else f"{ci_slices}c.{base}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def mig_inventory(nvml: Any) -> MigInventory:
    """Every MIG instance of the node's GPUs in MIG mode (``nvml``: the ``pynvml`` module, or
    recorded answers standing in for it)."""
    out = MigInventory()
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        parent = DeviceID(_text(nvml.nvmlDeviceGetUUID(handle)))
        try:
            current = int(nvml.nvmlDeviceGetMigMode(handle)[0])
        except nvml.NVMLError:
            continue  # no MIG (or unreadable: the whole-GPU inventory reports it unhealthy)
        if current != MIG_ENABLED:
            continue
        out.mig_gpus.append(parent)
        devices, problems = mig_devices(nvml, handle, index, parent)
        out.problems += problems
        for dev in devices:
            out.by_resource.setdefault(dev.resource, []).append(dev)
    return out


def mig_devices(
    nvml: Any, handle: Any, index: int, parent: DeviceID
) -> tuple[list[MigDevice], list[str]]:
    """The MIG devices of one GPU in MIG mode (``handle``, its index and UUID), in slot order,
    and what could not be read of them.  Raises ``nvml.NVMLError`` when the GPU's own memory
    or slot count cannot be read."""
    out: list[MigDevice] = []
    problems: list[str] = []
    parent_bytes = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    for k in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
        except nvml.NVMLError:
            continue  # an empty slot
        try:
            uuid = DeviceID(_text(nvml.nvmlDeviceGetUUID(mig)))
            attrs = nvml.nvmlDeviceGetAttributes(mig)
            memory = int(nvml.nvmlDeviceGetMemoryInfo(mig).total) // MIB
            profile = profile_name(
                int(attrs.gpuInstanceSliceCount),
                int(attrs.computeInstanceSliceCount),
                int(attrs.memorySizeMB),
                parent_bytes,
            )
        except (nvml.NVMLError, AttributeError, TypeError, ValueError) as exc:
            problems.append(f"GPU {index} ({parent}) MIG device {k}: {exc}")
            continue
        out.append(MigDevice(uuid, parent, index, k, profile, memory))
    return out, problems
