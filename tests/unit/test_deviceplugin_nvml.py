"""The NVML backend driven by recorded NVML answers: a fake ``pynvml`` built from plain data
(the real module's error class and constants, recorded return values), handed to the backend.

What ListAndWatch would send is recorded from the ``DeviceState`` the backend keeps current:
every change, as kubelet's health strings.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from deviceplugin.devices import DeviceBackendError, DeviceState
from deviceplugin.nvml import NvmlBackend, add_flags
from deviceplugin.nvml_health import (
    APPLICATION_XIDS,
    HealthBook,
    Reason,
    XidPolicy,
    parse_ignored_xids,
    wait_backoff_s,
)
from deviceplugin.servicer import device_message
from handoff.wire import GPU, DeviceID

XID = pynvml.nvmlEventTypeXidCriticalError
MIB = 1024 * 1024


def gpu_record(index: int, **overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000",
        "name": "NVIDIA H100 80GB HBM3",
        "memory_mib": 81559,
        "minor": index,
        "numa": 0,
        "mig": [0],  # current MIG mode per call (the last one repeats); "unsupported", "error"
        "events": True,  # supports critical XID events
        "recovery": [0],  # GPU_RECOVERY_ACTION per read (the last repeats); None: unsupported
    }
    record.update(overrides)
    return record


class RecordedNvml(SimpleNamespace):
    """Stands in for the ``pynvml`` module, answering from ``gpus`` and ``waits``.

    ``waits``: one per ``nvmlEventSetWait`` call, in order: ``"timeout"``, ``{"error": code}``,
    or ``{"xid": n, "gpu": index}`` (``"gpu": None``: NVML cannot name the GPU).  Once they run
    out every wait times out after a few milliseconds.
    """

    def __init__(self, gpus: Sequence[dict[str, Any]], waits: Sequence[Any] = ()) -> None:
        super().__init__(
            NVMLError=pynvml.NVMLError,
            NVML_ERROR_NOT_SUPPORTED=pynvml.NVML_ERROR_NOT_SUPPORTED,
            NVML_ERROR_FUNCTION_NOT_FOUND=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            NVML_ERROR_TIMEOUT=pynvml.NVML_ERROR_TIMEOUT,
            nvmlEventTypeXidCriticalError=XID,
        )
        self.gpus = [dict(g) for g in gpus]
        self.waits: deque[Any] = deque(waits)
        self.wait_calls = 0
        self.calls: dict[str, int] = {}

    @staticmethod
    def _next(values: list[Any]) -> Any:
        return values.pop(0) if len(values) > 1 else values[0]

    def _fail(self, code: int) -> pynvml.NVMLError:
        return pynvml.NVMLError(code)

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        for index, g in enumerate(self.gpus):
            if g["uuid"] == uuid:
                return index
        raise self._fail(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if handle is None:
            raise self._fail(pynvml.NVML_ERROR_UNKNOWN)
        return str(self.gpus[handle]["uuid"])

    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        return int(self.gpus[handle]["minor"])

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(self.gpus[handle]["name"])

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(total=self.gpus[handle]["memory_mib"] * MIB)

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        return int(self.gpus[handle]["numa"])

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        mode = self._next(self.gpus[handle]["mig"])
        if mode == "unsupported":
            raise self._fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if mode == "error":
            raise self._fail(pynvml.NVML_ERROR_UNKNOWN)
        return [mode, mode]

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass

    def nvmlDeviceGetSupportedEventTypes(self, handle: int) -> int:
        return XID if self.gpus[handle]["events"] else 0

    def nvmlDeviceRegisterEvents(self, handle: int, mask: int, event_set: str) -> None:
        assert mask == XID

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        self.wait_calls += 1
        if not self.waits:
            time.sleep(0.005)
            raise self._fail(pynvml.NVML_ERROR_TIMEOUT)
        wait = self.waits.popleft()
        if wait == "timeout":
            raise self._fail(pynvml.NVML_ERROR_TIMEOUT)
        if "error" in wait:
            raise self._fail(wait["error"])
        return SimpleNamespace(
            device=wait["gpu"],
            eventType=wait.get("type", XID),
            eventData=wait["xid"],
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )

    def nvmlDeviceGetFieldValues(self, handle: int, field_ids: list[int]) -> list[Any]:
        assert field_ids == [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        action = self._next(self.gpus[handle]["recovery"])
        if action is None:
            raise self._fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=action))]


class ListAndWatch(DeviceState):
    """A DeviceState that records what ListAndWatch sends after each change."""

    def __init__(self, gpus: Sequence[GPU]) -> None:
        super().__init__(gpus)
        self.sent: list[list[str]] = []

    async def update(self, gpus: Sequence[GPU]) -> bool:
        changed = await super().update(gpus)
        if changed:
            self.sent.append([device_message(g).health for g in self.gpus])
        return changed


async def run_watch(
    fake: RecordedNvml, *, env: dict[str, str] | None = None
) -> tuple[NvmlBackend, ListAndWatch, list[float]]:
    """Discover, then watch until every recorded wait was answered and three more rounds ran
    (each round polls: ``poll_s`` is 0)."""
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await asyncio.sleep(0)

    backend = NvmlBackend(nvml=fake, environ=env or {}, sleep=sleep, poll_s=0.0)
    state = ListAndWatch(await backend.discover())
    rounds = len(fake.waits) + 3
    watcher = asyncio.create_task(backend.watch(state))
    try:
        for _ in range(2000):  # 10 s at most
            if max(fake.wait_calls, len(sleeps)) >= rounds:
                break
            await asyncio.sleep(0.005)
    finally:
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watcher
    return backend, state, sleeps


H, U = "Healthy", "Unhealthy"


async def test_gpus_in_mig_mode_are_never_advertised_as_whole_gpus() -> None:
    fake = RecordedNvml(
        [
            gpu_record(0),
            gpu_record(1, mig=[1]),  # MIG mode on: left out
            gpu_record(2, mig=["unsupported"]),  # no MIG on this GPU: a whole GPU
            gpu_record(3, mig=["error"]),  # cannot tell: advertised unhealthy
        ]
    )
    backend = NvmlBackend(nvml=fake, environ={})
    gpus = await backend.discover()
    assert [g.index for g in gpus] == [0, 2, 3]
    assert [g.healthy for g in gpus] == [True, True, False]
    assert backend.skipped_mig == [fake.gpus[1]["uuid"]]
    assert backend.device_nodes([g.id for g in gpus])[:3] == [
        "/dev/nvidia0",
        "/dev/nvidia2",
        "/dev/nvidia3",
    ]


async def test_a_gpu_switched_to_mig_mode_turns_unhealthy_until_switched_back() -> None:
    # discovery reads 0, the first poll 1, the next ones 0 again
    fake = RecordedNvml([gpu_record(0, mig=[0, 1, 0]), gpu_record(1)])
    backend, state, _ = await run_watch(fake)
    assert state.sent == [[U, H], [H, H]]
    assert backend.health_report()["mig"] == {g["uuid"]: "disabled" for g in fake.gpus}


async def test_xid_then_recovery_is_unhealthy_then_healthy() -> None:
    fake = RecordedNvml(
        [gpu_record(0), gpu_record(1, recovery=[1, 1, 0])],  # GPU_RESET twice, then NONE
        waits=[{"xid": 79, "gpu": 1}, "timeout", "timeout"],
    )
    backend, state, sleeps = await run_watch(fake)
    assert state.sent == [[H, U], [H, H]]
    assert sleeps == []
    assert backend.book.reasons(DeviceID(fake.gpus[1]["uuid"])) == frozenset()


async def test_an_xid_stays_unhealthy_while_nvml_cannot_report_recovery() -> None:
    fake = RecordedNvml([gpu_record(0, recovery=[None])], waits=[{"xid": 48, "gpu": 0}])
    backend, state, _ = await run_watch(fake)
    assert state.sent == [[U]]
    assert backend.health_report()["health"] == {
        fake.gpus[0]["uuid"]: {"healthy": False, "reasons": ["xid"]}
    }


async def test_application_xids_and_other_events_leave_the_gpu_healthy() -> None:
    fake = RecordedNvml(
        [gpu_record(0)],
        waits=[
            {"xid": 13, "gpu": 0},
            {"xid": 43, "gpu": 0},
            {"xid": 48, "gpu": 0, "type": pynvml.nvmlEventTypeDoubleBitEccError},
        ],
    )
    _, state, _ = await run_watch(fake)
    assert state.sent == []


async def test_an_xid_nvml_cannot_place_marks_every_gpu() -> None:
    fake = RecordedNvml(
        [gpu_record(0, recovery=[None]), gpu_record(1, recovery=[None])],
        waits=[{"xid": 79, "gpu": None}],
    )
    _, state, _ = await run_watch(fake)
    assert state.sent == [[U, U]]


async def test_a_failing_event_wait_marks_every_gpu_and_backs_off() -> None:
    unknown = pynvml.NVML_ERROR_UNKNOWN
    fake = RecordedNvml(
        [gpu_record(0), gpu_record(1)],
        waits=[{"error": unknown}, {"error": unknown}, {"error": unknown}, "timeout"],
    )
    _, state, sleeps = await run_watch(fake)
    assert state.sent == [[U, U], [H, H]]
    assert sleeps == [0.5, 1.0, 2.0]  # one pause after each failed wait, growing
    assert fake.wait_calls >= 4


def test_the_backoff_grows_to_a_cap() -> None:
    assert [wait_backoff_s(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert wait_backoff_s(50) == 30.0


async def test_all_health_checks_disabled_watches_no_events() -> None:
    fake = RecordedNvml([gpu_record(0)], waits=[{"xid": 79, "gpu": 0}])
    _, state, _ = await run_watch(fake, env={"DP_DISABLE_HEALTHCHECKS": "all"})
    assert state.sent == []
    assert fake.wait_calls == 0


async def test_polled_gpus_without_events_turn_unhealthy_when_they_stop_answering() -> None:
    fake = RecordedNvml([gpu_record(0, events=False)])
    backend = NvmlBackend(nvml=fake, environ={}, poll_s=0.0)
    state = ListAndWatch(await backend.discover())
    watcher = asyncio.create_task(backend.watch(state))
    await asyncio.sleep(0.05)
    fake.gpus[0]["uuid"] = "GPU-gone"  # the handle lookup now fails: no answer
    for _ in range(500):  # 5 s at most
        if state.sent:
            break
        await asyncio.sleep(0.01)
    watcher.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watcher
    assert state.sent == [[U]]


@pytest.mark.parametrize(
    ("disable", "enable", "fatal", "healthy"),
    [
        (None, None, [79, 48, 94], [13, 31, 43, 45, 68, 109]),
        ("79, x,,48", None, [94], [79, 48, 13]),
        ("all", None, [], [79, 48, 13]),
        ("xids", None, [], [79]),
        ("all", "79", [79], [48, 13]),  # NVIDIA documents this: enable beats "all"
        (None, "13", [13, 79], [31]),  # an application XID enabled again
        ("79", "all", [79, 13, 31], []),
    ],
)
def test_xid_policy_follows_nvidias_environment(
    disable: str | None, enable: str | None, fatal: list[int], healthy: list[int]
) -> None:
    policy = XidPolicy.from_settings(disable=disable, enable=enable)
    assert [x for x in fatal if not policy.fatal(x)] == []
    assert [x for x in healthy if policy.fatal(x)] == []


def test_checks_are_off_only_when_everything_is_disabled_and_nothing_enabled() -> None:
    assert XidPolicy.from_settings(disable="all", enable=None).checks_off
    assert not XidPolicy.from_settings(disable="all", enable="48").checks_off
    assert not XidPolicy.from_settings(disable="48", enable=None).checks_off


def test_ignored_xids_add_to_the_application_ones() -> None:
    policy = XidPolicy.from_environment({}, ignored=parse_ignored_xids("79, 48"))
    assert not policy.fatal(79)
    assert not policy.fatal(13)
    assert policy.fatal(94)
    assert policy.disabled.xids >= APPLICATION_XIDS


def test_a_malformed_ignored_xid_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not an XID: 'x'"):
        parse_ignored_xids("79,x")
    fake = RecordedNvml([gpu_record(0)])
    with pytest.raises(DeviceBackendError, match="NODELOCK_IGNORED_XIDS"):
        NvmlBackend(nvml=fake, environ={"NODELOCK_IGNORED_XIDS": "79,x"})


def test_the_ignored_xids_flag_reaches_the_backend() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(["--ignored-xids", "79"])
    assert args.ignored_xids == "79"
    with pytest.raises(DeviceBackendError, match="--ignored-xids"):
        NvmlBackend.from_args(parser.parse_args(["--ignored-xids", "7x"]))


def test_health_book_reasons_clear_independently() -> None:
    a, b = DeviceID("GPU-a"), DeviceID("GPU-b")
    book = HealthBook([a, b])
    book.mark([a], Reason.XID)
    book.mark([a, b], Reason.EVENT_WAIT)
    book.clear([a, b], Reason.EVENT_WAIT)
    assert not book.healthy(a)
    assert book.healthy(b)
    book.clear([a], Reason.XID)
    assert book.healthy(a)
