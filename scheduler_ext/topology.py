"""Which GPUs of a node a pod gets when links, NUMA nodes and selections matter (pure).

``place`` answers, for one node picture and one pod, either the devices of every slot (a
``Pick``) or why the pod does not fit (a ``Miss``).  ``scheduler_ext.choose`` calls it for fit,
score and choose alike, so the three never disagree.

How a set is chosen:

1. *Selection.*  Only devices the pod's wishes allow (``handoff.placement``) are candidates.
2. *NUMA alignment.*  When the node's kubelet runs a topology manager policy other than
   ``none`` and the devices report NUMA nodes, kubelet itself restricts each container's devices
   to the NUMA nodes its topology manager picks, and that pick is deterministic: among the masks
   of NUMA nodes whose available devices cover the container's request, the *preferred* ones are
   those as narrow as the narrowest mask that could hold the request on an empty node; the
   narrowest preferred mask wins, ties going to the lower-numbered NUMA nodes.  ``place``
   replays that pick per container (``kubelet_affinity``) and chooses inside it, because kubelet
   would refuse any other devices (they would not be in its aligned set).  ``single-numa-node``
   admits a container only on one NUMA node, ``restricted`` only on a preferred mask; both are
   filter verdicts here.  ``best-effort`` always admits.
3. *Connectivity.*  Among the candidates, the set whose weakest link (``handoff.topology``) is
   best; then the most strongly linked pairs; then the set that leaves the free devices in the
   fewest, largest groups (PCIe switch, NUMA node, NVSwitch domain, in that order); then the
   lowest indexes.  With the pod's ``topology: none``, or on a node without link or NUMA facts,
   the lowest-index candidates.
4. ``topology: required``: the node fits only when the chosen set is of the best class the node
   could offer the pod were all its healthy devices free; otherwise the filter says which class
   was asked for and which the free devices offer.

Guarantees: deterministic for equal inputs; a ``Pick`` names exactly ``need.total`` distinct
devices, all healthy, free and allowed by the wishes; with at most ``EXACT_LIMIT`` candidate sets
the chosen set's class is the best any allowed free set (inside kubelet's NUMA pick) has.
Non-guarantees: beyond ``EXACT_LIMIT`` candidate sets (16+ GPU nodes) the search is greedy; the
NUMA replay follows kubelet's container scope with the device manager as the only hint provider
(no CPU manager hints), and for a request no preferred mask covers under ``best-effort`` it
assumes kubelet allows every NUMA node (exact for up to two NUMA nodes).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from math import comb

from handoff.placement import TopologyWish
from handoff.topology import Link, NumaPolicy, has_topology, link
from handoff.wire import GPU
from scheduler_ext.need import PodNeed

EXACT_LIMIT = 1000  # candidate sets searched exhaustively (C(8, 4) = 70); more: greedy
CACHE_LIMIT = 8192


@dataclass(frozen=True, slots=True)
class Pick:
    """Where a pod goes on a node: ``slots[s]`` is the device of slot ``s``."""

    slots: tuple[GPU, ...]
    link: Link  # class of the whole set
    block: tuple[int, int]  # the largest free NUMA group left, and the largest NUMA group


@dataclass(frozen=True, slots=True)
class Miss:
    """Why a pod does not fit a node; ``ever`` is False when no departure could change that."""

    reason: str
    ever: bool


Outcome = Pick | Miss


def shape_key(devices: Sequence[GPU], free: Sequence[GPU], policy: NumaPolicy) -> str:
    """Everything ``place`` reads of a node besides device IDs, as one interned string: nodes
    with equal keys give equal outcomes (up to IDs) for every pod that names no UUID."""
    if not has_topology(devices):
        models = {g.model for g in devices if g.healthy}
        if len(models) <= 1:  # counts (in the fit key beside this) say the rest
            return sys.intern(repr(sorted(models)))
        healthy = Counter(g.model for g in devices if g.healthy)
        spare = Counter(g.model for g in free)
        return sys.intern(repr((sorted(healthy.items()), sorted(spare.items()))))
    mask = ",".join(str(g.index) for g in free)
    return sys.intern(f"{_layout(devices)}|{mask}|{policy.value}")


_layouts: dict[int, tuple[Sequence[GPU], str]] = {}


def _layout(devices: Sequence[GPU]) -> str:
    """``repr`` of the layout facts of ``devices``, computed once per inventory object (node
    pictures rebuilt from one node state share its ``devices`` tuple)."""
    found = _layouts.get(id(devices))
    if found is not None and found[0] is devices:
        return found[1]
    text = repr(tuple((g.index, g.model, g.numa, g.topo, g.healthy) for g in devices))
    if len(_layouts) >= CACHE_LIMIT:
        _layouts.clear()
    _layouts[id(devices)] = (devices, text)  # the reference keeps the id from being reused
    return text


_cache: dict[tuple[str, PodNeed], Outcome] = {}


def place(
    devices: Sequence[GPU],
    free: Sequence[GPU],
    need: PodNeed,
    policy: NumaPolicy,
    *,
    key: str | None = None,
) -> Outcome:
    """The pod's devices on the node, or why it does not fit (see the module docstring).

    ``devices`` is the node's inventory sorted by index, ``free`` its healthy untaken devices;
    with ``key`` (``shape_key`` of the same arguments) outcomes are remembered per shape and
    mapped onto this node's devices, unless the pod names device UUIDs.
    """
    if key is None or need.wishes.names_devices:
        return _place(devices, free, need, policy)
    found = _cache.get((key, need))
    if found is None:
        found = _place(devices, free, need, policy)
        if len(_cache) >= CACHE_LIMIT:
            _cache.clear()
        _cache[(key, need)] = found
        return found
    if isinstance(found, Miss):
        return found
    by_index = {g.index: g for g in devices}
    return Pick(tuple(by_index[g.index] for g in found.slots), found.link, found.block)


def _place(
    devices: Sequence[GPU], free: Sequence[GPU], need: PodNeed, policy: NumaPolicy
) -> Outcome:
    wishes = need.wishes
    allowed = [g for g in free if wishes.allows(g.id, g.model)]
    if wishes.selects:
        healthy = sum(1 for g in devices if g.healthy and wishes.allows(g.id, g.model))
        if healthy < need.total:
            return Miss(
                f"node has {healthy} healthy GPUs matching {wishes.describe()}, "
                f"pod needs {need.total}",
                ever=False,
            )
        if len(allowed) < need.total:
            return Miss(
                f"node has {len(allowed)} free GPUs matching {wishes.describe()} of {healthy}, "
                f"pod needs {need.total}",
                ever=True,
            )
    shaped = has_topology(devices)
    connect = shaped and wishes.topology is not TopologyWish.NONE
    numa = policy.aligns and any(g.numa is not None for g in devices)
    if numa:
        outcome = _aligned(devices, free, allowed, need, policy, connect)
    else:
        if len(allowed) < need.total:  # the count check runs first; this is belt and braces
            return Miss(f"node has {len(allowed)} free GPUs, pod needs {need.total}", ever=True)
        chosen = _best_set(allowed, need.total, allowed, connect)
        outcome = Pick(tuple(chosen), _set_link(chosen), _block(devices, free, chosen))
    if isinstance(outcome, Miss) or wishes.topology is not TopologyWish.REQUIRED or not shaped:
        return outcome
    everything = [g for g in devices if g.healthy]
    best = _place(devices, everything, _without_required(need), policy)
    if isinstance(best, Pick) and outcome.link < best.link:
        return Miss(
            f"pod requires its {need.total} GPUs connected by {best.link.label} (the best this "
            f"node offers); its free GPUs offer {outcome.link.label} at best",
            ever=True,
        )
    return outcome


def _without_required(need: PodNeed) -> PodNeed:
    return replace(need, wishes=replace(need.wishes, topology=TopologyWish.PREFERRED))


def _aligned(
    devices: Sequence[GPU],
    free: Sequence[GPU],
    allowed: Sequence[GPU],
    need: PodNeed,
    policy: NumaPolicy,
    connect: bool,
) -> Outcome:
    """Per container, kubelet's NUMA pick, then the best set inside it."""
    nodes = sorted({g.numa for g in devices if g.numa is not None})
    slots: dict[int, GPU] = {}
    available = list(free)  # kubelet's view: every free device, whatever the pod allows
    for name, container_slots in need.plan:
        fresh = [s for s in container_slots if s not in slots]
        if not fresh:
            continue
        mask = kubelet_affinity(devices, available, len(container_slots), nodes)
        if mask is None:
            return _numa_miss(devices, name, len(container_slots), nodes, policy)
        numas, preferred = mask
        if not preferred and policy is not NumaPolicy.BEST_EFFORT:
            return _numa_miss(devices, name, len(container_slots), nodes, policy)
        if policy is NumaPolicy.SINGLE_NUMA_NODE and len(numas) > 1:
            return _numa_miss(devices, name, len(container_slots), nodes, policy)
        taken = set(slots.values())
        inside = [g for g in allowed if g not in taken and (not preferred or g.numa in numas)]
        if len(inside) < len(fresh):
            where = "NUMA node" + ("s " if len(numas) > 1 else " ")
            return Miss(
                f"kubelet's topology manager ({policy.value}) puts container {name!r} on "
                f"{where}{','.join(map(str, sorted(numas)))}, where {len(inside)} free GPUs "
                f"match {need.wishes.describe() or 'the pod'}; it needs {len(fresh)}",
                ever=True,
            )
        chosen = _best_set(inside, len(fresh), inside, connect, near=list(slots.values()))
        for s, g in zip(fresh, chosen, strict=True):
            slots[s] = g
        available = [g for g in available if g not in chosen]
    picked = [slots[s] for s in range(need.total)]
    return Pick(tuple(picked), _set_link(picked), _block(devices, free, picked))


