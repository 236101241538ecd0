"""The plugin's unix socket and its registration with kubelet.

kubelet dials the plugin back inside ``Register``, so the socket is served first and registered
second.  When kubelet restarts it deletes every socket in the plugin directory and makes a new
``kubelet.sock``; the plugin notices either and serves a fresh socket and registers again.  It
follows both names with inotify (``deviceplugin.dirwatch``), so it looks at once after a change
and otherwise every ``RECHECK_S`` (5 s); where inotify cannot be used it polls every ``POLL_S``
(0.2 s), both from ``dirwatch``.  Either way it is back within about a second of the new
kubelet listening.

Guarantees: at most one gRPC server per endpoint at a time; Register is retried (every second at
most) until kubelet accepts it, and never sent while the plugin's socket is missing.
Not guaranteed: that kubelet accepted the resource (a kubelet that refuses the version or the
resource name answers with an error, which is logged and retried).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import grpc

from deviceplugin.dirwatch import POLL_S, DirChanges
from deviceplugin.metrics import PluginMetrics
from proto import deviceplugin_v1beta1_pb2 as pb
from proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
REGISTER_TIMEOUT_S = 5.0
REGISTER_RETRY_S = 1.0
STOP_GRACE_S = 0.5

# (st_dev, st_ino, st_ctime_ns): a file recreated under the same name differs even when the
# file system hands out the freed inode number again
FileId = tuple[int, int, int]
log = logging.getLogger(__name__)


def file_id(path: Path) -> FileId | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def register_request(socket_name: str, resource: str) -> pb.RegisterRequest:
    return pb.RegisterRequest(
        version=API_VERSION,
        endpoint=socket_name,
        resource_name=resource,
        options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
    )


class Endpoint:
    """Serves a DevicePlugin servicer on ``plugin_dir/socket_name`` and keeps it registered."""

    def __init__(
        self,
        *,
        plugin_dir: Path,
        socket_name: str,
        resource: str,
        servicer: pb_grpc.DevicePluginServicer,
        metrics: PluginMetrics,
        poll_s: float = POLL_S,
    ) -> None:
        if "/" in socket_name or not socket_name:
            raise ValueError(f"socket name {socket_name!r} must be a plain file name")
        self.plugin_dir = plugin_dir
        self.socket_name = socket_name
        self.socket = plugin_dir / socket_name
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self._resource = resource
        self._servicer = servicer
        self._metrics = metrics
        self._poll_s = poll_s
        self._changes = DirChanges(plugin_dir, (socket_name, KUBELET_SOCKET))
        self.serving = asyncio.Event()  # set while the socket is served
        self.registered = asyncio.Event()  # set once kubelet accepted Register; cleared on restart
        self.registrations = 0
        self.restarts = 0

    async def run(self) -> None:
        """Serve and stay registered until cancelled."""
        try:
            while True:
                server, sock = await self._serve()
                try:
                    await self._stay_registered(sock)
                finally:
                    self.serving.clear()
                    self.registered.clear()
                    await server.stop(STOP_GRACE_S)
                    if file_id(self.socket) == sock:  # ours still: nobody should dial it now
                        self.socket.unlink(missing_ok=True)
                self.restarts += 1
                log.info(
                    "socket %s was removed (kubelet restarted?); serving it again", self.socket
                )
        finally:
            self._changes.close()

    async def _serve(self) -> tuple[grpc.aio.Server, FileId]:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self._servicer, server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        sock = file_id(self.socket)
        if sock is None:
            await server.stop(None)
            raise OSError(f"gRPC server started but {self.socket} does not exist")
        self.serving.set()
        log.info("serving the device plugin API on %s", self.socket)
        return server, sock

    async def _stay_registered(self, sock: FileId) -> None:
        """Return when our socket is gone; (re-)register whenever kubelet's socket is new."""
        loop = asyncio.get_running_loop()
        registered_with: FileId | None = None
        next_try = 0.0
        while file_id(self.socket) == sock:
            kubelet = file_id(self.kubelet_socket)
            if kubelet is None and registered_with is not None:
                log.info("kubelet.sock is gone (kubelet restarting?); waiting for it")
                registered_with = None
                self.registered.clear()
            if kubelet is not None and kubelet != registered_with and loop.time() >= next_try:
                if self.registered.is_set():
                    log.info("kubelet.sock was recreated; registering again")
                    self.registered.clear()
                if await self._register():
                    registered_with = kubelet
                else:
                    next_try = loop.time() + REGISTER_RETRY_S
            period = self._changes.period(self._poll_s)
            if kubelet is not None and kubelet != registered_with:  # a Register to retry
                period = min(period, max(0.0, next_try - loop.time()))
            await self._changes.wait(period)

    async def _register(self) -> bool:
        request = register_request(self.socket_name, self._resource)
        try:
            async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                stub = pb_grpc.RegistrationStub(channel)
                await stub.Register(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self._metrics.registrations.labels(result="error").inc()
            log.warning(
                "Register with kubelet failed (%s): %s", exc.code().name, exc.details() or ""
            )
            return False
        self._metrics.registrations.labels(result="ok").inc()
        self.registrations += 1
        self.registered.set()
        log.info(
            "registered %s with kubelet (endpoint %s, API %s)",
            self._resource,
            self.socket_name,
            API_VERSION,
        )
        return True
