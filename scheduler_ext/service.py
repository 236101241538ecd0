"""A running extender: the watch-fed caches, the lock watch and the HTTP(S) server, wired up.

``Extender.start`` lists nodes and pods and starts their watches, starts ``NodeLocks.watch()``,
and serves the endpoints; ``stop`` ends all of it.  One ``Extender`` per event loop; several may
run in one process (tests run two replicas side by side) when each gets its own registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry

from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX, DEFAULT_RESOURCE, Keys
from kube.client import JSON, KubeClient, node_path, pod_path
from kube.errors import ApiError, ApiUnavailable, Conflict, Forbidden, NotFound
from kube.events import EventRecorder
from kube.opsport import OpsServer, listening_site
from kube.process import freeze_long_lived
from kube.reflector import Reflector
from lockd.locks import NodeLocks
from lockd.metrics import LockMetrics
from scheduler_ext.binder import CONFIRM_WAIT_S, DEFAULT_WAIT_BUDGET_S, Binder
from scheduler_ext.cache import ClusterCache
from scheduler_ext.choose import Policy
from scheduler_ext.config import DEFAULT_HTTP_TIMEOUT_S, check_bind_timing
from scheduler_ext.deadline import DeadlineClient
from scheduler_ext.events import BindEvents
from scheduler_ext.metrics import ExtenderMetrics
from scheduler_ext.retries import TurnedAway
from scheduler_ext.server import DEFAULT_MAX_BODY_BYTES, Endpoints, ServerOptions, make_app
from scheduler_ext.takeover import DEFAULT_REQUEST_TIMEOUT_S

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A setting of the extender is unusable; the message says which and why."""

    user_facing = True


@dataclass(frozen=True)
class Settings:
    """Everything the extender is configured with (the CLI flags)."""

    host: str = "127.0.0.1"
    port: int = 8888
    lock_namespace: str = DEFAULT_LOCK_NAMESPACE
    annotation_prefix: str = DEFAULT_PREFIX
    resource_name: str = DEFAULT_RESOURCE
    policy: Policy = Policy.BINPACK
    lease_duration_s: int = 15
    wait_budget_s: float = DEFAULT_WAIT_BUDGET_S
    scheduler_http_timeout_s: float = DEFAULT_HTTP_TIMEOUT_S
    apiserver_request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    lock_aware: bool = True
    tls_cert: str | None = None
    tls_key: str | None = None
    client_ca: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # 0: any free port (``Extender.metrics_url`` says which)
    events: bool = True  # Kubernetes Events on pods and nodes (rate-limited)
    ask_again: bool = False  # update turned-away pods once room appears (needs patch on pods)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"--listen {value!r}: expected host:port, e.g. 127.0.0.1:8888")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        number = int(port)
    except ValueError as exc:
        raise ConfigError(f"--listen {value!r}: port {port!r} is not a number") from exc
    if not 0 <= number <= 65535:
        raise ConfigError(f"--listen {value!r}: port {number} is out of range")
    return host, number


