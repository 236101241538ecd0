"""Binds on their way: the best-scored node of each pod that was prioritized but not yet bound.

kube-scheduler prioritizes the next pod while the previous pod's bind is still on its way, so a
bind that will queue for a node is not yet visible there: in a burst, every pod would pick the
same "best" node and queue behind each other.  ``Promises`` remembers, for a short time, the node
each pod scored highest, so that prioritize counts it as one more bind expected on that node for
*other* pods.  A promise ends when the pod's bind arrives (it is then in the node's queue) or
after ``ttl_s``; it is a hint for scoring only and never refuses anything.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence

from lockd.model import NodeName

DEFAULT_TTL_S = 1.0


class Promises:
    """Pod UID -> (its best node, expiry on the local clock), for the prioritize hint."""

    def __init__(
        self, *, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._by_pod: dict[str, tuple[NodeName, float]] = {}

    def promise(
        self, names: Sequence[NodeName], scores: Sequence[int], pod_uid: str
    ) -> NodeName | None:
        """Remember the best-scored node (``scores[i]`` is ``names[i]``'s; first of equals; none
        when nothing scores) for the pod."""
        best = max(scores, default=0)
        if best <= 0:
            self.forget(pod_uid)
            return None
        node = names[scores.index(best)]
        self._by_pod[pod_uid] = (node, self._clock() + self._ttl_s)
        return node

    def forget(self, pod_uid: str) -> None:
        """The pod's bind arrived: its promise has done its work."""
        self._by_pod.pop(pod_uid, None)

    def nodes(self) -> dict[str, NodeName]:
        """Pod UID -> its promised node (expired ones included until the next count)."""
        return {uid: node for uid, (node, _) in self._by_pod.items()}

    def promised_to_others(self, pod_uid: str) -> collections.Counter[NodeName]:
        """Per node, the unexpired promises of pods other than ``pod_uid``."""
        now = self._clock()
        for uid in [u for u, (_, until) in self._by_pod.items() if until <= now]:
            del self._by_pod[uid]
        return collections.Counter(n for u, (n, _) in self._by_pod.items() if u != pod_uid)
