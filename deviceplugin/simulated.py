"""A simulated GPU backend: devices from flags or a JSON file, health flipped by editing the file.

Device IDs are ``GPU-<uuid5>`` of the node name and index, so they are stable across restarts,
distinct between nodes and shaped like real GPU UUIDs (40 characters).  The simulated backend
answers Allocate with environment variables only: there are no device nodes to hand out.

The file (``--sim-file``) overrides the flags; every key is optional::

    {"count": 8, "model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "numaNodes": 2,
     "layout": "pcie-2numa", "unhealthy": [3],
     "devices": [{"index": 5, "healthy": false, "model": "…", "memoryMiB": 40960, "numa": 1}]}

``unhealthy`` lists indexes; ``devices`` overrides single devices by index.  ``layout`` names one
of ``LAYOUTS`` and gives every device its NUMA node and links (``layout_of``); it overrides
``numaNodes``.  The file is polled
(every 0.2 s) and reloaded when its content changes; a file that does not parse keeps the last
good inventory and is logged, so a half-written edit never drops devices.
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
from handoff.topology import NO_TOPO, Topo
from handoff.wire import GPU, DeviceID

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_MEMORY_MIB = 81559
POLL_S = 0.2
_NAMESPACE = uuid.UUID("6f1b2c52-0d55-4a4c-9a43-7e0c8f6b7a11")  # nodelock's simulated GPUs

log = logging.getLogger(__name__)


def simulated_id(node: str, index: int) -> DeviceID:
    """The stable, UUID-shaped ID of simulated GPU ``index`` on ``node``."""
    return DeviceID(f"GPU-{uuid.uuid5(_NAMESPACE, f'{node}/{index}')}")


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
    per_device: dict[int, dict[str, Any]] = {}
    for d in o.get("devices", []):
        if not isinstance(d, dict) or not isinstance(d.get("index"), int):
            raise ValueError("every entry of devices needs an integer index")
        per_device[d["index"]] = d
    gpus = []
    for i in range(count):
        d = per_device.get(i, {})
        numa: int | None = (i * numa_nodes) // count if numa_nodes else None
        topo = NO_TOPO
        if placed:
            numa, topo = placed[i]
        numa_value = d.get("numa", numa)
        gpus.append(
            GPU(
                id=DeviceID(str(d.get("id", simulated_id(node, i)))),
                index=i,
                model=str(d.get("model", model)),
                memory_mib=_nat(d.get("memoryMiB", memory), "memoryMiB"),
                numa=None if numa_value is None else _nat(numa_value, "numa"),
                healthy=bool(d.get("healthy", i not in unhealthy)),
                topo=topo,
            )
        )
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
        while True:
            await asyncio.sleep(POLL_S)
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
