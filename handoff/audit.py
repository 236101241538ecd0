"""Do the scheduler, kubelet and the device plugin agree on which pod has which GPU? (pure)

Three views of one node, each from its own owner:

- **assignments**: the scheduler extender's ``nodelock.io/assignment`` on each pod bound to the
  node (container -> device IDs);
- **kubelet**: kubelet's PodResources ``List`` (pod/container -> device IDs of the GPU resource),
  the same answer monitoring (DCGM exporter) reads;
- **answers**: what the device plugin answered kubelet's ``Allocate`` with, per container, as
  kubelet recorded it in its device checkpoint (the GPUs named in ``NVIDIA_VISIBLE_DEVICES`` and
  the CDI device names: what the container runtime really hands the container).

``audit_node`` compares them and returns every ``Disagreement`` (empty when all agree).  It is a
function of plain data, so the same check can run in ``nodelock audit``, in a test, or inside the
device plugin.

What counts (``Kind``):

- ``device-in-two-pods``: kubelet lists one device for two live pods;
- ``assigned-twice``: two live pods on the node are assigned the same device;
- ``kubelet-differs``: a container's kubelet devices are not what the assignment gives it (for a
  pod with GPU init containers, whose app containers may reuse the init containers' devices:
  not the same number, or not among the pod's assigned devices);
- ``no-kubelet-record``: a Running pod with an assignment for which kubelet lists no devices;
- ``no-assignment``: kubelet lists devices for a pod that has no (valid) assignment;
- ``bad-assignment``: the assignment annotation does not parse;
- ``answer-differs``: the plugin's answer names other GPUs than kubelet's devices for that
  container (the runtime would hand over GPUs that kubelet accounts to someone else);
- ``unknown-device``: kubelet lists a device the node's inventory does not have;
- ``unknown-pod``: kubelet lists devices for a pod the API server does not know (a static pod
  whose mirror pod is denied or not written): it holds them outside every lock, and its devices
  count towards ``device-in-two-pods``;
- ``kubelet-unreachable``: the PodResources view could not be read (nothing else is judged for
  the kubelet side of that node).

On a node that shares its GPUs (``handoff.sharing``) kubelet's devices are virtual, ``<uuid>::<k>``,
and several pods' assignments name one physical GPU.  kubelet's IDs are folded to their GPU
wherever they are compared with an assignment, the inventory or the plugin's answer;
``device-in-two-pods`` is judged on kubelet's own (virtual) IDs, which it never gives twice; and
a GPU assigned to several live pods is ``assigned-twice`` only when one of them takes it whole
(a container asking for no slice), not when every one takes a slice of it.  Whether the slices
fit the GPU's memory and cores is not this module's question (``devcluster.invariants`` and the
extender's choice answer it).

A node with MIG instances (``nvidia.com/mig-<profile>``) is judged once per resource: kubelet's
devices and the plugin's answers of that resource against each pod's assignment restricted to
that resource's devices (``for_resource``); a pod whose assignment names none of them has no
assignment for it.

Not judged: pods the API server knows that are finished (``Succeeded``/``Failed``) or being
deleted (kubelet frees their devices and forgets them on its own schedule), containers kubelet
does not list (init containers that are not sidecars), and a pod that kubelet lists without
devices while it is still ``Pending`` (admission in progress).  The views are read one after the
other, not atomically: a pod that changes while they are read may show a disagreement that a
second look no longer sees (``confirmed`` keeps only what two looks share).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from handoff.sharing import BadShare, physical_of, pod_slices
from handoff.wire import Keys, MalformedAnnotation, format_assignment, parse_assignment

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class Kind(StrEnum):
    """What disagrees (see the module docstring)."""

    DEVICE_IN_TWO_PODS = "device-in-two-pods"
    ASSIGNED_TWICE = "assigned-twice"
    KUBELET_DIFFERS = "kubelet-differs"
    NO_KUBELET_RECORD = "no-kubelet-record"
    NO_ASSIGNMENT = "no-assignment"
    BAD_ASSIGNMENT = "bad-assignment"
    ANSWER_DIFFERS = "answer-differs"
    UNKNOWN_DEVICE = "unknown-device"
    UNKNOWN_POD = "unknown-pod"
    KUBELET_UNREACHABLE = "kubelet-unreachable"


@dataclass(frozen=True)
class PodRecord:
    """The API server's view of one pod bound to the node."""

    namespace: str
    name: str
    uid: str
    phase: str
    deleting: bool
    assignment_raw: str | None  # the assignment annotation as written; None when absent
    init_containers: frozenset[str] = frozenset()  # non-restartable ones (kubelet won't list)
    sliced: frozenset[str] = frozenset()  # containers that take slices of GPUs, not whole GPUs

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def live(self) -> bool:
        """Holds its devices: not finished and not being deleted."""
        return self.phase not in TERMINAL_PHASES and not self.deleting


