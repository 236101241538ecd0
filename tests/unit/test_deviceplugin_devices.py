"""Device backends and the device state: simulated inventory, NVML's pure parts, answers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from deviceplugin import nvml
from deviceplugin.answer import DeviceMode, DeviceNode, container_answer
from deviceplugin.decide import Refusal, RefusalKind
from deviceplugin.devices import DeviceBackendError, DeviceState
from deviceplugin.servicer import container_response, device_message, options, status_code
from deviceplugin.simulated import SimSpec, SimulatedBackend, inventory, simulated_id
from handoff.wire import GPU, DeviceID, format_inventory, parse_inventory, valid_device_id


def test_simulated_ids_are_stable_distinct_and_valid() -> None:
    a = [simulated_id("n1", i) for i in range(16)]
    assert a == [simulated_id("n1", i) for i in range(16)]
    assert len(set(a) | {simulated_id("n2", i) for i in range(16)}) == 32
    for dev in a:
        assert dev.startswith("GPU-")
        assert valid_device_id(dev)
        assert len(dev) == 40


def test_simulated_inventory_from_flags() -> None:
    gpus = inventory("n1", SimSpec(count=3, model="M", memory_mib=100))
    assert [g.index for g in gpus] == [0, 1, 2]
    assert {g.model for g in gpus} == {"M"}
    assert all(g.healthy and g.memory_mib == 100 and g.numa is None for g in gpus)


def test_simulated_inventory_file_overrides() -> None:
    gpus = inventory(
        "n1",
        SimSpec(count=8),
        {
            "count": 4,
            "numaNodes": 2,
            "unhealthy": [1],
            "devices": [{"index": 3, "model": "small", "memoryMiB": 5, "healthy": False}],
        },
    )
    assert [g.healthy for g in gpus] == [True, False, True, False]
    assert [g.numa for g in gpus] == [0, 0, 1, 1]
    assert (gpus[3].model, gpus[3].memory_mib) == ("small", 5)


@pytest.mark.parametrize(
    "bad",
    [[], {"count": -1}, {"count": "8"}, {"unhealthy": "1"}, {"devices": [{"healthy": False}]}],
)
def test_simulated_inventory_rejects_bad_files(bad: object) -> None:
    with pytest.raises(ValueError, match=r"."):
        inventory("n1", SimSpec(), bad)


def test_inventory_round_trips_through_the_node_annotation_format() -> None:
    gpus = inventory("n1", SimSpec(count=4, numa_nodes=2), {"unhealthy": [2]})
    assert parse_inventory(format_inventory(gpus)) == gpus


async def test_simulated_backend_reloads_its_file(tmp_path: Path) -> None:
    sim = tmp_path / "gpus.json"
    sim.write_text(json.dumps({"count": 2}))
    backend = SimulatedBackend("n1", SimSpec(), sim_file=sim)
    state = DeviceState(await backend.discover())
    assert [g.healthy for g in state.gpus] == [True, True]
    watcher = asyncio.create_task(backend.watch(state))
    try:
        version = state.version
        sim.write_text("{ half written")  # ignored: the last good inventory stays
        sim.write_text(json.dumps({"count": 2, "unhealthy": [1]}))
        await asyncio.wait_for(state.wait_newer(version), 10)
        assert [g.healthy for g in state.gpus] == [True, False]
    finally:
        watcher.cancel()


async def test_simulated_backend_with_a_broken_file_fails_clearly(tmp_path: Path) -> None:
    sim = tmp_path / "gpus.json"
    sim.write_text("nope")
    with pytest.raises(DeviceBackendError, match=r"gpus\.json"):
        await SimulatedBackend("n1", SimSpec(), sim_file=sim).discover()
    with pytest.raises(DeviceBackendError, match=r"missing\.json"):
        await SimulatedBackend("n1", SimSpec(), sim_file=tmp_path / "missing.json").discover()


async def test_device_state_wakes_waiters_only_on_change() -> None:
    gpus = inventory("n1", SimSpec(count=2))
    state = DeviceState(gpus)
    assert not await state.update(list(reversed(gpus)))  # same inventory, other order
    waiter = asyncio.create_task(state.wait_newer(state.version))
    await asyncio.sleep(0)
    assert not waiter.done()
    sick = [gpus[0], GPU(gpus[1].id, 1, gpus[1].model, gpus[1].memory_mib, None, False)]
    assert await state.update(sick)
    assert await asyncio.wait_for(waiter, 10) == 1
    assert state.health() == {gpus[0].id: True, gpus[1].id: False}


def test_nvml_without_the_library_is_a_clear_user_facing_error() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML is available here; the real-GPU check covers this backend")
    with pytest.raises(DeviceBackendError, match="--backend simulated") as info:
        nvml.NvmlBackend()
    assert info.value.user_facing


def test_nvml_numa_from_sysfs(tmp_path: Path) -> None:
    dev = tmp_path / "0000:17:00.0"
    dev.mkdir()
    (dev / "numa_node").write_text("1\n")
    assert nvml.sysfs_numa("00000000:17:00.0", root=tmp_path) == 1
    (dev / "numa_node").write_text("-1\n")
    assert nvml.sysfs_numa("00000000:17:00.0", root=tmp_path) is None
    assert nvml.sysfs_numa("00000000:99:00.0", root=tmp_path) is None


IDS = [DeviceID("GPU-b"), DeviceID("GPU-a")]


def test_answer_env_in_assignment_order_and_device_nodes() -> None:
    a = container_answer(
        IDS,
        mode=DeviceMode.DEVICE_NODES,
        host_nodes=["/dev/nvidia1", "/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidiactl"],
    )
    assert a.envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-a"}
    assert a.device_nodes == (
        DeviceNode("/dev/nvidia1"),
        DeviceNode("/dev/nvidia0"),
        DeviceNode("/dev/nvidiactl"),
    )
    assert a.cdi_devices == ()


def test_answer_simulated_is_env_only_and_cdi_names_devices() -> None:
    assert container_answer(IDS, mode=DeviceMode.DEVICE_NODES).device_nodes == ()
    cdi = container_answer(IDS, mode=DeviceMode.CDI, host_nodes=["/dev/nvidia0"])
    assert cdi.cdi_devices == ("nvidia.com/gpu=GPU-b", "nvidia.com/gpu=GPU-a")
    assert cdi.device_nodes == ()


def test_protobuf_translation() -> None:
    resp = container_response(
        container_answer(IDS, mode=DeviceMode.DEVICE_NODES, host_nodes=["/dev/nvidia3"])
    )
    assert dict(resp.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-a"}
    assert [(d.container_path, d.host_path, d.permissions) for d in resp.devices] == [
        ("/dev/nvidia3", "/dev/nvidia3", "rw")
    ]
    healthy = device_message(GPU(DeviceID("GPU-x"), 0, "m", 1, 1, True))
    assert (healthy.ID, healthy.health, [n.ID for n in healthy.topology.nodes]) == (
        "GPU-x",
        "Healthy",
        [1],
    )
    sick = device_message(GPU(DeviceID("GPU-y"), 1, "m", 1, None, False))
    assert sick.health == "Unhealthy"
    assert not sick.HasField("topology")
    assert options().get_preferred_allocation_available
    assert not options().pre_start_required


def test_status_codes() -> None:
    assert status_code(Refusal(RefusalKind.BAD_REQUEST, "")) is grpc.StatusCode.INVALID_ARGUMENT
    assert status_code(Refusal(RefusalKind.FORGED, "")) is grpc.StatusCode.FAILED_PRECONDITION
    assert status_code(Refusal(RefusalKind.NO_HOLDER, "")) is grpc.StatusCode.FAILED_PRECONDITION
    assert status_code(Refusal(RefusalKind.UNAVAILABLE, "")) is grpc.StatusCode.UNAVAILABLE
