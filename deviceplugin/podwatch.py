"""The pods bound to this node, kept by a list-then-watch (``fieldSelector=spec.nodeName=<node>``).

The device plugin uses it to notice a GPU pod that kubelet may be admitting besides the lock's
holder (one bound around the extender).  It is built to answer "which pods are bound here" and
"this pod by key" from memory, so the holder pod could later be read from it instead of a GET,
and which pods it saw deleted (``gone``).  ``on_change`` is called after every change, so the
plugin releases the lock of a holder that ended as soon as the watch shows it.

Guarantees: those of the list-then-watch loop it runs (``kube.reflector``): events are applied in
the order the API server sent them; after a 410 Gone, an unexpected error, or a watch round with
neither event nor bookmark, the pods are listed again and replaced whole, so pods deleted while
the stream was down are dropped.  A broken connection is retried with capped exponential backoff
from the last resourceVersion seen.  ``synced`` is False until the first list has been applied.
Non-guarantee: the view lags the API server by the watch's delay; a pod bound a moment ago may not
be in it yet.  ``list_now`` is the fresh answer (one consistent LIST), for decisions that must
include every pod kubelet may be admitting.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from kube.client import KubeClient, pod_path
from kube.reflector import Reflector
from lockd.model import HolderKey, NodeName

PodJSON = Mapping[str, Any]
TOMBSTONES = 1024  # how many deleted pods' UIDs are remembered (``gone``)


def _key(pod: PodJSON) -> HolderKey:
    meta = pod.get("metadata") or {}
    return HolderKey(f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def _uid(pod: PodJSON) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _failed(pod: PodJSON) -> bool:
    return bool((pod.get("status") or {}).get("phase") == "Failed")


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
        self.node = node
        self._pods: dict[HolderKey, PodJSON] = {}
        # UIDs seen deleted -> whether the pod was last seen Failed (``gone_failed``)
        self._gone: OrderedDict[str, bool] = OrderedDict()
        self.synced = False
        self.on_synced: Callable[[], None] = lambda: None
        # called after every change the watch applied (an event, or a list replacing the view)
        self.on_change: Callable[[], None] = lambda: None
        self._reflector = Reflector(
            kube,
            pod_path(),
            name=f"pods of node {node}",
            replace=self._replace,
            apply=self._apply,
            alive=lambda: None,
            field_selector=f"spec.nodeName={node}",
            page_size=page_size,
            watch_timeout_s=watch_timeout_s,
            max_backoff_s=max_backoff_s,
        )

    # -- reads ----------------------------------------------------------------------------------

    def pods(self) -> list[PodJSON]:
        """Every pod bound to this node, as last seen."""
        return list(self._pods.values())

    def get(self, key: HolderKey) -> PodJSON | None:
        """The pod ``namespace/name`` as last seen (None: not bound here, or not seen yet)."""
        return self._pods.get(key)

    def gone(self, uid: str) -> bool:
        """Whether the watch saw the pod of ``uid`` deleted (the last ``TOMBSTONES`` of them)."""
        return uid in self._gone

    def gone_failed(self, uid: str) -> bool:
        """Whether the watch saw the pod of ``uid`` deleted, and Failed when last seen (a
        rejected pod its controller deleted)."""
        return self._gone.get(uid, False)

    async def list_now(self) -> list[PodJSON]:
        """Every pod bound to this node, by one consistent LIST (paged) of the API server; it
        does not change the watch's view.  Raises ``ApiUnavailable``/``ApiError``."""
        items, _ = await self._reflector.list_all()
        return list(items)

    # -- the watch ------------------------------------------------------------------------------

    def _replace(self, items: list[Any]) -> None:
        before = {_uid(p): _failed(p) for p in self._pods.values()}
        self._pods = {_key(p): p for p in items}
        for uid in before.keys() - {_uid(p) for p in items}:
            self._bury(uid, failed=before[uid])
        if not self.synced:
            self.synced = True
            self.on_synced()
        self.on_change()

    def _apply(self, kind: str, pod: PodJSON) -> None:
        key = _key(pod)
        if kind == "DELETED":
            last = self._pods.pop(key, None)
            self._bury(_uid(pod), failed=_failed(pod) or (last is not None and _failed(last)))
        else:
            self._pods[key] = pod
        self.on_change()

    def _bury(self, uid: str, *, failed: bool) -> None:
        if not uid:
            return
        self._gone[uid] = failed or self._gone.get(uid, False)
        self._gone.move_to_end(uid)
        while len(self._gone) > TOMBSTONES:
            self._gone.popitem(last=False)

    async def run(self) -> None:
        """List, then watch forever; list again on 410 Gone or a silent round; back off on
        errors."""
        await self._reflector.run()
