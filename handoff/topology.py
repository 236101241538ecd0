"""How a node's GPUs are connected, on the wire and as a link model (pure).

Each device of the inventory annotation may carry a ``topo`` object (docs/handoff.md)::

    {"v": 1, "socket": 0, "pcie": "0000:16", "nvswitch": "0", "nvlink": [1, 3]}

``v`` is the encoding's version (this module reads 1); ``socket`` the CPU socket, ``pcie`` an ID
of the PCIe switch the GPU hangs off (GPUs with equal IDs share that switch), ``nvswitch`` an ID
of the NVSwitch domain (GPUs with equal IDs reach each other at full NVLink bandwidth), ``nvlink``
the indexes of GPUs bridged to this one by direct NVLink.  Every key but ``v`` is optional; a
device without ``topo`` (inventories written before topology existed) has no link facts, and a
``topo`` of a newer version is read as absent, so an older extender still schedules on the node.

The link model: the connection of two GPUs is the best of (in this order) the same NVSwitch
domain, a direct NVLink, the same PCIe switch, the same NUMA node (or CPU socket), else the
inter-socket path.  A *set* of GPUs is as good as its weakest pair.

Guarantee: ``parse_topo(format_topo(t)) == t`` for every valid ``Topo``; parsing raises
``ValueError`` naming what is wrong for a version-1 object that breaks the format.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from itertools import combinations
from typing import Any, Protocol

TOPO_VERSION = 1
MAX_ID_LEN = 64
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")


class Link(IntEnum):
    """How two GPUs reach each other; larger is better."""

    SYSTEM = 0  # across CPU sockets / NUMA nodes (nvidia-smi topo: SYS)
    NUMA = 1  # same NUMA node or socket, through the host bridge (NODE, PHB)
    PCIE = 2  # same PCIe switch (PIX, PXB)
    NVLINK = 3  # a direct NVLink bridge (NV#)
    NVSWITCH = 4  # the same NVSwitch domain (all-to-all NVLink)

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    Link.SYSTEM: "across NUMA nodes",
    Link.NUMA: "the same NUMA node",
    Link.PCIE: "the same PCIe switch",
    Link.NVLINK: "NVLink",
    Link.NVSWITCH: "one NVSwitch domain",
}


class NumaPolicy(StrEnum):
    """kubelet's topology manager policy on a node (``--topology-manager-policy``)."""

    NONE = "none"
    BEST_EFFORT = "best-effort"
    RESTRICTED = "restricted"
    SINGLE_NUMA_NODE = "single-numa-node"

    @property
    def aligns(self) -> bool:
        """Whether kubelet restricts a container's devices to the NUMA nodes it picked."""
        return self is not NumaPolicy.NONE


@dataclass(frozen=True, slots=True)
class Topo:
    """One GPU's connectivity facts (all optional)."""

    socket: int | None = None
    pcie: str | None = None
    nvswitch: str | None = None
    nvlink: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return self == NO_TOPO


NO_TOPO = Topo()


def format_topo(t: Topo) -> dict[str, Any]:
    """The ``topo`` object of one inventory row (keys in a fixed order, absent facts left out)."""
    out: dict[str, Any] = {"v": TOPO_VERSION}
    if t.socket is not None:
        out["socket"] = t.socket
    if t.pcie is not None:
        out["pcie"] = t.pcie
    if t.nvswitch is not None:
        out["nvswitch"] = t.nvswitch
    if t.nvlink:
        out["nvlink"] = sorted(t.nvlink)
    return out


def parse_topo(raw: object) -> Topo:
    """Parse a ``topo`` object; ``NO_TOPO`` for None or a version this code does not read."""
    if raw is None:
        return NO_TOPO
    if not isinstance(raw, Mapping):
        raise ValueError(f"topo must be an object, got {raw!r}")
    version = raw.get("v")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"topo.v must be a positive integer, got {version!r}")
    if version > TOPO_VERSION:
        return NO_TOPO  # written by a newer plugin: schedule without link facts
    socket = raw.get("socket")
    if socket is not None and (isinstance(socket, bool) or not isinstance(socket, int)):
        raise ValueError(f"topo.socket must be an integer, got {socket!r}")
    if isinstance(socket, int) and socket < 0:
        raise ValueError(f"topo.socket must not be negative, got {socket!r}")
    nvlink = raw.get("nvlink", [])
    if not isinstance(nvlink, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in nvlink
    ):
        raise ValueError(f"topo.nvlink must be a list of device indexes, got {nvlink!r}")
    return Topo(
        socket=socket,
        pcie=_ident(raw.get("pcie"), "topo.pcie"),
        nvswitch=_ident(raw.get("nvswitch"), "topo.nvswitch"),
        nvlink=tuple(sorted(set(nvlink))),
    )


def _ident(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_ID_LEN or not _ID.match(value):
        raise ValueError(f"{what} must be a short identifier, got {value!r}")
    return value


class Placed(Protocol):
    """What the link model reads of a device (``handoff.wire.GPU`` is one)."""

    @property
    def index(self) -> int: ...

    @property
    def numa(self) -> int | None: ...

    @property
    def topo(self) -> Topo: ...


def link(a: Placed, b: Placed) -> Link:
    """How GPUs ``a`` and ``b`` are connected (symmetric: an NVLink listed on either side
    counts)."""
    ta, tb = a.topo, b.topo
    if ta.nvswitch is not None and ta.nvswitch == tb.nvswitch:
        return Link.NVSWITCH
    if b.index in ta.nvlink or a.index in tb.nvlink:
        return Link.NVLINK
    if ta.pcie is not None and ta.pcie == tb.pcie:
        return Link.PCIE
    if a.numa is not None and a.numa == b.numa:
        return Link.NUMA
    if ta.socket is not None and ta.socket == tb.socket:
        return Link.NUMA
    return Link.SYSTEM


def set_link(devices: Sequence[Placed]) -> Link:
    """The class of a set of GPUs: its weakest pair (``NVSWITCH`` for fewer than two GPUs, which
    need no link)."""
    best = Link.NVSWITCH
    for a, b in combinations(devices, 2):
        best = min(best, link(a, b))
        if best is Link.SYSTEM:
            break
    return best


def has_topology(devices: Sequence[Placed]) -> bool:
    """Whether sets of these devices can differ: some device carries link facts, or the devices
    sit on more than one NUMA node (else every set is alike, for kubelet too)."""
    return any(not d.topo.empty for d in devices) or len({d.numa for d in devices}) > 1
