"""``nodelock demo``: a local GPU cluster, a realistic GPU workload, live progress and a report.

From nothing: builds or reuses the control plane, starts devcluster with the extender wired into
kube-scheduler and GPU nodes with our device plugin, submits Deployments and Jobs of 1-, 2-, 4-
and 8-GPU pods plus a burst that contends for the same nodes, watches everything, and prints
what happened and whether the invariants held.

The nodes are simulated kubelets (kubelet's own device manager in a harness, ``--kubelet sim``,
the default) or the real ``kubelet`` of the cluster's release against a fake container runtime
(``--kubelet real``).  S1 and S2 are judged from the kubelets' own records: the simulated
kubelets' annotations, or the real kubelets' device checkpoints and the container configs they
handed the runtime (``devcluster.realkubelet.kubelet_records``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devcluster.binaries import ensure_control_plane, ensure_cri, ensure_kubelet, ensure_simkubelet
from devcluster.cluster import Cluster
from devcluster.errors import DevclusterError
from devcluster.gpunodes import up_gpu_cluster
from devcluster.invariants import PodRecord, allocated, check_locks_free, check_pods
from devcluster.namespaces import create_namespace
from devcluster.realkubelet import KubeletKind, records_under
from handoff.sharing import FULL_CORES, GPUMEM, BadShare, Slice, container_slice, physical_of
from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_RESOURCE, GPU, Keys, parse_inventory
from kube.client import JSON, KubeClient
from nodelock import htmlreport
from nodelock.audit import audit_devcluster
from nodelock.measure import (
    BACKGROUND_S,
    HANDOFF_WRITES,
    Timeline,
    api_requests,
    background_requests,
    follow,
    histogram,
    metric_samples,
    metric_sum,
    net_of_background,
    pod_key,
    quantile,
    scrape,
    watch_leases,
    watch_pods,
)

NAMESPACE = "demo"
RUN_SECONDS = "sim.nodelock.io/run-seconds"
WAVE_AT_S = (0.0, 2.0, 5.0)  # training Jobs, then Deployments, then the burst
# pods -> (pod key -> what kubelet gave each container); None: the simulated kubelets' annotations
Records = Callable[[Sequence[Mapping[str, Any]]], Mapping[str, PodRecord]]


def real_kubelet_records(state_dir: Path) -> Records:
    """What the real kubelets under ``state_dir`` gave the pods, read afresh at each call: their
    device checkpoints and the container configs they handed the runtime."""
    return functools.partial(records_under, state_dir)


@dataclass(frozen=True)
class Workload:
    """One controller of the demo's workload."""

    kind: str  # Deployment | Job
    name: str
    replicas: int
    gpus: int
    init_gpus: int = 0
    run_seconds: int = 0
    wave: int = 0  # 0: at start, 1: 2 s later, 2: the burst (WAVE_AT_S)
    gpumem_mib: int = 0  # > 0: a slice of a shared GPU (nvidia.com/gpumem), not a whole one

    @property
    def gpu_need(self) -> int:
        return self.replicas * max(self.gpus, self.init_gpus)


def default_workload(total_gpus: int) -> list[Workload]:
    """A mix sized to about 80% of the cluster's GPUs at its peak."""
    scale = max(total_gpus / 128, 1 / 16)

    def n(x: int) -> int:
        return max(1, round(x * scale))

    return [
        Workload("Job", "train-8gpu", n(2), 8, run_seconds=20),
        Workload("Job", "train-4gpu", n(4), 4, run_seconds=20),
        Workload("Deployment", "inference", n(16), 1, wave=1),
        Workload("Deployment", "finetune", n(6), 2, wave=1),
        Workload("Deployment", "preprocess-then-serve", n(4), 2, init_gpus=1, wave=1),
        Workload("Job", "burst", n(24), 1, run_seconds=8, wave=2),
    ]


SHARED_SLICE_MIB = 20000  # four of them fit an 80 GB GPU (81559 MiB)


