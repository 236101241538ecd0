"""One node's device plugin, assembled: devices, lock watch, admission, endpoint, inventory.

``DevicePlugin.start`` discovers the devices, reads the checkpoint, starts watching the node's
Lease, serves the socket (and registers with kubelet in the background), publishes the inventory
and retries pending releases.  A node with GPUs in MIG mode gets one more endpoint (own socket,
own Register) per MIG profile found at start, resource ``nvidia.com/mig-<profile>``; all of them
share one ``Admission``, so MIG instances are handed off under the same node lock as whole GPUs.
The MIG profiles served are fixed at start: instances of a profile that appears later are
published in the inventory but not served until the plugin restarts.

Before any of it, ``start`` refuses (``DraConflict``) when a DRA driver also publishes one of the
resources it would serve for the node (``deviceplugin.dra``): two owners of the same GPUs would
give one twice.  It checks again every ``dra_check_s`` while running and stops with the same
error when a DRA driver appears; an API server it cannot reach then only logs.

``stop`` undoes all of it.  ``run`` does both around a wait that ends on cancellation or when any
part fails, so a broken plugin exits (and its DaemonSet restarts it) rather than limping on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deviceplugin import checkpoint
from deviceplugin.admission import Admission
from deviceplugin.answer import DeviceMode
from deviceplugin.decide import MismatchPolicy
from deviceplugin.devices import DeviceBackend, DeviceState
from deviceplugin.dra import DraCheck, DraConflict, check_node
from deviceplugin.endpoint import Endpoint
from deviceplugin.events import AllocateEvents
from deviceplugin.inventory import InventoryPublisher
from deviceplugin.kubeletview import KUBELET_CHECKPOINT, PodResources
from deviceplugin.metrics import PluginMetrics
from deviceplugin.podwatch import NodePods
from deviceplugin.servicer import DevicePluginServicer
from deviceplugin.sharing import SharingServicer, SplitDeviceState
from handoff.sharing import bound_slices, node_use
from handoff.wire import (
    DEFAULT_LOCK_NAMESPACE,
    DEFAULT_PREFIX,
    DEFAULT_RESOURCE,
    Keys,
    resource_of,
)
from kube.client import KubeClient
from kube.events import EventRecorder
from lockd.locks import NodeLocks
from lockd.metrics import LockMetrics
from lockd.model import NodeName

DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_SOCKET = "nodelock-gpu.sock"
DEFAULT_STATE_DIR = Path("/var/lib/nodelock")
GPU_USE_PERIOD_S = 5.0  # how often the per-GPU committed gauges are recomputed
DRA_CHECK_S = 60.0  # how often a running plugin checks again that no DRA driver serves its resource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PluginConfig:
    """Everything a plugin needs to know besides its API client and device backend."""

    node: NodeName
    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    socket_name: str = DEFAULT_SOCKET
    resource: str = DEFAULT_RESOURCE
    lock_namespace: str = DEFAULT_LOCK_NAMESPACE
    prefix: str = DEFAULT_PREFIX
    state_dir: Path = DEFAULT_STATE_DIR
    mode: DeviceMode = DeviceMode.DEVICE_NODES
    policy: MismatchPolicy = MismatchPolicy.REFUSE
    poll_s: float = 0.2
    events: bool = True  # Kubernetes Events for refused Allocate calls (rate-limited)
    gpu_split: int = 1  # > 1: S virtual devices per GPU, shared GPUs (deviceplugin.sharing)
    # kubelet's PodResources socket: who kubelet admits (None: a LIST at the API server)
    pod_resources_socket: Path | None = None
    # seconds between checks that no DRA driver publishes the resource too (0: at start only)
    dra_check_s: float = DRA_CHECK_S
    keys: Keys = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", Keys(self.prefix))


def mig_socket_name(socket_name: str, profile: str) -> str:
    """The socket of the endpoint serving MIG ``profile``, next to the whole-GPU one's:
    ``nodelock-gpu.sock`` -> ``nodelock-gpu-mig-1g.10gb.sock``."""
    stem = socket_name.removesuffix(".sock")
    return f"{stem}-mig-{profile}.sock"


class DevicePlugin:
    """A running device plugin for one node."""

    def __init__(
        self,
        config: PluginConfig,
        *,
        kube: KubeClient,
        backend: DeviceBackend,
        metrics: PluginMetrics | None = None,
    ) -> None:
        self.config = config
        self.kube = kube
        self.backend = backend
        self.metrics = metrics if metrics is not None else PluginMetrics()
        self.locks = NodeLocks(
            kube,
            namespace=config.lock_namespace,
            prefix=config.prefix,
            metrics=LockMetrics(registry=self.metrics.registry),
        )
        self.state = DeviceState() if config.gpu_split <= 1 else SplitDeviceState(config.gpu_split)
        self.pods = NodePods(kube, config.node)
        self.pods.on_synced = lambda: self.metrics.pod_watch_synced.set(1)
        self.events = AllocateEvents(
            EventRecorder(kube, component="nodelock-device-plugin", host=config.node),
            config.node,
        )
        self.kubelet = (
            PodResources(config.pod_resources_socket, resource=config.resource)
            if config.pod_resources_socket is not None
            else None
        )
        self.admission = Admission(
            node=config.node,
            kube=kube,
            locks=self.locks,
            state=self.state,
            checkpoint_file=checkpoint.checkpoint_path(config.state_dir, config.node),
            metrics=self.metrics,
            device_nodes=backend.device_nodes,
            resource=config.resource,
            keys=config.keys,
            policy=config.policy,
            mode=config.mode,
            pods=self.pods,
            on_refused=self.events.refused if config.events else None,
            on_ended=self.events.released_ended if config.events else None,
            serving=self.serving,
            kubelet=self.kubelet,
            kubelet_checkpoint=config.plugin_dir / KUBELET_CHECKPOINT.name,
            on_fallback=self.events.fallback if config.events else None,
        )
        self.endpoint = Endpoint(
            plugin_dir=config.plugin_dir,
            socket_name=config.socket_name,
            resource=config.resource,
            servicer=(SharingServicer if config.gpu_split > 1 else DevicePluginServicer)(
                self.admission, self.state
            ),
            metrics=self.metrics,
            poll_s=config.poll_s,
        )
        self.mig_endpoints: dict[str, Endpoint] = {}  # by MIG profile, made at start
        self.inventory = InventoryPublisher(
            kube=kube, node=config.node, keys=config.keys, metrics=self.metrics
        )
        self._tasks: list[asyncio.Task[None]] = []

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(coro, name=f"deviceplugin-{name}"))

    async def start(self) -> None:
        """Start every part; returns once the plugin's socket is served."""
        self.admission.load()
        await self.state.update(await self.backend.discover())
        try:
            for check in await self.check_dra():
                log.info("DRA check: %s", check.message())
        except BaseException:
            await self.stop()
            raise
        self.metrics.set_devices(self.state.gpus)
        log.info(
            "node %s: %d GPUs (%s backend)",
            self.config.node,
            len(self.state.gpus),
            self.backend.name,
        )
        if self.config.dra_check_s > 0:
            self._spawn("dra-check", self._follow_dra())
        self.pods.on_change = self.admission.holder_changed.set
        self._spawn(
            "lease-watch",
            self.locks.watch(
                node=self.config.node,
                on_change=lambda view, node: self.admission.holder_changed.set(),
            ),
        )
        self._spawn("ended-holders", self.admission.run_ended_releases())
        self._spawn("pod-watch", self.pods.run())
        self._spawn("devices", self.backend.watch(self.state))
        self._spawn("health-gauges", self._follow_health())
        self._spawn("gpu-use-gauges", self._follow_gpu_use())
        self._spawn("releases", self.admission.run_releases())
        self._spawn("kubelet-sightings", self.admission.run_sightings())
        self._spawn("inventory", self.inventory.run(self.state))
        self._spawn("endpoint", self.endpoint.run())
        for profile in sorted({g.profile for g in self.state.gpus if g.profile}):
            endpoint = self.mig_endpoints[profile] = Endpoint(
                plugin_dir=self.config.plugin_dir,
                socket_name=mig_socket_name(self.config.socket_name, profile),
                resource=resource_of(profile),
                servicer=DevicePluginServicer(self.admission, self.state, profile=profile),
                metrics=self.metrics,
                poll_s=self.config.poll_s,
            )
            self._spawn(f"endpoint-mig-{profile}", endpoint.run())
        serving = asyncio.create_task(self._all_serving())
        done, _ = await asyncio.wait([serving, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
        if serving not in done:
            serving.cancel()
            await self.stop()
            for task in done:
                task.result()  # raises what broke the start
            raise RuntimeError("a device plugin task ended during start")

    def resources(self) -> list[str]:
        """The extended resources this plugin serves (whole GPUs, then each MIG profile)."""
        profiles = sorted({g.profile for g in self.state.gpus if g.profile})
        return [self.config.resource, *(resource_of(p) for p in profiles)]

    async def check_dra(self) -> list[DraCheck]:
        """The DRA check of each of ``resources()``; raises ``DraConflict`` if a DRA driver also
        publishes one of them for this node (``DraUnreadable`` if the API server will not say,
        ``ApiUnavailable`` if it cannot be reached)."""
        checks = await check_node(self.kube, node=self.config.node, resources=self.resources())
        conflicts = [c for c in checks if c.conflict]
        if conflicts:
            raise DraConflict(" | ".join(c.message() for c in conflicts))
        return checks

    async def _follow_dra(self) -> None:
        """Check again every ``dra_check_s``: a conflict ends the plugin (``DraConflict``); a
        check that cannot be made is logged and tried again."""
        while True:
            await asyncio.sleep(self.config.dra_check_s)
            try:
                await self.check_dra()
            except DraConflict:
                raise
            except Exception:  # DraUnreadable, ApiUnavailable: the next period tries again
                log.warning("node %s: DRA check not made", self.config.node, exc_info=True)

    async def _all_serving(self) -> None:
        for endpoint in [self.endpoint, *self.mig_endpoints.values()]:
            await endpoint.serving.wait()

    def serving(self) -> bool:
        """Whether every endpoint's ListAndWatch stream is open and has sent kubelet the devices
        (``DevicePluginServicer.listed``): kubelet can admit a pod asking for them."""
        return all(
            not isinstance(e.servicer, DevicePluginServicer) or e.servicer.listed
            for e in [self.endpoint, *self.mig_endpoints.values()]
        )

    def waiting_for(self) -> list[str]:
        """What the plugin still waits for before it is ready (``/readyz``; empty: ready): its
        socket served, registered with kubelet, and its devices sent to kubelet on an open
        ListAndWatch stream (``DevicePluginServicer.listed``)."""
        missing = []
        for e in [self.endpoint, *self.mig_endpoints.values()]:
            which = "" if e is self.endpoint else f" of {e.socket_name}"
            if not e.serving.is_set():
                missing.append(f"socket{which}")
            if not e.registered.is_set():
                missing.append(f"kubelet registration{which}")
            servicer = e.servicer
            if isinstance(servicer, DevicePluginServicer) and not servicer.listed:
                missing.append(f"devices listed to kubelet{which}")
        return missing

    async def _follow_health(self) -> None:
        while True:
            version = self.state.version
            self.metrics.set_devices(self.state.gpus)
            await self.state.wait_newer(version)

    async def _follow_gpu_use(self) -> None:
        """Every ``GPU_USE_PERIOD_S`` the per-GPU committed memory/cores gauges, from the pod
        watch's view of the node's pods (a timer, not a watch hook: it lags by at most that)."""
        while True:
            gpus = self.state.gpus
            try:
                held = bound_slices(self.pods.pods(), keys=self.config.keys)
                self.metrics.set_gpu_use(gpus, node_use(gpus, held))
            except Exception:  # a gauge is not worth the plugin: log, keep the last values
                log.exception("node %s: per-GPU committed gauges not updated", self.config.node)
            await asyncio.sleep(GPU_USE_PERIOD_S)

    async def wait(self) -> None:
        """Until a part fails (raising its error) or the caller is cancelled."""
        done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
        raise RuntimeError(f"device plugin task {next(iter(done)).get_name()} ended")

    async def stop(self) -> None:
        """Stop every part (the socket is no longer served; the checkpoint stays)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.admission.flush()
        with contextlib.suppress(TimeoutError):  # Events under way get a moment to be written
            await asyncio.wait_for(self.events.recorder.flush(), timeout=2.0)
        if self.kubelet is not None:
            await self.kubelet.close()
        self.backend.close()

    async def run(self) -> None:
        """Start, run until cancelled or a part fails, stop."""
        await self.start()
        try:
            await self.wait()
        finally:
            await self.stop()
