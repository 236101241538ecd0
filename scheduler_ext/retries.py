"""Pods filter turned away for want of room, named again once room appears there (pure).

kube-scheduler retries a pod an extender rejected on every cluster event it watches, the
departure of a bound pod included, or after five minutes in its unschedulable queue (the plugin
name ``Extender``: ``schedule_one.go``; ``defaultEnqueueExtension``,
``framework/runtime/framework.go``; v1.31.9 and v1.37.2).  Its retry after a bound pod leaves
can reach filter before this extender's own pod watch has delivered that departure; filter then
judges the pod on a picture that still holds the departed pod's GPUs, turns it away again, and
with nothing else happening on the cluster the pod waits those five minutes.

``TurnedAway`` remembers, for ``window_s``, each pod that filter turned away from every node it
was asked about, at least one of them for want of room (a node with too few GPUs in all, or none
usable, can never take it and does not count).  When the cache's picture of such a node changes,
``due`` names the remembered pods that fit there now, each once; the extender then updates the
pod, an update kube-scheduler requeues it for (``service.py``, docs/extender.md, "Pods turned
away").  A pod named when kube-scheduler would have retried it anyway costs one more filter call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lockd.model import NodeName
from scheduler_ext.choose import NodeGPUs
from scheduler_ext.need import PodNeed
from scheduler_ext.verbs import filter_nodes

__all__ = ["TURNED_AWAY_LIMIT", "TURNED_AWAY_WINDOW_S", "Due", "TurnedAway"]

# How long a turned-away pod is watched for room: longer than this extender's pod watch lags
# kube-scheduler's (a retry turned away on a stale picture is remembered until the picture
# catches up), short enough that a pod kube-scheduler gave up on is soon forgotten.
TURNED_AWAY_WINDOW_S = 30.0
TURNED_AWAY_LIMIT = 10_000  # pods remembered at most; the oldest are forgotten first


@dataclass(frozen=True)
class Due:
    """A turned-away pod that fits on ``node`` now."""

    uid: str
    key: str  # namespace/name
    node: NodeName


@dataclass(frozen=True)
class _Entry:
    key: str
    need: PodNeed
    nodes: frozenset[NodeName]
    at: float


class TurnedAway:
    """The pods filter turned away from every node, remembered for ``window_s`` by UID.

    Guarantees: ``due`` names a pod only if it was turned away within ``window_s`` before the
    call, from the node it names, and fits there by ``filter_nodes`` on the pictures given; it
    names each turned-away pod at most once (turning it away again remembers it again).  At most
    ``limit`` pods are remembered.
    """

    def __init__(
        self, *, window_s: float = TURNED_AWAY_WINDOW_S, limit: int = TURNED_AWAY_LIMIT
    ) -> None:
        self.window_s = window_s
        self.limit = limit
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # by UID, oldest first
        self._on_node: dict[NodeName, set[str]] = {}  # node -> UIDs turned away from it

    def __len__(self) -> int:
        return len(self._entries)

    def turned_away(
        self, uid: str, key: str, need: PodNeed, nodes: Iterable[NodeName], now: float
    ) -> None:
        """Remember that filter turned ``uid`` away, for want of room on ``nodes``."""
        self.forget(uid)
        entry = _Entry(key, need, frozenset(nodes), now)
        if not entry.nodes or not uid:
            return
        self._entries[uid] = entry
        for node in entry.nodes:
            self._on_node.setdefault(node, set()).add(uid)
        while len(self._entries) > self.limit:
            self.forget(next(iter(self._entries)))

    def forget(self, uid: str) -> None:
        """Stop watching ``uid`` (filter passed it, or it was named)."""
        entry = self._entries.pop(uid, None)
        if entry is None:
            return
        for node in entry.nodes:
            uids = self._on_node.get(node)
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self._on_node[node]

    def expire(self, now: float) -> None:
        """Forget the pods turned away longer than ``window_s`` before ``now``."""
        while self._entries:
            uid, oldest = next(iter(self._entries.items()))
            if now - oldest.at <= self.window_s:
                break
            self.forget(uid)

    def due(
        self,
        changed: Iterable[NodeName],
        gpus_of: Callable[[NodeName], NodeGPUs | None],
        now: float,
    ) -> list[Due]:
        """The remembered pods that fit now on a node in ``changed`` (its picture changed),
        forgotten as they are named; entries older than ``window_s`` are dropped first."""
        self.expire(now)
        out: list[Due] = []
        for node in sorted(set(changed)):
            for uid in sorted(self._on_node.get(node, ())):
                entry = self._entries[uid]
                if filter_nodes(entry.need, [node], gpus_of).passed:
                    self.forget(uid)
                    out.append(Due(uid, entry.key, node))
        return out