def shared_workload(shared_nodes: int, gpu_split: int) -> list[Workload]:
    """The inference wave on the sharing nodes: 20000 MiB slices of one GPU each, ``gpu_split``
    of them per sharing node (none without sharing nodes)."""
    if shared_nodes < 1 or gpu_split < 2:
        return []
    return [
        Workload(
            "Deployment",
            "shared-inference",
            shared_nodes * gpu_split,
            1,
            wave=1,
            gpumem_mib=SHARED_SLICE_MIB,
        )
    ]


def _pod_template(w: Workload) -> JSON:
    labels = {"app": w.name, "demo.nodelock.io/workload": w.name}
    annotations = {RUN_SECONDS: str(w.run_seconds)} if w.run_seconds else {}
    limits = {DEFAULT_RESOURCE: str(w.gpus)}
    if w.gpumem_mib:
        limits[GPUMEM] = str(w.gpumem_mib)
    container: JSON = {
        "name": "main",
        "image": "registry.invalid/nodelock/sim:never-pulled",
        "resources": {"limits": limits},
    }
    spec: JSON = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if w.init_gpus:
        spec["initContainers"] = [
            {
                "name": "prepare",
                "image": "registry.invalid/nodelock/sim:never-pulled",
                "resources": {"limits": {DEFAULT_RESOURCE: str(w.init_gpus)}},
            }
        ]
    if w.kind == "Job":
        spec["restartPolicy"] = "Never"
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}


def manifest(w: Workload) -> tuple[str, JSON]:
    """REST collection path and object for one workload."""
    template = _pod_template(w)
    if w.kind == "Deployment":
        return f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": w.name},
            "spec": {
                "replicas": w.replicas,
                "selector": {"matchLabels": {"app": w.name}},
                "template": template,
            },
        }
    return f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": w.name},
        "spec": {
            "completions": w.replicas,
            "parallelism": w.replicas,
            "backoffLimit": 100,
            "template": template,
        },
    }


def _ms(values: Sequence[float], q: float) -> str:
    v = quantile(values, q)
    return "n/a" if math.isnan(v) else f"{v * 1000:.0f} ms"


TARGET_S = 1.5  # the burst target: creation -> running p99 and lock waits p99


_LOCK_HELD = re.compile(r"node (\S+): lock held by")


async def _watch_events(kube: KubeClient, tl: Timeline) -> None:
    """Contention as kube-scheduler reports it: a failed bind whose reason is a held lock."""

    def apply(kind: str, event: Mapping[str, Any]) -> None:
        if kind not in ("ADDED", "MODIFIED"):
            return
        obj = event.get("involvedObject", {})
        pod = f"{obj.get('namespace')}/{obj.get('name')}"
        source = str((event.get("source") or {}).get("component", ""))
        if source.startswith("nodelock") and obj.get("kind") == "Pod":
            name = str(event["metadata"]["name"])
            tl.nodelock_events[name] = (pod, int(event.get("count") or 1))
        m = _LOCK_HELD.search(str(event.get("message", "")))
        if m:
            tl.contention.append((m.group(1), pod, tl.now()))

    path = f"/api/v1/namespaces/{NAMESPACE}/events"
    # events already there when the demo starts (or relists) are not its contention
    await follow(kube, path, "demo events", lambda _: None, apply)


def _last_event(tl: Timeline) -> float:
    times = [*tl.running.values(), *(t1 for *_, t1 in tl.holds), *(t for *_, t in tl.contention)]
    return max(times, default=tl.now())


def html_report(tl: Timeline, summary: list[tuple[str, str]]) -> str:
    """The report as a page: lock holds per node over time, creation -> lock acquired (the
    scheduling cycle and the bind's wait in its node's queue), bind -> admission."""
    acquired = {holder: t0 for _, holder, t0, _ in tl.holds}
    waits = [t - tl.first_seen[p] for p, t in acquired.items() if p in tl.first_seen]
    admit = [tl.running[p] - tl.bound[p] for p in tl.running if p in tl.bound]
    holds = [htmlreport.Hold(n, h, t0, t1) for n, h, t0, t1 in tl.holds]
    nodes = sorted({*tl.leases, *(n for n, *_ in tl.holds)})
    data = htmlreport.ReportData(
        title="nodelock demo",
        duration_s=_last_event(tl) + 1.0,
        nodes=nodes,
        holds=holds,
        contention=[htmlreport.Contention(n, p, t) for n, p, t in tl.contention],
        lock_waits_s=[w for w in waits if w >= 0],
        bind_to_admit_s=[a for a in admit if a >= 0],
        summary=summary,
    )
    return htmlreport.render(data)


