"""MIG instances for a pod: which free instances of the requested profiles it gets (pure).

A node's inventory lists the MIG instances of its GPUs in MIG mode as devices of their own
(``handoff.wire.GPU`` with ``profile`` and ``parent``), one extended resource per profile,
``nvidia.com/mig-<profile>``.  A pod asks for them like for whole GPUs (``nvidia.com/mig-1g.10gb:
1``), per container; ``scheduler_ext.need`` replays kubelet's walk of the pod's containers for
each profile on abstract slots (``MigNeed``), exactly as for whole GPUs.  Here the slots of each
profile are mapped to free instances of that profile on the node.

An instance is free when it is healthy and no live pod's assignment (nor the lock holder's)
names it: the same ``taken`` set as whole GPUs, since both are device IDs of one assignment.
Instances are taken in their inventory order (parent GPU index, then ID), so a pod's instances
are packed on the lowest parents first.

Guarantees: deterministic for equal inputs; ``choice`` never names an unhealthy or taken
instance, nor one of another profile, and gives no two app containers of a pod one instance.
Not handled: pods bound around the extender that ask for MIG instances (they are not counted
against a node's free instances, unlike whole GPUs); instances of a profile kubelet does not
report (the plugin serves the profiles it found at start).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from handoff.wire import GPU, ContainerName, DeviceID


@dataclass(frozen=True)
class MigNeed:
    """What a pod asks of one MIG profile: its resource, and per container (kubelet's order)
    the abstract slots it gets, ``total`` distinct instances in all (``need.plan_slots``)."""

    profile: str
    resource: str
    total: int
    plan: tuple[tuple[ContainerName, tuple[int, ...]], ...]


def free_of(instances: Sequence[GPU], taken: Collection[DeviceID], profile: str) -> list[GPU]:
    """The healthy, untaken instances of ``profile``, parent index then ID."""
    return sorted(
        (g for g in instances if g.profile == profile and g.healthy and g.id not in taken),
        key=lambda g: (g.index, g.id),
    )


def verdict(
    instances: Sequence[GPU], taken: Collection[DeviceID], needs: Sequence[MigNeed]
) -> tuple[bool, bool, str]:
    """(fits, could ever fit, reason) of a pod's MIG needs on a node."""
    for need in needs:
        healthy = sum(1 for g in instances if g.profile == need.profile and g.healthy)
        free = len(free_of(instances, taken, need.profile))
        if healthy < need.total:
            return (
                False,
                False,
                f"node has {healthy} healthy {need.resource} instances, pod needs {need.total}",
            )
        if free < need.total:
            return (
                False,
                True,
                f"node has {free} free {need.resource} instances of {healthy}, pod needs "
                f"{need.total}",
            )
    return True, True, ""


def choice(
    instances: Sequence[GPU], taken: Collection[DeviceID], needs: Sequence[MigNeed]
) -> dict[ContainerName, list[DeviceID]] | str:
    """The instances each container gets (container -> IDs, kubelet's order per profile), or
    why the pod does not fit."""
    ok, _, why = verdict(instances, taken, needs)
    if not ok:
        return why
    out: dict[ContainerName, list[DeviceID]] = {}
    for need in needs:
        ids = [g.id for g in free_of(instances, taken, need.profile)[: need.total]]
        for container, slots in need.plan:
            out.setdefault(container, []).extend(ids[s] for s in slots)
    return out


def conflicts(
    assignment: Mapping[ContainerName, Sequence[DeviceID]],
    instances: Sequence[GPU],
    taken: Collection[DeviceID],
) -> list[str]:
    """Why the MIG instances ``assignment`` names cannot be given now (empty when they can)."""
    by_id = {g.id: g for g in instances}
    problems: list[str] = []
    for dev in sorted({d for ids in assignment.values() for d in ids if d in by_id}):
        if not by_id[dev].healthy:
            problems.append(f"{dev} ({by_id[dev].resource}) is unhealthy")
        elif dev in taken:
            problems.append(f"{dev} ({by_id[dev].resource}) is assigned to another pod")
    return problems


def fill_after(
    instances: Sequence[GPU], taken: Collection[DeviceID], needs: Sequence[MigNeed]
) -> tuple[int, int]:
    """(instances taken once the pod is placed, healthy instances) of the profiles it asks
    for: what ranks nodes for a pod of MIG instances only."""
    profiles = {n.profile for n in needs}
    mine = [g for g in instances if g.profile in profiles and g.healthy]
    used = sum(1 for g in mine if g.id in taken) + sum(n.total for n in needs)
    return used, len(mine)


def key(instances: Sequence[GPU], taken: Collection[DeviceID]) -> str:
    """What ``verdict`` and ``fill_after`` read of a node, for its fit key: per profile the
    healthy and free instance counts."""
    counts: dict[str, list[int]] = {}
    for g in instances:
        c = counts.setdefault(g.profile, [0, 0])
        if g.healthy:
            c[0] += 1
            c[1] += g.id not in taken
    return "|mig:" + ",".join(f"{p}={h}/{f}" for p, (h, f) in sorted(counts.items()))
