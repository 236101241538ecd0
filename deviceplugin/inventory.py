"""Publishes the node's GPU inventory as one Node annotation (``<prefix>gpus``).

The value is ``handoff.wire.format_inventory`` of the current devices (sorted, deterministic),
written with a merge PATCH of that one annotation, and only when it differs from what this
process last wrote or (at start) from what the Node already carries.  A failed write (node not
registered yet, API server down) is retried with capped backoff; the latest inventory wins.
"""

from __future__ import annotations

import logging

from deviceplugin.devices import DeviceState
from deviceplugin.metrics import PluginMetrics
from handoff.wire import Keys, format_inventory
from kube.backoff import Backoff
from kube.client import KubeClient, node_path
from kube.errors import ApiError, ApiUnavailable
from lockd.model import NodeName

BACKOFF_S = (0.5, 10.0)
log = logging.getLogger(__name__)


class InventoryPublisher:
    """Keeps ``<prefix>gpus`` on the Node equal to the plugin's devices."""

    def __init__(
        self, *, kube: KubeClient, node: NodeName, keys: Keys, metrics: PluginMetrics
    ) -> None:
        self._kube = kube
        self._node = node
        self._key = keys.gpus
        self._metrics = metrics
        self.written: str | None = None  # the value the Node is known to carry
        self.writes = 0

    async def run(self, state: DeviceState) -> None:
        """Publish now and after every change of ``state``, until cancelled."""
        backoff = Backoff(*BACKOFF_S)  # jittered: nodes must not retry in lockstep
        while True:
            version = state.version
            value = format_inventory(state.gpus)
            try:
                await self._publish(value)
                backoff.reset()
            except (ApiError, ApiUnavailable) as exc:
                self._metrics.inventory_writes.labels(result="error").inc()
                log.warning("cannot publish the GPU inventory of node %s: %s", self._node, exc)
                await backoff.sleep()
                continue
            await state.wait_newer(version)

    async def _publish(self, value: str) -> None:
        if value == self.written:
            return
        path = node_path(self._node)
        if self.written is None:
            node = await self._kube.get(path)
            current = ((node.get("metadata") or {}).get("annotations") or {}).get(self._key)
            if current == value:
                self.written = value
                return
        await self._kube.patch(path, {"metadata": {"annotations": {self._key: value}}})
        self.written = value
        self.writes += 1
        self._metrics.inventory_writes.labels(result="ok").inc()
        log.info("published the GPU inventory of node %s", self._node)
