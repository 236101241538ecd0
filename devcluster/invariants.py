"""Check the invariants of docs/design.md ("Invariants") from what kubelet recorded (plain data
in, out).

The records are plain data (``ContainerRecord``: per container, the device IDs kubelet allocated
per resource, and the ``NVIDIA_VISIBLE_DEVICES`` our plugin answered with when the reader knows
it), so any reader can feed the checker: ``sim_records`` reads the simulated kubelets'
``sim.nodelock.io/allocated`` annotations; a reader of a real kubelet's PodResources gives the
same shape (without the environment).  Over the pods:

- **S1** no GPU is held by two live pods on the same node, nor by two containers of one pod that
  run at the same time (app containers and sidecars); a pod's init containers may reuse devices
  that its own app containers get, as kubelet does;
- **S2** every container that asks for devices appears in kubelet's record with exactly as many
  as it asks for, and exactly its assignment, except where kubelet's reuse rule decides (below);
  the plugin served exactly kubelet's devices (``NVIDIA_VISIBLE_DEVICES`` equals kubelet's device
  IDs).  A GPU pod that ran (Running or Succeeded) with no readable record, a pod whose spec
  cannot be read, and a pod that carries an assignment but asks for none of the checked resources
  (a wrong ``resource``) are S2 violations;
- **L1** every GPU pod was bound and admitted (Running or Succeeded), except those the caller
  names in ``may_be_unadmitted``.

**kubelet's reuse rule** (``pkg/kubelet/cm/devicemanager/manager.go``, v1.31.9 and v1.37.2,
``ManagerImpl.Allocate`` and ``devicesToAllocate``): kubelet walks a pod's init containers in
order, then its app containers, keeping a reuse pool per resource.  Each container takes devices
from the pool first (as many as it needs, or the whole pool; which ones is Go map order), the rest
from free devices, where the plugin's preferred allocation (the container's assignment) decides.
A non-restartable init container's devices are then added to the pool; a sidecar's and an app
container's removed from it.  So a container with an empty pool gets exactly its assignment; one
with a pool gets ``min(count, |pool|)`` of the pool and, outside the devices the init containers
put in the pool, exactly its assignment's devices.

The caller states how many GPU pods it expects (``expected_pods``): fewer checked is a
``coverage`` finding, and ``ok`` is never true when no pod was checked.

On a node that shares GPUs (``handoff.sharing``) kubelet allocates virtual devices
``<uuid>::<k>``; they are folded to their physical GPU, and S1 becomes: a GPU held whole is held by
no other pod, and the slices on one GPU never commit more memory or cores than it has (memory is
checked where the caller passes the nodes' inventories).

MIG instances (``nvidia.com/mig-<profile>``, recorded under ``otherResources``) are devices like
whole GPUs for S1 and S2, each profile a resource of its own with its own reuse pool: a
container's devices are its whole GPUs and its instances.  A container that asks for both gets
``NVIDIA_VISIBLE_DEVICES`` from each plugin answer and kubelet keeps one of them: it must then
equal one resource's devices.

S3 (no lock left held) is checked from the Leases: ``check_locks_free``, given the nodes whose
locks the caller expects to exist.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from handoff.request import BadPod, ContainerKind, container_needs
from handoff.sharing import FULL_CORES, BadShare, Slice, container_slice, larger, physical_of
from handoff.wire import DEFAULT_PREFIX, DEFAULT_RESOURCE, GPU, MIG_RESOURCE_PREFIX

ALLOCATED = "sim.nodelock.io/allocated"
LIVE_PHASES = ("Pending", "Running", "Unknown")
RAN = ("Running", "Succeeded")


@dataclass
class Findings:
    """Violations per invariant; an empty list means the invariant held.  ``coverage`` says what
    could not be checked (fewer GPU pods than expected, none at all, nodes without a Lease)."""

    checked_pods: int = 0
    s1: list[str] = field(default_factory=list)
    s2: list[str] = field(default_factory=list)
    s3: list[str] = field(default_factory=list)
    l1: list[str] = field(default_factory=list)
    coverage: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No violation, and something was checked."""
        return self.checked_pods > 0 and not (
            self.s1 or self.s2 or self.s3 or self.l1 or self.coverage
        )


