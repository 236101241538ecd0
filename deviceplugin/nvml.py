"""The NVML backend: the node's real GPUs through ``pynvml`` (nvidia-ml-py).

``pynvml`` is imported only when this backend is used, and a node without the NVIDIA driver gets
one clear ``DeviceBackendError`` instead of a traceback.  The backend takes the ``pynvml``
module as a parameter (``NvmlBackend(nvml=...)``), so its whole behaviour is tested against
recorded NVML answers with no GPU.

A GPU in MIG mode is never advertised as a whole GPU: one that is in MIG mode at start is served
as its MIG instances (``deviceplugin.mig``; one resource per profile, docs/mig.md), one whose
MIG mode cannot be read is advertised unhealthy, and one switched to MIG mode later turns
unhealthy until it is switched back.  A MIG instance's health is its parent GPU's: XID events
are registered on the parent and mark all its instances, and the instances turn unhealthy when
the parent leaves MIG mode (they no longer exist).

Health (decisions in ``deviceplugin.nvml_health``, NVIDIA k8s-device-plugin's XID rules and
``DP_DISABLE_HEALTHCHECKS``/``DP_ENABLE_HEALTHCHECKS``): every GPU is registered for critical
XID events on one NVML event set, waited on in a worker thread.

- A fatal XID marks its GPU unhealthy (every GPU when NVML cannot say which one).  It becomes
  healthy again when NVML reports that no recovery action is needed any more (the
  ``GPU_RECOVERY_ACTION`` field reads ``NONE``, checked every ``poll_s``); a driver that cannot
  report it keeps the GPU unhealthy until the plugin restarts, as NVIDIA's plugin does.
- A failed event wait (not a timeout) marks every GPU unhealthy and pauses 0.5 s, doubling to
  30 s while it keeps failing — never a busy loop; the first wait that answers again makes them
  healthy again.
- GPUs whose events NVML cannot watch (``NotSupported``) are polled every ``poll_s`` instead and
  are unhealthy while they do not answer; any other registration error marks the GPU unhealthy
  until the plugin restarts.

Not verified here: this module needs a GPU for a real run.  The unit tests drive it with a fake
``pynvml`` built from recorded answers; the real-GPU check is ``python -m deviceplugin.nvml
--watch 30`` (docs/deviceplugin.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deviceplugin.devices import DeviceBackendError, DeviceState
from deviceplugin.mig import mig_devices
from deviceplugin.nvml_health import (
    IGNORED_ENV,
    HealthBook,
    Reason,
    XidPolicy,
    parse_ignored_xids,
    wait_backoff_s,
)
from deviceplugin.nvml_topology import with_links
from handoff.wire import GPU, DeviceID, format_inventory

CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
WAIT_MS = 1000
POLL_S = 5.0
MIB = 1024 * 1024
MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
RECOVERY_ACTION_NONE = 0  # NVML_GPU_RECOVERY_ACTION_NONE

log = logging.getLogger(__name__)


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


def init_nvml(pynvml: Any) -> Any:
    """Initialise NVML through ``pynvml``, or raise a ``DeviceBackendError`` saying why not."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise DeviceBackendError(
            f"cannot initialise NVML ({exc}): is the NVIDIA driver installed and "
            "libnvidia-ml.so.1 visible to this process? Use --backend simulated without GPUs"
        ) from exc
    return pynvml


def load_pynvml() -> Any:
    """Import ``pynvml`` and initialise NVML, or raise a ``DeviceBackendError`` saying why not."""
    try:
        pynvml = importlib.import_module("pynvml")
    except ImportError as exc:
        raise DeviceBackendError(
            "the NVML backend needs the nvidia-ml-py package (module pynvml); install it or use "
            "--backend simulated"
        ) from exc
    return init_nvml(pynvml)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The NVML backend's flags, for ``nodelock device-plugin`` (``NvmlBackend.from_args``)."""
    parser.add_argument(
        "--ignored-xids",
        default="",
        help="comma-separated XIDs that leave a GPU healthy, besides the application XIDs "
        "13,31,43,45,68,109 (NVML backend; DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS "
        "are honoured as by NVIDIA's device plugin)",
    )