def _numa_miss(
    devices: Sequence[GPU], name: str, count: int, nodes: Sequence[int], policy: NumaPolicy
) -> Miss:
    per_node = Counter(g.numa for g in devices if g.healthy and g.numa is not None)
    largest = max(per_node.values(), default=0)
    if policy is NumaPolicy.SINGLE_NUMA_NODE and largest < count:
        return Miss(
            f"kubelet's topology manager policy single-numa-node needs container {name!r}'s "
            f"{count} GPUs on one NUMA node; the largest NUMA node has {largest} healthy GPUs",
            ever=False,
        )
    return Miss(
        f"kubelet's topology manager policy {policy.value} needs container {name!r}'s {count} "
        f"GPUs NUMA-aligned; no "
        + ("NUMA node" if policy is NumaPolicy.SINGLE_NUMA_NODE else "narrowest set of NUMA nodes")
        + f" has {count} free GPUs",
        ever=True,
    )


def kubelet_affinity(
    devices: Sequence[GPU], available: Sequence[GPU], request: int, nodes: Sequence[int]
) -> tuple[frozenset[int], bool] | None:
    """The NUMA nodes kubelet's topology manager picks for a container requesting ``request``
    devices, and whether that pick is preferred; None when no mask has enough available devices.

    kubelet's device manager counts every device it knows (healthy or not) for the narrowest
    possible mask, and available devices for each mask's hint; the merge keeps the narrowest
    preferred hint, ties to the lower NUMA nodes (``bitmask.IsNarrowerThan``).
    """
    min_size = len(nodes)
    masks = [m for size in range(1, len(nodes) + 1) for m in combinations(nodes, size)]
    for m in masks:
        if sum(1 for g in devices if g.numa in m) >= request:
            min_size = min(min_size, len(m))
    hints = [m for m in masks if sum(1 for g in available if g.numa in m) >= request]
    if not hints:
        return None
    preferred = [m for m in hints if len(m) == min_size]
    if not preferred:
        return frozenset(nodes), False
    # IsNarrowerThan: fewer NUMA nodes, then the smaller bitmask as a number (IsLessThan)
    best = min(preferred, key=lambda m: (len(m), sum(1 << n for n in m)))
    return frozenset(best), True


