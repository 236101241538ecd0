"""The prepared inventory printer: table and link matrix from recorded NVML answers and layouts."""

from __future__ import annotations

import pytest

from deviceplugin.devices import DeviceBackendError
from deviceplugin.nvml_topology import with_links
from deviceplugin.print_inventory import main, render
from deviceplugin.simulated import SimSpec, inventory
from handoff.wire import GPU
from tests.unit.test_deviceplugin_nvml_topology import (
    MULTIPLE,
    SWITCH_TYPE,
    SYSTEM,
    Recorded,
    gpus,
    pairs,
)


def matrix(text: str) -> list[list[str]]:
    rows = [line.split() for line in text.splitlines() if line.startswith("GPU")]
    return [r[1:] for r in rows]


def test_an_nvswitch_baseboard_from_recorded_nvml_answers() -> None:
    # the recorded HGX H100 answers of test_deviceplugin_nvml_topology (4 of its 8 GPUs)
    buses = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:9A:00.0", "00000000:AB:00.0"]
    links = {(g, lnk): ("00000000:05:00.0", SWITCH_TYPE) for g in range(4) for lnk in range(18)}
    ancestors = pairs(4, lambda i, j: MULTIPLE if i // 2 == j // 2 else SYSTEM)
    text = render(with_links(Recorded(buses, links, ancestors), gpus(4)))
    assert matrix(text) == [["X" if i == j else "NVSW" for j in range(4)] for i in range(4)]
    assert "pci-0000:9a" in text.splitlines()[3]


def test_pcie_switches_and_sockets_without_nvlink() -> None:
    buses = ["0000:17:00.0", "0000:31:00.0", "0000:b1:00.0", "0000:ca:00.0"]
    ancestors = pairs(4, lambda i, j: MULTIPLE if i // 2 == j // 2 else SYSTEM)
    nvml = Recorded(buses, {}, ancestors, nvlink_supported=False)
    m = matrix(render(with_links(nvml, gpus(4))))
    assert m[0] == ["X", "PIX", "SYS", "SYS"]
    assert m[3] == ["SYS", "SYS", "PIX", "X"]


def test_layouts_show_their_link_classes() -> None:
    pairs_layout = inventory("n", SimSpec(), {"layout": "nvlink-pairs"})
    m = matrix(render(pairs_layout))
    assert m[0][:4] == ["X", "NV", "NODE", "NODE"]
    assert m[0][4] == "SYS"
    numa = inventory("n", SimSpec(), {"layout": "pcie-2numa"})
    assert matrix(render(numa))[2][:4] == ["NODE", "NODE", "X", "PIX"]
    table = render(numa).splitlines()
    assert table[0].split()[:3] == ["IDX", "ID", "MODEL"]
    assert "pcie1" in table[3]


def test_render_empty() -> None:
    assert render([]) == "no GPUs"


def test_without_nvml_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    def no_nvml() -> list[GPU]:
        raise DeviceBackendError("cannot initialise NVML (NVML Shared Library Not Found)")

    assert main([], discover=no_nvml) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("print_inventory: no GPU inventory from NVML: cannot initialise NVML")


def test_json_is_the_annotation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json", "--layout", "nvswitch"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('[{"id":"GPU-')
    assert '"nvswitch":"nvsw0"' in out