@dataclass(frozen=True)
class WaitOutcome:
    """What one ``nvmlEventSetWait`` gave: nothing (timeout), an error, or an event."""

    failed: str | None = None  # the error, when the wait failed
    event_type: int | None = None  # None: timed out
    xid: int = 0
    device: DeviceID | None = None  # None with an event: NVML could not name the GPU


class NvmlBackend:
    """The node's NVIDIA GPUs.

    ``nvml`` is the ``pynvml`` module (imported and initialised here when not given);
    ``environ`` is where ``DP_DISABLE_HEALTHCHECKS``/``DP_ENABLE_HEALTHCHECKS`` (and, without
    ``ignored_xids``, ``NODELOCK_IGNORED_XIDS``) are read; ``sleep`` and ``clock`` pace the
    backoff and the polls (tests pass fakes)."""

    def __init__(
        self,
        *,
        nvml: Any | None = None,
        dev_root: Path = Path("/"),
        ignored_xids: Iterable[int] | None = None,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] | None = None,
        poll_s: float = POLL_S,
        wait_ms: int = WAIT_MS,
    ) -> None:
        env = os.environ if environ is None else environ
        if ignored_xids is None:
            try:
                ignored_xids = parse_ignored_xids(env.get(IGNORED_ENV, ""))
            except ValueError as exc:
                raise DeviceBackendError(f"{IGNORED_ENV}: {exc}") from exc
        self.policy = XidPolicy.from_environment(env, ignored=ignored_xids)
        self._nvml = load_pynvml() if nvml is None else init_nvml(nvml)
        self._dev_root = dev_root
        self._minor: dict[DeviceID, int] = {}
        self._sleep = sleep
        self._clock = clock
        self._poll_s = poll_s
        self._wait_ms = wait_ms
        self.skipped_mig: list[DeviceID] = []  # GPUs in MIG mode at discovery: not advertised
        self._parent: dict[DeviceID, DeviceID] = {}  # MIG instance -> its GPU
        self.mig: dict[DeviceID, bool | None] = {}  # MIG mode as last read (None: unreadable)
        self.book = HealthBook(())

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NvmlBackend:
        """The backend for ``nodelock device-plugin`` (flags from ``add_flags``)."""
        text: str | None = getattr(args, "ignored_xids", None)
        if text is None:  # the flag is not there: NODELOCK_IGNORED_XIDS is read instead
            return cls()
        try:
            return cls(ignored_xids=parse_ignored_xids(text))
        except ValueError as exc:
            raise DeviceBackendError(f"--ignored-xids: {exc}") from exc

    @property
    def name(self) -> str:
        return "nvml"

    def _code(self, exc: BaseException) -> int | None:
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else None

    def _mig_enabled(self, handle: Any) -> bool | None:
        """Whether MIG mode is on (current mode), False for GPUs without MIG, None if unknown."""
        n = self._nvml
        try:
            current = n.nvmlDeviceGetMigMode(handle)[0]
        except n.NVMLError as exc:
            if self._code(exc) in (n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_FUNCTION_NOT_FOUND):
                return False
            log.warning("cannot read the MIG mode of a GPU: %s", exc)
            return None
        except AttributeError:  # a pynvml without MIG support
            return False
        return int(current) == MIG_ENABLED

    def _list(self) -> list[GPU]:
        n = self._nvml
        gpus: list[GPU] = []
        instances: list[GPU] = []
        self.skipped_mig = []
        self._parent = {}
        try:
            for index in range(n.nvmlDeviceGetCount()):
                h = n.nvmlDeviceGetHandleByIndex(index)
                uuid = DeviceID(_text(n.nvmlDeviceGetUUID(h)))
                mig = self._mig_enabled(h)
                self.mig[uuid] = mig
                if mig:
                    self.skipped_mig.append(uuid)
                    instances += self._instances(h, index, uuid)
                    continue
                self._minor[uuid] = int(n.nvmlDeviceGetMinorNumber(h))
                gpus.append(
                    GPU(
                        id=uuid,
                        index=index,
                        model=_text(n.nvmlDeviceGetName(h)),
                        memory_mib=int(n.nvmlDeviceGetMemoryInfo(h).total) // MIB,
                        numa=self._numa(h),
                        healthy=mig is not None,
                    )
                )
        except n.NVMLError as exc:
            raise DeviceBackendError(f"NVML cannot list the GPUs: {exc}") from exc
        return [*with_links(n, gpus), *instances]

    def _instances(self, h: Any, index: int, uuid: DeviceID) -> list[GPU]:
        """The MIG instances of GPU ``index`` (in MIG mode) as devices of their own."""
        n = self._nvml
        try:
            found, problems = mig_devices(n, h, index, uuid)
        except (n.NVMLError, AttributeError) as exc:  # AttributeError: a pynvml without MIG
            found, problems = [], [f"GPU {index} ({uuid}): cannot list its MIG devices: {exc}"]
        for problem in problems:
            log.warning("MIG instance left out: %s", problem)
        log.warning(
            "GPU %d (%s) is in MIG mode: not advertised as a whole GPU; served as %d MIG "
            "instances (%s)",
            index,
            uuid,
            len(found),
            ", ".join(d.profile for d in found) or "none",
        )
        self._minor[uuid] = int(n.nvmlDeviceGetMinorNumber(h))
        model, numa = _text(n.nvmlDeviceGetName(h)), self._numa(h)
        out = []
        for d in found:
            self._parent[d.id] = uuid
            out.append(
                GPU(d.id, index, model, d.memory_mib, numa, True, profile=d.profile, parent=uuid)
            )
        return out

    def _targets(self, ids: Iterable[DeviceID]) -> dict[DeviceID, list[DeviceID]]:
        """The GPUs NVML is asked about, each with the served devices it stands for: a whole
        GPU for itself, a GPU in MIG mode for its instances."""
        out: dict[DeviceID, list[DeviceID]] = {}
        for dev in ids:
            out.setdefault(self._parent.get(dev, dev), []).append(dev)
        return out

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

    def _register(self, ids: Sequence[DeviceID], event_set: Any) -> list[DeviceID]:
        """Register every GPU for critical XID events; returns the GPUs to poll instead."""
        n = self._nvml
        polled: list[DeviceID] = []
        for dev, served in self._targets(ids).items():  # a MIG GPU's events cover its instances
            try:
                h = n.nvmlDeviceGetHandleByUUID(dev)
                supported = int(n.nvmlDeviceGetSupportedEventTypes(h))
                mask = supported & n.nvmlEventTypeXidCriticalError
                if not mask:
                    raise n.NVMLError(n.NVML_ERROR_NOT_SUPPORTED)
                n.nvmlDeviceRegisterEvents(h, mask, event_set)
            except n.NVMLError as exc:
                if self._code(exc) == n.NVML_ERROR_NOT_SUPPORTED:
                    log.info("GPU %s: no NVML XID events (%s); polling it instead", dev, exc)
                    polled += served
                else:
                    log.warning("GPU %s: cannot watch its health (%s): unhealthy", dev, exc)
                    self.book.mark(served, Reason.NO_HEALTH_EVENTS)
        return polled

    async def watch(self, state: DeviceState) -> None:
        n = self._nvml
        loop = asyncio.get_running_loop()
        clock = self._clock or loop.time
        self.book = book = HealthBook(g.id for g in state.gpus)
        book.mark([g.id for g in state.gpus if self.mig.get(g.id, False) is None], Reason.MIG)
        event_set: Any = None
        polled: list[DeviceID] = []
        if self.policy.checks_off:
            log.info(
                "%s (DP_DISABLE_HEALTHCHECKS); only MIG mode is watched", self.policy.describe()
            )
        else:
            log.info("GPU health from NVML events: %s", self.policy.describe())
            try:
                event_set = await asyncio.to_thread(n.nvmlEventSetCreate)
            except n.NVMLError as exc:
                log.warning("NVML cannot create an event set (%s): polling every GPU", exc)
                polled = list(book.ids)
            else:
                polled = await asyncio.to_thread(self._register, book.ids, event_set)
        await self._publish(state)
        next_poll = clock() + self._poll_s
        failures = 0
        waiting: asyncio.Future[WaitOutcome] | None = None
        try:
            while True:
                if event_set is None:
                    await self._sleep(self._poll_s)
                else:
                    waiting = loop.run_in_executor(None, self._wait_event, event_set)
                    outcome = await asyncio.shield(waiting)
                    waiting = None
                    failures = self._judge(outcome, failures)
                    await self._publish(state)  # an XID is published before any recovery check
                    if failures:
                        await self._sleep(wait_backoff_s(failures))
                if clock() >= next_poll:
                    await asyncio.to_thread(self._poll, polled)
                    next_poll = clock() + self._poll_s
                    await self._publish(state)
        finally:
            if waiting is not None and not waiting.done():
                # the worker thread is still inside nvmlEventSetWait (at most wait_ms): let it
                # return before the event set is freed under it
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(waiting), self._wait_ms / 1000 + 5)
            if event_set is not None:
                with contextlib.suppress(n.NVMLError):
                    n.nvmlEventSetFree(event_set)

    def _judge(self, outcome: WaitOutcome, failures: int) -> int:
        """Apply one wait's outcome to the health book; returns failed waits in a row."""
        book = self.book
        if outcome.failed is not None:
            if not failures:
                log.warning("NVML event wait failed (%s): every GPU unhealthy", outcome.failed)
            book.mark(book.ids, Reason.EVENT_WAIT)
            return failures + 1
        book.clear(book.ids, Reason.EVENT_WAIT)
        if outcome.event_type is None:
            return 0
        if outcome.event_type != self._nvml.nvmlEventTypeXidCriticalError:
            log.info("NVML event %#x skipped (not a critical XID)", outcome.event_type)
            return 0
        if not self.policy.fatal(outcome.xid):
            log.info("GPU %s: XID %d ignored, still healthy", outcome.device, outcome.xid)
            return 0
        if outcome.device is None:
            log.warning("XID %d on a GPU NVML cannot name: every GPU unhealthy", outcome.xid)
            book.mark(book.ids, Reason.XID)
        elif outcome.device in (targets := self._targets(book.ids)):
            log.warning("GPU %s: XID %d, unhealthy", outcome.device, outcome.xid)
            book.mark(targets[outcome.device], Reason.XID)  # a MIG GPU: all its instances
        else:
            log.info("XID %d on a GPU this plugin does not serve (%s)", outcome.xid, outcome.device)
        return 0

    def _wait_event(self, event_set: Any) -> WaitOutcome:
        n = self._nvml
        try:
            data = n.nvmlEventSetWait(event_set, self._wait_ms)
        except n.NVMLError as exc:
            if self._code(exc) == n.NVML_ERROR_TIMEOUT:
                return WaitOutcome()
            return WaitOutcome(failed=str(exc) or repr(exc))
        try:
            device: DeviceID | None = DeviceID(_text(n.nvmlDeviceGetUUID(data.device)))
        except n.NVMLError:
            device = None
        return WaitOutcome(event_type=int(data.eventType), xid=int(data.eventData), device=device)

    def _recovered(self, handle: Any) -> bool:
        """NVML says the GPU needs no recovery action (False when it cannot say)."""
        n = self._nvml
        try:
            field = n.nvmlDeviceGetFieldValues(handle, [RECOVERY_ACTION_FIELD])[0]
        except (n.NVMLError, AttributeError):
            return False
        if int(field.nvmlReturn) != 0:  # NVML_SUCCESS
            return False
        return int(field.value.uiVal) == RECOVERY_ACTION_NONE

    def _poll(self, polled: Sequence[DeviceID]) -> None:
        """Every ``poll_s``: polled GPUs still answer, XID-marked GPUs recovered, MIG mode."""
        n = self._nvml
        book = self.book
        xid_marked = set(book.having(Reason.XID))
        for dev, served in self._targets(book.ids).items():  # a MIG GPU for its instances
            asked = any(d in polled for d in served)
            try:
                h = n.nvmlDeviceGetHandleByUUID(dev)
                if asked:
                    n.nvmlDeviceGetMemoryInfo(h)
            except n.NVMLError as exc:
                if asked:
                    if Reason.NOT_ANSWERING not in book.reasons(served[0]):
                        log.warning("GPU %s does not answer NVML: %s", dev, exc)
                    book.mark(served, Reason.NOT_ANSWERING)
                continue
            book.clear(served, Reason.NOT_ANSWERING)
            if any(d in xid_marked for d in served) and self._recovered(h):
                log.info("GPU %s: NVML reports no recovery action needed; healthy again", dev)
                book.clear(served, Reason.XID)
            mig = self._mig_enabled(h)
            self.mig[dev] = mig
            if served != [dev]:  # its MIG instances: gone unless the GPU is still in MIG mode
                (book.clear if mig else book.mark)(served, Reason.MIG)
            elif mig:
                book.mark([dev], Reason.MIG)
            elif mig is False:
                book.clear([dev], Reason.MIG)

    async def _publish(self, state: DeviceState) -> None:
        before = state.health()
        if await state.update(self.book.apply(state.gpus)):
            for gpu in state.gpus:
                if before.get(gpu.id) != gpu.healthy:
                    reasons = ", ".join(sorted(self.book.reasons(gpu.id))) or "recovered"
                    log.warning(
                        "GPU %s now %s (%s)",
                        gpu.id,
                        "healthy" if gpu.healthy else "unhealthy",
                        reasons,
                    )

    def device_nodes(self, ids: Sequence[DeviceID]) -> list[str]:
        gpus = dict.fromkeys(self._parent.get(d, d) for d in ids)  # a MIG instance: its GPU's
        nodes = [f"/dev/nvidia{self._minor[d]}" for d in gpus if d in self._minor]
        nodes += [c for c in CONTROL_DEVICES if (self._dev_root / c.lstrip("/")).exists()]
        return nodes

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)

    def health_report(self) -> dict[str, object]:
        """Health and MIG state of every GPU, for the real-GPU check."""
        return {
            "healthChecks": self.policy.describe(),
            "mig": {
                d: ("unknown" if m is None else "enabled" if m else "disabled")
                for d, m in self.mig.items()
            },
            "notAdvertisedMig": list(self.skipped_mig),
            "health": {
                d: {"healthy": self.book.healthy(d), "reasons": sorted(self.book.reasons(d))}
                for d in self.book.ids
            },
        }


async def _check(watch_s: float) -> int:
    """``python -m deviceplugin.nvml``: what this backend sees on this machine (real-GPU check)."""
    backend = NvmlBackend()
    try:
        gpus = await backend.discover()
        print(format_inventory(gpus))
        print(json.dumps({"deviceNodes": backend.device_nodes([g.id for g in gpus])}))
        state = DeviceState(gpus)
        watcher = asyncio.create_task(backend.watch(state))
        await asyncio.sleep(max(watch_s, 0.5))  # at least one pass: health as registered
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        print(format_inventory(state.gpus))
        print(json.dumps(backend.health_report()))
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    import sys

    parser = argparse.ArgumentParser(prog="python -m deviceplugin.nvml", description=_check.__doc__)
    parser.add_argument("--watch", type=float, default=0.0, help="watch health for SECONDS")
    try:
        sys.exit(asyncio.run(_check(parser.parse_args().watch)))
    except DeviceBackendError as exc:
        print(f"deviceplugin.nvml: {exc}", file=sys.stderr)
        sys.exit(2)
