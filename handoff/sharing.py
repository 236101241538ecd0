"""Shared GPUs: memory and compute slices of one physical GPU, several pods per GPU (pure).

The resource model is HAMi's, so workloads move over unchanged:

| resource (per container) | meaning |
| --- | --- |
| ``nvidia.com/gpu: N`` | N *distinct* physical GPUs |
| ``nvidia.com/gpumem: M`` | M MiB of memory on each of them |
| ``nvidia.com/gpumem-percentage: P`` | P % of each GPU's memory (instead of ``gpumem``) |
| ``nvidia.com/gpucores: C`` | C % of each GPU's compute (0 or absent: no claim) |

A container that asks for ``nvidia.com/gpu`` and none of the other three gets its GPUs whole and
exclusively (``WHOLE``).  A container that asks for cores but no memory gets all of each GPU's
memory, as in HAMi.  A node shares when its device plugin runs with a split count S > 1
(``--gpu-split S``): kubelet then sees S virtual devices per GPU, ``<uuid>::<k>``, so at most S
containers hold slices of one GPU.

Per GPU the scheduler commits memory and cores against the GPU's capacity (its memory from the
inventory, 100 % cores) and counts the slices in use; ``place`` picks a pod's GPUs so that no
GPU's committed memory or cores exceed capacity, no GPU holds more than S slices, and a GPU
held whole holds nothing else.

Guarantees: every function is deterministic for equal inputs; ``container_slice`` and
``slot_slices`` raise ``BadShare`` naming the container and the value for every request they do
not accept (never a silent default); ``place`` never returns a GPU that is unhealthy, named twice,
or that would be over-committed.
Non-guarantee: ``place`` is greedy per slot (largest demand first); for a pod whose containers
ask for different slices it may miss a placement that a full search would find.  It never
returns one that breaks capacity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from handoff.request import whole_quantity
from handoff.wire import GPU, MAX_SPLIT, DeviceID, Keys, MalformedAnnotation, parse_assignment

GPU_RESOURCE = "nvidia.com/gpu"
GPUMEM = "nvidia.com/gpumem"
GPUMEM_PERCENTAGE = "nvidia.com/gpumem-percentage"
GPUCORES = "nvidia.com/gpucores"
SHARING_RESOURCES = (GPUMEM, GPUMEM_PERCENTAGE, GPUCORES)
FULL_CORES = 100
VIRTUAL_SEP = "::"
MAX_AMOUNT = 10**12


class BadShare(ValueError):
    """A container's sharing request cannot be accepted; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Slice:
    """What one container asks of each of its GPUs.

    ``exclusive``: the whole GPU, nothing else on it.  Otherwise ``memory_mib`` (absolute) or
    ``memory_percent`` (of the GPU's memory), or neither (all of its memory), and ``cores``.
    """

    memory_mib: int | None = None
    memory_percent: int | None = None
    cores: int = 0
    exclusive: bool = False

    def memory_on(self, gpu: GPU) -> int:
        """MiB this slice commits on ``gpu``."""
        if self.exclusive or (self.memory_mib is None and self.memory_percent is None):
            return gpu.memory_mib
        if self.memory_mib is not None:
            return self.memory_mib
        assert self.memory_percent is not None
        return gpu.memory_mib * self.memory_percent // 100

    @property
    def cores_claimed(self) -> int:
        return FULL_CORES if self.exclusive else self.cores

    def describe(self) -> str:
        if self.exclusive:
            return "a whole GPU"
        if self.memory_mib is not None:
            mem = f"{self.memory_mib} MiB"
        elif self.memory_percent is not None:
            mem = f"{self.memory_percent}% of memory"
        else:
            mem = "all memory"
        return f"{mem} and {self.cores}% cores"


WHOLE = Slice(exclusive=True)


def _amount(raw: object, *, what: str) -> int:
    """A sharing request's value: a Kubernetes quantity that is a whole number."""
    return whole_quantity(raw, what=what, maximum=MAX_AMOUNT, error=BadShare)


def _request(container: Mapping[str, Any], resource: str) -> object | None:
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        return None
    for field in ("limits", "requests"):  # kubelet reads limits; the API server defaults both
        values = resources.get(field) or {}
        if isinstance(values, Mapping) and resource in values:
            return cast(object, values[resource])
    return None