async def inventories(kube: KubeClient) -> dict[str, list[GPU]]:
    """Each node's published GPU inventory (node -> GPUs), for S1 on shared GPUs."""
    out = {}
    for node in (await kube.list("/api/v1/nodes"))["items"]:
        raw = node.get("metadata", {}).get("annotations", {}).get(Keys().gpus)
        if raw:
            out[str(node["metadata"]["name"])] = parse_inventory(raw)
    return out


def node_view(
    pods: Sequence[Mapping[str, Any]],
    gpus: Mapping[str, Sequence[GPU]],
    *,
    records: Mapping[str, PodRecord] | None = None,
) -> list[tuple[str, str]]:
    """Per GPU of the sharing nodes (split > 1): memory and cores committed against capacity
    and the pods holding them, from the kubelets' records (``records``: pod key -> what kubelet
    gave each container; by default the simulated kubelets' annotations; pods not Running or
    Pending, or admitted without devices, hold nothing), as (node and GPUs, what) rows."""
    held: dict[tuple[str, str], dict[str, Slice]] = {}
    for pod in pods:
        if pod.get("status", {}).get("phase", "Pending") not in ("Running", "Pending"):
            continue
        node = str(pod.get("spec", {}).get("nodeName") or "")
        spec = pod.get("spec", {})
        containers = {
            str(c.get("name")): c
            for c in [*spec.get("initContainers", []), *spec.get("containers", [])]
        }
        name = str(pod.get("metadata", {}).get("name"))
        if records is None:
            given = {c: list(seen.get("deviceIDs", [])) for c, seen in allocated(pod).items()}
        else:
            record = records.get(pod_key(pod), {})
            given = {c: list(r.devices.get(DEFAULT_RESOURCE, ())) for c, r in record.items()}
        for container, ids in given.items():
            try:
                claim = container_slice(containers.get(container, {}))
            except BadShare:
                claim = None
            for dev in {physical_of(str(d)) for d in ids}:
                # a container without a slice has its GPU whole
                held.setdefault((node, dev), {})[name] = claim or Slice(exclusive=True)
    rows: list[tuple[str, str]] = []
    for node in sorted(gpus):
        idle = []
        for gpu in sorted(gpus[node], key=lambda g: g.index):
            if gpu.split < 2:
                continue
            on = held.get((node, str(gpu.id)), {})
            if not on:
                idle.append(str(gpu.index))
                continue
            memory = sum(c.memory_on(gpu) for c in on.values())
            cores = sum(c.cores_claimed for c in on.values())
            whole = any(c.exclusive for c in on.values())
            use = "whole" if whole and len(on) == 1 else f"{len(on)}/{gpu.split} slices"
            rows.append(
                (
                    f"{node} GPU {gpu.index}",
                    f"{use}, memory {memory}/{gpu.memory_mib} MiB, "
                    f"cores {cores}/{FULL_CORES}%: {', '.join(sorted(on))}",
                )
            )
        if idle:
            rows.append((f"{node} GPU {', '.join(idle)}", "nothing committed"))
    return rows


def _gpu_pods(tl: Timeline) -> list[JSON]:
    out = []
    for p in tl.pods.values():
        spec = p.get("spec", {})
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            if DEFAULT_RESOURCE in c.get("resources", {}).get("limits", {}):
                out.append(p)
                break
    return out


def _progress_line(tl: Timeline, total: int) -> str:
    pods = _gpu_pods(tl)
    phases = Counter(p.get("status", {}).get("phase", "Pending") for p in pods)
    bound_pending = sum(
        1
        for p in pods
        if p.get("spec", {}).get("nodeName") and p.get("status", {}).get("phase") == "Pending"
    )
    unbound = sum(1 for p in pods if not p.get("spec", {}).get("nodeName"))
    held = sum(1 for le in tl.leases.values() if le.get("spec", {}).get("holderIdentity"))
    return (
        f"[{tl.now():6.1f}s] GPU pods {len(pods):>3}/{total}: unbound {unbound:>3}  "
        f"bound {bound_pending:>3}  running {phases['Running']:>3}  "
        f"succeeded {phases['Succeeded']:>3}  failed {phases['Failed']:>3}  "
        f"| locks held {held:>2}  handoffs {len(tl.holds):>3}"
    )


