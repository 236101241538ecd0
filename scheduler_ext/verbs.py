"""Filter and prioritize as pure functions of a pod's need and each node's GPU picture.

``gpus_of(node)`` supplies the picture (None for a node the extender does not know); the server
builds it from the watch-fed cache plus the node lock holder's assignment (``with_lock_holder``),
so no function here can reach the API server.
"""

from __future__ import annotations

import collections
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import compress
from typing import Generic, TypeVar, cast

from handoff.sharing import WHOLE
from handoff.wire import LEASE_ASSIGNMENT, Keys, MalformedAnnotation, parse_assignment
from lockd.model import Holder, NodeLockView, NodeName
from scheduler_ext.choose import (
    Fit,
    FitKey,
    NodeGPUs,
    Policy,
    Verdict,
    devices_of,
    fit,
    reserved_levels,
    score,
    steer_by_wait,
)
from scheduler_ext.need import PodNeed
from scheduler_ext.sharing import sharing_node

log = logging.getLogger(__name__)

UNKNOWN_NODE = "node is not (yet) in the GPU extender's cache"
DEFAULT_KEYS = Keys()


V = TypeVar("V")


class KeyMemo(Generic[V]):
    """Answers per (pod need, policy) and node key, kept across requests.

    ``NodeGPUs.fit_key`` holds everything ``fit`` and ``score`` read, so an answer for a key
    holds for every node with that key, now and later: in a large cluster most keys recur from
    one request to the next, and each then costs one lookup.  A pod that names devices is
    judged per node (its keys name the node, not its state) and is never memoized.  Bounded:
    the ``needs`` most recent (need, policy) pairs, at most ``keys`` answers each.
    """

    def __init__(
        self,
        answer: Callable[[NodeGPUs, PodNeed, Policy], V],
        *,
        needs: int = 64,
        keys: int = 50_000,
    ) -> None:
        self._answer = answer
        self._needs = needs
        self._keys = keys
        self._memo: OrderedDict[tuple[PodNeed, Policy], dict[FitKey, V]] = OrderedDict()

    def answers(
        self,
        keys: Iterable[FitKey],
        picture: Callable[[FitKey], NodeGPUs],
        need: PodNeed,
        policy: Policy,
    ) -> dict[FitKey | None, V]:
        """The answer for each of the distinct ``keys``; ``picture(key)``, a node's picture with
        that key, is asked only for the keys not answered before."""
        if need.wishes.names_devices:
            return {key: self._answer(picture(key), need, policy) for key in keys}
        memo = self._memo.get((need, policy))
        if memo is None or len(memo) > self._keys:
            memo = self._memo[(need, policy)] = {}
            if len(self._memo) > self._needs:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end((need, policy))
        out: dict[FitKey | None, V] = {}
        for key in keys:
            value = memo.get(key)
            if value is None:
                value = memo[key] = self._answer(picture(key), need, policy)
            out[key] = value
        return out


SCORES: KeyMemo[int] = KeyMemo(score)
VERDICTS: KeyMemo[Verdict] = KeyMemo(lambda gpus, need, _policy: fit(gpus, need))


@dataclass(frozen=True)
class Filtered:
    """Filter outcome: nodes that fit, and why the others do not."""

    passed: tuple[NodeName, ...]
    failed: dict[NodeName, str]
    unresolvable: dict[NodeName, str]


def with_lock_holder(
    gpus: NodeGPUs,
    view: NodeLockView | None,
    *,
    pod_uid: str | None = None,
    keys: Keys = DEFAULT_KEYS,
    finished: Callable[[str], bool] | None = None,
) -> NodeGPUs:
    """``gpus`` with the lock holder's assigned devices taken (unless the holder is ``pod_uid``,
    or ``finished(holder_uid)`` says the holder's devices need no Lease copy: its pod was seen
    deleted, terminal or bound — bound, its own annotations count them where it is).

    The holder's pod annotation may not have reached the cache yet; the Lease's copy of its
    assignment covers that gap.  On a sharing node each of the holder's GPUs counts as held
    whole (the copy names GPUs, not the size of the holder's slice), also a GPU that already
    holds other pods' slices.
    """
    holder = view.record.holder if view is not None else None
    return with_holder(gpus, holder, pod_uid=pod_uid, keys=keys, finished=finished)


