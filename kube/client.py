"""The one module in nodelock that talks to the Kubernetes client library.

Everything else (lockd, the extender, the device plugin, tests) goes through ``KubeClient``,
which speaks plain JSON objects (``dict``) over the REST paths of the API server.  The client
library (``kubernetes_asyncio``, chosen by measurement: docs/decisions/0001-kubernetes-client.md)
is used for what it does well — kubeconfig and in-cluster credentials, TLS, token refresh, one
pooled aiohttp session — and nothing else, so that swapping it touches this file only.

Guarantees:
- Every error status becomes an ``ApiError`` subclass (``kube.errors``); connection failures,
  timeouts, 429 and 5xx become ``ApiUnavailable``; the transport error is chained as the cause.
- Bodies are sent exactly as given: nothing reformats timestamps (see ``lockd.microtime``).
- ``watch`` yields events in the order the server sent them, each read whole however large, and
  raises ``Gone`` on a 410, so a caller can relist.  It does not retry by itself (the
  list-then-watch loop that does is ``kube.reflector``).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import aiohttp.helpers
import orjson
import yarl
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from kube.errors import ApiUnavailable, api_error

JSON = dict[str, Any]
Body = JSON | list[Any]
Query = list[tuple[str, str]]

DEFAULT_TIMEOUT_S = 10.0


class PatchType(Enum):
    """Content types of the PATCH verb."""

    MERGE = "application/merge-patch+json"
    STRATEGIC = "application/strategic-merge-patch+json"
    JSON = "application/json-patch+json"


@dataclass(frozen=True)
class WatchEvent:
    """One event of a watch stream: ADDED, MODIFIED, DELETED or BOOKMARK."""

    type: str
    object: JSON


def _seg(value: str) -> str:
    return quote(value, safe="")


def namespace_path(name: str | None = None) -> str:
    """REST path of namespaces, or of one namespace."""
    return "/api/v1/namespaces" + (f"/{_seg(name)}" if name else "")


def node_path(name: str | None = None, *, subresource: str | None = None) -> str:
    """REST path of nodes, one node, or one of its subresources (``status``)."""
    path = "/api/v1/nodes" + (f"/{_seg(name)}" if name else "")
    return path + (f"/{subresource}" if subresource else "")


def pod_path(
    namespace: str | None = None, name: str | None = None, *, subresource: str | None = None
) -> str:
    """REST path of pods (all namespaces when ``namespace`` is None), one pod, or a subresource."""
    path = "/api/v1" + (f"/namespaces/{_seg(namespace)}" if namespace else "") + "/pods"
    path += f"/{_seg(name)}" if name else ""
    return path + (f"/{subresource}" if subresource else "")


def lease_path(namespace: str | None = None, name: str | None = None) -> str:
    """REST path of coordination.k8s.io/v1 Leases (all namespaces when ``namespace`` is None)."""
    path = "/apis/coordination.k8s.io/v1" + (f"/namespaces/{_seg(namespace)}" if namespace else "")
    return path + "/leases" + (f"/{_seg(name)}" if name else "")


def event_path(namespace: str | None = None, name: str | None = None) -> str:
    """REST path of core/v1 Events (all namespaces when ``namespace`` is None), or one Event."""
    path = "/api/v1" + (f"/namespaces/{_seg(namespace)}" if namespace else "") + "/events"
    return path + (f"/{_seg(name)}" if name else "")


def _query(**params: str | int | bool | None) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        out.append((key, str(value)))
    return out


@dataclass(frozen=True)
class _Call:
    """One request as sent; it reads ``METHOD path`` in error messages."""

    method: str
    path: str
    query: Query | None = None
    body: Body | None = None
    content_type: str = "application/json"
    timeout_s: float | None = None  # None: the client's own

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


async def _read(resp: aiohttp.ClientResponse, call: _Call) -> bytes:
    """The whole body of ``resp``, which is released; a broken read raises ``ApiUnavailable``."""
    try:
        return await resp.read()
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise ApiUnavailable(f"{call}: {exc!r}") from exc
    finally:
        resp.release()


async def _load_configuration(kubeconfig: str | None, context: str | None) -> Any:
    cfg = k8s_client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        await k8s_config.load_kube_config(
            config_file=path, context=context, client_configuration=cfg
        )
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        await k8s_config.load_kube_config(context=context, client_configuration=cfg)
    return cfg


def _read_environment_once(rest: Any, host: str) -> None:
    """Settle the proxy for the API server from the environment now, not on every request.

    kubernetes_asyncio's session trusts the environment, so aiohttp looks up ``~/.netrc`` and
    the ``*_PROXY``/``NO_PROXY`` variables on two worker threads for every request, a visible
    share of the extender's CPU in a burst.  The same lookup, done once here, gives every
    request the same proxy (none when ``NO_PROXY`` covers the API server); the API server's
    credentials come from the kubeconfig, never from ``.netrc``.
    """
    session = rest.pool_manager
    if not session.trust_env:
        return
    if not rest.proxy:
        try:
            proxy, auth = aiohttp.helpers.get_env_proxy_for_url(yarl.URL(host))
        except LookupError:  # no proxy for the API server
            pass
        else:
            rest.proxy = str(proxy)
            if auth is not None and not rest.proxy_headers:
                rest.proxy_headers = {"Proxy-Authorization": auth.encode()}
    session._trust_env = False


class KubeClient:
    """An async client for the Kubernetes REST API that speaks plain JSON.

    Create with ``await KubeClient.connect(...)`` and close with ``await client.close()`` (or use
    it as an async context manager).  Safe to share between tasks of one event loop.
    """

    def __init__(self, api_client: Any, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._api = api_client
        self._timeout_s = timeout_s

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None = None,
        *,
        context: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_connections: int = 32,
    ) -> KubeClient:
        """Connect with a kubeconfig file, ``$KUBECONFIG``, or in-cluster credentials."""
        cfg = await _load_configuration(kubeconfig, context)
        cfg.connection_pool_maxsize = max_connections
        api = k8s_client.ApiClient(configuration=cfg)
        _read_environment_once(api.rest_client, str(cfg.host))
        return cls(api, timeout_s=timeout_s)

    @property
    def host(self) -> str:
        """The API server's base URL."""
        return str(self._api.configuration.host)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._api.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send(self, call: _Call) -> aiohttp.ClientResponse:
        """Send ``call``; an answer of status 300 or more is read, released and raised.

        The request goes out on the client library's session with its credentials (the bearer
        token asked of its configuration on every call, so a refreshed token is used; client
        certificates and the CA are in the session's TLS context), its proxy settings and its
        default headers, but not through its generic ``call_api``: that walks every body
        recursively to "sanitize" it and encodes it with the standard ``json`` module, a few
        percent of the extender's and the device plugin's CPU in a burst
        (``python -m bench.clients_compare`` measures the client's CPU per Lease write).
        The body is encoded with orjson; JSON bodies are plain dicts and lists, so the bytes
        say the same, and strings (timestamps among them) go out exactly as given."""
        api = self._api
        rest = api.rest_client
        headers = {
            **api.default_headers,
            "Accept": "application/json",
            "Content-Type": call.content_type,
        }
        query = list(call.query or [])
        timeout_s = call.timeout_s if call.timeout_s is not None else self._timeout_s
        options: dict[str, Any] = {"timeout": aiohttp.ClientTimeout(total=timeout_s)}
        if rest.proxy:
            options["proxy"] = rest.proxy
        if rest.proxy_headers:
            options["proxy_headers"] = rest.proxy_headers
        if rest.server_hostname:
            options["server_hostname"] = rest.server_hostname
        try:
            await api.update_params_for_auth(headers, query, ["BearerToken"])
            url = str(api.configuration.host) + call.path
            if query:
                url += "?" + urlencode(query)
            data = None if call.body is None else orjson.dumps(call.body)
            resp: aiohttp.ClientResponse = await rest.pool_manager.request(
                call.method, url, headers=headers, data=data, **options
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ApiUnavailable(f"{call}: {exc!r}") from exc
        if resp.status >= 300:
            text = (await _read(resp, call)).decode("utf-8", "replace")
            reason, message = resp.reason or "", text
            try:
                status_obj = json.loads(text)
                reason = status_obj.get("reason", reason) or reason
                message = status_obj.get("message", message) or message
            except ValueError:
                pass
            if resp.status == 429 or resp.status >= 500:
                raise ApiUnavailable(f"{call}: {resp.status} {reason}: {message}")
            raise api_error(resp.status, str(reason), str(message))
        return resp

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Body | None = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
    ) -> JSON:
        """Send one request and return the decoded JSON answer."""
        call = _Call(method, path, query, body, content_type, timeout_s)
        raw = await _read(await self._send(call), call)
        decoded: JSON = orjson.loads(raw) if raw else {}
        return decoded

    async def request_text(self, method: str, path: str) -> str:
        """Send one request and return the answer as text (e.g. ``/metrics``)."""
        call = _Call(method, path)
        return (await _read(await self._send(call), call)).decode("utf-8", "replace")

    async def get(self, path: str) -> JSON:
        """GET one object."""
        return await self.request("GET", path)

    async def list(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> JSON:
        """LIST a collection; the answer has ``items`` and ``metadata.resourceVersion``."""
        query = _query(
            labelSelector=label_selector,
            fieldSelector=field_selector,
            resourceVersion=resource_version,
            limit=limit,
        )
        if continue_token:
            query.append(("continue", continue_token))
        return await self.request("GET", path, query=query)

    async def create(self, path: str, body: JSON) -> JSON:
        """POST a new object to a collection (or a subresource such as ``binding``)."""
        return await self.request("POST", path, body=body)

    async def replace(self, path: str, body: JSON) -> JSON:
        """PUT an object; conditional when ``body.metadata.resourceVersion`` is set."""
        return await self.request("PUT", path, body=body)

    async def patch(
        self, path: str, body: Body, *, patch_type: PatchType = PatchType.MERGE
    ) -> JSON:
        """PATCH an object."""
        return await self.request("PATCH", path, body=body, content_type=patch_type.value)

    async def delete(
        self,
        path: str,
        *,
        grace_period_seconds: int | None = None,
        preconditions: Mapping[str, str] | None = None,
    ) -> JSON:
        """DELETE an object, optionally with UID/resourceVersion preconditions."""
        body: JSON = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        if preconditions:
            body["preconditions"] = dict(preconditions)
        return await self.request("DELETE", path, body=body)

    async def watch(
        self,
        path: str,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        allow_bookmarks: bool = True,
    ) -> AsyncIterator[WatchEvent]:
        """Stream watch events of a collection from ``resource_version``.

        Ends when the server closes the stream (after ``timeout_seconds``); raises ``Gone`` when
        the version is too old and ``ApiUnavailable`` when the connection breaks.  An event is
        read whole however long its line (an object may be as large as the API server allows,
        about 1.5 MB; aiohttp's ``readline`` would refuse a line over its buffer limit).
        """
        query = _query(
            watch=True,
            resourceVersion=resource_version,
            labelSelector=label_selector,
            fieldSelector=field_selector,
            timeoutSeconds=timeout_seconds,
            allowWatchBookmarks=allow_bookmarks,
        )
        resp = await self._send(_Call("GET", path, query, timeout_s=timeout_seconds + 30))
        try:
            async for line in _lines(resp.content, path):
                if not line.strip():
                    continue
                event = orjson.loads(line)
                kind = str(event.get("type", ""))
                obj: JSON = event.get("object") or {}
                if kind == "ERROR":
                    code = int(obj.get("code", 500))
                    err = api_error(code, str(obj.get("reason", "")), str(obj.get("message", "")))
                    if code >= 500:
                        raise ApiUnavailable(str(err)) from err
                    raise err
                yield WatchEvent(kind, obj)
        finally:
            resp.close()


async def _lines(stream: aiohttp.StreamReader, path: str) -> AsyncIterator[bytes]:
    """The newline-separated lines of a watch stream, without a limit on a line's length; a last
    line without its newline is yielded too.  A broken connection raises ``ApiUnavailable``."""
    buf = bytearray()
    scanned = 0  # bytes of ``buf`` known to hold no newline
    while True:
        try:
            chunk = await stream.readany()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ApiUnavailable(f"watch {path}: {exc!r}") from exc
        if not chunk:
            if buf:
                yield bytes(buf)
            return
        buf += chunk
        while (end := buf.find(b"\n", scanned)) >= 0:
            line = bytes(buf[:end])
            del buf[: end + 1]
            scanned = 0
            yield line
        scanned = len(buf)
