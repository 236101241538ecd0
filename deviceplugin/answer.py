"""What a container gets for its devices: environment, device nodes or CDI names (pure).

``NVIDIA_VISIBLE_DEVICES`` lists the assigned GPU UUIDs in assignment order (the order CUDA will
number them in the container).  In CDI mode (the default) the devices are named for the container
runtime's CDI support; in device-nodes mode the device nodes are passed, when the backend has them
(real GPUs).

Why CDI by default: kubelet puts a container's own environment after the device plugin's, so a pod
that sets ``NVIDIA_VISIBLE_DEVICES=all`` overrides this answer wherever the NVIDIA runtime reads
the variable (its environment mode).  CDI names are resolved by the runtime from the node's CDI
spec and a container cannot change them.  The variable is still set in CDI mode: it overrides the
``NVIDIA_VISIBLE_DEVICES=all`` that CUDA images carry in their own environment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from handoff.wire import DeviceID

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
CDI_KIND = "nvidia.com/gpu"


class DeviceMode(StrEnum):
    """How devices reach the container."""

    CDI = "cdi"  # env + CDI device names nvidia.com/gpu=<UUID>
    DEVICE_NODES = "device-nodes"  # env + device specs (none for the simulated backend)


DEFAULT_DEVICE_MODE = DeviceMode.CDI  # what the CLI and the chart choose (see above)


@dataclass(frozen=True)
class DeviceNode:
    """A host device node made available at the same path inside the container."""

    path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class ContainerAnswer:
    """The plain-data form of one ``ContainerAllocateResponse``."""

    envs: dict[str, str] = field(default_factory=dict)
    device_nodes: tuple[DeviceNode, ...] = ()
    cdi_devices: tuple[str, ...] = ()


def container_answer(
    devices: Sequence[DeviceID], *, mode: DeviceMode, host_nodes: Sequence[str] = ()
) -> ContainerAnswer:
    """The answer for a container given ``devices`` (kept in order, no duplicates)."""
    envs = {VISIBLE_DEVICES_ENV: ",".join(devices)}
    if mode is DeviceMode.CDI:
        return ContainerAnswer(envs=envs, cdi_devices=tuple(f"{CDI_KIND}={d}" for d in devices))
    seen: list[str] = []
    for node in host_nodes:
        if node not in seen:
            seen.append(node)
    return ContainerAnswer(envs=envs, device_nodes=tuple(DeviceNode(p) for p in seen))
