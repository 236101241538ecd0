"""Check the invariants of docs/design.md ("Invariants") from what the simulated kubelets
recorded (plain data in, out).

Every admitted pod carries ``sim.nodelock.io/allocated``: per container, the device IDs kubelet's
own device manager allocated and the environment our plugin answered with.  From the pods alone:

- **S1** no GPU is held by two live pods on the same node, nor by two containers of one pod that
  run at the same time (app containers and sidecars); a pod's init containers may reuse devices
  that its own app containers get, as kubelet does;
- **S2** every container got devices of its pod's assignment only, as many as its assignment
  names, and the plugin served exactly kubelet's devices (``NVIDIA_VISIBLE_DEVICES`` equals
  kubelet's device IDs).  Which of the pod's devices a container gets is kubelet's choice when
  it reuses an init container's devices, so it may differ from the container's own entry;
- **L1** every GPU pod was bound and admitted (Running or Succeeded).

On a node that shares GPUs (``handoff.sharing``) kubelet allocates virtual devices
``<uuid>::<k>``; they are folded to their physical GPU, and S1 becomes: a GPU held whole is held by
no other pod, and the slices on one GPU never commit more memory or cores than it has (memory is
checked where the caller passes the nodes' inventories).

MIG instances (``nvidia.com/mig-<profile>``, recorded under ``otherResources``) are devices like
whole GPUs for S1 and S2: a container's devices are its whole GPUs and its instances.  A container
that asks for both gets ``NVIDIA_VISIBLE_DEVICES`` from each plugin answer and kubelet keeps one
of them: it must then equal one resource's devices.

S3 (no lock left held) is checked from the Leases: ``check_locks_free``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from handoff.sharing import FULL_CORES, BadShare, Slice, container_slice, larger, physical_of
from handoff.wire import DEFAULT_PREFIX, DEFAULT_RESOURCE, GPU, MIG_RESOURCE_PREFIX

ALLOCATED = "sim.nodelock.io/allocated"
LIVE_PHASES = ("Pending", "Running", "Unknown")


@dataclass
class Findings:
    """Violations per invariant; an empty list means the invariant held."""

    checked_pods: int = 0
    s1: list[str] = field(default_factory=list)
    s2: list[str] = field(default_factory=list)
    s3: list[str] = field(default_factory=list)
    l1: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.s1 or self.s2 or self.s3 or self.l1)


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _requests_gpu(pod: Mapping[str, Any], resource: str) -> bool:
    """Whether the pod asks for ``resource`` or for MIG instances."""
    spec = pod.get("spec", {})
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        res = c.get("resources", {})
        asked = [*res.get("limits", {}), *res.get("requests", {})]
        if resource in asked or any(r.startswith(MIG_RESOURCE_PREFIX) for r in asked):
            return True
    return False


def _by_resource(seen: Mapping[str, Any]) -> list[list[str]]:
    """A container's record per resource: its whole GPUs (virtual IDs folded) and its MIG
    instances of each profile, each sorted; resources it got nothing of are left out."""
    out = [sorted(str(physical_of(d)) for d in seen.get("deviceIDs", []))]
    others = seen.get("otherResources") or {}
    out += [sorted(others[r]) for r in sorted(others) if r.startswith(MIG_RESOURCE_PREFIX)]
    return [ids for ids in out if ids]


def _reusing_init_containers(pod: Mapping[str, Any]) -> set[str]:
    """Init containers whose devices kubelet hands on to later containers (not sidecars)."""
    spec = pod.get("spec", {})
    return {
        str(c.get("name"))
        for c in spec.get("initContainers", [])
        if c.get("restartPolicy") != "Always"
    }


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


def check_pods(
    pods: Sequence[Mapping[str, Any]],
    *,
    resource: str = DEFAULT_RESOURCE,
    prefix: str = DEFAULT_PREFIX,
    require_admitted: bool = True,
    inventories: Mapping[str, Sequence[GPU]] | None = None,
) -> Findings:
    """Check S1, S2 and (when ``require_admitted``) L1 over a snapshot of pods;
    ``inventories`` (node -> GPUs) lets S1 check the memory committed on shared GPUs."""
    found = Findings()
    holders: dict[tuple[str, str], str] = {}
    claims: dict[tuple[str, str], dict[str, Slice]] = {}  # (node, GPU) -> pod -> its claim
    for pod in pods:
        if not _requests_gpu(pod, resource):
            continue
        found.checked_pods += 1
        key = _key(pod)
        phase = pod.get("status", {}).get("phase", "Pending")
        node = pod.get("spec", {}).get("nodeName")
        record = allocated(pod)
        if require_admitted and phase not in ("Running", "Succeeded"):
            found.l1.append(f"{key} is {phase} on {node or 'no node'}")
        if phase not in ("Running", "Succeeded", *LIVE_PHASES) or not record:
            continue
        annotations = pod.get("metadata", {}).get("annotations", {})
        try:
            assignment = json.loads(annotations.get(f"{prefix}assignment", "null"))
        except ValueError:
            assignment = None
        if not isinstance(assignment, dict):
            found.s2.append(f"{key} was admitted with devices but has no valid assignment")
            assignment = {}
        devices_of_pod: set[str] = set()
        assigned_to_pod = {d for ids in assignment.values() if isinstance(ids, list) for d in ids}
        reusing = _reusing_init_containers(pod)
        kept: dict[str, str] = {}  # device -> container of this pod that keeps it
        slices = _slices(pod)
        for container, seen in record.items():
            per_resource = _by_resource(seen)
            ids = sorted(d for r in per_resource for d in r)
            claim = slices.get(container)
            for dev in ids:
                if claim is not None:
                    mine = claims.setdefault((str(node), dev), {})
                    mine[key] = claim if key not in mine else larger(mine[key], claim)
            want = sorted(assignment.get(container, []))
            if not set(ids) <= assigned_to_pod or len(ids) != len(want):
                found.s2.append(
                    f"{key}/{container}: kubelet allocated {ids}, assignment {want} (pod: "
                    f"{sorted(assigned_to_pod)})"
                )
            env = seen.get("envs", {}).get("NVIDIA_VISIBLE_DEVICES", "")
            env_ids = sorted(x for x in env.split(",") if x)
            if env_ids != ids and (len(per_resource) < 2 or env_ids not in per_resource):
                found.s2.append(
                    f"{key}/{container}: NVIDIA_VISIBLE_DEVICES={env!r}, kubelet allocated {ids}"
                )
            devices_of_pod.update(ids)
            if container not in reusing:
                for dev in ids:
                    other = kept.setdefault(dev, container)
                    if other != container:
                        found.s1.append(
                            f"{dev} on {node} is held by both {key}/{other} and {key}/{container}"
                        )
        if phase == "Succeeded":
            for dev in devices_of_pod:
                claims.get((str(node), dev), {}).pop(key, None)
            continue  # its devices are free again
        for dev in devices_of_pod:
            other = holders.setdefault((str(node), dev), key)
            if other != key and not _sliced(claims.get((str(node), dev), {}), other, key):
                found.s1.append(f"{dev} on {node} is held by both {other} and {key}")
    _check_shared(claims, inventories or {}, found)
    return found


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


def check_locks_free(leases: Iterable[Mapping[str, Any]], findings: Findings) -> None:
    """S3 at quiescence: no node lock is still held."""
    for lease in leases:
        holder = lease.get("spec", {}).get("holderIdentity")
        if holder:
            findings.s3.append(f"node {lease['metadata']['name']} is still locked by {holder}")
