"""``nodelock locks show`` on a node that shares its GPUs: each GPU's slices (pure part)."""

from __future__ import annotations

from handoff.sharing import WHOLE, Held, Slice
from handoff.wire import GPU, DeviceID
from nodelock.locks_output import gpu_slices, gpu_slices_text

MIB = 81920


def gpu(i: int) -> GPU:
    return GPU(DeviceID(f"GPU-{i}"), i, "H100", MIB, 0, True, split=4)


def test_each_gpu_lists_who_holds_how_much_and_the_totals_against_capacity() -> None:
    held = [
        Held("ml/a", DeviceID("GPU-0"), Slice(memory_mib=20000, cores=30)),
        Held("ml/b", DeviceID("GPU-0"), Slice(memory_percent=50)),
        Held("ml/train", DeviceID("GPU-1"), WHOLE),
    ]
    got = gpu_slices([gpu(0), gpu(1), gpu(2)], held)
    assert [(g["gpu"], g["memoryCommittedMiB"], g["coresCommitted"], g["slices"]) for g in got] == [
        ("GPU-0", 20000 + MIB // 2, 30, 2),
        ("GPU-1", MIB, 100, 1),
        ("GPU-2", 0, 0, 0),
    ]
    assert got[0]["holders"] == [
        {"pod": "ml/a", "memoryMiB": 20000, "cores": 30, "whole": False},
        {"pod": "ml/b", "memoryMiB": MIB // 2, "cores": 0, "whole": False},
    ]
    assert gpu_slices_text(got) == [
        ("gpu GPU-0", f"{20000 + MIB // 2}/{MIB} MiB, 30/100% cores, 2/4 slices"),
        ("  slice ml/a", "20000 MiB, 30% cores"),
        ("  slice ml/b", f"{MIB // 2} MiB, 0% cores"),
        ("gpu GPU-1", f"{MIB}/{MIB} MiB, 100/100% cores, 1/4 slices"),
        ("  slice ml/train", "whole GPU"),
        ("gpu GPU-2", f"0/{MIB} MiB, 0/100% cores, 0/4 slices"),
    ]


def test_a_holding_on_a_gpu_not_in_the_inventory_is_left_out() -> None:
    got = gpu_slices([gpu(0)], [Held("ml/x", DeviceID("GPU-9"), WHOLE)])
    assert got[0]["slices"] == 0
    assert got[0]["holders"] == []