def _expected_pods(workloads: Sequence[Workload]) -> int:
    return sum(w.replicas for w in workloads)


def _done(tl: Timeline, workloads: Sequence[Workload]) -> bool:
    pods = _gpu_pods(tl)
    by_wl: Counter[str] = Counter()
    for p in pods:
        phase = p.get("status", {}).get("phase")
        wl = p.get("metadata", {}).get("labels", {}).get("demo.nodelock.io/workload", "")
        if phase in ("Running", "Succeeded"):
            by_wl[wl] += 1
    for w in workloads:
        if w.kind == "Deployment" and by_wl[w.name] < w.replicas:
            return False
        if w.kind == "Job":
            succeeded = sum(
                1
                for p in pods
                if p["metadata"]["labels"].get("demo.nodelock.io/workload") == w.name
                and p.get("status", {}).get("phase") == "Succeeded"
            )
            if succeeded < w.replicas:
                return False
    return True


async def run_workload(
    cluster: Cluster,
    workloads: Sequence[Workload],
    *,
    timeout_s: float,
    extender_metrics: str,
    out: Any = sys.stdout,
    records: Records | None = None,
) -> tuple[Timeline, dict[str, Any]]:
    """Submit the workload, show progress, and collect what the report needs; S1 and S2 are
    checked as the run goes from ``records`` (default: the simulated kubelets' annotations)."""
    async with await KubeClient.connect(str(cluster.kubeconfig)) as kube:
        await create_namespace(kube, NAMESPACE)
        background = await background_requests(kube, seconds=BACKGROUND_S)
        before = await api_requests(kube)
        run_started = time.monotonic()
        tl = Timeline()
        tasks = [
            asyncio.create_task(watch_pods(kube, tl, NAMESPACE)),
            asyncio.create_task(watch_leases(kube, tl)),
            asyncio.create_task(_watch_events(kube, tl)),
        ]
        total = _expected_pods(workloads)
        try:
            waves = sorted({w.wave for w in workloads})
            sent: set[int] = set()
            print(
                "submitting: training Jobs first, then Deployments at "
                f"{WAVE_AT_S[1]:.0f} s, then a burst of single-GPU pods at {WAVE_AT_S[2]:.0f} s",
                file=out,
            )
            tty = out.isatty() if hasattr(out, "isatty") else False
            last_line = 0.0
            deadline = time.monotonic() + timeout_s
            while True:
                for wave in waves:
                    if wave not in sent and tl.now() >= WAVE_AT_S[wave]:
                        for w in workloads:
                            if w.wave == wave:
                                path, body = manifest(w)
                                await kube.create(path, body)
                        sent.add(wave)
                await asyncio.sleep(0.5)
                # S1/S2 as the run goes (pods still being created: the count is judged at the end)
                pods = _gpu_pods(tl)
                snapshot = check_pods(
                    pods,
                    expected_pods=0,
                    require_admitted=False,
                    records=None if records is None else records(pods),
                )
                for kind in ("s1", "s2"):
                    for v in getattr(snapshot, kind):
                        if v not in getattr(tl.violations, kind):
                            getattr(tl.violations, kind).append(v)
                line = _progress_line(tl, total)
                if tty:
                    print("\r" + line, end="", file=out, flush=True)
                elif tl.now() - last_line >= 5:
                    print(line, file=out, flush=True)
                    last_line = tl.now()
                if len(sent) == len(waves) and _done(tl, workloads):
                    break
                if time.monotonic() > deadline:
                    print(f"\ntimed out after {timeout_s:.0f}s", file=out)
                    break
            await asyncio.sleep(1.0)  # let the last releases arrive
            if tty:
                print("", file=out)
            print(_progress_line(tl, total), file=out)
            after = await api_requests(kube)
            extender_text = scrape(extender_metrics)
            leases_text = cluster.kubectl("get", "leases", "-n", DEFAULT_LOCK_NAMESPACE)
            gpus = await inventories(kube)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    extra = {
        "requests": after - before,
        "net_requests": net_of_background(
            after - before, background, (time.monotonic() - run_started) / BACKGROUND_S
        ),
        "extender_metrics": metric_samples(extender_text),
        "leases_text": leases_text,
        "inventories": gpus,
        "records": None if records is None else records(_gpu_pods(tl)),
        "kubelet": "simulated kubelets'" if records is None else "real kubelets'",
    }
    return tl, extra