def container_slice(container: Mapping[str, Any], *, resource: str = GPU_RESOURCE) -> Slice | None:
    """The container's slice, ``WHOLE`` when it asks for GPUs without sharing resources, None
    when it asks for no GPU at all.  Raises ``BadShare`` for a request it cannot honour."""
    name = container.get("name", "?")
    where = f"container {name!r}"
    raw_count = _request(container, resource)
    count = 0 if raw_count is None else _amount(raw_count, what=f"{where} {resource}")
    asked = {r: _request(container, r) for r in SHARING_RESOURCES}
    asked = {r: v for r, v in asked.items() if v is not None}
    if not asked:
        return WHOLE if count > 0 else None
    if count == 0:
        raise BadShare(
            f"{where} requests {', '.join(asked)} but no {resource}: a slice needs "
            f"{resource}: 1 (the number of GPUs to take slices of)"
        )
    memory = percent = None
    if GPUMEM in asked:
        memory = _amount(asked[GPUMEM], what=f"{where} {GPUMEM}")
        if memory == 0:
            raise BadShare(f"{where} {GPUMEM}: must be at least 1 MiB")
    if GPUMEM_PERCENTAGE in asked:
        if memory is not None:
            raise BadShare(f"{where} requests both {GPUMEM} and {GPUMEM_PERCENTAGE}; ask for one")
        percent = _amount(asked[GPUMEM_PERCENTAGE], what=f"{where} {GPUMEM_PERCENTAGE}")
        if not 1 <= percent <= 100:
            raise BadShare(f"{where} {GPUMEM_PERCENTAGE}: {percent} is not between 1 and 100")
    cores = 0
    if GPUCORES in asked:
        cores = _amount(asked[GPUCORES], what=f"{where} {GPUCORES}")
        if cores > FULL_CORES:
            raise BadShare(f"{where} {GPUCORES}: {cores} is over {FULL_CORES} (percent of a GPU)")
    return Slice(memory_mib=memory, memory_percent=percent, cores=cores)


def pod_slices(pod: Mapping[str, Any], *, resource: str = GPU_RESOURCE) -> dict[str, Slice]:
    """Container name -> slice, for every container (init containers too) that asks for GPUs."""
    spec = pod.get("spec") or {}
    out: dict[str, Slice] = {}
    if not isinstance(spec, Mapping):
        return out
    for group in ("initContainers", "containers"):
        for c in spec.get(group) or []:
            if isinstance(c, Mapping):
                s = container_slice(c, resource=resource)
                if s is not None:
                    out[str(c.get("name", ""))] = s
    return out


def shares(slices: Iterable[Slice]) -> bool:
    """Whether any of ``slices`` is a slice rather than a whole GPU."""
    return any(not s.exclusive for s in slices)


def larger(a: Slice, b: Slice) -> Slice:
    """What one device must hold for two containers of one pod that get it one after another
    (an init container's device reused by an app container): the larger claim of each kind."""
    if a.exclusive or b.exclusive:
        return WHOLE
    whole_memory = (a.memory_mib, a.memory_percent) == (None, None) or (
        b.memory_mib,
        b.memory_percent,
    ) == (None, None)
    mem: int | None
    pct: int | None
    if whole_memory:
        mem, pct = None, None
    elif a.memory_percent is None and b.memory_percent is None:
        mem, pct = max(a.memory_mib or 0, b.memory_mib or 0), None
    elif a.memory_mib is None and b.memory_mib is None:
        mem, pct = None, max(a.memory_percent or 0, b.memory_percent or 0)
    else:  # one absolute, one relative: not comparable without the GPU; take all its memory
        mem, pct = None, None
    return Slice(memory_mib=mem, memory_percent=pct, cores=max(a.cores, b.cores))


def slot_slices(
    slices: Mapping[str, Slice], plan: Sequence[tuple[str, Sequence[int]]]
) -> tuple[Slice, ...]:
    """Each device slot's claim (``plan``: container -> slots, as ``scheduler_ext.need`` plans
    them): the larger of the claims of the containers that use the slot."""
    total = 1 + max((s for _, slots in plan for s in slots), default=-1)
    out: list[Slice | None] = [None] * total
    for container, slots in plan:
        claim = slices.get(container, WHOLE)
        for s in slots:
            prev = out[s]
            out[s] = claim if prev is None else larger(prev, claim)
    return tuple(WHOLE if s is None else s for s in out)


# ---- the node side ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Use:
    """What one GPU holds: committed memory and cores, slices in use, whether held whole."""

    memory_mib: int = 0
    cores: int = 0
    slices: int = 0
    exclusive: bool = False

    def plus(self, claim: Slice, gpu: GPU) -> Use:
        return Use(
            memory_mib=self.memory_mib + claim.memory_on(gpu),
            cores=self.cores + claim.cores_claimed,
            slices=self.slices + 1,
            exclusive=self.exclusive or claim.exclusive,
        )

    @property
    def empty(self) -> bool:
        return self.slices == 0 and not self.exclusive


FREE = Use()


def split_of(devices: Iterable[GPU]) -> int:
    """The node's split count S (1: the node does not share)."""
    return max((g.split for g in devices), default=1)