@dataclass(frozen=True)
class ContainerRecord:
    """What kubelet gave one container: the device IDs it allocated per resource (as kubelet
    names them: virtual IDs on a sharing node), and the ``NVIDIA_VISIBLE_DEVICES`` the plugin's
    answer set (``None``: the reader does not know it, e.g. kubelet's PodResources)."""

    devices: Mapping[str, Sequence[str]]
    visible: str | None = None


PodRecord = Mapping[str, ContainerRecord]  # container name -> what kubelet gave it


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _resources_of(pod: Mapping[str, Any], resource: str) -> list[str]:
    """``resource`` and every MIG resource any container of the pod names."""
    spec = pod.get("spec") or {}
    mig: set[str] = set()
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        res = (c.get("resources") if isinstance(c, Mapping) else None) or {}
        for part in ("limits", "requests"):
            mig |= {r for r in res.get(part) or {} if r.startswith(MIG_RESOURCE_PREFIX)}
    return [resource, *sorted(mig)]


def allocated(pod: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The simulated kubelet's record of a pod, or {} when it was not admitted with devices."""
    raw = pod.get("metadata", {}).get("annotations", {}).get(ALLOCATED)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def sim_record(pod: Mapping[str, Any], *, resource: str = DEFAULT_RESOURCE) -> PodRecord | None:
    """The simulated kubelet's record of a pod (``sim.nodelock.io/allocated``; ``deviceIDs`` are
    its ``--resource-name``, ``resource``), or None when it has none or it cannot be read."""
    value = allocated(pod)
    if not value:
        return None
    out: dict[str, ContainerRecord] = {}
    for container, seen in value.items():
        if not isinstance(seen, Mapping):
            return None
        devices: dict[str, Sequence[str]] = {}
        ids = seen.get("deviceIDs") or []
        others = seen.get("otherResources") or {}
        if not isinstance(ids, list) or not isinstance(others, Mapping):
            return None
        if ids:
            devices[resource] = [str(d) for d in ids]
        for r, other in others.items():
            if not isinstance(other, list):
                return None
            if other:
                devices[str(r)] = [str(d) for d in other]
        envs = seen.get("envs") or {}
        visible = envs.get("NVIDIA_VISIBLE_DEVICES", "") if isinstance(envs, Mapping) else ""
        out[str(container)] = ContainerRecord(devices, str(visible))
    return out


def sim_records(
    pods: Iterable[Mapping[str, Any]], *, resource: str = DEFAULT_RESOURCE
) -> dict[str, PodRecord]:
    """Pod key -> the simulated kubelet's record, for every pod that has a readable one."""
    out: dict[str, PodRecord] = {}
    for pod in pods:
        record = sim_record(pod, resource=resource)
        if record is not None:
            out[_key(pod)] = record
    return out


def check_pods(
    pods: Sequence[Mapping[str, Any]],
    *,
    expected_pods: int,
    records: Mapping[str, PodRecord] | None = None,
    resource: str = DEFAULT_RESOURCE,
    prefix: str = DEFAULT_PREFIX,
    require_admitted: bool = True,
    may_be_unadmitted: Collection[str] = (),
    inventories: Mapping[str, Sequence[GPU]] | None = None,
) -> Findings:
    """Check S1, S2 and (when ``require_admitted``) L1 over a snapshot of pods, from
    ``records`` (pod key -> container -> what kubelet gave it; by default the simulated
    kubelets' annotations, ``sim_records``).  ``expected_pods`` is how many GPU pods the caller
    made and expects in ``pods``; fewer is a ``coverage`` finding.  ``may_be_unadmitted`` names
    pod keys L1 leaves alone (pods the caller made to fail).  ``inventories`` (node -> GPUs) lets
    S1 check the memory committed on shared GPUs."""
    if records is None:
        records = sim_records(pods, resource=resource)
    found = Findings()
    holders: dict[tuple[str, str], str] = {}
    claims: dict[tuple[str, str], dict[str, Slice]] = {}  # (node, GPU) -> pod -> its claim
    for pod in pods:
        key = _key(pod)
        annotations = pod.get("metadata", {}).get("annotations") or {}
        try:
            needs = {r: container_needs(pod, r) for r in _resources_of(pod, resource)}
        except BadPod as exc:
            found.s2.append(f"{key}: its spec cannot be read ({exc})")
            continue
        if not any(n.count for per in needs.values() for n in per):
            if f"{prefix}assignment" in annotations:
                found.s2.append(f"{key} carries an assignment but asks for none of {sorted(needs)}")
            continue
        found.checked_pods += 1
        phase = pod.get("status", {}).get("phase", "Pending")
        node = str(pod.get("spec", {}).get("nodeName") or "")
        if require_admitted and phase not in RAN and key not in may_be_unadmitted:
            found.l1.append(f"{key} is {phase} on {node or 'no node'}")
        record = records.get(key)
        if record is None:
            if phase in RAN:
                found.s2.append(f"{key} is {phase} but kubelet's record of its devices is missing")
            continue
        if phase not in LIVE_PHASES and phase != "Succeeded":
            continue
        try:
            assignment = json.loads(annotations.get(f"{prefix}assignment", "null"))
        except ValueError:
            assignment = None
        if not isinstance(assignment, dict):
            found.s2.append(f"{key} was admitted with devices but has no valid assignment")
            assignment = {}
        devices_of_pod = _check_containers(
            key, node, needs, resource, record, assignment, found, admitting=phase == "Pending"
        )
        slices = _slices(pod)
        for container, rec in record.items():
            claim = slices.get(container)
            if claim is None:
                continue
            for dev in {str(physical_of(d)) for ids in rec.devices.values() for d in ids}:
                mine = claims.setdefault((node, dev), {})
                mine[key] = claim if key not in mine else larger(mine[key], claim)
        if phase == "Succeeded":
            for dev in devices_of_pod:
                claims.get((node, dev), {}).pop(key, None)
            continue  # its devices are free again
        for dev in devices_of_pod:
            other = holders.setdefault((node, dev), key)
            if other != key and not _sliced(claims.get((node, dev), {}), other, key):
                found.s1.append(f"{dev} on {node} is held by both {other} and {key}")
    _check_shared(claims, inventories or {}, found)
    if found.checked_pods < expected_pods:
        found.coverage.append(
            f"{found.checked_pods} GPU pods checked, {expected_pods} expected "
            f"(resources {resource} and MIG instances)"
        )
    if found.checked_pods == 0:
        found.coverage.append("no GPU pod was checked")
    return found


def _check_containers(
    key: str,
    node: str,
    needs: Mapping[str, Sequence[Any]],
    resource: str,
    record: PodRecord,
    assignment: Mapping[str, Any],
    found: Findings,
    *,
    admitting: bool = False,
) -> set[str]:
    """S2 per container, walking the containers in kubelet's order with its reuse pool per
    resource (module docstring), and S1 between a pod's own containers; the pod's devices.
    ``admitting`` (the pod is Pending): a container the record has no entry for is not known yet
    (a real kubelet writes its checkpoint after each container's Allocate,
    ``allocateContainerResources`` in ``pkg/kubelet/cm/devicemanager/manager.go``, v1.31.9 line
    919, v1.37.2 line 959)."""
    order = [(n.name, n.kind) for n in needs[resource]]
    count = {(r, n.name): n.count for r, per in needs.items() for n in per}
    pool: dict[str, set[str]] = defaultdict(set)
    pooled: set[str] = set()  # every device an init container put in the pool
    kept: dict[str, str] = {}  # device -> container of this pod that keeps it
    devices_of_pod: set[str] = set()
    names = {name for name, _ in order}
    for container in sorted(set(record) - names):
        found.s2.append(f"{key}: kubelet's record names {container}, which the pod does not have")
    for container in sorted(set(assignment) - names):
        found.s2.append(f"{key}: the assignment names {container}, which the pod does not have")
    for container, kind in order:
        asks = {r: count[(r, container)] for r in needs if count[(r, container)]}
        rec = record.get(container)
        raw_want = assignment.get(container, [])
        want = {str(d) for d in raw_want} if isinstance(raw_want, list) else set()
        if not asks:
            if rec is not None and any(rec.devices.values()):
                found.s2.append(f"{key}/{container} asks for no device but kubelet gave it some")
            if want:
                found.s2.append(f"{key}/{container} asks for no device but is assigned {want}")
            continue
        if rec is None:
            if not admitting:
                found.s2.append(
                    f"{key}/{container} asks for {asks} but kubelet's record has no entry for it"
                )
            continue
        got_by = {r: [str(physical_of(d)) for d in ids] for r, ids in rec.devices.items()}
        for r in sorted(set(asks) | set(got_by)):
            n, got_r = asks.get(r, 0), got_by.get(r, [])
            if len(got_r) != n or len(set(got_r)) != len(got_r):
                found.s2.append(
                    f"{key}/{container}: kubelet allocated {sorted(got_r)} of {r}, {n} asked"
                )
            reused = len(set(got_r) & pool[r])
            if reused != min(n, len(pool[r])):
                found.s2.append(
                    f"{key}/{container}: {reused} of {r} from the pod's reuse pool "
                    f"{sorted(pool[r])}, kubelet takes {min(n, len(pool[r]))} from it first"
                )
        ids = sorted({d for got_r in got_by.values() for d in got_r})
        if set(ids) - pooled != want - pooled:
            seen = f"{ids}" if not pooled else f"{ids} (init containers' {sorted(pooled)})"
            found.s2.append(
                f"{key}/{container}: kubelet allocated {seen}, assignment {sorted(want)}"
            )
        per_resource = [sorted(g) for _, g in sorted(got_by.items()) if g]
        if rec.visible is not None:
            env_ids = sorted(x for x in rec.visible.split(",") if x)
            if env_ids != ids and (len(per_resource) < 2 or env_ids not in per_resource):
                found.s2.append(
                    f"{key}/{container}: NVIDIA_VISIBLE_DEVICES={rec.visible!r}, kubelet allocated "
                    f"{ids}"
                )
        devices_of_pod.update(ids)
        for r, got_r in got_by.items():
            if kind is ContainerKind.INIT:
                pool[r] |= set(got_r)
                pooled.update(got_r)
            else:
                pool[r] -= set(got_r)
        if kind is not ContainerKind.INIT:
            for dev in ids:
                other = kept.setdefault(dev, container)
                if other != container:
                    found.s1.append(
                        f"{dev} on {node} is held by both {key}/{other} and {key}/{container}"
                    )
    return devices_of_pod


def _slices(pod: Mapping[str, Any]) -> dict[str, Slice]:
    out: dict[str, Slice] = {}
    spec = pod.get("spec", {})
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        try:
            claim = container_slice(c)
        except BadShare:
            continue
        if claim is not None:
            out[str(c.get("name"))] = claim
    return out


def _sliced(on_gpu: Mapping[str, Slice], a: str, b: str) -> bool:
    """Whether two pods on one GPU both hold slices of it (not the whole GPU)."""
    return all(k in on_gpu and not on_gpu[k].exclusive for k in (a, b))


def _check_shared(
    claims: Mapping[tuple[str, str], Mapping[str, Slice]],
    inventories: Mapping[str, Sequence[GPU]],
    found: Findings,
) -> None:
    for (node, dev), pods in sorted(claims.items()):
        if len(pods) < 2 or any(c.exclusive for c in pods.values()):
            continue  # a GPU held whole by one of several pods is reported above
        cores = sum(c.cores_claimed for c in pods.values())
        if cores > FULL_CORES:
            found.s1.append(f"{dev} on {node}: {cores}% cores committed ({sorted(pods)})")
        gpu = next((g for g in inventories.get(node, ()) if g.id == dev), None)
        if gpu is None:
            continue
        memory = sum(c.memory_on(gpu) for c in pods.values())
        if memory > gpu.memory_mib:
            found.s1.append(
                f"{dev} on {node}: {memory} MiB committed of {gpu.memory_mib} ({sorted(pods)})"
            )
        if len(pods) > gpu.split:
            found.s1.append(f"{dev} on {node}: {len(pods)} pods on {gpu.split} slices")


def check_locks_free(
    leases: Iterable[Mapping[str, Any]], findings: Findings, *, nodes: Collection[str]
) -> None:
    """S3 at quiescence: no node lock is still held.  ``nodes`` are the nodes whose lock the
    caller expects to exist (GPU pods were handed off there): a node among them without a Lease
    is a ``coverage`` finding, so an empty or wrong Lease list cannot pass."""
    seen: set[str] = set()
    for lease in leases:
        name = str(lease.get("metadata", {}).get("name", "?"))
        seen.add(name)
        holder = (lease.get("spec") or {}).get("holderIdentity")
        if holder:
            findings.s3.append(f"node {name} is still locked by {holder}")
    for node in sorted(set(nodes) - seen):
        findings.coverage.append(f"node {node} has no Lease: its lock was expected to exist")