def _set_link(devices: Sequence[GPU]) -> Link:
    best = Link.NVSWITCH
    for a, b in combinations(devices, 2):
        best = min(best, link(a, b))
    return best


def _groups(g: GPU) -> tuple[object, object, object]:
    return (g.topo.pcie, g.numa, g.topo.nvswitch)


def _leftover(free: Sequence[GPU], chosen: Sequence[GPU]) -> tuple[int, int, int]:
    """How concentrated the free devices stay: sum of squared free counts per PCIe switch, NUMA
    node and NVSwitch domain, compared in that order (larger: fewer, larger groups)."""
    rest = [g for g in free if g not in chosen]
    out = []
    for level in range(3):
        counts = Counter(_groups(g)[level] for g in rest if _groups(g)[level] is not None)
        out.append(sum(c * c for c in counts.values()))
    return (out[0], out[1], out[2])


def _best_set(
    candidates: Sequence[GPU],
    k: int,
    free: Sequence[GPU],
    connect: bool,
    *,
    near: Sequence[GPU] = (),
) -> list[GPU]:
    """``k`` of ``candidates`` (sorted by index): lowest indexes, or with ``connect`` the best
    set by (weakest link, sum of links, leftover groups, lowest indexes)."""
    ordered = sorted(candidates, key=lambda g: (g.index, g.id))
    if not connect or k <= 0 or k >= len(ordered):
        return ordered[:k]
    n = len(ordered)
    links = [[link(a, b) if a is not b else Link.NVSWITCH for b in ordered] for a in ordered]
    near_links = [sum(int(link(a, b)) for b in near) for a in ordered]

    def rank(combo: Sequence[int]) -> tuple[int, int, tuple[int, int, int], tuple[int, ...]]:
        weakest = Link.NVSWITCH
        total = 0
        for i, j in combinations(combo, 2):
            value = links[i][j]
            total += value
            if value < weakest:
                weakest = value
        total += sum(near_links[i] for i in combo)
        chosen = [ordered[i] for i in combo]
        return (weakest, total, _leftover(free, chosen), tuple(-ordered[i].index for i in combo))

    if comb(n, k) <= EXACT_LIMIT:
        best = max(combinations(range(n), k), key=rank)
        return [ordered[i] for i in best]
    # greedy from every seed: add the device with the best weakest link, then sum of links
    results = []
    for seed in range(n):
        combo = [seed]
        while len(combo) < k:
            rest = [i for i in range(n) if i not in combo]
            nxt = max(
                rest,
                key=lambda i: (
                    min(links[i][j] for j in combo),
                    sum(links[i][j] for j in combo),
                    -ordered[i].index,
                ),
            )
            combo.append(nxt)
        results.append(tuple(sorted(combo)))
    best = max(results, key=rank)
    return [ordered[i] for i in best]


def _block(devices: Sequence[GPU], free: Sequence[GPU], chosen: Sequence[GPU]) -> tuple[int, int]:
    """The largest free NUMA group after ``chosen`` leaves, and the largest NUMA group of
    healthy devices (the whole node when devices report no NUMA node); (1, 1) for none."""
    size = Counter(g.numa for g in devices if g.healthy)
    left = Counter(g.numa for g in free if g not in chosen)
    largest = max(size.values(), default=0)
    if largest == 0:
        return (1, 1)
    return (max(left.values(), default=0), largest)


def ceiling(devices: Sequence[GPU], need: PodNeed, policy: NumaPolicy) -> Link | None:
    """The best class ``place`` gives the pod on this node with all healthy devices free (None
    when it would not fit even then); remembered per layout."""
    healthy = [g for g in devices if g.healthy]
    outcome = place(devices, healthy, need, policy, key=shape_key(devices, healthy, policy))
    return outcome.link if isinstance(outcome, Pick) else None