def commitments(
    devices: Sequence[GPU],
    holdings: Iterable[tuple[DeviceID, Slice]],
    *,
    unknown: Iterable[DeviceID] = (),
) -> dict[DeviceID, Use]:
    """Per GPU of ``devices``, what ``holdings`` (device, claim) commit; GPUs in ``unknown``
    (held by a claim whose size is not known, e.g. a lock holder's) count as held whole."""
    by_id = {g.id: g for g in devices}
    out: dict[DeviceID, Use] = {}
    for dev, claim in holdings:
        gpu = by_id.get(dev)
        if gpu is not None:
            out[dev] = out.get(dev, FREE).plus(claim, gpu)
    for dev in unknown:
        if dev in by_id:
            u = out.get(dev, FREE)
            out[dev] = Use(u.memory_mib, u.cores, u.slices + 1, exclusive=True)
    return out


@dataclass(frozen=True, slots=True)
class Held:
    """One bound pod's claim on one physical GPU (``bound_slices``)."""

    pod: str  # namespace/name
    gpu: DeviceID
    claim: Slice


FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def bound_slices(
    pods: Iterable[Mapping[str, Any]], *, keys: Keys | None = None, resource: str = GPU_RESOURCE
) -> list[Held]:
    """What the pods bound to a node hold, from their assignment annotations and specs: per
    pod and physical GPU of its assignment, the larger claim of the containers given it.

    A container of the assignment that asks for no slice (or whose request is not accepted)
    holds its GPUs whole, the safe side; finished pods (Succeeded/Failed) and pods without a
    well-formed assignment hold nothing.  Sorted by pod, then GPU."""
    key_name = (keys or Keys()).assignment
    out: list[Held] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if status.get("phase") in FINISHED_PHASES:
            continue
        try:
            assignment = parse_assignment(
                (meta.get("annotations") or {}).get(key_name), key=key_name
            )
        except MalformedAnnotation:
            continue
        try:
            slices = pod_slices(pod, resource=resource)
        except BadShare:
            slices = {}
        claims: dict[DeviceID, Slice] = {}
        for container, ids in assignment.items():
            claim = slices.get(container, WHOLE)
            for dev in ids:
                gpu = physical_of(dev)
                prev = claims.get(gpu)
                claims[gpu] = claim if prev is None or prev == claim else larger(prev, claim)
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        out += [Held(key, gpu, claim) for gpu, claim in claims.items()]
    return sorted(out, key=lambda h: (h.pod, h.gpu))


def node_use(devices: Sequence[GPU], held: Iterable[Held]) -> dict[DeviceID, Use]:
    """Per GPU of ``devices`` (every one, FREE when nothing holds it) what ``held`` commits;
    a claim on a GPU not in ``devices`` is left out."""
    use = commitments(devices, [(h.gpu, h.claim) for h in held])
    return {g.id: use.get(g.id, FREE) for g in devices}


def room_for(gpu: GPU, use: Use, claim: Slice, split: int) -> str | None:
    """Why ``claim`` does not fit on ``gpu`` holding ``use`` (None when it fits)."""
    if not gpu.healthy:
        return "unhealthy"
    if use.exclusive:
        return "held whole by another pod"
    if claim.exclusive:
        return None if use.empty else f"shared by {use.slices} pods"
    if use.slices >= split:
        return f"all {split} slices in use"
    need_mem = claim.memory_on(gpu)
    if use.memory_mib + need_mem > gpu.memory_mib:
        return f"{gpu.memory_mib - use.memory_mib} of {gpu.memory_mib} MiB free"
    if use.cores + claim.cores > FULL_CORES:
        return f"{FULL_CORES - use.cores}% cores free"
    return None


@dataclass(frozen=True, slots=True)
class Miss:
    """No placement: ``ever`` is False when none exists whatever leaves the node."""

    reason: str
    ever: bool


def never_fits(devices: Sequence[GPU], slots: Sequence[Slice], split: int) -> str | None:
    """Why the pod cannot fit this node even when it is empty (None: it could)."""
    healthy = [g for g in devices if g.healthy]
    if len(healthy) < len(slots):
        return f"node has {len(healthy)} healthy GPUs, pod needs {len(slots)} distinct GPUs"
    if shares(slots) and split <= 1:
        return (
            "node does not share GPUs (its device plugin runs without --gpu-split) but the pod "
            f"requests {'/'.join(SHARING_RESOURCES)}"
        )
    for claim in slots:
        if claim.exclusive:
            continue
        if not any(room_for(g, FREE, claim, split) is None for g in healthy):
            largest = max((g.memory_mib for g in healthy), default=0)
            return (
                f"pod asks for {claim.describe()} per GPU; the largest GPU here has {largest} MiB"
            )
    return None


