"""The extender's HTTP endpoints: thin translation between the wire and the pure verbs.

POST ``/filter``, ``/prioritize``, ``/bind`` (kube-scheduler calls ``urlPrefix + "/" + verb``),
GET ``/healthz`` (the process serves), ``/readyz`` (the caches are listed).  ``/metrics`` is not
served here: it is on the plain-HTTP operations port (``kube.opsport``, with the probes again), so
no scrape credential is one that can also call ``/bind``.

Guarantees: a body that is not the protocol (not JSON, wrong types, missing fields) gets a 400,
one over the size limit a 413, each with ``{"Error": reason}``; nothing a client sends stops the
server.  Filter and prioritize read only the cache and the lock views: they never call the API
server.  A bind is shielded from its caller's disconnect, so a lock is never left half-handled:
a caller that leaves (kube-scheduler's timeout) makes the bind leave its queue, send no further
Lease write and no binding, and release a lock it took (``Binder.abandon``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
from aiohttp import web

from handoff.request import BadPod
from lockd.locks import NodeLocks
from lockd.model import NodeName
from scheduler_ext.binder import Binder
from scheduler_ext.cache import ClusterCache, node_gpus
from scheduler_ext.choose import FitKey, NodeGPUs, Policy, burst_fills_anyway
from scheduler_ext.events import BindEvents
from scheduler_ext.metrics import ExtenderMetrics, Result, Verb
from scheduler_ext.need import PodNeed
from scheduler_ext.promises import Promises
from scheduler_ext.protocol import (
    BadRequest,
    BindingArgs,
    ExtenderArgs,
    binding_result,
    filter_error,
    filter_result,
    host_priority_list,
    parse_binding_args,
    parse_extender_args,
)
from scheduler_ext.retries import Due, TurnedAway
from scheduler_ext.state import BadObject, node_state
from scheduler_ext.takeover import copy_unneeded, holder_accounted
from scheduler_ext.verbs import (
    Filtered,
    KeyIndex,
    filter_nodes,
    prioritize_nodes,
    with_holder,
    with_lock_holder,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024  # 5,000 full Node objects fit (nodeCacheCapable: false)


@dataclass(frozen=True)
class ServerOptions:
    """How the endpoints decide."""

    policy: Policy = Policy.BINPACK
    lock_aware: bool = True
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


def _json(body: object, *, status: int = 200) -> web.Response:
    """``body`` as a JSON response (orjson: filter and prioritize answers name every node)."""
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"Error": message}, status=status)


class Endpoints:
    """The request handlers over one cache, one ``NodeLocks`` and one ``Binder``."""

    def __init__(
        self,
        cache: ClusterCache,
        locks: NodeLocks,
        binder: Binder,
        metrics: ExtenderMetrics,
        options: ServerOptions,
        *,
        ready: Callable[[], list[str]] | None = None,
        events: BindEvents | None = None,
        turned_away: TurnedAway | None = None,
    ) -> None:
        """``turned_away``: where filter remembers the pods it turns away (``due_again``);
        None, as without ``--ask-again-turned-away``, remembers none."""
        self.cache = cache
        self.events = events
        self.locks = locks
        self.binder = binder
        self.metrics = metrics
        self.options = options
        self._ready = ready
        # node -> (cache picture, (holder, holder finished), picture with its devices taken)
        self._overlays: dict[NodeName, tuple[NodeGPUs, object, NodeGPUs]] = {}
        self.promises = Promises()
        self.turned_away = turned_away
        self.turned_away_added = asyncio.Event()  # set when filter turns a pod away

    # ---- helpers ----------------------------------------------------------------------------

    async def _body(self, request: web.Request) -> object:
        raw = await request.read()  # HTTPRequestEntityTooLarge past the size limit
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:  # also bad UTF-8 and nesting past 1,024 levels
            raise BadRequest(f"body is not JSON: {exc}") from exc

    def _gpus_of(
        self, args: ExtenderArgs, pod_uid: str
    ) -> tuple[Callable[[NodeName], NodeGPUs | None], KeyIndex | None]:
        """Each node's GPU picture for this request, and (node-cache capable requests) the
        matching ``KeyIndex``: the cache's pictures and keys with each held lock's holder
        overlaid.  Costs a few lookups per held lock and none per node; a held lock's expiry is
        read only when its holder is unknown to the cache (the expiry then decides)."""
        if args.nodes is None:
            return self._cached_gpus_of(pod_uid)
        keys = self.cache.keys
        cache = self.cache
        # not node-cache capable: the scheduler sent the Node objects; read inventories there
        given = dict(zip(args.node_names, args.nodes, strict=True))

        def from_args(name: NodeName) -> NodeGPUs | None:
            try:
                state = node_state(given[name], keys=keys, resource=self.cache.resource)
            except BadObject:
                return None
            gpus = node_gpus(state, self.cache.pods_on(name))
            view = self.locks.view(name)
            return with_lock_holder(
                gpus, view, pod_uid=pod_uid, keys=keys, finished=holder_accounted(cache, view)
            )

        return from_args, None

    def _cached_gpus_of(
        self, pod_uid: str
    ) -> tuple[Callable[[NodeName], NodeGPUs | None], KeyIndex]:
        """``_gpus_of`` from the cache's nodes: its pictures with each held lock's holder
        overlaid (but ``pod_uid``'s own lock)."""
        keys = self.cache.keys
        cache = self.cache
        pictures = self.cache.pictures()
        fit_keys = self.cache.fit_keys()
        holders = self.locks.holders()  # the held locks only: few, whatever the node count
        if not holders:
            return pictures.get, KeyIndex(fit_keys.get, self._with_key({}))
        merged = dict(pictures)
        merged_keys = dict(fit_keys)
        overlaid: dict[FitKey, NodeGPUs] = {}
        for name, holder in holders.items():
            gpus = pictures.get(name)
            if gpus is None or holder.uid == pod_uid:
                continue
            # the holder's Lease copy is not needed (takeover.lease_copy_needed)
            done = copy_unneeded(cache, holder.uid, partial(self.locks.expired, name))
            memo = self._overlays.get(name)  # same picture, holder, holder state: reuse
            if memo is not None and memo[0] is gpus and memo[1] == (holder, done):
                over = memo[2]
            else:
                over = gpus if done else with_holder(gpus, holder, keys=keys)
                self._overlays[name] = (gpus, (holder, done), over)
            merged[name] = over
            if over is not gpus:
                merged_keys[name] = over.fit_key
                overlaid[over.fit_key] = over
        return merged.get, KeyIndex(merged_keys.get, self._with_key(overlaid))

    def due_again(self) -> list[Due]:
        """The pods filter turned away that fit now on a node whose cached picture changed
        since the last call (``retries.TurnedAway.due``), each named once."""
        changed = self.cache.take_changed_nodes()
        if self.turned_away is None:
            return []
        if not changed or not len(self.turned_away):
            self.turned_away.expire(time.monotonic())
            return []
        gpus_of, _ = self._cached_gpus_of("")
        due = self.turned_away.due(changed, gpus_of, time.monotonic())
        return [d for d in due if not self.cache.seen_bound_or_gone(d.uid)]

    def _with_key(self, overlaid: dict[FitKey, NodeGPUs]) -> Callable[[FitKey], NodeGPUs]:
        """``KeyIndex.picture``: the overlaid pictures first, then the cache's."""
        cache = self.cache

        def picture(key: FitKey) -> NodeGPUs:
            found = overlaid.get(key) or cache.with_key(key)
            if found is None:  # the cache keeps a picture for every key it hands out
                raise LookupError(f"no picture with fit key {key!r}")
            return found

        return picture

    def _parse(self, body: object) -> tuple[ExtenderArgs, PodNeed, str]:
        args = parse_extender_args(body)
        uid = str((args.pod.get("metadata") or {}).get("uid", ""))
        try:
            need = self.cache.pod_need(args.pod)
        except BadPod as exc:
            raise BadRequest(f"ExtenderArgs.Pod: {exc}") from exc
        return args, need, uid

    def _done(self, verb: Verb, result: Result, started: float) -> None:
        self.metrics.latency.labels(verb.value).observe(time.perf_counter() - started)
        self.metrics.requests.labels(verb.value, result.value).inc()

    # ---- the verbs --------------------------------------------------------------------------

    async def filter(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            args, need, uid = self._parse(await self._body(request))
        except BadRequest as exc:
            self._done(Verb.FILTER, Result.BAD_REQUEST, started)
            return _error(400, str(exc))
        try:
            gpus_of, index = self._gpus_of(args, uid)
            out = filter_nodes(need, args.node_names, gpus_of, index=index)
        except Exception as exc:  # a bug must not fail scheduling silently: say so in Error
            log.exception("filter failed")
            self._done(Verb.FILTER, Result.ERROR, started)
            return _json(filter_error(f"GPU extender filter failed: {exc!r}"))
        self.metrics.filter_nodes.labels("passed").inc(len(out.passed))
        self.metrics.filter_nodes.labels("failed").inc(len(out.failed))
        self.metrics.filter_nodes.labels("unresolvable").inc(len(out.unresolvable))
        if self.turned_away is not None:
            self._remember(args, uid, need, out)
        body = filter_result(args, out.passed, out.failed, out.unresolvable)
        self._done(Verb.FILTER, Result.OK, started)
        return _json(body)

    def _remember(self, args: ExtenderArgs, uid: str, need: PodNeed, out: Filtered) -> None:
        """Remember a pod filter turned away for want of room on ``out.failed`` (and forget one
        it passed), for ``due_again`` (``retries.py``)."""
        assert self.turned_away is not None
        if out.passed or not out.failed:
            self.turned_away.forget(uid)
            return
        meta = args.pod.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        self.turned_away.turned_away(uid, key, need, out.failed, time.monotonic())
        self.turned_away_added.set()

    async def prioritize(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            args, need, uid = self._parse(await self._body(request))
        except BadRequest as exc:
            self._done(Verb.PRIORITIZE, Result.BAD_REQUEST, started)
            return _error(400, str(exc))
        waits = None
        queues = self.binder.queues
        if self.options.lock_aware:  # binds queued, locks held, and pods about to bind
            waits = queues.expected_waits(
                self.locks.holders(),
                self.locks.held_ages(),
                self.promises.promised_to_others(uid),
                pod_uid=uid,
            )
        gpus_of, index = self._gpus_of(args, uid)
        tolerance = queues.steering_tolerance_s()
        larger: dict[int, int] | None = None
        inflight: dict[NodeName, int] = {}
        if waits is not None and not need.slices:  # whole GPUs only
            demand, largest = self.cache.pending_demand()
            free = (g.available for g in map(gpus_of, args.node_names) if g is not None)
            if burst_fills_anyway(demand, largest, need, free):
                tolerance = 0.0  # packing keeps nothing free for later: serve it soonest
            elif largest > need.total:
                larger, inflight = self._larger_pending(need, uid)
        scores = prioritize_nodes(
            need,
            args.node_names,
            gpus_of,
            policy=self.options.policy,
            waits=waits,
            tolerance_s=tolerance,
            larger=larger,
            inflight=inflight,
            index=index,
        )
        if self.options.lock_aware:
            self.promises.promise(args.node_names, scores, uid)
        self._done(Verb.PRIORITIZE, Result.OK, started)
        return _json(host_priority_list(zip(args.node_names, scores, strict=True)))

    def _larger_pending(
        self, need: PodNeed, uid: str
    ) -> tuple[dict[int, int], dict[NodeName, int]]:
        """GPUs per pod -> pods not bound yet that need more GPUs than ``need``, less those
        whose bind is already on its way; and per node, the GPUs of the binds on their way there
        (queued or promised: kube-scheduler counts them, the cache's pictures not yet)."""
        larger = self.cache.pending_sizes(above=need.total)
        inflight: dict[NodeName, int] = {}
        on_way = {**self.promises.nodes(), **self.binder.queues.nodes()}
        for other, node in on_way.items():
            pod = self.cache.pod(other)
            if other == uid or pod is None or pod.node is not None or pod.need is None:
                continue
            size = pod.need.total
            inflight[node] = inflight.get(node, 0) + size
            if larger.get(size, 0) > 0:
                larger[size] -= 1
        return {size: n for size, n in larger.items() if n > 0}, inflight

    async def bind(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            args = parse_binding_args(await self._body(request))
        except BadRequest as exc:
            self._done(Verb.BIND, Result.BAD_REQUEST, started)
            return _error(400, str(exc))
        self.promises.forget(args.pod_uid)
        notice = self._notice_if_still_waiting(args, started)
        bind = asyncio.ensure_future(self.binder.bind(args))
        try:
            # shielded: a disconnect (kube-scheduler's timeout) makes the bind leave its queue
            # and send no further write; it releases a lock it took, or keeps one whose binding
            # was already sent (its outcome unknown)
            outcome = await asyncio.shield(bind)
        except asyncio.CancelledError:
            self.binder.abandon(args.node, args.pod_uid)
            self._done(Verb.BIND, Result.ERROR, started)
            raise
        except Exception as exc:  # a bug: say so in Error (a 500 would reach no one's events)
            log.exception("bind of %s to %s failed", args.key, args.node)
            self._done(Verb.BIND, Result.ERROR, started)
            return web.json_response(binding_result(f"GPU extender bind failed: {exc!r}"))
        finally:
            if notice is not None:
                notice.cancel()
        if outcome.error:
            log.info("bind %s to %s: %s", args.key, args.node, outcome.error)
            if self.events is not None:
                self.events.bind_failed(args, outcome.result, outcome.error)
        self._done(Verb.BIND, outcome.result, started)
        return web.json_response(binding_result(outcome.error))

    def _notice_if_still_waiting(
        self, args: BindingArgs, started: float
    ) -> asyncio.TimerHandle | None:
        """A timer that writes the pod's ``WaitingForNodeLock`` Event if its bind is still
        running ``notice_after_s`` from now (the caller cancels it when the bind ends)."""
        events = self.events
        if events is None:
            return None

        def still_waiting() -> None:
            events.still_waiting(args, self.locks.view(args.node), time.perf_counter() - started)

        return asyncio.get_running_loop().call_later(events.notice_after_s, still_waiting)

    # ---- probes -----------------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    def waiting_for(self) -> list[str]:
        """What the extender still waits for before it is ready (empty: ready)."""
        missing = [] if self.cache.nodes_synced else ["nodes"]
        if not self.cache.pods_synced:
            missing.append("pods")
        if self._ready is not None:
            missing.extend(self._ready())
        return missing

    async def readyz(self, request: web.Request) -> web.Response:
        missing = self.waiting_for()
        if missing:
            return web.Response(status=503, text=f"waiting for: {', '.join(missing)}\n")
        return web.Response(text="ok\n")


@web.middleware
async def _too_large(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
    except web.HTTPRequestEntityTooLarge as exc:
        return _error(413, f"body too large: {exc.text}")
    return response


def make_app(endpoints: Endpoints) -> web.Application:
    """The aiohttp application serving ``endpoints`` on the extender's API port: the three verbs
    and the probes, never ``/metrics``."""
    app = web.Application(
        client_max_size=endpoints.options.max_body_bytes, middlewares=[_too_large]
    )
    app.router.add_post("/filter", endpoints.filter)
    app.router.add_post("/prioritize", endpoints.prioritize)
    app.router.add_post("/bind", endpoints.bind)
    app.router.add_get("/healthz", endpoints.healthz)
    app.router.add_get("/readyz", endpoints.readyz)
    return app
