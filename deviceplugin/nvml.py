"""The NVML backend: the node's real GPUs through ``pynvml`` (nvidia-ml-py).

``pynvml`` is imported only when this backend is used, and a node without the NVIDIA driver gets
one clear ``DeviceBackendError`` instead of a traceback.  Whole GPUs only (MIG is not handled).

Health: every device is registered for critical XID and double-bit ECC events on one NVML event
set, waited on in a worker thread.  An XID that an application can cause (13, 31, 43, 45, 68,
109, as NVIDIA's device plugin skips; more with ``NODELOCK_IGNORED_XIDS=1,2``) leaves the device
healthy; any other critical event marks it unhealthy until the plugin restarts.  Devices whose
events cannot be registered (``NotSupported``) are polled every ``POLL_S`` seconds instead; a
device that no longer answers is unhealthy.

Not verified here: this module needs a GPU.  The unit tests cover its pure parts and the error
on a machine without NVML; the real-GPU check is separate (docs/deviceplugin.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from deviceplugin.devices import DeviceBackendError, DeviceState
from deviceplugin.nvml_topology import with_links
from handoff.wire import GPU, DeviceID, format_inventory

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
WAIT_MS = 1000
POLL_S = 5.0
MIB = 1024 * 1024

log = logging.getLogger(__name__)


def fatal_xid(xid: int, ignored: Iterable[int] = APPLICATION_XIDS) -> bool:
    """Whether a critical XID event means the device is broken (not an application's fault)."""
    return xid not in set(ignored)


def ignored_xids(env: str | None) -> frozenset[int]:
    """The application XIDs plus those listed (comma-separated) in ``env``; bad entries skipped."""
    extra = {int(x) for x in (env or "").split(",") if x.strip().isdigit()}
    return APPLICATION_XIDS | extra


def sysfs_numa(bus_id: str, *, root: Path = Path("/sys/bus/pci/devices")) -> int | None:
    """The NUMA node of PCI device ``bus_id`` (NVML's 8-digit domain form), None if unknown."""
    short = bus_id.lower()[-12:]  # "00000000:17:00.0" -> "0000:17:00.0"
    try:
        value = int((root / short / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def load_pynvml() -> ModuleType:
    """Import ``pynvml`` and initialise NVML, or raise a ``DeviceBackendError`` saying why not."""
    try:
        pynvml = importlib.import_module("pynvml")
    except ImportError as exc:
        raise DeviceBackendError(
            "the NVML backend needs the nvidia-ml-py package (module pynvml); install it or use "
            "--backend simulated"
        ) from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise DeviceBackendError(
            f"cannot initialise NVML ({exc}): is the NVIDIA driver installed and "
            "libnvidia-ml.so.1 visible to this process? Use --backend simulated without GPUs"
        ) from exc
    return pynvml


class NvmlBackend:
    """The node's NVIDIA GPUs."""

    def __init__(self, *, dev_root: Path = Path("/")) -> None:
        self._nvml = load_pynvml()
        self._dev_root = dev_root
        self._minor: dict[DeviceID, int] = {}
        self._ignored = ignored_xids(os.environ.get("NODELOCK_IGNORED_XIDS"))

    @property
    def name(self) -> str:
        return "nvml"

    def _list(self) -> list[GPU]:
        n = self._nvml
        gpus: list[GPU] = []
        try:
            for index in range(n.nvmlDeviceGetCount()):
                h = n.nvmlDeviceGetHandleByIndex(index)
                uuid = DeviceID(_text(n.nvmlDeviceGetUUID(h)))
                self._minor[uuid] = int(n.nvmlDeviceGetMinorNumber(h))
                gpus.append(
                    GPU(
                        id=uuid,
                        index=index,
                        model=_text(n.nvmlDeviceGetName(h)),
                        memory_mib=int(n.nvmlDeviceGetMemoryInfo(h).total) // MIB,
                        numa=self._numa(h),
                        healthy=True,
                    )
                )
        except n.NVMLError as exc:
            raise DeviceBackendError(f"NVML cannot list the GPUs: {exc}") from exc
        return with_links(n, gpus)

    def _numa(self, handle: Any) -> int | None:
        n = self._nvml
        try:
            value = int(n.nvmlDeviceGetNumaNodeId(handle))
            return value if value >= 0 else None
        except (n.NVMLError, AttributeError):
            pass
        try:
            return sysfs_numa(_text(n.nvmlDeviceGetPciInfo(handle).busId))
        except n.NVMLError:
            return None

    async def discover(self) -> list[GPU]:
        return await asyncio.to_thread(self._list)

    async def watch(self, state: DeviceState) -> None:
        n = self._nvml
        events = n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError
        event_set = await asyncio.to_thread(n.nvmlEventSetCreate)
        polled: list[DeviceID] = []
        for gpu in state.gpus:
            try:
                h = n.nvmlDeviceGetHandleByUUID(gpu.id)
                supported = n.nvmlDeviceGetSupportedEventTypes(h) & events
                if not supported:
                    raise n.NVMLError(n.NVML_ERROR_NOT_SUPPORTED)
                n.nvmlDeviceRegisterEvents(h, supported, event_set)
            except n.NVMLError as exc:
                log.info("GPU %s: no NVML health events (%s); polling instead", gpu.id, exc)
                polled.append(gpu.id)
        loop = asyncio.get_running_loop()
        next_poll = loop.time() + POLL_S
        waiting: asyncio.Future[set[DeviceID]] | None = None
        try:
            while True:
                waiting = loop.run_in_executor(None, self._wait_event, event_set)
                sick = await asyncio.shield(waiting)
                if loop.time() >= next_poll:
                    sick |= await asyncio.to_thread(self._poll, polled)
                    next_poll = loop.time() + POLL_S
                if sick:
                    gpus = [replace(g, healthy=False) if g.id in sick else g for g in state.gpus]
                    if await state.update(gpus):
                        log.warning("GPUs marked unhealthy: %s", sorted(sick))
        finally:
            if waiting is not None and not waiting.done():
                # the worker thread is still inside nvmlEventSetWait (at most WAIT_MS): let it
                # return before the event set is freed under it
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(waiting), WAIT_MS / 1000 + 5)
            n.nvmlEventSetFree(event_set)

    def _wait_event(self, event_set: Any) -> set[DeviceID]:
        n = self._nvml
        try:
            data = n.nvmlEventSetWait(event_set, WAIT_MS)
        except n.NVMLError_Timeout:
            return set()
        except n.NVMLError as exc:
            log.warning("NVML event wait failed: %s", exc)
            return set()
        uuid = DeviceID(_text(n.nvmlDeviceGetUUID(data.device)))
        if data.eventType == n.nvmlEventTypeXidCriticalError and not fatal_xid(
            int(data.eventData), self._ignored
        ):
            log.info("GPU %s: application XID %d, still healthy", uuid, data.eventData)
            return set()
        log.warning("GPU %s: critical event %#x (data %d)", uuid, data.eventType, data.eventData)
        return {uuid}

    def _poll(self, ids: Sequence[DeviceID]) -> set[DeviceID]:
        n = self._nvml
        sick: set[DeviceID] = set()
        for dev in ids:
            try:
                n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByUUID(dev))
            except n.NVMLError as exc:
                log.warning("GPU %s does not answer NVML: %s", dev, exc)
                sick.add(dev)
        return sick

    def device_nodes(self, ids: Sequence[DeviceID]) -> list[str]:
        nodes = [f"/dev/nvidia{self._minor[d]}" for d in ids if d in self._minor]
        nodes += [c for c in CONTROL_DEVICES if (self._dev_root / c.lstrip("/")).exists()]
        return nodes

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)


async def _check(watch_s: float) -> int:
    """``python -m deviceplugin.nvml``: what this backend sees on this machine (real-GPU check)."""
    backend = NvmlBackend()
    try:
        gpus = await backend.discover()
        print(format_inventory(gpus))
        print(json.dumps({"deviceNodes": backend.device_nodes([g.id for g in gpus])}))
        if watch_s > 0:
            state = DeviceState(gpus)
            watcher = asyncio.create_task(backend.watch(state))
            await asyncio.sleep(watch_s)
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            print(format_inventory(state.gpus))
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m deviceplugin.nvml", description=_check.__doc__)
    parser.add_argument("--watch", type=float, default=0.0, help="watch health for SECONDS")
    try:
        sys.exit(asyncio.run(_check(parser.parse_args().watch)))
    except DeviceBackendError as exc:
        print(f"deviceplugin.nvml: {exc}", file=sys.stderr)
        sys.exit(2)
