"""The node's GPUs as the plugin knows them, and the backends that find them.

``DeviceState`` holds the current inventory (``handoff.wire.GPU``: ID = GPU UUID, index, model,
memory, NUMA node, health) and wakes every waiter when it changes; ListAndWatch, the inventory
annotation and the health gauges all follow it.  A backend (NVML, ``deviceplugin.nvml``, or the
simulated one, ``deviceplugin.simulated``) fills it and keeps its health current.

Guarantees: ``update`` bumps the version only when the inventory really changed, and waiters see
every version at least once as the latest (they may skip intermediate ones, never the last).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from handoff.wire import GPU, DeviceID


class DeviceBackendError(Exception):
    """The backend cannot find or watch the node's GPUs; the message says what to do."""

    user_facing = True


class DeviceState:
    """The current inventory, sorted by index, and a version that grows on every change."""

    def __init__(self, gpus: Sequence[GPU] = ()) -> None:
        self._gpus = _sorted(gpus)
        self._version = 0
        self._changed = asyncio.Condition()

    @property
    def gpus(self) -> tuple[GPU, ...]:
        return self._gpus

    @property
    def version(self) -> int:
        return self._version

    def health(self) -> dict[DeviceID, bool]:
        """Device ID -> healthy."""
        return {g.id: g.healthy for g in self._gpus}

    async def update(self, gpus: Sequence[GPU]) -> bool:
        """Replace the inventory; returns whether it changed (and woke the waiters)."""
        new = _sorted(gpus)
        if new == self._gpus:
            return False
        async with self._changed:
            self._gpus = new
            self._version += 1
            self._changed.notify_all()
        return True

    async def wait_newer(self, version: int) -> int:
        """Wait until the version is not ``version`` any more; returns the new version."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._version != version)
            return self._version


def _sorted(gpus: Sequence[GPU]) -> tuple[GPU, ...]:
    return tuple(sorted(gpus, key=lambda g: (g.index, g.id)))


class DeviceBackend(Protocol):
    """Finds the node's GPUs and keeps their health current in a ``DeviceState``."""

    @property
    def name(self) -> str: ...

    async def discover(self) -> list[GPU]:
        """The node's GPUs now; raises ``DeviceBackendError`` when they cannot be listed."""
        ...

    async def watch(self, state: DeviceState) -> None:
        """Keep ``state`` current (health, and for the simulated backend its file) until
        cancelled."""
        ...

    def device_nodes(self, ids: Sequence[DeviceID]) -> list[str]:
        """Host device nodes a container needs for ``ids`` (empty when there are none)."""
        ...

    def close(self) -> None:
        """Release the backend's resources (e.g. NVML)."""
        ...
