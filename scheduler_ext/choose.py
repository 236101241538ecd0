"""Which nodes fit a pod, how to rank them, and which exact GPUs it gets (pure).

Exclusive whole GPUs: a device is free when it is healthy and neither assigned to a live pod on
the node nor named in the node lock holder's assignment.  Pods bound to the node that request
GPUs but carry no assignment (bound around the extender) occupy unknown devices; they are counted
against the node's free count (``unattributed``), never ignored.

MIG instances (``mig``: the inventory's instances, never among ``devices``) are chosen by
``scheduler_ext.mig`` from the same ``taken`` set; one pod's whole GPUs and MIG instances go in
one assignment.

Guarantees: every function here is deterministic for equal inputs (devices are taken in index
order, ties in ID order); ``choose`` never returns a device that is unhealthy or in ``taken``, and
never gives two app containers the same device.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NewType

from handoff.topology import Link, NumaPolicy, has_topology
from handoff.wire import GPU, Assignment, ContainerName, DeviceID
from lockd.model import NodeName
from scheduler_ext import mig as migs
from scheduler_ext import sharing
from scheduler_ext.need import PodNeed
from scheduler_ext.topology import Miss, Pick, ceiling, place, shape_key

MAX_SCORE = 10  # k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority


class Policy(StrEnum):
    """How to rank the nodes a pod fits on."""

    BINPACK = "binpack"  # fill nodes: fewest free GPUs left after placing the pod scores highest
    SPREAD = "spread"  # most free GPUs left scores highest


class Fit(StrEnum):
    """Filter verdict for one node."""

    FITS = "fits"
    NO_ROOM = "no-room"  # could fit once other pods leave (kube-scheduler: Unschedulable)
    NEVER = "never"  # cannot fit whatever leaves (UnschedulableAndUnresolvable)


FitKey = NewType("FitKey", str)  # see ``NodeGPUs.fit_key``


def fit_key(
    problem: str | None,
    healthy: int,
    allocatable: int | None,
    capacity: int,
    available: int,
    shape: str = "",
) -> FitKey:
    """What ``fit`` and ``score`` read of a node, as one interned string: equal inputs give the
    same string object, whose hash is computed once, so a dictionary keyed by it costs a pointer
    comparison per node where a tuple would be hashed again at every lookup.  ``shape`` is
    ``scheduler_ext.topology.shape_key``: models, links, NUMA nodes, which devices are free and
    the node's topology manager policy."""
    return FitKey(sys.intern(repr((problem, healthy, allocatable, capacity, available, shape))))


