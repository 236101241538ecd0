"""Kubernetes Events (core/v1) where admins look: ``kubectl describe pod`` and ``describe node``.

nodelock's parts report what an operator needs to see next to a pod or node (a bind waiting for
or refused by a node lock and its holder, an Allocate refused and why, an expired lock taken
over, a lock broken by hand) as Events on that object.

Guarantees:
- ``record`` never waits for the API server and never raises: the write runs in the background,
  and a failed write is logged at DEBUG level and counted in ``failed``.  Events are best effort;
  no decision depends on one.
- No event storm: per (object, reason) the first Event is created at once; repeats within
  ``interval_s`` of the last write only count up; the first repeat after that patches the same
  Event (``count``, ``lastTimestamp``, ``message``), as client-go's aggregation does.  So a pod
  gets at most one write per reason per ``interval_s``, however many binds it goes through.
- Memory and concurrency are bounded: at most ``max_keys`` (object, reason) pairs are
  remembered (the oldest forgotten first) and at most ``max_in_flight`` writes run at once; a
  write beyond that is dropped and counted in ``dropped``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from kube.client import JSON, KubeClient, PatchType, event_path
from kube.errors import ApiError, ApiUnavailable, NotFound

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 60.0
MAX_MESSAGE = 1024  # the API server refuses longer event messages


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True)
class ObjectRef:
    """The object an Event is about (``involvedObject``)."""

    kind: str
    name: str
    namespace: str = ""  # empty for cluster-scoped objects (Node)
    uid: str = ""

    @classmethod
    def pod(cls, key: str, uid: str) -> ObjectRef:
        """The pod ``namespace/name`` with ``uid`` (``describe pod`` matches on the UID)."""
        namespace, _, name = key.partition("/")
        if not name:
            raise ValueError(f"pod key {key!r} is not namespace/name")
        return cls("Pod", name, namespace, uid)

    @classmethod
    def node(cls, name: str) -> ObjectRef:
        """The Node ``name``: like kubelet, with the name as UID (what ``describe node`` asks)."""
        return cls("Node", name, "", name)

    @property
    def event_namespace(self) -> str:
        """Where its Events live: its own namespace, ``default`` for cluster-scoped objects."""
        return self.namespace or "default"


def _timestamp(wall: float) -> str:
    return datetime.fromtimestamp(int(wall), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(
    obj: ObjectRef,
    kind: EventType,
    reason: str,
    message: str,
    *,
    name: str,
    component: str,
    host: str,
    wall: float,
) -> JSON:
    """The core/v1 Event ``name`` about ``obj`` (pure)."""
    involved: JSON = {"apiVersion": "v1", "kind": obj.kind, "name": obj.name}
    if obj.namespace:
        involved["namespace"] = obj.namespace
    if obj.uid:
        involved["uid"] = obj.uid
    stamp = _timestamp(wall)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": obj.event_namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": kind.value,
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "source": {"component": component, **({"host": host} if host else {})},
        "reportingComponent": component,
        "reportingInstance": host or component,
    }


def _series_name(obj: ObjectRef) -> str:
    return f"{obj.name}.{secrets.token_hex(8)}"


@dataclass
class _Series:
    name: str  # the Event written for this (object, reason); "" before the first create
    count: int  # occurrences so far (the Event says ``written`` of them)
    written: int
    last_write: float  # monotonic


class EventRecorder:
    """Rate-limited Events of one component (see the module's guarantees)."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        component: str,
        host: str = "",
        interval_s: float = DEFAULT_INTERVAL_S,
        max_keys: int = 4096,
        max_in_flight: int = 64,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self.component = component
        self.host = host
        self.interval_s = interval_s
        self._max_keys = max_keys
        self._max_in_flight = max_in_flight
        self._clock = clock
        self._wall = wall_clock
        self._series: OrderedDict[tuple[ObjectRef, str], _Series] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self.created = 0
        self.patched = 0
        self.suppressed = 0  # repeats that only counted up
        self.dropped = 0
        self.failed = 0

    def record(self, obj: ObjectRef, kind: EventType, reason: str, message: str) -> None:
        """Report ``reason`` on ``obj`` (in the background; never raises)."""
        key = (obj, reason)
        now = self._clock()
        series = self._series.get(key)
        if series is not None:
            series.count += 1
            self._series.move_to_end(key)
            if now - series.last_write < self.interval_s:
                self.suppressed += 1
                return
            series.last_write = now
        else:
            series = self._series[key] = _Series("", 1, 0, now)
            while len(self._series) > self._max_keys:
                self._series.popitem(last=False)
        self._spawn(self._write(obj, kind, reason, message, series))

    def _spawn(self, write: Coroutine[Any, Any, None]) -> None:
        if len(self._tasks) >= self._max_in_flight:
            write.close()
            self.dropped += 1
            return
        task = asyncio.get_running_loop().create_task(write)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(
        self, obj: ObjectRef, kind: EventType, reason: str, message: str, series: _Series
    ) -> None:
        """Bring the series' Event to ``series.count``: patch it once written, else (none written
        yet, or the API server's event TTL removed it) create a new one under a new name."""
        count = series.count
        try:
            if series.written:
                patch = {
                    "count": count,
                    "lastTimestamp": _timestamp(self._wall()),
                    "message": message[:MAX_MESSAGE],
                }
                try:
                    await self._kube.patch(
                        event_path(obj.event_namespace, series.name),
                        patch,
                        patch_type=PatchType.MERGE,
                    )
                    series.written = count
                    self.patched += 1
                    return
                except NotFound:
                    pass  # removed by the TTL: a new series below
            series.name = _series_name(obj)
            body = event_body(
                obj,
                kind,
                reason,
                message,
                name=series.name,
                component=self.component,
                host=self.host,
                wall=self._wall(),
            )
            body["count"] = count
            await self._kube.create(event_path(obj.event_namespace), body)
        except (ApiError, ApiUnavailable) as exc:
            self.failed += 1
            log.debug("event %s on %s %s not written: %s", reason, obj.kind, obj.name, exc)
            return
        series.written = count
        self.created += 1

    async def flush(self) -> None:
        """Wait for the writes under way (tests; a clean stop)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
