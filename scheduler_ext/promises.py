"""Nodes this extender expects to be locked soon: the best-scored node of each pod in flight.

kube-scheduler prioritizes the next pod while the previous pod's bind is still on its way, so a
lock taken in that bind is not yet visible: in a burst, every pod would pick the same "best"
node and all but one would fail to bind and back off.  ``Promises`` remembers, for a short
time, the node each pod scored highest, so that prioritize can steer *other* pods away from it
as if it were already locked.  A promise ends when the pod binds (or fails to) or after
``ttl_s``; it is a hint for scoring only and never refuses anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from lockd.model import NodeName

DEFAULT_TTL_S = 1.0


class Promises:
    """Node -> (pod UID, expiry on the local clock), for the prioritize hint."""

    def __init__(
        self, *, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._by_node: dict[NodeName, tuple[str, float]] = {}

    def promise(self, scores: Sequence[tuple[NodeName, int]], pod_uid: str) -> NodeName | None:
        """Remember the best-scored node (first of equals; none when nothing scores) for the pod."""
        best = max(scores, key=lambda s: s[1], default=None)
        if best is None or best[1] <= 0:
            return None
        self.forget(pod_uid)
        self._by_node[best[0]] = (pod_uid, self._clock() + self._ttl_s)
        return best[0]

    def forget(self, pod_uid: str) -> None:
        """The pod's bind came (or failed): its promise has done its work."""
        for node in [n for n, (uid, _) in self._by_node.items() if uid == pod_uid]:
            del self._by_node[node]

    def promised_to_others(self, pod_uid: str) -> list[NodeName]:
        """Nodes promised to another pod and not expired."""
        now = self._clock()
        for node in [n for n, (_, until) in self._by_node.items() if until <= now]:
            del self._by_node[node]
        return [n for n, (uid, _) in self._by_node.items() if uid != pod_uid]