@dataclass(frozen=True)
class KubeletPod:
    """One pod of kubelet's PodResources ``List``: container -> device IDs of the resource."""

    namespace: str
    name: str
    containers: Mapping[str, frozenset[str]]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def devices(self) -> frozenset[str]:
        return frozenset().union(*self.containers.values())


@dataclass(frozen=True)
class PluginAnswer:
    """One container's entry in kubelet's device checkpoint: the devices kubelet allocated and
    the GPUs the plugin's answer names (``None`` when the answer names none it can read)."""

    pod_uid: str
    container: str
    kubelet_devices: frozenset[str]
    answered: frozenset[str] | None


@dataclass(frozen=True)
class NodeViews:
    """Everything ``audit_node`` judges for one node."""

    node: str
    pods: Sequence[PodRecord]
    kubelet: Sequence[KubeletPod] | None  # None: PodResources could not be read
    kubelet_error: str = ""
    answers: Sequence[PluginAnswer] | None = None  # None: kubelet's checkpoint not read
    inventory: frozenset[str] | None = None  # the node's device IDs; None: unknown
    keys: Keys = field(default_factory=Keys)


@dataclass(frozen=True, order=True)
class Disagreement:
    """One thing the views disagree on; ``devices`` are the device IDs involved, sorted."""

    node: str
    kind: Kind
    pod: str = ""  # namespace/name, or "" for the node as a whole
    container: str = ""
    devices: tuple[str, ...] = ()
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "kind": self.kind.value,
            "pod": self.pod,
            "container": self.container,
            "devices": list(self.devices),
            "detail": self.detail,
        }

    @property
    def identity(self) -> tuple[str, Kind, str, str, tuple[str, ...]]:
        """What makes two looks' findings the same finding (the detail text aside)."""
        return (self.node, self.kind, self.pod, self.container, self.devices)


def _gpus(devices: Iterable[str]) -> frozenset[str]:
    """kubelet's device IDs folded to their physical GPUs (a physical ID is its own)."""
    return frozenset(physical_of(d) for d in devices)


def _ids(devices: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(devices))


def _show(devices: Iterable[str]) -> str:
    return "[" + ", ".join(sorted(devices)) + "]"


def answered_gpus(
    envs: Mapping[str, str], cdi_devices: Sequence[str], *, resource: str
) -> frozenset[str] | None:
    """The GPUs a device plugin's container answer names: ``NVIDIA_VISIBLE_DEVICES`` (a comma
    list of IDs) and CDI names ``<resource>=<ID>``; ``None`` when it names none (an answer by
    device nodes only cannot be read back as device IDs)."""
    found: set[str] = set()
    visible = envs.get(VISIBLE_DEVICES_ENV)
    if visible is not None:
        found.update(v.strip() for v in visible.split(",") if v.strip())
    prefix = f"{resource}="
    found.update(name[len(prefix) :] for name in cdi_devices if name.startswith(prefix))
    return frozenset(found) if found else None


def _assignments(
    views: NodeViews, out: list[Disagreement]
) -> dict[str, tuple[PodRecord, dict[str, frozenset[str]]]]:
    """Live pods with a valid assignment, by key; a malformed one is reported."""
    parsed: dict[str, tuple[PodRecord, dict[str, frozenset[str]]]] = {}
    for pod in views.pods:
        if not pod.live or pod.assignment_raw is None:
            continue
        try:
            assignment = parse_assignment(pod.assignment_raw, key=views.keys.assignment)
        except MalformedAnnotation as exc:
            out.append(Disagreement(views.node, Kind.BAD_ASSIGNMENT, pod.key, detail=str(exc)))
            continue
        parsed[pod.key] = (pod, {c: frozenset(ids) for c, ids in assignment.items()})
    return parsed


