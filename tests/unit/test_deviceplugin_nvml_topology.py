"""Link facts from NVML, replayed from recorded answers (plain data, no GPU).

``Recorded`` answers the few NVML calls ``deviceplugin.nvml_topology`` makes from a table of
what a machine answered, and raises ``NVMLError`` for everything the table lacks, as NVML
answers NotSupported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from deviceplugin.nvml_topology import link_facts, with_links
from handoff.topology import NO_TOPO, Link, Topo, set_link
from handoff.wire import GPU, DeviceID

pytestmark = pytest.mark.unit


class NVMLError(Exception):
    pass


@dataclass
class Recorded:
    """NVML as one machine answered: bus IDs, active links with their far ends and kinds,
    common ancestors of GPU pairs."""

    buses: list[str]
    links: dict[tuple[int, int], tuple[str, int]] = field(default_factory=dict)  # (gpu, link)
    ancestors: dict[tuple[int, int], int] = field(default_factory=dict)
    nvlink_supported: bool = True
    NVMLError: type[Exception] = NVMLError
    NVML_NVLINK_MAX_LINKS: int = 18

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i >= len(self.buses):
            raise NVMLError("InvalidArgument")
        return i

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self.buses[h].encode())

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if not self.nvlink_supported or link >= self.NVML_NVLINK_MAX_LINKS:
            raise NVMLError("NotSupported")
        return 1 if (h, link) in self.links else 0

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, h: int, link: int) -> Any:
        return SimpleNamespace(busId=self.links[(h, link)][0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        return self.links[(h, link)][1]

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        key = (min(a, b), max(a, b))
        if key not in self.ancestors:
            raise NVMLError("NotSupported")
        return self.ancestors[key]


GPU_TYPE, SWITCH_TYPE = 0, 2
SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM = 10, 20, 30, 40, 50


def pairs(n: int, level: Any) -> dict[tuple[int, int], int]:
    return {(i, j): level(i, j) for i in range(n) for j in range(i + 1, n)}


def gpus(n: int) -> list[GPU]:
    return [GPU(DeviceID(f"GPU-{i}"), i, "H100", 1, None, True) for i in range(n)]


def test_an_nvswitch_baseboard_is_one_domain_with_pcie_switches_and_sockets() -> None:
    # recorded shape of an HGX H100 (4 of its 8 GPUs): every GPU has active links to NVSwitches
    # (their PCI addresses are not GPUs), GPUs in pairs under PCIe switches, two sockets
    buses = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:9A:00.0", "00000000:AB:00.0"]
    links = {(g, lnk): ("00000000:05:00.0", SWITCH_TYPE) for g in range(4) for lnk in range(18)}
    ancestors = pairs(4, lambda i, j: MULTIPLE if i // 2 == j // 2 else SYSTEM)
    got = link_facts(Recorded(buses, links, ancestors), [0, 1, 2, 3])
    assert [t.nvswitch for t in got] == ["nvsw"] * 4
    assert [t.pcie for t in got] == ["pci-0000:18", "pci-0000:18", "pci-0000:9a", "pci-0000:9a"]
    assert [t.socket for t in got] == [0, 0, 1, 1]
    assert all(t.nvlink == () for t in got)


def test_bridged_pairs_are_direct_nvlink_peers() -> None:
    # two NVLink bridges (0-1, 2-3), each bridge four links; one socket, separate PCIe switches
    buses = ["0000:17:00.0", "0000:31:00.0", "0000:b1:00.0", "0000:ca:00.0"]
    links: dict[tuple[int, int], tuple[str, int]] = {}
    for a, b in ((0, 1), (2, 3)):
        for lnk in range(4):
            links[(a, lnk)] = (buses[b].upper(), GPU_TYPE)
            links[(b, lnk)] = (buses[a], GPU_TYPE)
    ancestors = pairs(4, lambda i, j: NODE)
    recorded = Recorded(buses, links, ancestors)
    got = with_links(recorded, gpus(4))
    assert [g.topo.nvlink for g in got] == [(1,), (0,), (3,), (2,)]
    assert [g.topo.pcie for g in got] == [
        "pci-0000:17",
        "pci-0000:31",
        "pci-0000:b1",
        "pci-0000:ca",
    ]
    assert {g.topo.socket for g in got} == {0}
    assert set_link(got[0:2]) is Link.NVLINK
    assert set_link(got[1:3]) is Link.NUMA


def test_a_single_gpu_without_nvlink_support_has_no_link_facts() -> None:
    # recorded from one PCIe GPU: NVLink calls answer NotSupported, no pairs to compare
    recorded = Recorded(["00000000:3B:00.0"], nvlink_supported=False)
    assert with_links(recorded, gpus(1))[0].topo == NO_TOPO


def test_unanswered_facts_stay_unknown() -> None:
    recorded = Recorded(["0000:17:00.0", "0000:31:00.0"], nvlink_supported=False)
    got = link_facts(recorded, [0, 1])
    assert got == [Topo(), Topo()]