def events_per_pod(events: Mapping[str, tuple[str, int]], pods: int) -> str:
    """The Events nodelock wrote on pods, per pod (rate-limited: one Event per pod and reason,
    counted up, however many binds the pod went through)."""
    per_pod = Counter(pod for pod, _ in events.values())
    occurrences = sum(count for _, count in events.values())
    return (
        f"{len(events) / max(pods, 1):.2f} on average, at most {max(per_pod.values(), default=0)} "
        f"on one pod ({len(events)} Events counting {occurrences} occurrences)"
    )


def _describe(w: Workload) -> str:
    slice_ = f" ({w.gpumem_mib} MiB slice)" if w.gpumem_mib else ""
    return f"{w.name} {w.replicas}x{w.gpus} GPU{slice_}"


def slowest(tl: Timeline, keys: Iterable[str], n: int = 3) -> list[str]:
    """The ``n`` pods of ``keys`` slowest from creation to running, slowest first, each with how
    long it waited to be bound and how long it took from bound to running (the handoff and
    kubelet); pods not seen both created and running are left out."""
    seen = [
        (tl.running[k] - tl.first_seen[k], k)
        for k in keys
        if k in tl.first_seen and k in tl.running
    ]
    out = []
    for total, key in sorted(seen, reverse=True)[:n]:
        bound = tl.bound.get(key)
        split = ""
        if bound is not None:
            split = (
                f" (bound after {(bound - tl.first_seen[key]) * 1000:.0f} ms, "
                f"running {(tl.running[key] - bound) * 1000:.0f} ms later)"
            )
        out.append(f"{key} {total * 1000:.0f} ms{split}")
    return out