def with_holder(
    gpus: NodeGPUs,
    holder: Holder | None,
    *,
    pod_uid: str | None = None,
    keys: Keys = DEFAULT_KEYS,
    finished: Callable[[str], bool] | None = None,
) -> NodeGPUs:
    """``with_lock_holder`` given the holder itself (None: the lock is free)."""
    if holder is None:
        return gpus
    if pod_uid is not None and holder.uid == pod_uid:
        return gpus
    if finished is not None and finished(holder.uid):
        return gpus
    raw = holder.data.get(LEASE_ASSIGNMENT)
    if raw is None:
        return gpus
    try:
        devices = devices_of(parse_assignment(raw, key=keys.assignment))
    except MalformedAnnotation as exc:
        log.warning("node %s: lock holder %s: %s", gpus.node, holder.key, exc)
        return gpus
    if sharing_node(gpus.devices):
        # A GPU here may hold several pods' slices, so "already taken" says nothing about the
        # holder's own claim, and the Lease's copy names GPUs, not claim sizes: each of the
        # holder's GPUs counts as held whole until its pod is seen bound (its spec then counts).
        extra = tuple((d, WHOLE) for d in sorted(devices))
        return replace(gpus, taken=gpus.taken | devices, held=(*gpus.held, *extra))
    if devices <= gpus.taken:
        return gpus
    return replace(gpus, taken=gpus.taken | devices)


@dataclass(frozen=True)
class KeyIndex:
    """Each node's ``NodeGPUs.fit_key`` and a picture per key, as kept by the cache
    (``ClusterCache.fit_keys``, ``with_key``): with it a request costs one lookup per name.

    Must agree with the ``gpus_of`` it comes with: ``key_of(n)`` is ``gpus_of(n).fit_key``
    (None for an unknown node) and ``picture(k)`` a picture whose key is ``k``.
    """

    key_of: Callable[[NodeName], FitKey | None]
    picture: Callable[[FitKey], NodeGPUs]


def _fit_keys(
    names: Sequence[NodeName],
    gpus_of: Callable[[NodeName], NodeGPUs | None],
    need: PodNeed,
    index: KeyIndex | None = None,
) -> tuple[list[FitKey | None], set[FitKey], Callable[[FitKey], NodeGPUs]]:
    """Each name's ``fit_key`` (None: unknown node), the distinct keys, and a picture per key.

    A pod that names device UUIDs is judged node by node (the key leaves device IDs out).
    Written with built-ins (``map``, ``zip``, ``dict``) so that little Python code runs per node,
    none at all for ``gpus_of`` and ``index.key_of`` when they are themselves built-ins (a dict's
    ``get``, as the server passes).
    """
    if index is not None and not need.wishes.names_devices:
        keys = list(map(index.key_of, names))
        distinct = set(keys)
        distinct.discard(None)
        return keys, cast(set[FitKey], distinct), index.picture
    pictures = list(map(gpus_of, names))
    if need.wishes.names_devices:
        keys = [None if g is None else FitKey(f"node {g.node}") for g in pictures]
    else:
        keys = [None if g is None else g.fit_key for g in pictures]
    one_each = dict(zip(keys, pictures, strict=True))  # nodes with equal keys judge alike
    one_each.pop(None, None)
    by_key = cast(dict[FitKey, NodeGPUs], one_each)
    return keys, set(by_key), by_key.__getitem__