def _shared(
    node: str, kind: Kind, holders: Mapping[str, set[str]], what: str
) -> list[Disagreement]:
    """Devices that more than one pod holds, one finding per pair of pods and their devices."""
    by_pods: dict[tuple[str, ...], set[str]] = {}
    for dev, pods in holders.items():
        if len(pods) > 1:
            by_pods.setdefault(tuple(sorted(pods)), set()).add(dev)
    return [
        Disagreement(
            node,
            kind,
            pods[0],
            devices=_ids(devs),
            detail=f"{_show(devs)} {what} both {' and '.join(pods)}",
        )
        for pods, devs in sorted(by_pods.items())
    ]


def audit_node(views: NodeViews) -> list[Disagreement]:
    """Every disagreement between the three views of ``views.node``, sorted."""
    node = views.node
    out: list[Disagreement] = []
    assigned = _assignments(views, out)

    assigned_to: dict[str, set[str]] = {}
    held_whole: set[str] = set()  # GPUs some live pod is assigned whole
    for key, (pod, assignment) in assigned.items():
        for container, devs in assignment.items():
            for dev in devs:
                assigned_to.setdefault(dev, set()).add(key)
                if container not in pod.sliced:
                    held_whole.add(dev)
    exclusive = {d: keys for d, keys in assigned_to.items() if d in held_whole}
    out += _shared(node, Kind.ASSIGNED_TWICE, exclusive, "are assigned to")

    if views.kubelet is None:
        out.append(
            Disagreement(node, Kind.KUBELET_UNREACHABLE, detail=views.kubelet_error or "no view")
        )
        return sorted(out)

    live = {p.key: p for p in views.pods if p.live}
    known = {p.key for p in views.pods}
    listed = {kp.key: kp for kp in views.kubelet}
    held_by: dict[str, set[str]] = {}
    for kp in views.kubelet:
        if kp.key not in known and kp.devices:
            for dev in kp.devices:
                held_by.setdefault(dev, set()).add(kp.key)
            out.append(
                Disagreement(
                    node,
                    Kind.UNKNOWN_POD,
                    kp.key,
                    devices=_ids(kp.devices),
                    detail=f"kubelet gave it {_show(kp.devices)} but the API server has no such "
                    "pod (a static pod without a mirror pod?): it holds them outside every lock",
                )
            )
            continue
        if kp.key not in live:
            continue  # finished or being deleted: kubelet frees its devices on its own schedule
        for dev in kp.devices:
            held_by.setdefault(dev, set()).add(kp.key)
        if views.inventory is not None:
            unknown = frozenset(d for d in kp.devices if physical_of(d) not in views.inventory)
            if unknown:
                out.append(
                    Disagreement(
                        node,
                        Kind.UNKNOWN_DEVICE,
                        kp.key,
                        devices=_ids(unknown),
                        detail=f"kubelet lists {_show(unknown)}, not in the node's inventory",
                    )
                )
        if kp.devices and kp.key not in assigned:
            out.append(
                Disagreement(
                    node,
                    Kind.NO_ASSIGNMENT,
                    kp.key,
                    devices=_ids(kp.devices),
                    detail=f"kubelet gave it {_show(kp.devices)} but it has no assignment",
                )
            )
    out += _shared(node, Kind.DEVICE_IN_TWO_PODS, held_by, "are given by kubelet to")

    for key, (pod, assignment) in sorted(assigned.items()):
        entry = listed.get(key)
        if entry is None or not entry.devices:
            if pod.phase == "Running":
                devs = frozenset().union(*assignment.values())
                out.append(
                    Disagreement(
                        node,
                        Kind.NO_KUBELET_RECORD,
                        key,
                        devices=_ids(devs),
                        detail="Running with an assignment, but kubelet lists no devices for it",
                    )
                )
            continue
        out += _compare_containers(node, pod, assignment, entry)

    if views.answers is not None:
        uid_to_key = {p.uid: p.key for p in views.pods if p.live}
        for answer in views.answers:
            holder = uid_to_key.get(answer.pod_uid)
            if holder is None or answer.answered is None:
                continue
            if answer.answered != _gpus(answer.kubelet_devices):
                out.append(
                    Disagreement(
                        node,
                        Kind.ANSWER_DIFFERS,
                        holder,
                        answer.container,
                        _ids(answer.answered ^ answer.kubelet_devices),
                        f"the plugin answered {_show(answer.answered)}, kubelet allocated "
                        f"{_show(answer.kubelet_devices)}",
                    )
                )
    return sorted(out)