def place(
    devices: Sequence[GPU],
    use: Mapping[DeviceID, Use],
    slots: Sequence[Slice],
    *,
    split: int,
    binpack: bool,
    allows: Callable[[GPU], bool] = lambda g: True,
) -> tuple[GPU, ...] | Miss:
    """One distinct GPU per slot (slot order), each with room for its claim.

    ``binpack``: the fullest GPU that fits (fewest MiB left after), else the emptiest; ties by
    index.  ``allows`` filters GPUs (the pod's model/UUID selection).
    """
    reason = never_fits(devices, slots, split)
    if reason is not None:
        return Miss(reason, ever=False)
    candidates = sorted((g for g in devices if allows(g)), key=lambda g: (g.index, g.id))
    if len(candidates) < len(slots):
        return Miss(
            f"only {len(candidates)} GPUs match the pod's selection, it needs {len(slots)}",
            ever=False,
        )
    chosen: dict[int, GPU] = {}
    taken: set[DeviceID] = set()
    order = sorted(range(len(slots)), key=lambda i: _demand(slots[i]), reverse=True)
    for i in order:
        claim = slots[i]
        fits = [
            g
            for g in candidates
            if g.id not in taken and room_for(g, use.get(g.id, FREE), claim, split) is None
        ]
        if not fits:
            return Miss(_no_room(candidates, use, claim, split, len(slots)), ever=True)

        def left(g: GPU, claim: Slice = claim) -> int:
            return g.memory_mib - use.get(g.id, FREE).memory_mib - claim.memory_on(g)

        best = min(fits, key=lambda g: (left(g) if binpack else -left(g), g.index, g.id))
        chosen[i] = best
        taken.add(best.id)
    return tuple(chosen[i] for i in range(len(slots)))


def _demand(claim: Slice) -> tuple[int, int, int]:
    if claim.exclusive:
        return (2, 0, 0)
    return (1, claim.memory_mib or 0, claim.cores)


def _no_room(
    gpus: Sequence[GPU], use: Mapping[DeviceID, Use], claim: Slice, split: int, count: int
) -> str:
    shown = "; ".join(
        f"GPU {g.index}: {room_for(g, use.get(g.id, FREE), claim, split) or 'fits'}"
        for g in gpus[:8]
    )
    more = f"; … {len(gpus) - 8} more" if len(gpus) > 8 else ""
    return f"pod needs {count} GPU(s) with room for {claim.describe()} each ({shown}{more})"


def fill(devices: Sequence[GPU], use: Mapping[DeviceID, Use]) -> tuple[int, int]:
    """Committed and total memory (MiB) over healthy GPUs, held-whole GPUs counted full."""
    total = committed = 0
    for g in devices:
        if not g.healthy:
            continue
        u = use.get(g.id, FREE)
        total += g.memory_mib
        committed += g.memory_mib if u.exclusive else min(u.memory_mib, g.memory_mib)
    return committed, total


# ---- virtual devices and the container's limits -----------------------------------------------


def virtual_id(gpu: DeviceID, k: int) -> DeviceID:
    """The ``k``-th virtual device of ``gpu`` that kubelet sees on a sharing node."""
    return DeviceID(f"{gpu}{VIRTUAL_SEP}{k}")


def physical_of(dev: str) -> DeviceID:
    """The physical GPU of a virtual device ID (a physical ID is its own)."""
    return DeviceID(dev.split(VIRTUAL_SEP, 1)[0])


MPS_MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
HAMI_MEMORY_ENV = "CUDA_DEVICE_MEMORY_LIMIT"  # _<i> per visible device
HAMI_CORES_ENV = "CUDA_DEVICE_SM_LIMIT"


def limit_envs(claim: Slice, gpus: Sequence[GPU]) -> dict[str, str]:
    """The environment that tells an enforcer (CUDA MPS, or HAMi-core) the container's limits;
    ``gpus`` in the order the container sees them (device ordinal 0, 1, …).  Empty for a whole
    GPU."""
    if claim.exclusive or not gpus:
        return {}
    mems = [claim.memory_on(g) for g in gpus]
    envs = {MPS_MEMORY_ENV: ",".join(f"{i}={m}M" for i, m in enumerate(mems))}
    for i, m in enumerate(mems):
        envs[f"{HAMI_MEMORY_ENV}_{i}"] = f"{m}m"
    if claim.cores > 0:
        envs[MPS_THREADS_ENV] = str(claim.cores)
        envs[HAMI_CORES_ENV] = str(claim.cores)
    return envs


def check_split(split: int) -> int:
    """A valid split count, or ``ValueError``."""
    if not 1 <= split <= MAX_SPLIT:
        raise ValueError(f"--gpu-split must be between 1 and {MAX_SPLIT}, got {split}")
    return split
