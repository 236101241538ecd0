"""A simulated GPU backend: devices from flags or a JSON file, health flipped by editing the file.

Device IDs are ``GPU-<uuid5>`` of the node name and index, so they are stable across restarts,
distinct between nodes and shaped like real GPU UUIDs (40 characters).  The simulated backend
answers Allocate with environment variables only: there are no device nodes to hand out.

The file (``--sim-file``) overrides the flags; every key is optional::

    {"count": 8, "model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "numaNodes": 2,
     "layout": "pcie-2numa", "unhealthy": [3],
     "devices": [{"index": 5, "healthy": false, "model": "…", "memoryMiB": 40960, "numa": 1}]}

``unhealthy`` lists indexes; ``devices`` overrides single devices by index.  A device entry's
``"mig": "3g.40gb+2g.20gb+2x1g.10gb"`` (or ``--sim-mig 0=7x1g.10gb``) puts that GPU in MIG mode
with those instances (``mig_layout``): the GPU is then no device of its own, only its instances
are (IDs ``MIG-<uuid5>``, stable like the GPUs', each with its parent's health, NUMA node and
links).  Reconfiguring a GPU's MIG layout while the plugin runs changes the inventory but not
the MIG resources the plugin serves (those are fixed at start).  ``layout`` names one
of ``LAYOUTS`` and gives every device its NUMA node and links (``layout_of``); it overrides
``numaNodes``.  The file is read again
when inotify reports it written or replaced (``deviceplugin.dirwatch``; every 5 s in any case,
every 0.2 s where inotify cannot be used) and reloaded when its content changed; a file that
does not parse keeps the last good inventory and is logged, so a half-written edit never drops
devices.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deviceplugin.devices import DeviceBackendError, DeviceState
from deviceplugin.dirwatch import DirChanges
from handoff.topology import NO_TOPO, Topo
from handoff.wire import GPU, DeviceID, valid_mig_profile

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_MEMORY_MIB = 81559
_NAMESPACE = uuid.UUID("6f1b2c52-0d55-4a4c-9a43-7e0c8f6b7a11")  # nodelock's simulated GPUs

log = logging.getLogger(__name__)


def simulated_id(node: str, index: int) -> DeviceID:
    """The stable, UUID-shaped ID of simulated GPU ``index`` on ``node``."""
    return DeviceID(f"GPU-{uuid.uuid5(_NAMESPACE, f'{node}/{index}')}")


def simulated_mig_id(node: str, index: int, slot: int) -> DeviceID:
    """The stable, UUID-shaped ID of MIG instance ``slot`` of simulated GPU ``index``."""
    return DeviceID(f"MIG-{uuid.uuid5(_NAMESPACE, f'{node}/{index}/mig/{slot}')}")


MIG_COMPUTE_SLICES = 7  # an A100's or H100's GPU slices (and 8 memory eighths)
MIB_PER_GB = 1024


def mig_layout(text: str, *, parent_memory_mib: int) -> tuple[str, ...]:
    """The MIG profiles of one GPU from ``+``-joined parts ``[<n>x]<profile>`` (pure), e.g.
    ``7x1g.10gb`` or ``3g.40gb+2g.20gb+2x1g.10gb``.

    Raises ``ValueError`` for an unknown profile shape, or instances whose GPU slices exceed the
    7 of an A100/H100 or whose memory exceeds the parent's (only sums are checked, not NVIDIA's
    placement rules).
    """
    profiles: list[str] = []
    for part in text.split("+"):
        count, x, profile = part.strip().rpartition("x")
        if not x:
            count = "1"
        if not count.isdigit() or int(count) < 1 or not valid_mig_profile(profile):
            raise ValueError(
                f"MIG layout {text!r}: {part!r} is not [<n>x]<profile> with a profile like 1g.10gb"
            )
        profiles += [profile] * int(count)
    if len(profiles) > MIG_COMPUTE_SLICES:
        raise ValueError(f"MIG layout {text!r}: more than {MIG_COMPUTE_SLICES} instances")
    gi = sum(_mig_numbers(p)[0] for p in profiles)
    gb = sum(_mig_numbers(p)[1] for p in profiles)
    parent_gb = -(-parent_memory_mib // MIB_PER_GB)
    if gi > MIG_COMPUTE_SLICES:
        raise ValueError(f"MIG layout {text!r}: {gi} GPU slices; a GPU has {MIG_COMPUTE_SLICES}")
    if gb > parent_gb:
        raise ValueError(f"MIG layout {text!r}: {gb} GB of instances on a {parent_gb} GB GPU")
    return tuple(profiles)


def _mig_numbers(profile: str) -> tuple[int, int]:
    """(GPU instance slices, memory GB) of a valid profile name."""
    gi, mem = profile.split(".")[-2:]
    return int(gi[:-1]), int(mem[:-2])


def parse_mig_flags(values: Sequence[str]) -> tuple[tuple[int, str], ...]:
    """``--sim-mig INDEX=LAYOUT`` values as (GPU index, layout) pairs (pure); raises
    ``ValueError`` for a value of another shape or an index given twice."""
    out: dict[int, str] = {}
    for value in values:
        index, eq, layout = value.partition("=")
        if not eq or not index.isdigit() or not layout:
            raise ValueError(f"--sim-mig {value!r}: expected INDEX=LAYOUT, e.g. 0=7x1g.10gb")
        if int(index) in out:
            raise ValueError(f"--sim-mig names GPU {index} twice")
        out[int(index)] = layout
    return tuple(sorted(out.items()))


def mig_instances(node: str, parent: GPU, profiles: Sequence[str]) -> list[GPU]:
    """The MIG instances of ``parent`` for ``profiles``, in slot order (pure)."""
    return [
        GPU(
            id=simulated_mig_id(node, parent.index, slot),
            index=parent.index,
            model=parent.model,
            memory_mib=_mig_numbers(profile)[1] * MIB_PER_GB,
            numa=parent.numa,
            healthy=parent.healthy,
            topo=parent.topo,
            profile=profile,
            parent=parent.id,
        )
        for slot, profile in enumerate(profiles)
    ]


LAYOUTS = ("nvswitch", "pcie-2numa", "nvlink-pairs")


def layout_numa_nodes(name: str) -> int:
    """How many NUMA nodes layout ``name`` spreads its GPUs over."""
    if name not in LAYOUTS:
        raise ValueError(f"unknown GPU layout {name!r}; known: {', '.join(LAYOUTS)}")
    return 2


def layout_of(name: str, count: int) -> list[tuple[int, Topo]]:
    """NUMA node and links of each of ``count`` GPUs in a named layout (pure).

    - ``nvswitch``: every GPU in one NVSwitch domain (HGX/DGX H100-like); half the GPUs on each
      of two NUMA nodes, two per PCIe switch.
    - ``pcie-2numa``: no NVLink; two NUMA nodes, each with PCIe switches of two GPUs.
    - ``nvlink-pairs``: GPUs bridged in pairs (0-1, 2-3, …) by NVLink, each pair on its own PCIe
      switch; half the pairs on each of two NUMA nodes.

    Raises ``ValueError`` for an unknown name, or a count the layout cannot split evenly.
    """
    numa_nodes = layout_numa_nodes(name)
    if count % (2 * numa_nodes):
        raise ValueError(f"layout {name} needs a GPU count divisible by {2 * numa_nodes}")
    out = []
    for i in range(count):
        numa = i * numa_nodes // count
        pcie = f"pcie{i // 2}"
        if name == "nvswitch":
            topo = Topo(socket=numa, pcie=pcie, nvswitch="nvsw0")
        elif name == "pcie-2numa":
            topo = Topo(socket=numa, pcie=pcie)
        else:
            topo = Topo(socket=numa, pcie=pcie, nvlink=(i ^ 1,))
        out.append((numa, topo))
    return out


@dataclass(frozen=True)
class SimSpec:
    """Defaults from the command line."""

    count: int = 8
    model: str = DEFAULT_MODEL
    memory_mib: int = DEFAULT_MEMORY_MIB
    numa_nodes: int = 0  # 0: no NUMA information
    mig: tuple[tuple[int, str], ...] = ()  # (GPU index, MIG layout) of GPUs in MIG mode


def inventory(node: str, spec: SimSpec, overrides: Any = None) -> list[GPU]:
    """The simulated inventory of ``node`` from ``spec`` and a parsed sim file (pure).

    Raises ``ValueError`` naming what is wrong with ``overrides``.
    """
    o: dict[str, Any] = {}
    if overrides is not None:
        if not isinstance(overrides, dict):
            raise ValueError("the simulation file must hold a JSON object")
        o = overrides
    count = _nat(o.get("count", spec.count), "count")
    model = str(o.get("model", spec.model))
    memory = _nat(o.get("memoryMiB", spec.memory_mib), "memoryMiB")
    numa_nodes = _nat(o.get("numaNodes", spec.numa_nodes), "numaNodes")
    unhealthy = o.get("unhealthy", [])
    if not isinstance(unhealthy, list) or not all(isinstance(i, int) for i in unhealthy):
        raise ValueError("unhealthy must be a list of device indexes")
    placed: list[tuple[int | None, Topo]] = []
    if o.get("layout") is not None:
        placed = [(n, t) for n, t in layout_of(str(o["layout"]), count)]
    per_device: dict[int, dict[str, Any]] = {i: {"mig": layout} for i, layout in spec.mig}
    for d in o.get("devices", []):
        if not isinstance(d, dict) or not isinstance(d.get("index"), int):
            raise ValueError("every entry of devices needs an integer index")
        per_device[d["index"]] = {**per_device.get(d["index"], {}), **d}
    beyond = sorted(i for i, d in per_device.items() if d.get("mig") and not 0 <= i < count)
    if beyond:
        raise ValueError(f"MIG layouts for GPUs {beyond} the node does not have ({count} GPUs)")
    gpus: list[GPU] = []
    for i in range(count):
        d = per_device.get(i, {})
        numa: int | None = (i * numa_nodes) // count if numa_nodes else None
        topo = NO_TOPO
        if placed:
            numa, topo = placed[i]
        numa_value = d.get("numa", numa)
        gpu = GPU(
            id=DeviceID(str(d.get("id", simulated_id(node, i)))),
            index=i,
            model=str(d.get("model", model)),
            memory_mib=_nat(d.get("memoryMiB", memory), "memoryMiB"),
            numa=None if numa_value is None else _nat(numa_value, "numa"),
            healthy=bool(d.get("healthy", i not in unhealthy)),
            topo=topo,
        )
        if d.get("mig"):
            layout = mig_layout(str(d["mig"]), parent_memory_mib=gpu.memory_mib)
            gpus.extend(mig_instances(node, gpu, layout))
        else:
            gpus.append(gpu)
    return gpus


def _nat(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return value


class SimulatedBackend:
    """GPUs that exist only in this process (and in the optional file that describes them)."""

    def __init__(self, node: str, spec: SimSpec, *, sim_file: Path | None = None) -> None:
        self._node = node
        self._spec = spec
        self._file = sim_file
        self._last_text: str | None = None

    @property
    def name(self) -> str:
        return "simulated"

    async def discover(self) -> list[GPU]:
        if self._file is None:
            return inventory(self._node, self._spec)
        try:
            text = self._file.read_text(encoding="utf-8")
        except OSError as exc:
            raise DeviceBackendError(f"cannot read simulation file {self._file}: {exc}") from exc
        try:
            gpus = inventory(self._node, self._spec, json.loads(text))
        except ValueError as exc:
            raise DeviceBackendError(f"simulation file {self._file}: {exc}") from exc
        self._last_text = text
        return gpus

    async def watch(self, state: DeviceState) -> None:
        if self._file is None:
            await asyncio.Event().wait()  # nothing ever changes
            return
        changes = DirChanges(self._file.parent, [self._file.name])
        try:
            await self._follow(changes, state)
        finally:
            changes.close()

    async def _follow(self, changes: DirChanges, state: DeviceState) -> None:
        assert self._file is not None
        while True:  # the first wait starts the watch and returns at once: a first look
            await changes.wait(changes.period())
            try:
                text = self._file.read_text(encoding="utf-8")
            except OSError as exc:
                if self._last_text is not None:  # log once per disappearance
                    log.warning(
                        "simulation file %s unreadable, keeping devices: %s", self._file, exc
                    )
                self._last_text = None
                continue
            if text == self._last_text:
                continue
            self._last_text = text
            try:
                gpus = inventory(self._node, self._spec, json.loads(text))
            except ValueError as exc:
                log.warning("simulation file %s ignored until fixed: %s", self._file, exc)
                continue
            if await state.update(gpus):
                log.info(
                    "simulated devices changed: %d healthy of %d",
                    sum(g.healthy for g in gpus),
                    len(gpus),
                )

    def device_nodes(self, ids: Sequence[DeviceID]) -> list[str]:
        return []

    def close(self) -> None:
        pass
