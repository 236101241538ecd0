"""The plain-HTTP operations port of a long-running part: ``/metrics``, ``/healthz``, ``/readyz``.

The extender and the device plugin each serve this port next to their real interface (the
extender's HTTPS port, the plugin's unix socket), so Prometheus and kubelet's probes need no
credential at all.

Guarantees: only ``GET`` (and ``HEAD``) of these three paths is served; any other path is a 404
and any other method a 405, so nothing reachable here changes state.  ``/healthz`` answers 200
while the event loop runs; ``/readyz`` answers 503 naming what is missing while ``ready()``
returns anything, else 200; ``/metrics`` is the Prometheus text of the given registry.

``listening_site`` is how every TCP listener of the parts opens (this port and the extender's
HTTPS port): ``::`` (or an empty host) is every address of both families on one socket, an IPv6
socket with ``IPV6_V6ONLY`` off so that IPv4 clients arrive as ``::ffff:a.b.c.d``, as Go and
kube-scheduler's ``--bind-address=::`` do; where the kernel has no IPv6 it is IPv4's
``0.0.0.0``.  Any other host (``0.0.0.0`` included) is that address alone.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

OPS_PATHS = ("/metrics", "/healthz", "/readyz")


# hosts meaning every address of both families (IPv6 with IPv4-mapped addresses)
ANY_ADDRESS = ("", "::")


def listening_site(
    runner: web.BaseRunner, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None
) -> web.BaseSite:
    """The site that listens on ``host:port`` for ``runner``: dual-stack for ``::`` or ``""``
    (module docstring); raises ``OSError`` when started, or here when ``::``'s port is taken."""
    if host in ANY_ADDRESS:
        sock = _dual_stack_socket(port)
        if sock is not None:
            return web.SockSite(runner, sock, ssl_context=ssl_context)
        host = "0.0.0.0"
    return web.TCPSite(runner, host, port, ssl_context=ssl_context)


def _dual_stack_socket(port: int) -> socket.socket | None:
    """An IPv6 socket bound to ``[::]:port`` that accepts IPv4 too; None where the kernel has no
    IPv6 (no AF_INET6, or ``::`` not an address it can bind)."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::", port))
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            return None
        raise
    sock.setblocking(False)
    return sock


class OpsPortError(OSError):
    """The operations port could not be opened; the message names the address."""

    user_facing = True


def ops_app(registry: CollectorRegistry, ready: Callable[[], list[str]]) -> web.Application:
    """The application of the operations port over ``registry``; ``ready()`` names what the
    part still waits for (empty: ready)."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        missing = ready()
        if missing:
            return web.Response(status=503, text=f"waiting for: {', '.join(missing)}\n")
        return web.Response(text="ok\n")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


class OpsServer:
    """The operations port, started and stopped with its part."""

    def __init__(self, registry: CollectorRegistry, ready: Callable[[], list[str]]) -> None:
        self._app = ops_app(registry, ready)
        self._runner: web.AppRunner | None = None
        self.host = ""
        self.port = 0

    @property
    def url(self) -> str:
        """``http://host:port`` of the running port (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (``::``: every address, IPv4 and IPv6; port 0: any free port,
        then ``self.port`` says which); raises ``OpsPortError`` if the address cannot be used."""
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        try:
            await listening_site(self._runner, host, port).start()
        except OSError as exc:
            await self.stop()
            shown = f"[{host}]" if ":" in host else host
            raise OpsPortError(f"cannot serve metrics on {shown}:{port}: {exc}") from exc
        self.host = host
        self.port = int(self._runner.addresses[0][1]) if self._runner.addresses else port
        log.info("metrics and probes on %s", self.url)

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