@dataclass(frozen=True, slots=True)
class NodeGPUs:
    """One node's GPUs as the extender sees them: inventory, what is taken, what kubelet reports.

    ``problem`` is set when the node cannot take GPU pods at all (no inventory published, or an
    inventory that does not parse); the message says which.  ``numa_policy`` is the topology
    manager policy of the node's kubelet (node label, docs/handoff.md).
    """

    node: NodeName
    devices: tuple[GPU, ...] = ()
    taken: frozenset[DeviceID] = frozenset()
    unattributed: int = 0
    allocatable: int | None = None
    problem: str | None = None
    numa_policy: NumaPolicy = NumaPolicy.NONE
    held: tuple[sharing.Holding, ...] = ()  # sharing nodes: what bound pods hold of each GPU
    mig: tuple[GPU, ...] = ()  # MIG instances of the node's GPUs in MIG mode (``devices``: whole)
    free: tuple[GPU, ...] = field(init=False, repr=False, compare=False)
    healthy: int = field(init=False, repr=False, compare=False)
    capacity: int = field(init=False, repr=False, compare=False)
    assigned: int = field(init=False, repr=False, compare=False)
    available: int = field(init=False, repr=False, compare=False)
    shaped: bool = field(init=False, repr=False, compare=False)
    shape: str = field(init=False, repr=False, compare=False)
    fit_key: FitKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Derive, once, what filter and prioritize read for every candidate node.

        ``free``: healthy untaken devices by index; ``capacity``: healthy devices capped by
        kubelet's allocatable (what a pod could ever get); ``assigned``: devices held by pods or
        the lock holder, attributed or not; ``available``: what a new pod can get now;
        ``fit_key``: everything ``fit`` and ``score`` read, so that nodes with equal keys get the
        same verdict (reason included) and the same score for any pod and policy.
        """
        free = sorted(
            (g for g in self.devices if g.healthy and g.id not in self.taken),
            key=lambda g: (g.index, g.id),
        )
        healthy = sum(1 for g in self.devices if g.healthy)
        capacity = healthy if self.allocatable is None else min(healthy, self.allocatable)
        assigned = sum(1 for g in self.devices if g.id in self.taken) + self.unattributed
        available = len(free) - self.unattributed
        if self.allocatable is not None:
            available = min(available, self.allocatable - assigned)
        shape = shape_key(self.devices, free, self.numa_policy)
        if sharing.sharing_node(self.devices):  # shared GPUs: commitments decide, not IDs
            shape += sharing.key(self.devices, self.taken, self.held)
        if self.mig:
            shape += migs.key(self.mig, self.taken)
        for name, value in (
            ("free", tuple(free)),
            ("healthy", healthy),
            ("capacity", capacity),
            ("assigned", assigned),
            ("available", max(available, 0)),
            ("shaped", has_topology(self.devices)),
            ("shape", shape),
            (
                "fit_key",
                fit_key(
                    self.problem, healthy, self.allocatable, capacity, max(available, 0), shape
                ),
            ),
        ):
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class Verdict:
    """Whether a pod fits a node and, if not, a reason a person can read."""

    fit: Fit
    reason: str = ""


FITS = Verdict(Fit.FITS)


class NoFit(Exception):
    """The pod does not fit the node (the reason is the message)."""


def fit(node: NodeGPUs, need: PodNeed) -> Verdict:
    """Filter one node for a pod."""
    if not need.wants_gpus:
        return FITS
    if node.problem is not None:
        return Verdict(Fit.NEVER, node.problem)
    if need.problem:  # a sharing request no node can honour (scheduler_ext.need)
        return Verdict(Fit.NEVER, need.problem)
    if need.mig:  # MIG instances (scheduler_ext.mig), then whole GPUs if the pod asks for any
        ok, ever, why = migs.verdict(node.mig, node.taken, need.mig)
        if not ok:
            return Verdict(Fit.NO_ROOM if ever else Fit.NEVER, why)
        if need.total == 0:
            return FITS
    if need.slices or sharing.sharing_node(node.devices):  # shared GPUs (scheduler_ext.sharing)
        ok, ever, why = sharing.verdict(node.devices, node.taken, node.held, need)
        return FITS if ok else Verdict(Fit.NO_ROOM if ever else Fit.NEVER, why)
    if node.capacity < need.total:
        if node.allocatable is not None and node.allocatable < node.healthy:
            reason = (
                f"node has {node.healthy} healthy GPUs but kubelet reports {node.allocatable} "
                f"allocatable, pod needs {need.total}"
            )
        else:
            reason = f"node has {node.healthy} healthy GPUs, pod needs {need.total}"
        return Verdict(Fit.NEVER, reason)
    if node.available < need.total:
        return Verdict(
            Fit.NO_ROOM,
            f"node has {node.available} free GPUs of {node.capacity}, pod needs {need.total}",
        )
    if _placed(node, need):
        outcome = _place(node, need)
        if isinstance(outcome, Miss):
            return Verdict(Fit.NO_ROOM if outcome.ever else Fit.NEVER, outcome.reason)
    return FITS


def _placed(node: NodeGPUs, need: PodNeed) -> bool:
    """Whether the pod's devices on ``node`` depend on more than counts (links, NUMA nodes,
    selections); else the lowest-index free devices are as good as any."""
    return node.shaped or need.wishes.selects


def _place(node: NodeGPUs, need: PodNeed) -> Pick | Miss:
    return place(node.devices, node.free, need, node.numa_policy, key=node.shape)


def score(node: NodeGPUs, need: PodNeed, policy: Policy) -> int:
    """Rank a node for a pod: 1..MAX_SCORE where it fits (higher is better under ``policy``),
    0 where it does not."""
    cap = node.capacity
    if need.mig and need.total == 0 and node.problem is None and not need.problem:
        return _mig_score(node, need, policy)
    if not need.wants_gpus or node.problem is not None or need.problem or cap == 0:
        return 0
    if cap < need.total or node.available < need.total:  # does not fit (same test as ``fit``)
        return 0
    if need.wishes.policy is not None:
        policy = Policy(need.wishes.policy)
    if need.slices:  # a slice of a shared GPU: by memory committed
        return _shared_score(node, need, policy)
    if sharing.sharing_node(node.devices):
        # a whole-GPU pod goes to a sharing node last: it takes one of the node's virtual devices
        # in kube-scheduler's count but a whole GPU in fact, so kube-scheduler cannot see a burst
        # of them racing for that node's last GPUs (binds refused, backoff), and each one it
        # places there is a GPU the pods that share can no longer use
        return 1
    free_after = node.available - need.total
    filled = cap - free_after if policy is Policy.BINPACK else free_after
    # 1..MAX_SCORE for a node that fits (0 is kept for "does not fit"); round half up in
    # integers, deterministic on every platform
    span = MAX_SCORE - 1
    if not _placed(node, need):
        return 1 + min(span, (2 * span * filled + cap) // (2 * cap))
    outcome = _place(node, need)
    if isinstance(outcome, Miss):
        return 0
    if not node.shaped:
        return 1 + min(span, (2 * span * filled + cap) // (2 * cap))
    # six tenths the policy, three the set's link class against the best the node could give
    # it, one the largest NUMA group it leaves free: the policy still ranks fuller against
    # emptier nodes, a node where the pod gets a worse set than the node can offer drops up to
    # three points, and a node that keeps a large block free wins a tie.  Relative, not
    # absolute, class: an absolute one draws small pods to NVSwitch nodes and leaves the 8-GPU
    # pods the PCIe ones (bench.allocation measured it)
    best = ceiling(node.devices, need, node.numa_policy)
    cls_num, cls_den = (
        (1, 1)
        if best is None or best <= Link.SYSTEM
        else (
            min(int(outcome.link), int(best)),
            int(best),
        )
    )
    blk_num, blk_den = outcome.block
    # value = (6 filled/cap + 3 cls + blk) / 10, as one fraction num/den in integers
    num = 6 * filled * cls_den * blk_den + 3 * cls_num * cap * blk_den + blk_num * cap * cls_den
    den = 10 * cap * cls_den * blk_den
    return 1 + min(span, (2 * span * num + den) // (2 * den))


def steer_by_wait(
    scores: Mapping[NodeName, int],
    waits: Mapping[NodeName, float],
    *,
    tolerance_s: float,
    fitting: int | None = None,
) -> dict[NodeName, int]:
    """Keep the policy's score only on the fitting nodes a bind would be served soonest.

    ``waits`` holds the expected wait of a bind per node (absent: none).  Among fitting nodes
    (score > 0, see ``score``), those expected to wait more than ``tolerance_s`` longer than the
    soonest get 0, so a burst spreads over the nodes where it is served first; the others keep
    their score, so the policy decides among equally soon nodes.  ``fitting`` is the number of
    fitting nodes when ``scores`` holds only some of them (at least every node with a wait);
    default: counted in ``scores``.
    """
    steered = dict(scores)
    busy = [(n, w) for n, w in waits.items() if scores.get(n, 0) > 0]  # waits is sparse
    if not busy:
        return steered
    if fitting is None:
        fitting = sum(1 for s in scores.values() if s > 0)
    soonest = 0.0 if fitting > len(busy) else min(w for _, w in busy)
    limit = soonest + tolerance_s
    for n, w in busy:
        if w > limit:
            steered[n] = 0
    return steered


def burst_fills_anyway(
    pending_gpus: int, largest_pending: int, need: PodNeed, free: Iterable[int]
) -> bool:
    """Whether a burst will fill the candidate nodes whatever prioritize does for this pod.

    True when the pods not yet bound ask for at least every free GPU of the candidate nodes
    (``free``: free GPUs per node) and none of them asks for more GPUs than this pod.  Packing
    this pod then keeps nothing free for later: every free GPU is taken by the burst, and no
    larger pod of the burst needs the node this pod would leave empty.  So the pod may go
    wherever it is served soonest (prioritize's tolerance 0).  Stops summing ``free`` once it
    exceeds the demand.
    """
    if largest_pending > need.total or pending_gpus <= 0:
        return False
    left = pending_gpus
    for gpus in free:
        left -= gpus
        if left < 0:
            return False
    return True


def placeable(free_levels: Mapping[int, int], pods: Mapping[int, int]) -> int:
    """How many of ``pods`` (GPUs per pod -> pods) fit on nodes with ``free_levels`` (free GPUs
    -> nodes): largest pod first, each on a node with the fewest free GPUs that hold it (best
    fit decreasing; counts only, links and NUMA aside)."""
    levels = {a: n for a, n in free_levels.items() if n > 0}
    placed = 0
    for size in sorted((s for s in pods if s > 0), reverse=True):
        want = pods[size]
        while want > 0:
            level = min((a for a, n in levels.items() if a >= size and n > 0), default=None)
            if level is None:
                break
            k = min(want, levels[level])
            levels[level] -= k
            levels[level - size] = levels.get(level - size, 0) + k
            placed += k
            want -= k
    return placed


def reserved_levels(
    free_levels: Mapping[int, int], larger: Mapping[int, int], need: PodNeed
) -> frozenset[int] | None:
    """The free-GPU counts a node may have for this pod to take it without costing a larger
    pending pod (``larger``: GPUs per pod -> pods) the room it needs; None when that restricts
    nothing (every fitting count is safe, or none is: then the policy decides as usual).

    A burst's small pod must not open the empty node its 8-GPU pod needs: kube-scheduler gives
    the larger pod no second chance until a node frees up (minutes in a burst that fills the
    cluster), so the small pod is steered to a node where the larger pods still all fit."""
    if not larger:
        return None
    fitting = [a for a, n in free_levels.items() if n > 0 and a >= need.total]
    base = placeable(free_levels, larger)
    safe = set()
    for level in fitting:
        after = dict(free_levels)
        after[level] -= 1
        after[level - need.total] = after.get(level - need.total, 0) + 1
        if placeable(after, larger) >= base:
            safe.add(level)
    if not safe or len(safe) == len(fitting):
        return None
    return frozenset(safe)


def choose(node: NodeGPUs, need: PodNeed) -> Assignment:
    """The devices each container gets on ``node``: container name -> device IDs, kubelet order.

    Takes the lowest-index free healthy devices on a node without link or NUMA facts and for a
    pod that selects no devices; otherwise ``scheduler_ext.topology.place``'s set.  Raises
    ``NoFit`` with the filter's reason.
    """
    verdict = fit(node, need)
    if verdict.fit is not Fit.FITS:
        raise NoFit(f"node {node.node}: {verdict.reason}")
    out = _choose_whole(node, need) if need.total else {}
    if need.mig:
        got = migs.choice(node.mig, node.taken, need.mig)
        if isinstance(got, str):  # fit said it fits; belt and braces
            raise NoFit(f"node {node.node}: {got}")
        for container, ids in got.items():
            out.setdefault(container, []).extend(ids)
    return out


def _choose_whole(node: NodeGPUs, need: PodNeed) -> Assignment:
    """``choose``'s whole GPUs (and GPU slices) of a pod that fits."""
    if need.slices or sharing.sharing_node(node.devices):  # shared GPUs (scheduler_ext.sharing)
        got = sharing.choice(node.devices, node.taken, node.held, need)
        if isinstance(got, str):
            raise NoFit(f"node {node.node}: {got}")
        return {ContainerName(c): ids for c, ids in got.items()}
    if _placed(node, need):
        outcome = _place(node, need)
        assert isinstance(outcome, Pick)  # fit said so
        devices = [g.id for g in outcome.slots]
    else:
        devices = [g.id for g in node.free[: need.total]]
    return {name: [devices[s] for s in slots] for name, slots in need.plan}


def conflicts(
    assignment: Mapping[ContainerName, Sequence[DeviceID]],
    node: NodeGPUs,
    need: PodNeed | None = None,
) -> list[str]:
    """Why ``assignment`` cannot stand on ``node`` now (empty when it can); on a node that
    shares GPUs, by the room each GPU has for ``need``'s claims (whole GPUs without it)."""
    instances = {g.id for g in node.mig}
    problems = migs.conflicts(assignment, node.mig, node.taken)
    whole = {c: [d for d in ids if d not in instances] for c, ids in assignment.items()}
    if sharing.sharing_node(node.devices):
        whole = {c: ids for c, ids in whole.items() if ids}
        return problems + sharing.conflicts(whole, node.devices, node.taken, node.held, need)
    health = {g.id: g.healthy for g in node.devices}
    for dev in sorted({d for ids in whole.values() for d in ids}):
        if dev not in health:
            problems.append(f"{dev} is not in the node's inventory")
        elif not health[dev]:
            problems.append(f"{dev} is unhealthy")
        elif dev in node.taken:
            problems.append(f"{dev} is assigned to another pod")
    return problems


def devices_of(assignment: Mapping[ContainerName, Sequence[DeviceID]]) -> frozenset[DeviceID]:
    """Every device an assignment names."""
    return frozenset(d for ids in assignment.values() for d in ids)


def _shared_score(node: NodeGPUs, need: PodNeed, policy: Policy) -> int:
    """Score on a sharing node: the share of its GPU memory committed once the pod is placed
    (binpack: fuller scores higher; spread: emptier), 1..MAX_SCORE; 0 where it does not fit."""
    after = sharing.fill_after(
        node.devices, node.taken, node.held, need, binpack=policy is Policy.BINPACK
    )
    if after is None or after[1] == 0:
        return 0
    committed, total = after
    filled = committed if policy is Policy.BINPACK else total - committed
    span = MAX_SCORE - 1
    return 1 + min(span, (2 * span * filled + total) // (2 * total))


def _mig_score(node: NodeGPUs, need: PodNeed, policy: Policy) -> int:
    """Score a pod of MIG instances only: the share of the node's instances of its profiles
    taken once it is placed (binpack: fuller scores higher; spread: emptier), 1..MAX_SCORE;
    0 where it does not fit."""
    ok, _, _ = migs.verdict(node.mig, node.taken, need.mig)
    used, total = migs.fill_after(node.mig, node.taken, need.mig)
    if not ok or total == 0:
        return 0
    if need.wishes.policy is not None:
        policy = Policy(need.wishes.policy)
    filled = used if policy is Policy.BINPACK else total - used
    span = MAX_SCORE - 1
    return 1 + min(span, (2 * span * filled + total) // (2 * total))
