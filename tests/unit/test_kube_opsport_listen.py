"""Where the parts listen: ``::`` is every address of IPv4 and IPv6 on one port (the chart's
setting, so the extender and the plugins serve single-stack IPv4, single-stack IPv6 and dual-stack
clusters alike); any other host is that address alone."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from kube.opsport import OpsServer, listening_site


def ipv6_loopback() -> bool:
    """Whether this machine can use ::1 (some sandboxes have no IPv6 at all)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture
async def ops() -> AsyncIterator[OpsServer]:
    server = OpsServer(CollectorRegistry(), lambda: [])
    yield server
    await server.stop()


async def healthz(host: str, port: int) -> int:
    host = f"[{host}]" if ":" in host else host
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{host}:{port}/healthz") as resp,
    ):
        return resp.status


async def test_the_any_address_serves_ipv4_and_ipv6_on_one_port(ops: OpsServer) -> None:
    await ops.start("::", 0)
    assert ops.port > 0
    assert await healthz("127.0.0.1", ops.port) == 200
    if ipv6_loopback():
        assert await healthz("::1", ops.port) == 200


async def test_an_ipv4_address_is_ipv4_only(ops: OpsServer) -> None:
    await ops.start("127.0.0.1", 0)
    assert await healthz("127.0.0.1", ops.port) == 200
    if ipv6_loopback():
        with pytest.raises(aiohttp.ClientConnectionError):
            await healthz("::1", ops.port)


async def test_a_taken_port_is_an_error_naming_the_address(ops: OpsServer) -> None:
    await ops.start("::", 0)
    other = OpsServer(CollectorRegistry(), lambda: [])
    with pytest.raises(OSError, match=rf"cannot serve metrics on \[::\]:{ops.port}"):
        await other.start("::", ops.port)
    await other.stop()


async def test_without_ipv6_the_any_address_falls_back_to_ipv4(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = socket.socket

    def no_ipv6(family: int = socket.AF_INET, *args: object, **kwargs: object) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(97, "Address family not supported by protocol")
        return real(family, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "socket", no_ipv6)
    runner = web.AppRunner(web.Application())
    await runner.setup()
    try:
        site = listening_site(runner, "::", 0)
        assert isinstance(site, web.TCPSite)
        assert site.name.startswith("http://0.0.0.0:")
    finally:
        await runner.cleanup()