def server_ssl_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    """TLS for the endpoints; with ``client_ca``, every client must present a certificate it
    signed (kube-scheduler's ``tlsConfig.certFile``/``keyFile``)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
        if client_ca is not None:
            ctx.load_verify_locations(cafile=client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS files: {exc}") from exc
    return ctx


def check_settings(settings: Settings) -> None:
    """Raise ``ConfigError`` for contradictory or impossible settings."""
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if settings.client_ca is not None and settings.tls_cert is None:
        raise ConfigError(
            "--client-ca needs --tls-cert and --tls-key (client certificates "
            "are only checked over HTTPS)"
        )
    if settings.lease_duration_s < 3:
        raise ConfigError("--lease-duration must be at least 3 seconds")
    try:
        check_bind_timing(
            wait_budget_s=settings.wait_budget_s,
            lease_duration_s=settings.lease_duration_s,
            http_timeout_s=settings.scheduler_http_timeout_s,
        )
    except ValueError as exc:
        raise ConfigError(
            f"--bind-wait-budget, --lease-duration and --scheduler-http-timeout: {exc}"
        ) from exc
    if settings.apiserver_request_timeout_s <= 0:
        raise ConfigError("--apiserver-request-timeout must be positive")
    if settings.max_body_bytes < 1024:
        raise ConfigError("--max-body-bytes must be at least 1024")
    if not 0 <= settings.metrics_port <= 65535:
        raise ConfigError(f"--metrics-port {settings.metrics_port} is not a port number")
    if settings.port != 0 and settings.metrics_port == settings.port:
        raise ConfigError("--metrics-port must differ from the --listen port")
    if not settings.annotation_prefix.endswith("/"):
        raise ConfigError("--annotation-prefix must end with '/', e.g. nodelock.io/")


class Extender:
    """One running extender."""

    def __init__(
        self,
        kube: KubeClient,
        settings: Settings,
        *,
        registry: CollectorRegistry = REGISTRY,
        lock_metrics: LockMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        confirm_wait_s: float = CONFIRM_WAIT_S,
    ) -> None:
        """``clock`` (monotonic seconds) judges lock expiry and the bind deadline."""
        check_settings(settings)
        self.settings = settings
        self.kube = kube
        self.cache = ClusterCache(
            keys=Keys(settings.annotation_prefix), resource=settings.resource_name
        )
        self.metrics = ExtenderMetrics(
            self.cache, registry=registry, http_timeout_s=settings.scheduler_http_timeout_s
        )
        # the binder's and its locks' requests are held to each bind's deadline
        held_to_deadline = DeadlineClient(kube)
        self.locks = NodeLocks(
            held_to_deadline,
            namespace=settings.lock_namespace,
            prefix=settings.annotation_prefix,
            duration_s=settings.lease_duration_s,
            metrics=lock_metrics,
            clock=clock,
        )
        self.events = BindEvents(
            EventRecorder(kube, component="nodelock-extender", host=socket.gethostname()),
            budget_s=settings.wait_budget_s,
        )
        self.binder = Binder(
            held_to_deadline,
            self.cache,
            self.locks,
            self.metrics,
            duration_s=settings.lease_duration_s,
            wait_budget_s=settings.wait_budget_s,
            request_timeout_s=settings.apiserver_request_timeout_s,
            confirm_wait_s=confirm_wait_s,
            http_timeout_s=settings.scheduler_http_timeout_s,
            clock=clock,
            on_takeover=self.events.takeover if settings.events else None,
            on_ended=self.events.released_ended if settings.events else None,
        )
        self.endpoints = Endpoints(
            self.cache,
            self.locks,
            self.binder,
            self.metrics,
            ServerOptions(
                policy=settings.policy,
                lock_aware=settings.lock_aware,
                max_body_bytes=settings.max_body_bytes,
            ),
            events=self.events if settings.events else None,
            turned_away=TurnedAway() if settings.ask_again else None,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self.port = settings.port
        self.ops = OpsServer(registry, self.endpoints.waiting_for)

    @property
    def url(self) -> str:
        """The base URL kube-scheduler's ``urlPrefix`` should name."""
        scheme = "https" if self.settings.tls else "http"
        host = self.settings.host
        host = f"[{host}]" if ":" in host else host
        return f"{scheme}://{host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """The base URL of the plain-HTTP operations port (``/metrics``, ``/healthz``,
        ``/readyz``; no client certificate, no verb)."""
        return self.ops.url

    def _reflectors(self) -> list[Reflector]:
        cache = self.cache

        def reflector(
            path: str,
            name: str,
            keep: Callable[[JSON], Any],
            replace: Callable[[list[Any]], None],
            apply: Callable[[str, Mapping[str, Any]], None],
        ) -> Reflector:
            return Reflector(
                self.kube,
                path,
                name=name,
                keep=keep,  # each listed page becomes the cache's records as it arrives
                replace=replace,
                apply=apply,
                alive=lambda: cache.mark_alive(name),
                on_relist=lambda: self.metrics.relists.labels(name).inc(),
            )

        return [
            reflector(
                node_path(), "nodes", cache.keep_node, cache.replace_node_states, cache.apply_node
            ),
            reflector(
                pod_path(), "pods", cache.keep_pod, cache.replace_pod_states, cache.apply_pod
            ),
        ]

    async def start(self, *, wait_synced_s: float | None = 60.0) -> None:
        """Start watching and serving; with ``wait_synced_s``, wait until the caches are listed."""
        for reflector in self._reflectors():
            self._tasks.append(asyncio.create_task(reflector.run(), name=reflector.name))
        self._tasks.append(
            asyncio.create_task(
                self.locks.watch(on_change=self.binder.queues.lock_changed), name="leases"
            )
        )
        self._tasks.append(asyncio.create_task(self.binder.sweep(), name="locks left behind"))
        if self.settings.ask_again:
            self._tasks.append(asyncio.create_task(self._ask_again(), name="turned away"))
        ssl_ctx = None
        if self.settings.tls_cert is not None and self.settings.tls_key is not None:
            ssl_ctx = server_ssl_context(
                self.settings.tls_cert, self.settings.tls_key, self.settings.client_ca
            )
        # a bind whose caller disconnects (kube-scheduler's httpTimeout) is cancelled, so it
        # leaves its node's queue; a bind that holds the lock finishes regardless (server.py)
        self._runner = web.AppRunner(
            make_app(self.endpoints), access_log=None, handler_cancellation=True
        )
        await self._runner.setup()
        try:
            site = listening_site(
                self._runner, self.settings.host, self.settings.port, ssl_context=ssl_ctx
            )
            await site.start()
        except OSError as exc:
            await self.stop()
            raise ConfigError(
                f"cannot listen on {self.settings.host}:{self.settings.port}: {exc}"
            ) from exc
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])
        try:
            await self.ops.start(self.settings.metrics_host, self.settings.metrics_port)
        except OSError as exc:
            await self.stop()
            raise ConfigError(str(exc)) from exc
        log.info("extender serving on %s", self.url)
        if wait_synced_s is not None:
            synced = await self.cache.wait_until(lambda: self.cache.synced, timeout_s=wait_synced_s)
            if not synced:
                log.warning("caches not listed after %.0fs; serving anyway", wait_synced_s)

    async def _ask_again(self) -> None:
        """Whenever the cache's picture of a node changes, update each pod filter turned away
        that fits there now (``Endpoints.due_again``), so that kube-scheduler asks for it again:
        kube-scheduler requeues an unscheduled pod on any update of it (``isPodUpdated``,
        ``internal/queue/scheduling_queue.go``, v1.31.9; the ``Pod/Update`` event, which
        ``Extender`` registers for, ``backend/queue/scheduling_queue.go``, v1.37.2).  The update
        is one annotation (``<prefix>room-seen``: the node and the time), its UID a
        precondition.  Runs until cancelled."""
        key = f"{self.settings.annotation_prefix}room-seen"
        endpoints = self.endpoints
        turned_away = endpoints.turned_away
        assert turned_away is not None  # settings.ask_again
        while True:
            if not len(turned_away):  # nothing to watch: no wake-up per cache change
                await endpoints.turned_away_added.wait()
                endpoints.turned_away_added.clear()
                continue
            await self.cache.wait_until(
                self.cache.has_changed_nodes, timeout_s=turned_away.window_s
            )
            for due in endpoints.due_again():
                namespace, _, name = due.key.partition("/")
                stamp = f"{due.node} {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
                body = {"metadata": {"uid": due.uid, "annotations": {key: stamp}}}
                try:
                    await self.kube.patch(pod_path(namespace, name), body)
                except (NotFound, Conflict):  # deleted, or a new pod of that name (its UID)
                    self.metrics.asked_again.labels("gone").inc()
                    continue
                except (ApiError, ApiUnavailable) as exc:
                    self.metrics.asked_again.labels("failed").inc()
                    log.warning(
                        "cannot update %s so that kube-scheduler tries it again on %s, where "
                        "room appeared: %s%s",
                        due.key,
                        due.node,
                        exc,
                        " (the extender's role needs patch on pods)"
                        if isinstance(exc, Forbidden)
                        else "",
                    )
                    continue
                self.metrics.asked_again.labels("asked").inc()
                log.info("room on %s for %s, turned away before: asked again", due.node, due.key)

    async def stop(self) -> None:
        """Stop serving and watching (Events under way get a moment to be written)."""
        await self.ops.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.events.recorder.flush(), timeout=2.0)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def serve_forever(self) -> None:
        """Run until cancelled (SIGINT/SIGTERM in the CLI).  Once the caches are first listed,
        the process's objects are kept out of the garbage collector's full passes
        (``kube.process.freeze_long_lived``): this runs the extender as its own process."""
        await self.start(wait_synced_s=None)
        try:
            while not await self.cache.wait_until(lambda: self.cache.synced, timeout_s=3600):
                pass
            took = freeze_long_lived()
            log.info("caches listed; objects kept out of full collections (%.0f ms)", took * 1000)
            await asyncio.Event().wait()
        finally:
            await self.stop()
