"""Filter and prioritize as pure functions of a pod's need and each node's GPU picture.

``gpus_of(node)`` supplies the picture (None for a node the extender does not know); the server
builds it from the watch-fed cache plus the node lock holder's assignment (``with_lock_holder``),
so no function here can reach the API server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from handoff.wire import Keys, MalformedAnnotation, parse_assignment
from lockd.model import NodeLockView, NodeName
from scheduler_ext.choose import (
    Fit,
    NodeGPUs,
    Policy,
    devices_of,
    fit,
    score,
    steer_by_wait,
)
from scheduler_ext.need import PodNeed

log = logging.getLogger(__name__)

UNKNOWN_NODE = "node is not (yet) in the GPU extender's cache"
DEFAULT_KEYS = Keys()
ASSIGNMENT_DATA = "assignment"  # Holder.data key: the Lease annotation <prefix>assignment


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
    or ``finished(holder_uid)`` says its pod was seen deleted or terminal).

    The holder's pod annotation may not have reached the cache yet; the Lease's copy of its
    assignment covers that gap.
    """
    if view is None or view.record.holder is None:
        return gpus
    holder = view.record.holder
    if pod_uid is not None and holder.uid == pod_uid:
        return gpus
    if finished is not None and finished(holder.uid):
        return gpus
    raw = holder.data.get(ASSIGNMENT_DATA)
    if raw is None:
        return gpus
    try:
        devices = devices_of(parse_assignment(raw, key=keys.assignment))
    except MalformedAnnotation as exc:
        log.warning("node %s: lock holder %s: %s", gpus.node, holder.key, exc)
        return gpus
    if devices <= gpus.taken:
        return gpus
    return replace(gpus, taken=gpus.taken | devices)


def filter_nodes(
    need: PodNeed, names: Sequence[NodeName], gpus_of: Callable[[NodeName], NodeGPUs | None]
) -> Filtered:
    """Keep the nodes the pod fits on now; the others go to failed (others hold their GPUs) or
    unresolvable (too few GPUs in all, or no usable inventory)."""
    if not need.wants_gpus:
        return Filtered(tuple(names), {}, {})
    passed: list[NodeName] = []
    failed: dict[NodeName, str] = {}
    unresolvable: dict[NodeName, str] = {}
    for name in names:
        gpus = gpus_of(name)
        if gpus is None:
            failed[name] = UNKNOWN_NODE
            continue
        verdict = fit(gpus, need)
        if verdict.fit is Fit.FITS:
            passed.append(name)
        elif verdict.fit is Fit.NO_ROOM:
            failed[name] = verdict.reason
        else:
            unresolvable[name] = verdict.reason
    return Filtered(tuple(passed), failed, unresolvable)


def prioritize_nodes(
    need: PodNeed,
    names: Sequence[NodeName],
    gpus_of: Callable[[NodeName], NodeGPUs | None],
    *,
    policy: Policy,
    waits: Mapping[NodeName, float] | None = None,
    tolerance_s: float = 0.0,
) -> list[tuple[NodeName, int]]:
    """Score every candidate 0..10 by ``policy``; with ``waits`` (node -> expected wait of a
    bind there), steer to the fitting nodes where a bind is served soonest (``steer_by_wait``).
    Same order as ``names``."""
    scores: dict[NodeName, int] = {}
    for name in names:
        gpus = gpus_of(name)
        scores[name] = 0 if gpus is None else score(gpus, need, policy)
    if waits:
        scores = steer_by_wait(scores, waits, tolerance_s=tolerance_s)
    return [(name, scores[name]) for name in names]