def report(
    tl: Timeline, workloads: Sequence[Workload], extra: Mapping[str, Any]
) -> tuple[str, list[tuple[str, str]]]:
    """The end-of-demo report, as text and as summary rows for the HTML page."""
    pods = _gpu_pods(tl)
    gpus: Mapping[str, Sequence[GPU]] = extra.get("inventories", {})
    records: Mapping[str, PodRecord] | None = extra.get("records")
    final = check_pods(
        pods, expected_pods=_expected_pods(workloads), inventories=gpus, records=records
    )
    final.s1 = sorted(set(final.s1) | set(tl.violations.s1))
    final.s2 = sorted(set(final.s2) | set(tl.violations.s2))
    handed_off = {str(p["spec"]["nodeName"]) for p in pods if p.get("spec", {}).get("nodeName")}
    check_locks_free(tl.leases.values(), final, nodes=handed_off)
    placed = [k for k in tl.running if k in {pod_key(p) for p in pods}]
    to_running = [tl.running[k] - tl.first_seen[k] for k in placed if k in tl.first_seen]
    holds = [t1 - t0 for _, _, t0, t1 in tl.holds]
    samples = extra["extender_metrics"]
    waits = histogram(samples, "nodelock_extender_bind_queue_wait_seconds")
    waited = waits.count - waits.at_most(0.1)
    contended = metric_sum(
        samples, "nodelock_extender_requests_total", verb="bind", result="contended"
    )
    requests: Counter[tuple[str, str]] = extra["requests"]
    n = max(len(pods), 1)
    net: Counter[tuple[str, str]] = extra["net_requests"]
    handoff_writes = sum(net.get(k, 0) for k in HANDOFF_WRITES)
    lists = sum(c for (verb, _), c in net.items() if verb == "LIST")
    last = max(tl.running.values(), default=math.nan)
    summary: list[tuple[str, str]] = [
        ("workload", ", ".join(_describe(w) for w in workloads)),
        ("GPU pods admitted", f"{len(placed)}/{len(pods)}, the last {last:.1f} s after the start"),
        ("creation -> running", f"p50 {_ms(to_running, 0.5)}, p99 {_ms(to_running, 0.99)}"),
        ("slowest to running", "; ".join(slowest(tl, placed)) or "-"),
        ("lock holds", f"{len(holds)} handoffs, p50 {_ms(holds, 0.5)}, p99 {_ms(holds, 0.99)}"),
        (
            "lock waits",
            f"{waited:.0f} of {waits.count:.0f} binds waited over 100 ms for their turn, p50 "
            f"{waits.quantile(0.5) * 1000:.0f} ms, p99 {waits.quantile(0.99) * 1000:.0f} ms; "
            f"{waits.at_most(TARGET_S) / max(waits.count, 1):.0%} within {TARGET_S:g} s",
        ),
        (
            "contention",
            f"{contended:.0f} binds could not get their turn in time and were retried",
        ),
        ("API requests per GPU pod", f"{sum(requests.values()) / n:.1f} (all clients)"),
        (
            "handoff writes per GPU pod",
            f"{handoff_writes / n:.2f} (Lease POST/PUT + pods/binding, net of the idle "
            "background: node heartbeats also write Leases)",
        ),
        ("LISTs during the run", f"{lists:.0f}"),
        ("nodelock Events per GPU pod", events_per_pod(tl.nodelock_events, len(pods))),
    ]
    checks = (
        ("S1", "no GPU assigned to two live pods", final.s1),
        ("S2", "every container got exactly its assignment", final.s2),
        ("S3", "no lock left held", final.s3),
        ("L1", "every GPU pod bound and admitted", [*final.l1, *final.coverage]),
    )
    for name, desc, found in checks:
        summary.append((f"{name} {desc}", "PASS" if not found else f"FAIL ({len(found)})"))
    lines = ["", "=" * 78, "nodelock demo report", "=" * 78]
    lines += [f"{label}: {value}" for label, value in summary[: -len(checks)]]
    lines.append(
        "  lock holds: bind -> device plugin release, seen on a Lease watch; lock waits: a bind "
        "joining its node's queue -> taking the lock, from the extender's histogram (quantiles "
        "interpolated within buckets, as Prometheus does)"
    )
    p99_running = quantile(to_running, 0.99)
    verdict = "met" if p99_running <= TARGET_S and waits.quantile(0.99) <= TARGET_S else "MISSED"
    lines.append(
        f"  target: creation -> running p99 and lock waits p99 each <= {TARGET_S:g} s: {verdict}"
    )
    top = ", ".join(f"{v} {r} {c / n:.2f}" for (v, r), c in requests.most_common(8))
    lines.append(f"  most frequent requests per GPU pod: {top}")
    whose = extra.get("kubelet", "simulated kubelets'")
    lines.append(f'invariants (docs/design.md, "Invariants"), checked from the {whose} records:')
    for name, desc, found in checks:
        verdict = "PASS" if not found else f"FAIL ({len(found)})"
        lines.append(f"  {name} {desc:<45} {verdict}")
        lines.extend(f"      {v}" for v in found[:5])
    shared = node_view(pods, gpus, records=records)
    if shared:
        lines.append("node view: the sharing nodes' GPUs at the end (slices, memory, cores, pods)")
        lines.extend(f"  {where}: {what}" for where, what in shared)
    lines.append(f"\n$ kubectl get leases -n {DEFAULT_LOCK_NAMESPACE}")
    lines.append(str(extra["leases_text"]).rstrip())
    # the page shows the node view as summary rows; the text has it above
    summary += [(f"node view: {where}", what) for where, what in shared]
    return "\n".join(lines), summary


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the demo: a local GPU cluster and a GPU workload")
    p.add_argument(
        "--nodes",
        type=int,
        default=None,
        help=f"GPU nodes (default {DEFAULT_SHAPE.nodes}; {CONTAINERD_SHAPE.nodes} with "
        "--runtime containerd)",
    )
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help=f"GPUs a node (default {DEFAULT_SHAPE.gpus_per_node}; "
        f"{CONTAINERD_SHAPE.gpus_per_node} with --runtime containerd)",
    )
    p.add_argument(
        "--shared-nodes",
        type=int,
        default=None,
        help="how many of the nodes (the last ones) share their GPUs, for the inference wave "
        f"(default {DEFAULT_SHAPE.shared_nodes}; not with --runtime containerd)",
    )
    p.add_argument(
        "--gpu-split",
        type=int,
        default=None,
        help="virtual devices per GPU on the sharing nodes "
        f"(default {DEFAULT_SHAPE.gpu_split}; not with --runtime containerd)",
    )
    p.add_argument(
        "--runtime",
        choices=["containerd"],
        default=None,
        help="containerd: the demo as an install (docs/containerd-nodes.md): nodes with "
        "containerd, runc, CNI and kube-proxy, the image built from deploy/Containerfile and the "
        "Helm chart installed on them, a small GPU workload in real containers, each "
        "container's printed devices against its assignment, and nodelock audit (needs root "
        "and `make runtime-deps`)",
    )
    p.add_argument(
        "--kubelet",
        choices=[k.value for k in KubeletKind],
        default=KubeletKind.SIM.value,
        help="what runs the GPU nodes: sim, the simulated kubelet (kubelet's device manager in "
        "a harness), or real, the kubelet binary of the cluster's release against a fake "
        "container runtime; the invariants are then checked from the real kubelets' device "
        "checkpoints and the container configs they handed the runtime (default sim)",
    )
    p.add_argument("--state-dir", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="leave the cluster running at the end")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the workload")
    p.set_defaults(func=_main)


