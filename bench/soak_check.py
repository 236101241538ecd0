"""The fault campaign's checker: judges a whole recorded history (plain data in, findings out).

A history is what ``bench.soak`` recorded while the campaign ran: ``Sample`` s (every GPU pod as
the API server showed it, with kubelet's record of its devices, and every node lock's Lease, read
about once a second) and ``Event`` s (each fault injected and healed, each
workload action).  Over it:

- **S1, S2** at every sample, with ``devcluster.invariants.check_pods`` (the e2e tests' checker:
  kubelet's devices against each container's assignment, no GPU held by two live pods, slices
  within their GPU), and across samples: kubelet's record of a pod never changes once written;
- **fencing**: per node, the Lease's token (``spec.leaseTransitions``) never goes down, a new
  holder never comes with the old token, and no two pods bound to one node carry the same token;
- **S3**: a lock whose holder has left the handoff (its pod gone, admitted, finished, or bound
  elsewhere) is not renewed any more once ``lease_s`` plus ``S3_SLACK_S`` have passed since it
  left (it expires, so the next bind may take it over); a lock is never taken over from a holder
  still in handoff, nor released ``expired`` (the Lease records ``last-outcome: taken-over`` or
  ``expired`` for a pod that a sample shows bound there with that token, Pending and not
  admitted); at the end every lock is free
  (``check_locks_free``);
- **L1** at the end: every GPU pod still there is Running or Succeeded, and a pod that Failed
  did so where a fault explains it (``blamed_fault``: a fault of its node's device plugin,
  kubelet or lock, or of the control plane, active or just healed), with the reason it failed.

Each violation comes with the minimal history around it: the events of the ``CONTEXT_S`` seconds
before it and the samples' view of the pods and locks it names.

kubelet's record of a pod (``record_of``) is the pod's ``kubelet`` field when the sample has one
(a real kubelet's: its device checkpoint and the container configs it handed the runtime, read
just after the pods, ``devcluster.realkubelet.records_under``), else the simulated kubelet's
annotation.  Device IDs are compared as GPUs (``physical_of``): a real kubelet's record of a
running pod whose checkpoint was lost names what its runtime config named, physical GPUs.

Not checked here: anything between two samples (a state that lasted less than a sample period
is not seen), and devices kubelet gave outside its record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devcluster.invariants import (
    ContainerRecord,
    Findings,
    PodRecord,
    check_locks_free,
    check_pods,
    sim_record,
)
from handoff.sharing import physical_of
from handoff.wire import DEFAULT_PREFIX, GPU, MIG_RESOURCE_PREFIX, Keys

RESOURCE = "nvidia.com/gpu"
S3_SLACK_S = 5.0  # sampling period, the extender's observed-time rule and the write itself
FAULT_BLAME_S = 30.0  # a pod failing this long after a fault healed is not blamed on it
CONTEXT_S = 15.0
HOLDER_UID = f"{DEFAULT_PREFIX}holder-uid"
TAKEN_OVER = "taken-over"  # lockd.model.Outcome.TAKEN_OVER, as the Lease records it
EXPIRED = "expired"  # lockd.model.Outcome.EXPIRED: released by an extender's sweep
KUBELET = "kubelet"  # a sampled pod's field: kubelet's record of it, when read apart from the pod
DELETED_UNSCHEDULED = "deleted before it had a node"  # failed by the pod GC, not by us


@dataclass(frozen=True)
class LeaseView:
    """One node lock as a sample saw it."""

    holder: str  # "" when free
    token: int
    renew: str
    holder_uid: str = ""
    # how the previous holder left (the Lease's last-* annotations), "" when none did
    last_holder: str = ""
    last_holder_uid: str = ""
    last_token: int = 0
    last_outcome: str = ""


@dataclass(frozen=True)
class Sample:
    """What the API server showed at ``t`` seconds into the run: the GPU pods (minimal JSON, as
    ``minimal_pod`` keeps them) and the node locks."""

    t: float
    pods: Sequence[Mapping[str, Any]]
    leases: Mapping[str, LeaseView]
    # node -> pod key -> container -> device IDs of nvidia.com/gpu, as kubelet's PodResources
    # List answered just after the pods were read (not every sample reads it)
    listed: Mapping[str, Mapping[str, Mapping[str, Sequence[str]]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    """A fault injected (``fault``) or healed (``heal``), or a workload action (``workload``)."""

    t: float
    kind: str
    what: str
    fault: str = ""  # the fault's kind, for ``fault`` and ``heal``


@dataclass
class Violation:
    invariant: str
    t: float
    message: str
    names: list[str] = field(default_factory=list)  # pod keys and node names it is about
    times_seen: int = 1
    history: list[str] = field(default_factory=list)

    def text(self) -> str:
        head = f"[{self.invariant}] t={self.t:.1f}s {self.message}"
        if self.times_seen > 1:
            head += f" (seen in {self.times_seen} samples)"
        return "\n".join([head, *(f"    {line}" for line in self.history)])


def asks_for_devices(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        res = c.get("resources") or {}
        for r in [*(res.get("limits") or {}), *(res.get("requests") or {})]:
            if r == RESOURCE or r.startswith(MIG_RESOURCE_PREFIX):
                return True
    return False


def minimal_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the checker reads of a pod: identity, nodelock's and the simulated kubelet's
    annotations, the containers' resources, node, phase and reason."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    notes = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if k.startswith(DEFAULT_PREFIX) or k.startswith("sim.nodelock.io/")
    }

    def slim(cs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for c in cs:
            one: dict[str, Any] = {"name": c.get("name")}
            if c.get("resources"):
                one["resources"] = c["resources"]
            if c.get("restartPolicy"):
                one["restartPolicy"] = c["restartPolicy"]
            out.append(one)
        return out

    small: dict[str, Any] = {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "annotations": notes,
        },
        "spec": {"containers": slim(spec.get("containers") or [])},
        "status": {"phase": status.get("phase", "Pending")},
    }
    if spec.get("initContainers"):
        small["spec"]["initContainers"] = slim(spec["initContainers"])
    if spec.get("nodeName"):
        small["spec"]["nodeName"] = spec["nodeName"]
    if meta.get("deletionTimestamp"):
        small["metadata"]["deletionTimestamp"] = meta["deletionTimestamp"]
    for k in ("reason", "message"):
        if status.get(k):
            small["status"][k] = str(status[k])[:300]
    if status.get("containerStatuses") or status.get("initContainerStatuses"):
        small["status"]["hasStatuses"] = True  # kubelet writes them only for a pod it admitted
    return small


def record_json(record: PodRecord) -> dict[str, Any]:
    """kubelet's record of a pod as a sampled pod's ``kubelet`` field."""
    return {
        c: {"devices": {r: list(ids) for r, ids in v.devices.items()}, "visible": v.visible}
        for c, v in record.items()
    }


def record_of(pod: Mapping[str, Any]) -> PodRecord | None:
    """kubelet's record of a sampled pod (its ``kubelet`` field, else the simulated kubelet's
    annotation); None when kubelet has none."""
    raw = pod.get(KUBELET)
    if raw is None:
        return sim_record(pod)
    out = {
        str(c): ContainerRecord(
            {str(r): [str(d) for d in ids] for r, ids in v["devices"].items()}, v.get("visible")
        )
        for c, v in raw.items()
    }
    return out or None


def _gpus_text(record: PodRecord) -> dict[str, str]:
    """Container -> its devices, each as its GPU, as one comparable text."""
    return {
        c: json.dumps(
            {r: sorted({str(physical_of(d)) for d in ids}) for r, ids in v.devices.items()},
            sort_keys=True,
        )
        for c, v in record.items()
    }


def lease_view(lease: Mapping[str, Any]) -> LeaseView:
    spec = lease.get("spec") or {}
    notes = (lease.get("metadata") or {}).get("annotations") or {}
    try:
        last_token = int(notes.get(f"{DEFAULT_PREFIX}last-token") or 0)
    except ValueError:
        last_token = -1
    return LeaseView(
        holder=str(spec.get("holderIdentity") or ""),
        token=int(spec.get("leaseTransitions") or 0),
        renew=str(spec.get("renewTime") or ""),
        holder_uid=str(notes.get(HOLDER_UID, "")),
        last_holder=str(notes.get(f"{DEFAULT_PREFIX}last-holder", "")),
        last_holder_uid=str(notes.get(f"{DEFAULT_PREFIX}last-holder-uid", "")),
        last_token=last_token,
        last_outcome=str(notes.get(f"{DEFAULT_PREFIX}last-outcome", "")),
    )


def key_of(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _admitted(pod: Mapping[str, Any]) -> bool:
    """kubelet has decided on the pod: it runs, finished or was refused."""
    return _phase(pod) in ("Running", "Succeeded", "Failed")


def _in_handoff(pod: Mapping[str, Any], node: str) -> bool:
    """Pending on ``node``, not being deleted, and not admitted: no record of devices from
    kubelet and no container statuses (``handoff.holder``'s in-handoff, seen from a sample)."""
    meta = pod.get("metadata") or {}
    return (
        _phase(pod) == "Pending"
        and _node(pod) == node
        and not meta.get("deletionTimestamp")
        and record_of(pod) is None
        and not (pod.get("status") or {}).get("hasStatuses")
    )


@dataclass
class Checker:
    """Judges a history, sample by sample (``add``), then at the end (``finish``)."""

    lease_s: float
    inventories: Mapping[str, Sequence[GPU]] = field(default_factory=dict)
    keys: Keys = field(default_factory=Keys)
    violations: list[Violation] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    # (uid, container) -> when kubelet's record of it was first seen, and what it was
    _records: dict[tuple[str, str], tuple[float, str]] = field(default_factory=dict)
    _tokens: dict[tuple[str, int], str] = field(default_factory=dict)  # (node, token) -> pod
    _lease_last: dict[str, LeaseView] = field(default_factory=dict)
    _left: dict[tuple[str, str], float] = field(default_factory=dict)  # (node, holder) -> t left
    _seen: dict[tuple[str, str], Violation] = field(default_factory=dict)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        pods = [p for p in sample.pods if asks_for_devices(p)]
        records = {key_of(p): r for p in pods if (r := record_of(p)) is not None}
        found = check_pods(
            pods,
            expected_pods=len(pods),
            records=records,
            require_admitted=False,
            inventories=self.inventories,
        )
        if pods:
            for msg in found.coverage:
                self._flag("coverage", sample.t, msg, [])
        for msg in found.s1:
            self._flag("S1", sample.t, msg, self._names_in(msg, pods))
        for msg in found.s2:
            self._flag("S2", sample.t, msg, self._names_in(msg, pods))
        self._records_unchanged(sample, pods)
        self._pod_resources(sample, pods)
        self._fencing(sample, pods)
        self._s3(sample, pods)
        self._takeovers(sample, pods)

    def _takeovers(self, sample: Sample, pods: Sequence[Mapping[str, Any]]) -> None:
        """S3's other half: a lock is never handed on while its holder is in handoff.  A lock
        taken over from pod P, token T, or released ``expired`` by an extender's sweep, while P
        (bound to the node with token T) is still Pending there and not admitted, was handed on
        from under a holder kubelet may admit."""
        by_key = {key_of(p): p for p in pods}
        for node, view in sample.leases.items():
            if view.last_outcome not in (TAKEN_OVER, EXPIRED) or not view.last_holder:
                continue
            pod = by_key.get(view.last_holder)
            if pod is None or (view.holder, view.holder_uid) == (
                view.last_holder,
                view.last_holder_uid,
            ):
                continue
            meta = pod["metadata"]
            if view.last_holder_uid and str(meta.get("uid")) != view.last_holder_uid:
                continue
            if meta["annotations"].get(self.keys.token) != str(view.last_token):
                continue
            if _in_handoff(pod, node):
                how = "taken over" if view.last_outcome == TAKEN_OVER else "released expired"
                self._flag(
                    "S3",
                    sample.t,
                    f"{node}'s lock (token {view.last_token}) was {how} from "
                    f"{view.last_holder} while it was Pending there, bound with that token and "
                    f"not admitted (now token {view.token}, {view.holder or 'free'})",
                    [view.last_holder, node],
                )

    def _records_unchanged(self, sample: Sample, pods: Sequence[Mapping[str, Any]]) -> None:
        """What kubelet gave a container never changes once recorded (a real kubelet writes its
        checkpoint container by container, so a record may grow; a lost checkpoint may shrink
        it)."""
        for pod in pods:
            rec = record_of(pod)
            if rec is None:
                continue
            uid = str(pod["metadata"].get("uid"))
            for container, text in _gpus_text(rec).items():
                first = self._records.setdefault((uid, container), (sample.t, text))
                if first[1] != text:
                    self._flag(
                        "S2",
                        sample.t,
                        f"{key_of(pod)}/{container}: kubelet's record changed from {first[1]} "
                        f"(t={first[0]:.1f}s) to {text}",
                        [key_of(pod)],
                    )

    def _pod_resources(self, sample: Sample, pods: Sequence[Mapping[str, Any]]) -> None:
        """kubelet's PodResources List against its record of each pod's devices: a container
        listed with devices has exactly the devices of ``nvidia.com/gpu`` its record names.  A
        container listed without devices is left alone: kubelet restarted without its checkpoint
        lists a running pod so (docs/simkubelet.md), and S1 still judges that pod from its
        record.  So is a container of a Pending pod that its record does not name yet: kubelet
        lists a container's devices from the plugin's answer on and writes its checkpoint after
        (``manager.go`` ``allocateContainerResources``, v1.31.9 lines 915 and 919, v1.37.2
        lines 955 and 959), and hands the runtime its config only when it creates it."""
        by_key = {key_of(p): p for p in pods}
        for node, listing in sample.listed.items():
            for key, containers in listing.items():
                pod = by_key.get(key)
                record = record_of(pod) if pod is not None and _node(pod) == node else None
                if record is None:
                    continue
                for container, ids in containers.items():
                    if not ids:
                        continue
                    rec = record.get(container)
                    if rec is None and pod is not None and _phase(pod) == "Pending":
                        continue  # recorded once kubelet writes its checkpoint (docstring)
                    had = sorted(rec.devices.get(RESOURCE, [])) if rec is not None else []
                    if _gpus(ids) != _gpus(had):
                        self._flag(
                            "S2",
                            sample.t,
                            f"{key}/{container}: kubelet's PodResources on {node} lists "
                            f"{sorted(ids)}, its record {had}",
                            [key, node],
                        )

    def _fencing(self, sample: Sample, pods: Sequence[Mapping[str, Any]]) -> None:
        for node, view in sample.leases.items():
            last = self._lease_last.get(node)
            if last is not None:
                if view.token < last.token:
                    self._flag(
                        "fencing",
                        sample.t,
                        f"the token of {node}'s lock went down from {last.token} to {view.token}",
                        [node],
                    )
                elif (
                    view.holder
                    and last.holder
                    and (view.holder, view.holder_uid) != (last.holder, last.holder_uid)
                    and view.token == last.token
                ):
                    self._flag(
                        "fencing",
                        sample.t,
                        f"{node}'s lock passed from {last.holder} to {view.holder} "
                        f"with the same token {view.token}",
                        [node, last.holder, view.holder],
                    )
            self._lease_last[node] = view
        for pod in pods:
            raw = pod["metadata"]["annotations"].get(self.keys.token)
            node = _node(pod)
            if raw is None or not node:
                continue
            try:
                token = int(raw)
            except ValueError:
                self._flag("fencing", sample.t, f"{key_of(pod)} has token {raw!r}", [key_of(pod)])
                continue
            uid = str(pod["metadata"].get("uid"))
            other = self._tokens.setdefault((node, token), f"{key_of(pod)} ({uid})")
            if other != f"{key_of(pod)} ({uid})":
                self._flag(
                    "fencing",
                    sample.t,
                    f"{key_of(pod)} ({uid}) and {other} were both bound to {node} "
                    f"with token {token}",
                    [key_of(pod), other.split(" ")[0], node],
                )

    def _s3(self, sample: Sample, pods: Sequence[Mapping[str, Any]]) -> None:
        by_key = {key_of(p): p for p in pods}
        for node, view in sample.leases.items():
            if not view.holder:
                continue
            pod = by_key.get(view.holder)
            uid = str((pod or {}).get("metadata", {}).get("uid", ""))
            gone = pod is None or (view.holder_uid and uid != view.holder_uid)
            left = gone or _admitted(pod or {}) or (_node(pod or {}) not in ("", node))
            mark = (node, f"{view.holder}@{view.token}")
            if not left:
                self._left.pop(mark, None)
                continue
            since = self._left.setdefault(mark, sample.t)
            last = self._lease_last_before.get(node)
            renewed = last is not None and last.holder == view.holder and last.renew != view.renew
            if renewed and sample.t - since > self.lease_s + S3_SLACK_S:
                self._flag(
                    "S3",
                    sample.t,
                    f"{node}'s lock is still renewed for {view.holder} {sample.t - since:.1f}s "
                    "after it left the handoff",
                    [node, view.holder],
                )
        self._lease_last_before = dict(sample.leases)

    _lease_last_before: dict[str, LeaseView] = field(default_factory=dict)

    def finish(
        self,
        final_pods: Sequence[Mapping[str, Any]],
        final_leases: Sequence[Mapping[str, Any]],
        events: Sequence[Event],
        *,
        t: float,
        locked_nodes: Sequence[str],
    ) -> None:
        """The end: L1 over the final pods, every lock free (S3), and each violation's history."""
        found = Findings()
        check_locks_free(final_leases, found, nodes=locked_nodes)
        for msg in found.s3:
            self._flag("S3", t, msg, [msg.split()[1]])
        for msg in found.coverage:
            self._flag("coverage", t, msg, [])
        for pod in final_pods:
            if not asks_for_devices(pod):
                continue
            phase = _phase(pod)
            if phase in ("Running", "Succeeded"):
                continue
            if phase == "Failed":
                continue  # judged below, from the time it failed
            self._flag(
                "L1",
                t,
                f"{key_of(pod)} is {phase} on {_node(pod) or 'no node'} at the end",
                [key_of(pod)],
            )
        for key, (failed_at, reason, node) in self.failures().items():
            if reason == DELETED_UNSCHEDULED:
                continue
            if not blamed_fault(events, failed_at, node):
                self._flag(
                    "L1",
                    failed_at,
                    f"{key} Failed on {node or 'no node'} ({reason}) with no fault there that "
                    "explains it",
                    [key, *([node] if node else [])],
                )
        for v in self.violations:
            v.history = self.history_of(v, events)

    def failures(self) -> dict[str, tuple[float, str, str]]:
        """Pod key -> (when it was first seen Failed, its reason, its node); the reason is
        ``DELETED_UNSCHEDULED`` for a pod deleted before it had a node, which
        kube-controller-manager's pod GC marks Failed (``gcUnscheduledTerminating``,
        ``pkg/controller/podgc/gc_controller.go``, v1.31.9 and v1.37.2): its owner removed it, no
        kubelet or lock was involved, so it is no L1."""
        out: dict[str, tuple[float, str, str]] = {}
        for sample in self.samples:
            for pod in sample.pods:
                if _phase(pod) == "Failed" and asks_for_devices(pod) and key_of(pod) not in out:
                    status = pod.get("status") or {}
                    reason = str(status.get("reason") or "no reason")
                    if not _node(pod) and (pod.get("metadata") or {}).get("deletionTimestamp"):
                        reason = DELETED_UNSCHEDULED
                    cause = failure_cause(str(status.get("message") or ""))
                    out[key_of(pod)] = (
                        sample.t,
                        f"{reason}: {cause}" if cause else reason,
                        _node(pod),
                    )
        return out

    def history_of(self, v: Violation, events: Sequence[Event]) -> list[str]:
        lines = [
            f"t={e.t:.1f}s {e.kind}: {e.what}"
            for e in events
            if v.t - CONTEXT_S <= e.t <= v.t + 1
            and (e.kind != "workload" or any(n in e.what for n in v.names))
        ]
        for name in v.names[:4]:
            trail: list[str] = []
            for sample in self.samples:
                if sample.t > v.t + 1 or sample.t < v.t - CONTEXT_S:
                    continue
                if name in sample.leases:
                    lv = sample.leases[name]
                    step = f"lock {lv.holder or 'free'} token {lv.token}"
                else:
                    pod = next((p for p in sample.pods if key_of(p) == name), None)
                    if pod is None:
                        step = "absent"
                    else:
                        notes = pod["metadata"]["annotations"]
                        step = (
                            f"{_phase(pod)} on {_node(pod) or '-'} "
                            f"token {notes.get(self.keys.token, '-')} "
                            f"assigned {notes.get(self.keys.assignment, '-')} "
                            f"kubelet {_kubelet_text(pod)}"
                        )
                if not trail or not trail[-1].endswith(step):
                    trail.append(f"t={sample.t:.1f}s {step}")
            lines += [f"{name}: {s}" for s in trail]
        return lines

    def _names_in(self, msg: str, pods: Sequence[Mapping[str, Any]]) -> list[str]:
        words = {w.strip(":,()'") for w in msg.replace("/", " / ").split()}
        keys = [key_of(p) for p in pods if key_of(p) in msg]
        nodes = [w for w in words if w.startswith("gpu-node-")]
        return sorted(set(keys)) + sorted(set(nodes))

    def _flag(self, invariant: str, t: float, msg: str, names: list[str]) -> None:
        seen = self._seen.get((invariant, msg))
        if seen is not None:
            seen.times_seen += 1
            return
        v = Violation(invariant, t, msg, names)
        self._seen[(invariant, msg)] = v
        self.violations.append(v)


def _gpus(ids: Sequence[str]) -> list[str]:
    return sorted({str(physical_of(d)) for d in ids})


def _kubelet_text(pod: Mapping[str, Any]) -> str:
    record = record_of(pod)
    return "-" if record is None else json.dumps(record_json(record), sort_keys=True)


def failure_cause(message: str) -> str:
    """The gist of kubelet's rejection message: what came after ``Allocate failed due to``, up
    to its first detail (``no healthy devices present``, ``rpc error: code = Unavailable``, the
    plugin's refusal), without pod names, UIDs or device IDs."""
    _, found, rest = message.partition("Allocate failed due to ")
    if not found:
        return message[:60]
    rest = rest.removesuffix(", which is unexpected")
    if rest.startswith("rpc error: code = "):
        code, _, detail = rest.removeprefix("rpc error: code = ").partition(" desc = ")
        detail = detail.split(": ", 1)[1] if detail.startswith("node ") else detail
        return f"rpc error {code}: {detail.split(' (')[0].split(' soak-')[0][:70]}"
    return rest.split(";")[0].split(" with err")[0][:70]


def load_history(lines: Sequence[str]) -> tuple[list[Sample], list[Event], dict[str, str]]:
    """A history as ``python -m bench.soak --history FILE`` wrote it: its samples, its events,
    and the nodes' inventory annotations (node -> ``nodelock.io/gpus``)."""
    samples: list[Sample] = []
    events: list[Event] = []
    inventories: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            continue
        item = json.loads(line)
        if "inventories" in item:
            inventories = dict(item["inventories"])
        elif "pods" in item:
            leases = {n: LeaseView(**v) for n, v in item["leases"].items()}
            samples.append(Sample(float(item["t"]), item["pods"], leases, item.get("listed") or {}))
        else:
            events.append(Event(**item))
    return samples, events, inventories


def replay(
    samples: Sequence[Sample],
    events: Sequence[Event],
    *,
    lease_s: float,
    inventories: Mapping[str, Sequence[GPU]] | None = None,
) -> Checker:
    """Judge a recorded history again, its last sample as the end state."""
    checker = Checker(lease_s=lease_s, inventories=inventories or {})
    for sample in samples:
        checker.add(sample)
    last = samples[-1]
    locked = sorted(
        {
            _node(p)
            for s in samples
            for p in s.pods
            if checker.keys.token in p["metadata"]["annotations"] and _node(p)
        }
    )
    leases = [
        {"metadata": {"name": n}, "spec": {"holderIdentity": v.holder} if v.holder else {}}
        for n, v in last.leases.items()
    ]
    checker.finish(list(last.pods), leases, events, t=last.t, locked_nodes=locked)
    return checker


GLOBAL_FAULTS = ("apiserver-kill", "etcd-kill")  # faults that may fail a pod on any node
RESTART_FAULTS = ("clock-skew", "slow-allocate", "restart")  # fail pods only as they restart
RESTART_BLAME_S = 10.0


def fault_windows(events: Sequence[Event]) -> list[tuple[float, float, str, str]]:
    """(start, end, what, kind) of every fault; one never healed lasts to the end.  A component
    started again by the supervisor is a ``restart`` of no duration."""
    open_: dict[str, tuple[float, str]] = {}
    out: list[tuple[float, float, str, str]] = []
    for e in events:
        if e.kind == "fault":
            open_[e.what] = (e.t, e.fault)
        elif e.kind == "heal" and e.what in open_:
            t0, kind = open_.pop(e.what)
            out.append((t0, e.t, e.what, kind))
        elif e.kind == "restart":
            out.append((e.t, e.t, e.what, "restart"))
    out += [(t0, float("inf"), what, kind) for what, (t0, kind) in open_.items()]
    return sorted(out)


def blamed_fault(events: Sequence[Event], t: float, node: str) -> str | None:
    """The fault that may have failed a pod on ``node`` at ``t``, if any: one on that node (its
    device plugin, kubelet or lock) active at ``t`` or healed within ``FAULT_BLAME_S`` before,
    or a control-plane kill (any node); a fault that only restarts a component (a skewed clock,
    a slowed Allocate, a supervisor's restart) only within ``RESTART_BLAME_S`` after each
    restart.  A fault of the extender or kube-scheduler never fails a pod at kubelet."""
    for start, end, what, kind in fault_windows(events):
        if kind not in GLOBAL_FAULTS and not (node and f"{node} " in f"{what} "):
            continue
        if kind in RESTART_FAULTS:
            windows = [(start - 1, start + RESTART_BLAME_S), (end - 1, end + RESTART_BLAME_S)]
        else:
            windows = [(start - 1, end + FAULT_BLAME_S)]
        if any(a <= t <= b for a, b in windows):
            return what
    return None
