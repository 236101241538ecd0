"""``python -m deviceplugin.print_inventory``: this node's GPUs and how they are connected.

Prints what the device plugin would publish in the node's ``nodelock.io/gpus`` annotation, read
from NVML exactly as the plugin reads it (``deviceplugin.nvml``: UUID, model, memory, NUMA node,
and the link facts of ``deviceplugin.nvml_topology``), as a table and a link matrix in the manner
of ``nvidia-smi topo -m``, or as the annotation's JSON with ``--json``.  ``--layout NAME`` prints a
simulated layout instead (no GPU needed).

On a machine without NVML (no driver, no ``pynvml``) it prints one line saying so on stderr and
exits 2.  It only reads: nothing is registered with kubelet and nothing is written.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from typing import Any

from deviceplugin.devices import DeviceBackendError
from deviceplugin.simulated import LAYOUTS, SimSpec, inventory
from handoff.topology import Link, link
from handoff.wire import GPU, format_inventory

LINK_NAMES = {
    Link.NVSWITCH: "NVSW",
    Link.NVLINK: "NV",
    Link.PCIE: "PIX",
    Link.NUMA: "NODE",
    Link.SYSTEM: "SYS",
}
LEGEND = (
    "NVSW = same NVSwitch domain, NV = direct NVLink, PIX = same PCIe switch, "
    "NODE = same NUMA node or socket, SYS = across sockets"
)


def _cell(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def render(gpus: Sequence[GPU]) -> str:
    """The inventory as a table, then the pairwise link matrix and its legend (pure)."""
    if not gpus:
        return "no GPUs"
    ordered = sorted(gpus, key=lambda g: g.index)
    head = ["IDX", "ID", "MODEL", "MEMORY", "NUMA", "SOCKET", "PCIE", "NVSWITCH", "NVLINK", "OK"]
    rows = [
        [
            str(g.index),
            g.id,
            g.model,
            f"{g.memory_mib} MiB",
            _cell(g.numa),
            _cell(g.topo.socket),
            _cell(g.topo.pcie),
            _cell(g.topo.nvswitch),
            ",".join(str(i) for i in sorted(g.topo.nvlink)) or "-",
            "yes" if g.healthy else "NO",
        ]
        for g in ordered
    ]
    lines = _columns([head, *rows])
    lines.append("")
    names = [f"GPU{g.index}" for g in ordered]
    matrix = [["", *names]]
    for a, name in zip(ordered, names, strict=True):
        matrix.append([name, *("X" if a is b else LINK_NAMES[link(a, b)] for b in ordered)])
    lines += _columns(matrix)
    lines.append(LEGEND)
    return "\n".join(lines)


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def discover_nvml(nvml: Any | None = None) -> list[GPU]:
    """The node's GPUs as the plugin's NVML backend lists them (``nvml``: a ``pynvml`` stand-in;
    ``DeviceBackendError`` when NVML cannot be used)."""
    from deviceplugin.nvml import NvmlBackend  # imports pynvml only when asked

    backend = NvmlBackend(nvml=nvml)
    try:
        return asyncio.run(backend.discover())
    finally:
        backend.close()


def main(
    argv: Sequence[str] | None = None, *, discover: Callable[[], list[GPU]] = discover_nvml
) -> int:
    """Print the inventory; 2 with one line on stderr when NVML cannot be read."""
    parser = argparse.ArgumentParser(
        prog="python -m deviceplugin.print_inventory",
        description="Print this node's GPU inventory with its topology, as the plugin reads it.",
    )
    parser.add_argument("--json", action="store_true", help="the nodelock.io/gpus annotation")
    parser.add_argument(
        "--layout",
        choices=sorted(LAYOUTS),
        default=None,
        help="print a simulated layout (8 GPUs) instead of reading NVML",
    )
    args = parser.parse_args(argv)
    try:
        if args.layout is not None:
            gpus = inventory("simulated", SimSpec(), {"layout": args.layout})
        else:
            gpus = discover()
    except DeviceBackendError as exc:
        print(f"print_inventory: no GPU inventory from NVML: {exc}", file=sys.stderr)
        return 2
    print(format_inventory(gpus) if args.json else render(gpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
