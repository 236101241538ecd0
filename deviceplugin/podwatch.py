"""The pods bound to this node, kept by a list-then-watch (``fieldSelector=spec.nodeName=<node>``).

The device plugin uses it to notice a GPU pod that kubelet may be admitting besides the lock's
holder (one bound around the extender).  It is built to answer "which pods are bound here" and
"this pod by key" from memory, so the holder pod could later be read from it instead of a GET.

Guarantees: events are applied in the order the API server sent them; after a 410 Gone, an
unexpected error, or a watch round with neither event nor bookmark, the pods are listed again and
replaced whole, so pods deleted while the stream was down are dropped.  A broken connection is
retried with capped exponential backoff from the last resourceVersion seen.  ``synced`` is False
until the first list has been applied.
Non-guarantee: the view lags the API server by the watch's delay; a pod bound a moment ago may not
be in it yet.  ``list_now`` is the fresh answer (one consistent LIST), for decisions that must
include every pod kubelet may be admitting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from lockd.errors import ApiError, ApiUnavailable, Gone
from lockd.kube import KubeClient, pod_path
from lockd.model import HolderKey, NodeName

log = logging.getLogger(__name__)

PodJSON = Mapping[str, Any]


def _key(pod: PodJSON) -> HolderKey:
    meta = pod.get("metadata") or {}
    return HolderKey(f"{meta.get('namespace', '')}/{meta.get('name', '')}")


class NodePods:
    """The pods bound to one node, from a watch; ``run`` never returns."""

    def __init__(
        self,
        kube: KubeClient,
        node: NodeName,
        *,
        page_size: int = 500,
        watch_timeout_s: int = 300,
        max_backoff_s: float = 10.0,
    ) -> None:
        self._kube = kube
        self.node = node
        self._selector = f"spec.nodeName={node}"
        self._page_size = page_size
        self._watch_timeout_s = watch_timeout_s
        self._max_backoff_s = max_backoff_s
        self._pods: dict[HolderKey, PodJSON] = {}
        self._version: str | None = None
        self.synced = False
        self.on_synced: Callable[[], None] = lambda: None

    # -- reads ----------------------------------------------------------------------------------

    def pods(self) -> list[PodJSON]:
        """Every pod bound to this node, as last seen."""
        return list(self._pods.values())

    def get(self, key: HolderKey) -> PodJSON | None:
        """The pod ``namespace/name`` as last seen (None: not bound here, or not seen yet)."""
        return self._pods.get(key)

    async def list_now(self) -> list[PodJSON]:
        """Every pod bound to this node, by one consistent LIST (paged) of the API server; it
        does not change the watch's view.  Raises ``ApiUnavailable``/``ApiError``."""
        items, _ = await self._list()
        return items

    # -- the watch ------------------------------------------------------------------------------

    def _replace(self, items: list[PodJSON]) -> None:
        self._pods = {_key(p): p for p in items}
        if not self.synced:
            self.synced = True
            self.on_synced()

    def _apply(self, kind: str, pod: PodJSON) -> None:
        key = _key(pod)
        if kind == "DELETED":
            self._pods.pop(key, None)
        else:
            self._pods[key] = pod

    async def _relist(self) -> None:
        items, version = await self._list()
        self._replace(items)
        self._version = version

    async def _list(self) -> tuple[list[PodJSON], str]:
        items: list[PodJSON] = []
        token: str | None = None
        version = ""
        while True:
            page = await self._kube.list(
                pod_path(),
                field_selector=self._selector,
                limit=self._page_size,
                continue_token=token,
            )
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion", version))
            token = meta.get("continue") or None
            if not token:
                break
        return items, version

    async def _watch_once(self) -> int:
        received = 0
        async for event in self._kube.watch(
            pod_path(),
            resource_version=self._version,
            field_selector=self._selector,
            timeout_seconds=self._watch_timeout_s,
        ):
            received += 1
            if event.type in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(event.type, event.object)
            version = (event.object.get("metadata") or {}).get("resourceVersion")
            if version:
                self._version = str(version)
        return received

    async def run(self) -> None:
        """List, then watch forever; list again on 410 Gone or a silent round; back off on
        errors."""
        backoff = 0.2
        need_list = True
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                if await self._watch_once() == 0:
                    need_list = True
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except Gone:
                need_list = True
            except (ApiUnavailable, ApiError) as exc:
                log.warning("pods of node %s: %s; retrying in %.1fs", self.node, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
                if self._version is None:
                    need_list = True
            except Exception:
                log.exception("pods of node %s: unexpected error; listing again", self.node)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
                need_list = True
