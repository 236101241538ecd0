"""The plain-HTTP operations port of a long-running part: ``/metrics``, ``/healthz``, ``/readyz``.

The extender and the device plugin each serve this port next to their real interface (the
extender's HTTPS port, the plugin's unix socket), so Prometheus and kubelet's probes need no
credential at all.

Guarantees: only ``GET`` (and ``HEAD``) of these three paths is served; any other path is a 404
and any other method a 405, so nothing reachable here changes state.  ``/healthz`` answers 200
while the event loop runs; ``/readyz`` answers 503 naming what is missing while ``ready()``
returns anything, else 200; ``/metrics`` is the Prometheus text of the given registry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

OPS_PATHS = ("/metrics", "/healthz", "/readyz")


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
        """Listen on ``host:port`` (port 0: any free port, then ``self.port`` says which);
        raises ``OpsPortError`` if the address cannot be used."""
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, host, port).start()
        except OSError as exc:
            await self.stop()
            raise OpsPortError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
        self.host = host
        self.port = int(self._runner.addresses[0][1]) if self._runner.addresses else port
        log.info("metrics and probes on %s", self.url)

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