def filter_nodes(
    need: PodNeed,
    names: Sequence[NodeName],
    gpus_of: Callable[[NodeName], NodeGPUs | None],
    *,
    index: KeyIndex | None = None,
) -> Filtered:
    """Keep the nodes the pod fits on now; the others go to failed (others hold their GPUs) or
    unresolvable (too few GPUs in all, or no usable inventory).

    Judges each distinct ``NodeGPUs.fit_key`` once (nodes with equal keys get equal verdicts), so
    a large cluster costs a few lookups per node (``index``: the keys kept by the cache).
    """
    if not need.wants_gpus:
        return Filtered(tuple(names), {}, {})
    keys, distinct, picture = _fit_keys(names, gpus_of, need, index)
    fits: set[FitKey | None] = set()
    no_room: dict[FitKey | None, str] = {None: UNKNOWN_NODE}
    never: dict[FitKey | None, str] = {}
    for key, verdict in VERDICTS.answers(distinct, picture, need, Policy.BINPACK).items():
        if verdict.fit is Fit.FITS:
            fits.add(key)
        elif verdict.fit is Fit.NO_ROOM:
            no_room[key] = verdict.reason
        else:
            never[key] = verdict.reason
    return Filtered(
        tuple(compress(names, map(fits.__contains__, keys))),
        _with_reason(names, keys, no_room),
        _with_reason(names, keys, never),
    )


def _with_reason(
    names: Sequence[NodeName], keys: list[FitKey | None], reasons: dict[FitKey | None, str]
) -> dict[NodeName, str]:
    """Name -> reason for each name whose key has one, in ``names`` order (built-ins only)."""
    if not reasons:
        return {}
    pairs = zip(names, map(reasons.get, keys), strict=True)  # None only where not kept below
    return cast(dict[NodeName, str], dict(compress(pairs, map(reasons.__contains__, keys))))


def prioritize_nodes(
    need: PodNeed,
    names: Sequence[NodeName],
    gpus_of: Callable[[NodeName], NodeGPUs | None],
    *,
    policy: Policy,
    waits: Mapping[NodeName, float] | None = None,
    tolerance_s: float = 0.0,
    larger: Mapping[int, int] | None = None,
    inflight: Mapping[NodeName, int] | None = None,
    index: KeyIndex | None = None,
) -> list[int]:
    """Score every candidate 0..10 by ``policy``; with ``larger`` (GPUs -> pods still pending
    that need more GPUs than this one), score 0 on the nodes where this pod would leave them
    no room (``reserved_levels``; ``inflight``: node -> GPUs of binds on their way there, not
    yet in the pictures); with ``waits`` (node -> expected wait of a bind there),
    steer to the fitting nodes where a bind is served soonest (``steer_by_wait``).
    The scores, in ``names`` order (``scores[i]`` is ``names[i]``'s).

    Scores each distinct ``NodeGPUs.fit_key`` once (nodes with equal keys score alike;
    ``index``: the keys kept by the cache)."""
    keys, distinct, picture = _fit_keys(names, gpus_of, need, index)
    by_key = SCORES.answers(distinct, picture, need, policy)
    by_key[None] = 0  # a node the extender does not know
    values = list(map(by_key.__getitem__, keys))
    if larger:  # the fitting nodes' free GPUs (a node this pod misses, a larger one misses too)
        ahead = inflight or {}
        free = [
            g.available - ahead.get(n, 0) if v > 0 and g is not None else -1
            for n, v, g in zip(names, values, map(gpus_of, names), strict=True)
        ]
        safe = reserved_levels(collections.Counter(f for f in free if f >= 0), larger, need)
        if safe is not None:
            values = [v if f in safe else 0 for v, f in zip(values, free, strict=True)]
    if waits:  # sparse: only nodes with a wait can lose their score (``steer_by_wait``)
        where = list(compress(range(len(names)), map(waits.__contains__, names)))  # built-ins
        busy = {names[i]: values[i] for i in where}
        fitting = len(values) - values.count(0)
        if len(set(names)) != len(names):  # a name given twice is one node
            fitting = len({n for n, v in zip(names, values, strict=True) if v > 0})
        steered = steer_by_wait(busy, waits, tolerance_s=tolerance_s, fitting=fitting)
        for i in where:
            values[i] = steered[names[i]]
    return values
