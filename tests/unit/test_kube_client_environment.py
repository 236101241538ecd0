"""The API client reads the proxy environment once, at connect, not on every request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kube.client import KubeClient

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://10.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: "t"}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"""


def connect(tmp_path: Path) -> tuple[object, str | None, object]:
    """(trust_env, proxy, proxy_headers) of a client connected with a kubeconfig (no request)."""
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)

    async def go() -> tuple[object, str | None, object]:
        client = await KubeClient.connect(str(path))
        try:
            rest = client._api.rest_client
            return rest.pool_manager.trust_env, rest.proxy, rest.proxy_headers
        finally:
            await client.close()

    return asyncio.run(go())


def clear_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_no_lookup_per_request_and_no_proxy_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_proxies(monkeypatch)
    trust_env, proxy, _ = connect(tmp_path)
    assert trust_env is False  # aiohttp no longer reads .netrc and the proxy variables per request
    assert proxy is None


def test_a_proxy_in_the_environment_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_proxies(monkeypatch)
    monkeypatch.setenv("HTTPS_PROXY", "http://user:secret@proxy.example:3128")
    trust_env, proxy, headers = connect(tmp_path)
    assert trust_env is False
    assert proxy == "http://proxy.example:3128"
    assert isinstance(headers, dict)
    assert headers["Proxy-Authorization"].startswith("Basic ")


def test_no_proxy_covering_the_api_server_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_proxies(monkeypatch)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "10.0.0.1")
    trust_env, proxy, _ = connect(tmp_path)
    assert trust_env is False
    assert proxy is None