@dataclass(frozen=True)
class DemoShape:
    nodes: int
    gpus_per_node: int
    shared_nodes: int = 0
    gpu_split: int = 1


DEFAULT_SHAPE = DemoShape(nodes=16, gpus_per_node=8, shared_nodes=2, gpu_split=4)
# real containers: a cluster a laptop starts in a couple of minutes
CONTAINERD_SHAPE = DemoShape(nodes=2, gpus_per_node=4)


def demo_shape(args: argparse.Namespace) -> DemoShape:
    """The cluster's shape from the command line, each size not given taken from the default
    of the runtime asked for; ``DevclusterError`` for what a runtime does not take."""
    if args.runtime is None:
        base = DEFAULT_SHAPE
    else:
        base = CONTAINERD_SHAPE
        given = [
            flag
            for flag, value in (
                ("--shared-nodes", args.shared_nodes),
                ("--gpu-split", args.gpu_split),
                ("--kubelet real", None if args.kubelet == KubeletKind.SIM.value else 1),
            )
            if value is not None
        ]
        if given:
            raise DevclusterError(
                f"--runtime containerd does not take {', '.join(given)}: its nodes run the real "
                "kubelet and serve whole simulated GPUs through the chart's device plugin"
            )

    def pick(value: int | None, default: int) -> int:
        return default if value is None else int(value)

    return DemoShape(
        nodes=pick(args.nodes, base.nodes),
        gpus_per_node=pick(args.gpus_per_node, base.gpus_per_node),
        shared_nodes=pick(args.shared_nodes, base.shared_nodes),
        gpu_split=pick(args.gpu_split, base.gpu_split),
    )


def gpu_cluster_options(args: argparse.Namespace) -> dict[str, Any]:
    """``up_gpu_cluster``'s arguments from the demo's command line."""
    shape = demo_shape(args)
    return {
        "nodes": shape.nodes,
        "gpus_per_node": shape.gpus_per_node,
        "gpu_split": shape.gpu_split,
        "shared_nodes": shape.shared_nodes,
        "kubelet": KubeletKind(args.kubelet),
    }


def _kubelets(kind: KubeletKind) -> str:
    if kind is KubeletKind.REAL:
        return "real kubelets, containers faked"
    return "simulated kubelets"