def _compare_containers(
    node: str, pod: PodRecord, assignment: Mapping[str, frozenset[str]], kp: KubeletPod
) -> list[Disagreement]:
    """Per container kubelet lists: its devices against the assignment."""
    out: list[Disagreement] = []
    reuse = any(c in pod.init_containers for c in assignment)  # app containers may reuse these
    pool = frozenset().union(*assignment.values())
    for container in sorted(set(kp.containers) | (set(assignment) - pod.init_containers)):
        given = kp.containers.get(container, frozenset())
        got = _gpus(given)  # two slices of one GPU fold to one: never a container's N GPUs
        want = assignment.get(container, frozenset())
        agrees = len(got) == len(want) and got <= pool if reuse else got == want
        if agrees and len(got) == len(given):
            continue
        if container not in kp.containers and pod.phase != "Running":
            continue  # not listed yet
        out.append(
            Disagreement(
                node,
                Kind.KUBELET_DIFFERS,
                pod.key,
                container,
                _ids(got ^ want or given),
                f"kubelet gave it {_show(given)}, the assignment {_show(want)}",
            )
        )
    return out


def confirmed(first: Sequence[Disagreement], second: Sequence[Disagreement]) -> list[Disagreement]:
    """The findings of ``second`` that ``first`` saw too (same node, kind, pod, container and
    devices): what stays after a second look, with the second look's details."""
    seen = {d.identity for d in first}
    return [d for d in second if d.identity in seen]


def for_resource(
    pods: Sequence[PodRecord], devices: Collection[str], keys: Keys
) -> list[PodRecord]:
    """The pods with their assignments restricted to ``devices`` (one resource's devices of the
    node, in the order the assignment names them); an assignment that names none of them
    becomes absent, a malformed one is kept as it is (reported on every resource's view)."""
    out: list[PodRecord] = []
    for pod in pods:
        if pod.assignment_raw is None:
            out.append(pod)
            continue
        try:
            assignment = parse_assignment(pod.assignment_raw, key=keys.assignment)
        except MalformedAnnotation:
            out.append(pod)
            continue
        mine = {c: [d for d in ids if d in devices] for c, ids in assignment.items()}
        mine = {c: ids for c, ids in mine.items() if ids}
        out.append(replace(pod, assignment_raw=format_assignment(mine) if mine else None))
    return out


def pod_record(pod: Mapping[str, Any], keys: Keys) -> PodRecord:
    """A pod object from the API server as the audit sees it."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    init = frozenset(
        str(c.get("name", ""))
        for c in spec.get("initContainers") or ()
        if (c.get("restartPolicy") or "") != "Always"
    )
    raw = annotations.get(keys.assignment)
    return PodRecord(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        phase=str((pod.get("status") or {}).get("phase", "")),
        deleting=meta.get("deletionTimestamp") is not None,
        assignment_raw=raw if isinstance(raw, str) else None,
        init_containers=init,
        sliced=_sliced(pod),
    )


def _sliced(pod: Mapping[str, Any]) -> frozenset[str]:
    """The pod's containers that take slices of their GPUs.  A pod whose sharing request does
    not parse has none (the extender never binds it, so its GPUs count as held whole)."""
    try:
        slices = pod_slices(pod)
    except BadShare:
        return frozenset()
    return frozenset(c for c, s in slices.items() if not s.exclusive)


def table(disagreements: Sequence[Disagreement], nodes: Sequence[str]) -> str:
    """A human table of the findings, or one line per node saying all agree."""
    if not disagreements:
        named = f" ({', '.join(nodes)})" if len(nodes) <= 4 else ""
        return f"nodelock audit: {len(nodes)} node(s), no disagreements{named}"
    head = ("NODE", "KIND", "POD", "CONTAINER", "DETAIL")
    rows = [
        (d.node, d.kind.value, d.pod or "-", d.container or "-", d.detail) for d in disagreements
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r[:4])) + "  " + r[4]
        for r in [head, *rows]
    ]
    lines.append(f"{len(disagreements)} disagreement(s) on {len(nodes)} node(s)")
    return "\n".join(line.rstrip() for line in lines)


def report_json(
    disagreements: Sequence[Disagreement], nodes: Sequence[str], notes: Sequence[str] = ()
) -> str:
    """The findings as one JSON document (``notes``: what could not be compared, and why)."""
    return json.dumps(
        {
            "nodes": list(nodes),
            "agree": not disagreements,
            "disagreements": [d.to_json() for d in disagreements],
            "notes": list(notes),
        },
        indent=1,
    )
