"""List-then-watch of one collection into a cache, as client-go's reflector does.

The one list-then-watch loop of nodelock: the extender's cache, the device plugin's pods of its
node and lockd's node locks all run it.

Guarantees: events reach ``apply`` in the order the API server sent them, each whole however large
(``KubeClient.watch``); after a 410 Gone, an unexpected error, or (unless told otherwise) a whole
watch round with no event and no bookmark (a resourceVersion the server will not reach, e.g. after
etcd was restored from a backup) the collection is listed again and handed whole to ``replace``, so
objects deleted while the stream was down are dropped.  A list is read page by page (``page_size``
objects a request) and each page's objects are handed to ``keep`` as the page arrives, so only
what ``keep`` returns of them (by default the objects themselves) is held until ``replace``: a
cache that keeps a small record per object never holds the whole collection as JSON.
A broken connection is retried with capped, jittered exponential backoff (``kube.backoff``),
resuming from the last resourceVersion seen (or, with ``relist_after_error``, from a fresh list).
``on_broken`` is called whenever a list or a watch round ends in an error, before the loop waits
or lists again.
Non-guarantee: while the API server is unreachable the cache stays as it was (its staleness is
exported as a metric).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kube.backoff import Backoff
from kube.client import KubeClient
from kube.errors import ApiError, ApiUnavailable, Gone

log = logging.getLogger(__name__)

JSON = dict[str, Any]

FIRST_BACKOFF_S = 0.2  # the first wait after an error (``max_backoff_s`` caps the later ones)


class Reflector:
    """Keeps ``replace``/``apply`` fed with one collection's state; ``run`` never returns."""

    def __init__(
        self,
        kube: KubeClient,
        path: str,
        *,
        name: str,
        replace: Callable[[list[Any]], None],
        apply: Callable[[str, Mapping[str, Any]], None],
        alive: Callable[[], None],
        on_relist: Callable[[], None] = lambda: None,
        on_broken: Callable[[], None] = lambda: None,
        keep: Callable[[JSON], Any] | None = None,
        relist_when_silent: bool = True,
        relist_after_error: bool = False,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
        watch_timeout_s: int = 300,
        max_backoff_s: float = 10.0,
    ) -> None:
        self._kube = kube
        self._path = path
        self.name = name
        self._replace = replace
        self._apply = apply
        self._alive = alive
        self._on_relist = on_relist
        self._on_broken = on_broken
        self._keep = keep
        self._relist_when_silent = relist_when_silent
        self._relist_after_error = relist_after_error
        self._field_selector = field_selector
        self._label_selector = label_selector
        self._page_size = page_size
        self._watch_timeout_s = watch_timeout_s
        self._backoff = Backoff(min(FIRST_BACKOFF_S, max_backoff_s), max_backoff_s)
        self.resource_version: str | None = None

    async def list_all(self) -> tuple[list[Any], str]:
        """One consistent LIST, page by page; returns what ``keep`` made of each item (the
        items themselves without it), in order, and the list's resourceVersion.  A page is
        dropped once ``keep`` has seen its items."""
        keep = self._keep
        items: list[Any] = []
        token: str | None = None
        version = ""
        while True:
            page = await self._kube.list(
                self._path,
                field_selector=self._field_selector,
                label_selector=self._label_selector,
                limit=self._page_size,
                continue_token=token,
            )
            meta = page.get("metadata") or {}
            got = page.pop("items", None) or []
            del page
            items.extend(got if keep is None else map(keep, got))
            del got
            version = str(meta.get("resourceVersion", version))
            token = meta.get("continue") or None
            if not token:
                return items, version

    async def relist(self) -> None:
        items, version = await self.list_all()
        self._replace(items)
        self.resource_version = version
        self._on_relist()

    async def _watch_once(self) -> int:
        """Follow one watch request to its end; returns how many events (bookmarks too) came."""
        received = 0
        async for event in self._kube.watch(
            self._path,
            resource_version=self.resource_version,
            field_selector=self._field_selector,
            label_selector=self._label_selector,
            timeout_seconds=self._watch_timeout_s,
        ):
            received += 1
            version = (event.object.get("metadata") or {}).get("resourceVersion")
            if event.type == "BOOKMARK":
                self._alive()
            elif event.type in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(event.type, event.object)
            if version:
                self.resource_version = str(version)
        return received

    async def run(self) -> None:
        """List, then watch forever; relist on 410 Gone; back off on errors."""
        backoff = self._backoff
        need_list = True
        while True:
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                if await self._watch_once() == 0 and self._relist_when_silent:
                    # a live stream brings a bookmark about every minute; silence for a whole
                    # round means the version is not one the server will ever reach (e.g. etcd
                    # restored from a backup): start again from a fresh list
                    log.info("%s: watch round brought nothing; listing again", self.name)
                    need_list = True
                backoff.reset()
                continue
            except asyncio.CancelledError:
                raise
            except Gone:
                log.info("%s: watch too old (410), listing again", self.name)
                self._on_broken()
                need_list = True
                continue
            except (ApiUnavailable, ApiError) as exc:
                delay = backoff.next_s()
                log.warning("%s: %s; retrying in %.1fs", self.name, exc, delay)
                if self.resource_version is None or self._relist_after_error:
                    need_list = True
            except Exception:
                delay = backoff.next_s()
                log.exception("%s: unexpected error; listing again in %.1fs", self.name, delay)
                need_list = True
            self._on_broken()
            await asyncio.sleep(delay)