def _main(args: argparse.Namespace) -> int:
    from devcluster.cluster import default_state_dir

    shape = demo_shape(args)
    if args.runtime is not None:
        return _main_containerd(args, shape)
    state = args.state_dir or default_state_dir().with_name("demo")
    t0 = time.monotonic()
    print("nodelock demo: building or reusing the Kubernetes binaries and the node harness")
    binaries = ensure_control_plane()
    kubelet = KubeletKind(args.kubelet)
    if kubelet is KubeletKind.REAL:
        ensure_cri()
        ensure_kubelet(version=binaries.kubernetes_version)
    else:
        ensure_simkubelet()
    cluster = Cluster(state, binaries=binaries)
    if cluster.running():
        print(f"stopping the previous demo cluster in {state}")
        cluster.down()
    # every demo starts from an empty cluster: the previous run's objects (its namespace, pods,
    # Leases) live in etcd's data and would otherwise come back with it
    shutil.rmtree(cluster.state_dir / "etcd", ignore_errors=True)
    cluster.up()
    try:
        print(
            f"control plane up ({time.monotonic() - t0:.1f}s); starting the extender and "
            f"{shape.nodes} GPU nodes x {shape.gpus_per_node} GPUs ({_kubelets(kubelet)})"
        )
        up_gpu_cluster(cluster, **gpu_cluster_options(args))
        print(
            f"GPU cluster ready ({time.monotonic() - t0:.1f}s): "
            f"{shape.nodes * shape.gpus_per_node} GPUs"
        )
        workloads = default_workload(shape.nodes * shape.gpus_per_node)
        workloads += shared_workload(shape.shared_nodes, shape.gpu_split)
        ext_url = cluster.settings()["extender"]["metrics"][0]  # the plain-HTTP metrics port
        tl, extra = asyncio.run(
            run_workload(
                cluster,
                workloads,
                timeout_s=args.timeout,
                extender_metrics=f"{ext_url}/metrics",
                records=real_kubelet_records(cluster.state_dir)
                if kubelet is KubeletKind.REAL
                else None,
            )
        )
        text, summary = report(tl, workloads, extra)
        # the scheduler's assignments against kubelet's PodResources and the plugin's answers
        checked = asyncio.run(audit_devcluster(cluster.state_dir))
        text += "\n\n" + checked.text()
        verdict = f"FAIL ({len(checked.disagreements)})" if checked.disagreements else "PASS"
        summary.append(("audit: assignments, kubelet's PodResources, plugin answers", verdict))
        print(text)
        (cluster.state_dir / "report.txt").write_text(text + "\n")
        html = cluster.state_dir / "report.html"
        html.write_text(html_report(tl, summary))
        print(f"\nThe report as a page, with lock holds per node over time: file://{html}")
        ok = not any(value.startswith("FAIL") for _, value in summary)
    except BaseException:
        if not args.keep:
            cluster.down()
        raise
    if args.keep:
        print("\nThe cluster is still running. Look around:")
        print(f"  export KUBECONFIG={cluster.kubeconfig} PATH={binaries.directory}:$PATH")
        print(
            f"  kubectl get pods -n {NAMESPACE} -o wide;"
            f" kubectl get leases -n {DEFAULT_LOCK_NAMESPACE}"
        )
        print("  .venv/bin/nodelock locks")
        print(f"  curl {cluster.settings()['extender']['metrics'][0]}/metrics")
        print(f"Stop it with: .venv/bin/nodelock devcluster down --state-dir {cluster.state_dir}")
    else:
        cluster.down()
        print("\ncluster stopped (run with --keep to leave it up and look around)")
    return 0 if ok else 1


def _main_containerd(args: argparse.Namespace, shape: DemoShape) -> int:
    """``demo --runtime containerd``: nodelock.demo_containerd in its own state directory."""
    from devcluster.cluster import default_state_dir
    from nodelock import demo_containerd

    state = args.state_dir or default_state_dir().with_name("demo-containerd")
    print("nodelock demo: building or reusing the Kubernetes binaries")
    cluster = Cluster(state, binaries=ensure_control_plane())
    demo_containerd.prepare(cluster)
    return demo_containerd.run_demo(
        cluster,
        nodes=shape.nodes,
        gpus_per_node=shape.gpus_per_node,
        keep=args.keep,
        timeout_s=args.timeout,
    )
