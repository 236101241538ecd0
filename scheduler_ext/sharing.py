"""Filter, score and choice on nodes that share GPUs (``handoff.sharing``), for ``choose``.

A node shares when its inventory carries a split count S > 1 (its device plugin runs with
``--gpu-split S``).  There a GPU holds the slices of the pods assigned to it, and placement
follows ``handoff.sharing.place``: a pod's N GPUs are distinct, no GPU's committed memory or
cores exceed its capacity, no GPU holds more than S slices, and a GPU held whole (a pod without
sharing resources) holds nothing else.  A node without sharing keeps the whole-GPU rules of
``scheduler_ext.choose``; a pod that asks for slices never fits there (a reason says why).

What a GPU holds comes from the bound pods' assignments and specs (``holdings``); a device in
the picture's ``taken`` that no known pod's slice explains (a lock holder's, whose pod the cache
has not seen bound) counts as held whole, the safe side.

Pure functions of plain data; the verdicts are ``(fits, ever, reason)`` triples that ``choose``
turns into its own types.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from handoff.sharing import (
    FREE,
    WHOLE,
    Miss,
    Slice,
    Use,
    commitments,
    fill,
    larger,
    place,
    room_for,
    split_of,
)
from handoff.wire import GPU, ContainerName, DeviceID
from scheduler_ext.need import PodNeed

Holding = tuple[DeviceID, Slice]


def slots_of(need: PodNeed) -> tuple[Slice, ...]:
    """Each device slot's claim (whole GPUs for a pod without sharing resources)."""
    return need.slices if need.slices else (WHOLE,) * need.total


def holdings(
    need: PodNeed | None, assignment: Mapping[ContainerName, Sequence[DeviceID]]
) -> list[Holding]:
    """What one bound pod holds: per assigned device, its slot's claim (the larger claim where
    one device serves several of the pod's containers).  Unknown need: every device whole."""
    if need is None or not need.slices:
        devices = dict.fromkeys(d for ids in assignment.values() for d in ids)
        return [(d, WHOLE) for d in devices]
    slots = slots_of(need)
    plan = dict(need.plan)
    out: dict[DeviceID, Slice] = {}
    for container, ids in assignment.items():
        for i, dev in enumerate(ids):
            container_slots = plan.get(container, ())
            claim = slots[container_slots[i]] if i < len(container_slots) else WHOLE
            prev = out.get(dev)
            out[dev] = claim if prev is None or prev == claim else larger(prev, claim)
    return list(out.items())


def use_of(
    devices: Sequence[GPU], taken: Collection[DeviceID], held: Sequence[Holding]
) -> dict[DeviceID, Use]:
    """Per GPU what is committed: the known holdings, and ``taken`` devices none explains."""
    known = {d for d, _ in held}
    return commitments(devices, held, unknown=[d for d in taken if d not in known])


def sharing_node(devices: Sequence[GPU]) -> bool:
    return split_of(devices) > 1


def placement(
    devices: Sequence[GPU],
    taken: Collection[DeviceID],
    held: Sequence[Holding],
    need: PodNeed,
    *,
    binpack: bool = True,
) -> tuple[GPU, ...] | Miss:
    """The pod's GPUs, one per slot, or why there are none."""
    if need.wishes.policy is not None:
        binpack = need.wishes.policy == "binpack"
    return place(
        devices,
        use_of(devices, taken, held),
        slots_of(need),
        split=split_of(devices),
        binpack=binpack,
        allows=lambda g: need.wishes.allows(g.id, g.model),
    )


def verdict(
    devices: Sequence[GPU], taken: Collection[DeviceID], held: Sequence[Holding], need: PodNeed
) -> tuple[bool, bool, str]:
    """(fits now, could ever fit, reason)."""
    got = placement(devices, taken, held, need)
    if isinstance(got, Miss):
        return False, got.ever, got.reason
    return True, True, ""


def fill_after(
    devices: Sequence[GPU],
    taken: Collection[DeviceID],
    held: Sequence[Holding],
    need: PodNeed,
    binpack: bool,
) -> tuple[int, int] | None:
    """(committed MiB after placing the pod, total MiB) on the node; None when it does not fit."""
    got = placement(devices, taken, held, need, binpack=binpack)
    if isinstance(got, Miss):
        return None
    after = [*held, *zip((g.id for g in got), slots_of(need), strict=True)]
    return fill(devices, use_of(devices, taken, after))


def choice(
    devices: Sequence[GPU], taken: Collection[DeviceID], held: Sequence[Holding], need: PodNeed
) -> dict[ContainerName, list[DeviceID]] | str:
    """Container -> physical GPUs (kubelet order), or the reason there are none."""
    got = placement(devices, taken, held, need)
    if isinstance(got, Miss):
        return got.reason
    ids = [g.id for g in got]
    return {name: [ids[s] for s in slots] for name, slots in need.plan}


def conflicts(
    assignment: Mapping[ContainerName, Sequence[DeviceID]],
    devices: Sequence[GPU],
    taken: Collection[DeviceID],
    held: Sequence[Holding],
    need: PodNeed | None,
) -> list[str]:
    """Why ``assignment`` cannot stand on the node as it is now (empty when it can): every
    assigned GPU must be in the inventory, healthy, and have room for the pod's claim on it."""
    by_id = {g.id: g for g in devices}
    use = use_of(devices, taken, held)
    split = split_of(devices)
    problems: list[str] = []
    for dev, claim in holdings(need, assignment):
        gpu = by_id.get(dev)
        if gpu is None:
            problems.append(f"{dev} is not in the node's inventory")
            continue
        why = room_for(gpu, use.get(dev, FREE), claim, split)
        if why is not None:
            problems.append(f"{dev} has no room for {claim.describe()} ({why})")
    return problems


def key(devices: Sequence[GPU], taken: Collection[DeviceID], held: Sequence[Holding]) -> str:
    """What placement reads of a sharing node beyond its shape, for ``NodeGPUs.fit_key``."""
    use = use_of(devices, taken, held)
    return repr(tuple(sorted((str(d), u) for d, u in use.items())))
