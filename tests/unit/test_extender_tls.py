"""HTTPS with client certificates: only a client holding a certificate of the given CA is served."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from devcluster.pki import ADMIN, PKI, SCHEDULER
from scheduler_ext.service import ConfigError, Settings, check_settings, server_ssl_context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    p = PKI(tmp_path_factory.mktemp("pki"))
    p.ensure()
    return p


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    p = PKI(tmp_path_factory.mktemp("other-pki"))
    p.ensure()
    return p


@pytest.fixture
async def https_url(pki: PKI) -> AsyncIterator[str]:
    app = web.Application()

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app.router.add_get("/healthz", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    ctx = server_ssl_context(str(pki.serving_cert), str(pki.serving_key), str(pki.ca_cert))
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    try:
        yield f"https://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def client_ctx(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None and key is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


async def get(url: str, ctx: ssl.SSLContext) -> int:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=ctx) as resp:
        await resp.read()
        return resp.status


async def test_client_with_a_certificate_of_the_ca_is_served(https_url: str, pki: PKI) -> None:
    ctx = client_ctx(pki.ca_cert, pki.client_cert(SCHEDULER), pki.client_key(SCHEDULER))
    assert await get(f"{https_url}/healthz", ctx) == 200


async def test_client_without_a_certificate_is_refused(https_url: str, pki: PKI) -> None:
    with pytest.raises(aiohttp.ClientError):
        await get(f"{https_url}/healthz", client_ctx(pki.ca_cert))


async def test_client_with_a_certificate_of_another_ca_is_refused(
    https_url: str, pki: PKI, other_pki: PKI
) -> None:
    ctx = client_ctx(pki.ca_cert, other_pki.client_cert(ADMIN), other_pki.client_key(ADMIN))
    with pytest.raises(aiohttp.ClientError):
        await get(f"{https_url}/healthz", ctx)


def test_tls_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="go together"):
        check_settings(Settings(tls_cert="c.pem"))
    with pytest.raises(ConfigError, match="client-ca needs"):
        check_settings(Settings(client_ca="ca.pem"))
    with pytest.raises(ConfigError, match="cannot load TLS files"):
        server_ssl_context(str(tmp_path / "no.pem"), str(tmp_path / "no.key"), None)
