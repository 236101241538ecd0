"""How a node's NVIDIA GPUs are connected, from NVML (``handoff.topology.Topo`` per GPU).

Every function takes the ``pynvml`` module (or anything answering the same calls) as a
parameter, so the reading is tested from recorded NVML answers without a GPU.

- **NVLink**: for each link ``0..NVML_NVLINK_MAX_LINKS-1`` that ``nvmlDeviceGetNvLinkState``
  reports active, ``nvmlDeviceGetNvLinkRemotePciInfo_v2`` names the far end; a far end that is
  one of the node's GPUs is a direct NVLink peer, anything else (``nvmlDeviceGetNvLinkRemote
  DeviceType`` says switch, or an unknown PCI address) an NVSwitch: GPUs with active links to
  NVSwitches share one NVSwitch domain (``nvsw``; one baseboard per node).
- **PCIe switch**: GPUs whose ``nvmlDeviceGetTopologyCommonAncestor`` is at most
  ``NVML_TOPOLOGY_MULTIPLE`` (nvidia-smi's PIX/PXB) share a PCIe switch tree; the group is named
  after the PCI bus ID of its lowest-index GPU.
- **Socket**: GPUs whose common ancestor is at most ``NVML_TOPOLOGY_NODE`` share a NUMA node /
  socket; groups are numbered by their lowest-index GPU (only used where NUMA is unknown).

A call NVML does not support (``NVMLError``, or a binding too old to have it) leaves that fact
unknown; nothing here raises for a missing fact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from handoff.topology import Topo
from handoff.wire import GPU

TOPOLOGY_MULTIPLE = 20  # NVML_TOPOLOGY_MULTIPLE: PCIe switches only between the two (PXB)
TOPOLOGY_NODE = 40  # NVML_TOPOLOGY_NODE: within one NUMA node
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS (H100: 18)
NVLINK_DEVICE_TYPE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
NVSWITCH_DOMAIN = "nvsw"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus(value: Any) -> str:
    """A PCI bus ID in one spelling: lower case, 4-digit domain ("0000:17:00.0")."""
    return _text(value).lower()[-12:]


def link_facts(nvml: Any, handles: Sequence[Any]) -> list[Topo]:
    """The links of each GPU in ``handles`` (by index), from NVML."""
    errors = (nvml.NVMLError, AttributeError, TypeError)
    count = len(handles)
    buses: list[str | None] = []
    for h in handles:
        try:
            buses.append(_bus(nvml.nvmlDeviceGetPciInfo(h).busId))
        except errors:
            buses.append(None)
    index_of = {b: i for i, b in enumerate(buses) if b is not None}
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS))
    switch_type = int(getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", NVLINK_DEVICE_TYPE_SWITCH))
    peers: list[set[int]] = [set() for _ in range(count)]
    on_switch = [False] * count
    for i, h in enumerate(handles):
        for lnk in range(max_links):
            try:
                active = int(nvml.nvmlDeviceGetNvLinkState(h, lnk)) == 1
            except errors:
                break  # NotSupported / InvalidArgument past the last link
            if not active:
                continue
            try:
                remote = _bus(nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(h, lnk).busId)
            except errors:
                continue
            peer = index_of.get(remote)
            kind: int | None = None
            try:
                kind = int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, lnk))
            except errors:
                kind = None
            if kind == switch_type or peer is None:
                on_switch[i] = True
            elif peer != i:
                peers[i].add(peer)
    pcie = _groups(nvml, handles, TOPOLOGY_MULTIPLE, errors)
    socket = _groups(nvml, handles, TOPOLOGY_NODE, errors)
    sockets = sorted({s for s in socket if s is not None})
    out = []
    for i in range(count):
        group = socket[i]
        first = pcie[i]
        pcie_id = buses[first] if first is not None else None
        out.append(
            Topo(
                socket=None if group is None else sockets.index(group),
                pcie=None if pcie_id is None else f"pci-{pcie_id[:7]}",
                nvswitch=NVSWITCH_DOMAIN if on_switch[i] else None,
                nvlink=tuple(sorted(peers[i])),
            )
        )
    return out


def _groups(
    nvml: Any, handles: Sequence[Any], level: int, errors: tuple[type[BaseException], ...]
) -> list[int | None]:
    """For each GPU, the lowest index of the GPUs it shares an ancestor at most ``level`` deep
    with (itself when it shares none; None when NVML answered no pair for it)."""
    count = len(handles)
    parent = list(range(count))
    answered = [False] * count

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(count):
        for j in range(i + 1, count):
            try:
                ancestor = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
            except errors:
                continue
            answered[i] = answered[j] = True
            if ancestor <= level:
                a, b = root(i), root(j)
                parent[max(a, b)] = min(a, b)
    if count == 1:
        return [None]
    return [root(i) if answered[i] else None for i in range(count)]


def with_links(nvml: Any, gpus: Sequence[GPU]) -> list[GPU]:
    """``gpus`` (listed by NVML index) with their link facts; unchanged where NVML says
    nothing."""
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(g.index) for g in gpus]
    except (nvml.NVMLError, AttributeError):
        return list(gpus)
    return [replace(g, topo=t) for g, t in zip(gpus, link_facts(nvml, handles), strict=True)]
