"""The plugin's unix socket and its registration with kubelet.

kubelet dials the plugin back inside ``Register``, so the socket is served first and registered
second.  When kubelet restarts it deletes every socket in the plugin directory and makes a new
``kubelet.sock``; the plugin notices either and serves a fresh socket and registers again.  It
follows both names with inotify (``deviceplugin.dirwatch``), so it looks at once after a change
and otherwise every ``RECHECK_S`` (5 s); where inotify cannot be used it polls every ``POLL_S``
(0.2 s), both from ``dirwatch``.  Either way it registers at its first try after the new
kubelet listens (a refusal is retried, below).

Guarantees: at most one gRPC server per endpoint at a time; one accepted Register per kubelet
(per ``kubelet.sock``: kubelet v1.37 refuses a second one on the same socket and then keeps a
stale record of the first, see ``ALREADY_CONNECTED``); a refused Register is retried after 50 ms,
doubling up to every second, and at once when ``kubelet.sock`` is replaced; none is sent while
the plugin's socket is missing.
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
from kube import failpoints
from proto import deviceplugin_v1beta1_pb2 as pb
from proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
# longer than kubelet's own dial back to the plugin (10 s: ``dial`` in
# ``pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go``, v1.31.9 and v1.37.2), so the plugin
# does not give up, and register again, while kubelet may still accept the first call
REGISTER_TIMEOUT_S = 15.0
# a refused Register is tried again after 50 ms, doubling up to every second: a kubelet that is
# starting refuses for a moment (its socket file exists from bind, it accepts from listen)
REGISTER_FIRST_RETRY_S = 0.05
REGISTER_RETRY_S = 1.0
STOP_GRACE_S = 0.5
# kubelet's answer to a Register for a socket it already has an endpoint for (``PluginConnected``,
# ``pkg/kubelet/cm/devicemanager/manager.go``, v1.37.2; v1.31.9 to v1.36.3 replace the endpoint)
ALREADY_CONNECTED = "device plugin already connected"

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


def register_retry_s(failures: int) -> float:
    """How long to wait before the next Register after ``failures`` (>= 1) refusals in a row by
    one ``kubelet.sock``: 50 ms, doubling, at most ``REGISTER_RETRY_S``."""
    doublings = min(max(failures - 1, 0), 32)  # 2**32 * 50 ms is past any cap
    return float(min(REGISTER_FIRST_RETRY_S * 2**doublings, REGISTER_RETRY_S))


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
        self.servicer = servicer
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
        pb_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
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
        """Return when our socket is gone; register once with each kubelet (each new
        ``kubelet.sock``), retrying until it accepts."""
        loop = asyncio.get_running_loop()
        registered_with: FileId | None = None
        failed_with: FileId | None = None  # a new kubelet.sock is tried at once
        next_try, failures = 0.0, 0  # failures in a row on failed_with
        while file_id(self.socket) == sock:
            kubelet = file_id(self.kubelet_socket)
            if kubelet is None and registered_with is not None:
                log.info("kubelet.sock is gone (kubelet restarting?); waiting for it")
                registered_with = None
                self.registered.clear()
            due = loop.time() >= next_try or kubelet != failed_with
            if kubelet is not None and kubelet != registered_with and due:
                if self.registered.is_set():
                    log.info("kubelet.sock was recreated; registering again")
                    self.registered.clear()
                if await self._register():
                    # The kubelet that answered listens on the socket there *now*: the one read
                    # above may have been a dead kubelet's leftover that a new kubelet replaced
                    # during the call, and a second Register to the same kubelet must not follow
                    # (``ALREADY_CONNECTED``).  A kubelet that starts removes our socket first
                    # (``CleanupPluginDirectory`` before ``Listen`` in ``Start``,
                    # ``pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go``, v1.31.9 and
                    # v1.37.2), so a new kubelet is never missed: we serve again and register.
                    kubelet = file_id(self.kubelet_socket) or kubelet
                    registered_with, failed_with, failures = kubelet, None, 0
                else:
                    failures = failures + 1 if kubelet == failed_with else 1
                    failed_with = kubelet
                    next_try = loop.time() + register_retry_s(failures)
            period = self._changes.period(self._poll_s)
            if kubelet is not None and kubelet != registered_with:  # a Register to retry
                period = min(period, max(0.0, next_try - loop.time()))
            await self._changes.wait(period)

    async def _register(self) -> bool:
        await failpoints.pause("register.start")  # e2e: a plugin slow to register again
        request = register_request(self.socket_name, self._resource)
        try:
            async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                stub = pb_grpc.RegistrationStub(channel)
                await stub.Register(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self._metrics.registrations.labels(result="error").inc()
            details = exc.details() or ""
            if ALREADY_CONNECTED in details:
                log.error(
                    "kubelet refuses to register %s again: it still holds an earlier connection "
                    "to this socket (%s); kubelet releases it only when it restarts, so restart "
                    "kubelet on this node (retrying every %.0f s meanwhile)",
                    self.socket,
                    details,
                    REGISTER_RETRY_S,
                )
            else:
                log.warning("Register with kubelet failed (%s): %s", exc.code().name, details)
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
