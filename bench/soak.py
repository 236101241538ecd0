"""The fault campaign: GPU workload churn under seeded faults on a devcluster, its whole history
checked.

    .venv/bin/python -m bench.soak --minutes 3 --seed 7 [--nodes 4] [--kubelet real|sim]
                                   [--results-dir bench/results]

The devcluster (``devcluster.cluster.throwaway_cluster``) has two extender replicas behind one
address and ``--nodes`` GPU nodes of four simulated GPUs each: the last node has GPU 0 in MIG mode
(``3g.40gb+4x1g.10gb``), the one before it shares its GPUs as four slices each, the others hand
out whole GPUs.  Each node is a real kubelet of the cluster's release against a runtime that
fakes only containers (``--kubelet real``, the default: ``devcluster.realkubelet``), or the
simulated kubelet (``--kubelet sim``: kubelet's own device manager in a Go harness).  Node locks
last ``LEASE_S`` seconds.

For ``--minutes`` the workload (``bench.soak_workload``) churns and the nemesis
(``bench.soak_nemesis``) injects the faults its seed schedules; a sampler reads every GPU pod
and every node lock about once a second, with what kubelet gave each pod (a real kubelet's device
checkpoint and the container configs it handed the runtime, read just after the pods; the
simulated kubelet's annotation), and the checker (``bench.soak_check``) judges each sample.
Then the run settles: no new work, no new fault; every GPU pod left must be Running or
Succeeded within ``L1_BOUND_S`` of the last fault's heal, one probe pod per node must run (a
lock whose holder left may be taken over), every lock must end free, and ``nodelock audit``
must find the scheduler's, kubelet's and the plugin's views equal.  The workload's Jobs may
still start their next pods after it stops, so the final judgment is made on the first sample
in which every GPU pod is Running, Succeeded or Failed and no lock is held (a pod a moment old
is not a stuck one), or, when none comes within ``L1_BOUND_S`` of the last heal, on the last.
After the cluster is down, no process, listening port or unix socket of it may be left.

Prints the faults by kind, the pods created, run and failed (with reasons), the longest lock
hold and the longest wait from a pod's first sight to Running, and each violation with the
events and samples around it; writes ``soak.json`` in ``--results-dir``.  Exit 0 when no
violation was found, 1 otherwise, 2 when the run could not be made.

``--plant`` is the checker's own test, a bug put in on purpose that the campaign must report:
``no-pending-guard`` starts the extender replicas with ``bench/soak_plant`` on their
``PYTHONPATH``, whose ``sitecustomize`` removes the takeover guard for a holder Pending on the
lock's node; ``edit-assignment`` rewrites, halfway through, a running pod's assignment annotation
to a device kubelet did not give it (what a bug that hands a pod the wrong devices leaves
behind).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import random
import socket
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.soak_check import (
    KUBELET,
    Checker,
    Event,
    Sample,
    asks_for_devices,
    key_of,
    lease_view,
    minimal_pod,
    record_json,
)
from bench.soak_nemesis import KINDS, Fault, Nemesis, schedule
from bench.soak_workload import Workload
from devcluster.admission import install_gpu_pod_policies
from devcluster.cluster import Cluster, throwaway_cluster
from devcluster.gpunodes import (
    NodeSpec,
    listing_of,
    node_names,
    pod_resources_socket,
    start_extender,
    start_node,
    wait_nodes_ready,
    wait_ok,
)
from devcluster.realkubelet import KubeletKind, records_under
from deviceplugin.kubeletview import KubeletViewError, list_pod_resources
from handoff.wire import DEFAULT_LOCK_NAMESPACE, Keys, parse_inventory
from kube.client import JSON, KubeClient, lease_path, namespace_path, node_path, pod_path
from nodelock.audit import audit, devcluster_sources

RESULTS = Path(__file__).resolve().parent / "results"
LEASE_S = 5
GPUS = 4
MIG_LAYOUT = "3g.40gb+4x1g.10gb"
GPU_MIB = 81920
SPLIT = 4
SAMPLE_S = 1.0
PODRESOURCES_EVERY = 5  # every 5th sample also reads each kubelet's PodResources List
RESOURCE = "nvidia.com/gpu"
L1_BOUND_S = 150.0  # every GPU pod left Running or Succeeded this long after the last heal
PROBE_BOUND_S = 60.0
PLANTS = ("edit-assignment", "no-pending-guard")
PLANT_DIR = Path(__file__).resolve().parent / "soak_plant"


def specs_for(nodes: int, kubernetes_version: str | None) -> list[NodeSpec]:
    """The campaign's nodes: whole GPUs, then (from 2 nodes) one sharing node, then (from 3) one
    node with GPU 0 in MIG mode."""
    listing = listing_of(kubernetes_version)
    out = []
    for i, name in enumerate(node_names(nodes)):
        spec = NodeSpec(name, GPUS, memory_mib=GPU_MIB, pod_resources_list=listing)
        if nodes >= 3 and i == nodes - 1:
            spec = dataclasses.replace(spec, mig=((0, MIG_LAYOUT),))
        elif nodes >= 2 and i == (nodes - 2 if nodes >= 3 else nodes - 1):
            spec = dataclasses.replace(spec, gpu_split=SPLIT)
        out.append(spec)
    return out


def start_gpu_side(
    cluster: Cluster,
    specs: Sequence[NodeSpec],
    extender_env: Mapping[str, str],
    kubelet: KubeletKind = KubeletKind.REAL,
) -> None:
    """The extender replicas (restarted with ``extender_env`` when it is not empty) and the
    nodes, with ``kubelet``'s kind of kubelet."""
    install_gpu_pod_policies(cluster)
    start_extender(cluster, replicas=2, extra_args=[f"--lease-duration={LEASE_S}"])
    if extender_env:
        urls = cluster.settings()["extender"]["metrics"]
        for i, url in enumerate(urls):
            cluster.restart_component(f"extender-{i}", env=extender_env)
            wait_ok(cluster, f"extender-{i}", f"{url}/readyz", 60.0)
    for spec in specs:
        start_node(cluster, spec, kubelet=kubelet)
    wait_nodes_ready(cluster, list(specs))


def extender_env(plant: str | None) -> dict[str, str]:
    """The extender replicas' environment: the planted bug's ``sitecustomize`` on their path."""
    return {"PYTHONPATH": str(PLANT_DIR)} if plant == "no-pending-guard" else {}


@dataclasses.dataclass
class Run:
    """One campaign in progress: the cluster, the clock, the history."""

    cluster: Cluster
    specs: Sequence[NodeSpec]
    args: argparse.Namespace
    started: float = dataclasses.field(default_factory=time.monotonic)
    events: list[Event] = dataclasses.field(default_factory=list)
    checker: Checker | None = None
    history_out: list[str] = dataclasses.field(default_factory=list)
    sample_errors: int = 0
    samples_taken: int = 0
    sampling: bool = True

    def now(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def log(self, kind: str, what: str, fault: str = "") -> None:
        e = Event(self.now(), kind, what, fault)
        self.events.append(e)
        if kind in ("fault", "heal", "restart", "skip", "plant") or self.args.verbose:
            print(f"  t={e.t:7.1f}s {kind:8} {what}", flush=True)

    async def sample(self, kube: KubeClient) -> tuple[list[JSON], list[JSON]] | None:
        try:
            pods = (await kube.list(pod_path()))["items"]
            leases = (await kube.list(lease_path(DEFAULT_LOCK_NAMESPACE)))["items"]
        except Exception:  # the API server may be down: the sample is missed
            self.sample_errors += 1
            return None
        assert self.checker is not None
        t = self.now()
        self.samples_taken += 1
        gpu_pods = [p for p in pods if asks_for_devices(p)]
        sampled = [minimal_pod(p) for p in gpu_pods]
        if self.args.kubelet == KubeletKind.REAL.value:
            records = await asyncio.to_thread(records_under, self.cluster.state_dir, gpu_pods)
            for pod in sampled:
                record = records.get(key_of(pod))
                if record is not None:
                    pod[KUBELET] = record_json(record)
        listed = {}
        if self.samples_taken % PODRESOURCES_EVERY == 0:
            listed = await asyncio.to_thread(self.pod_resources)
        sample = Sample(
            t,
            sampled,
            {str(le["metadata"]["name"]): lease_view(le) for le in leases},
            listed,
        )
        self.checker.add(sample)
        if self.args.history:
            self.history_out.append(json.dumps(_sample_json(sample)))
        return pods, leases

    def pod_resources(self) -> dict[str, dict[str, dict[str, list[str]]]]:
        """Every node's kubelet PodResources List (nvidia.com/gpu); a node whose kubelet does
        not answer (a fault) is left out."""
        out: dict[str, dict[str, dict[str, list[str]]]] = {}
        for spec in self.specs:
            socket_path = pod_resources_socket(self.cluster.state_dir, spec.name)
            try:
                listed = list_pod_resources(socket_path, resource=RESOURCE, timeout_s=2.0)
            except KubeletViewError:
                continue
            out[spec.name] = {
                p.key: {c: sorted(ids) for c, ids in p.containers.items()} for p in listed
            }
        return out

    async def sampler(self, kube: KubeClient) -> None:
        while self.sampling:
            t0 = time.monotonic()
            await self.sample(kube)
            await asyncio.sleep(max(0.0, SAMPLE_S - (time.monotonic() - t0)))


def _sample_json(s: Sample) -> JSON:
    return {
        "t": s.t,
        "pods": list(s.pods),
        "leases": {n: dataclasses.asdict(v) for n, v in s.leases.items()},
        "listed": s.listed,
    }


async def _inventories(kube: KubeClient) -> dict[str, str]:
    """Node -> its inventory annotation (``nodelock.io/gpus``)."""
    out = {}
    for node in (await kube.list(node_path()))["items"]:
        raw = node["metadata"].get("annotations", {}).get(Keys().gpus)
        if raw:
            out[str(node["metadata"]["name"])] = str(raw)
    return out


async def campaign(cluster: Cluster, specs: Sequence[NodeSpec], args: argparse.Namespace) -> JSON:
    run_s = args.minutes * 60.0
    nodes = [s.name for s in specs]
    replicas = sorted(
        n for n in cluster.state.procs() if n.startswith("extender-") and n != "extender-lb"
    )
    faults = schedule(args.seed, run_s=run_s, nodes=nodes, replicas=replicas, lease_s=LEASE_S)
    async with await KubeClient.connect(str(cluster.kubeconfig)) as kube:
        run = Run(cluster, specs, args)
        inventories = await _inventories(kube)
        run.checker = Checker(
            lease_s=LEASE_S,
            inventories={n: parse_inventory(raw) for n, raw in inventories.items()},
        )
        run.history_out.append(json.dumps({"inventories": inventories}))
        shared = next((s.name for s in specs if s.gpu_split > 1), None)
        mig = next((s.name for s in specs if s.mig), None)
        workload = Workload(
            kube,
            random.Random(args.seed * 7919 + 1),
            lambda what: run.log("workload", what),
            shared_node=shared,
            mig_node=mig,
        )
        nemesis = Nemesis(cluster, kube, run.log)
        nemesis.base_env = {name: extender_env(args.plant) for name in replicas}
        print(f"campaign: {len(faults)} faults scheduled over {run_s:.0f}s, seed {args.seed}")
        run.started = time.monotonic()
        sampler = asyncio.create_task(run.sampler(kube))
        supervisor = asyncio.create_task(nemesis.supervise())
        injecting = asyncio.create_task(nemesis.run(faults, run.started))
        planting = args.plant == "edit-assignment"
        plant = asyncio.create_task(_plant(run, kube, run_s / 2)) if planting else None
        wl_rng = random.Random(args.seed * 7919 + 2)
        while time.monotonic() - run.started < run_s:
            await workload.step()
            await asyncio.sleep(wl_rng.uniform(0.3, 1.5))
        await injecting
        if plant is not None:
            await plant
        last_heal = run.now()
        run.log("note", "the workload stops; the last fault has healed")
        settled_at = await _settle(run, kube, last_heal)
        probes_s = await _probes(run, kube, nodes)
        await _locks_free(kube)
        final = await _final(run, kube, until=last_heal + L1_BOUND_S)
        supervisor.cancel()
        run.sampling = False
        await sampler
        assert run.checker is not None
        pods, leases = final
        locked = sorted(
            {
                str(p["spec"].get("nodeName"))
                for s in run.checker.samples
                for p in s.pods
                if Keys().token in p["metadata"]["annotations"] and p["spec"].get("nodeName")
            }
        )
        run.checker.finish(
            [minimal_pod(p) for p in pods], leases, run.events, t=run.now(), locked_nodes=locked
        )
        audited = await audit(kube, devcluster_sources(cluster.state_dir))
        if args.history:
            lines = run.history_out + [json.dumps(dataclasses.asdict(e)) for e in run.events]
            args.history.write_text("\n".join(lines) + "\n")
        await _clean_namespaces(run, kube)
        return _report(
            run, faults, nemesis, workload, audited, last_heal, settled_at, probes_s, run_s
        )


async def _plant(run: Run, kube: KubeClient, at_s: float) -> None:
    """The planted fault: a running whole-GPU pod's assignment rewritten to a device kubelet did
    not give it."""
    await asyncio.sleep(at_s)
    keys = Keys()
    for _ in range(60):
        with_ok = await run.sample(kube)
        if with_ok is not None:
            for pod in with_ok[0]:
                notes = pod["metadata"].get("annotations", {})
                try:
                    assigned = json.loads(notes.get(keys.assignment, "null"))
                except ValueError:
                    continue
                if pod["status"].get("phase") != "Running" or not isinstance(assigned, dict):
                    continue
                if len(assigned) != 1 or any("::" in d for ids in assigned.values() for d in ids):
                    continue
                container, ids = next(iter(assigned.items()))
                if len(ids) != 1 or not ids[0][-1].isdigit():
                    continue
                other = ids[0][:-1] + str((int(ids[0][-1]) + 1) % GPUS)
                patch = {
                    "metadata": {"annotations": {keys.assignment: json.dumps({container: [other]})}}
                }
                ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                await kube.patch(pod_path(ns, name), patch)
                run.log("plant", f"{ns}/{name}: assignment rewritten from {ids} to [{other}]")
                return
        await asyncio.sleep(1.0)
    run.log("plant", "no running whole-GPU pod to plant on")


async def _gpu_pods(kube: KubeClient) -> list[JSON]:
    return [p for p in (await kube.list(pod_path()))["items"] if asks_for_devices(p)]


async def _settle(run: Run, kube: KubeClient, last_heal: float) -> float | None:
    """Wait until every GPU pod is Running, Succeeded or Failed; when that was, or None."""
    while run.now() - last_heal < L1_BOUND_S:
        try:
            pods = await _gpu_pods(kube)
        except Exception:
            await asyncio.sleep(1)
            continue
        if not _unsettled(pods):
            return run.now()
        await asyncio.sleep(1)
    return None


async def _probes(run: Run, kube: KubeClient, nodes: Sequence[str]) -> float | None:
    """One 1-GPU pod pinned to each node; seconds until all ran, or None."""
    ns = "soak-probes"
    await kube.create(namespace_path(), {"metadata": {"name": ns}})
    t0 = run.now()
    for node in nodes:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"probe-{node}"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.invalid/sim:never-pulled",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
                "nodeSelector": {"kubernetes.io/hostname": node},
                "terminationGracePeriodSeconds": 0,
            },
        }
        await kube.create(pod_path(ns), body)
        run.log("workload", f"pod {ns}/probe-{node} created (the final probe)")
    while run.now() - t0 < PROBE_BOUND_S:
        pods = (await kube.list(pod_path(ns)))["items"]
        if len(pods) == len(nodes) and all(p["status"].get("phase") == "Running" for p in pods):
            return run.now() - t0
        await asyncio.sleep(0.5)
    return None


async def _locks_free(kube: KubeClient) -> None:
    deadline = time.monotonic() + LEASE_S * 4 + 10
    while time.monotonic() < deadline:
        leases = (await kube.list(lease_path(DEFAULT_LOCK_NAMESPACE)))["items"]
        if not any((le.get("spec") or {}).get("holderIdentity") for le in leases):
            return
        await asyncio.sleep(0.5)


async def _final(run: Run, kube: KubeClient, *, until: float) -> tuple[list[JSON], list[JSON]]:
    """The sample the end is judged on: the first in which every GPU pod is Running, Succeeded
    or Failed and no node lock is held, else the last one taken by ``until`` (run time; at
    least 30 tries to reach the API server)."""
    last: tuple[list[JSON], list[JSON]] | None = None
    tries = 0
    while True:
        tries += 1
        got = await run.sample(kube)
        if got is not None:
            last = got
            if _settled(*got):
                return got
        if run.now() >= until and (last is not None or tries >= 30):
            break
        await asyncio.sleep(1)
    if last is None:
        raise RuntimeError("the API server did not answer at the end of the run")
    return last


def _unsettled(pods: Sequence[JSON]) -> list[JSON]:
    """The GPU pods not yet Running, Succeeded or Failed."""
    return [
        p
        for p in pods
        if asks_for_devices(p)
        and (p.get("status") or {}).get("phase") not in ("Running", "Succeeded", "Failed")
    ]


def _settled(pods: Sequence[JSON], leases: Sequence[JSON]) -> bool:
    """Every GPU pod Running, Succeeded or Failed, and no node lock held."""
    return not _unsettled(pods) and not any(
        (le.get("spec") or {}).get("holderIdentity") for le in leases
    )


async def _clean_namespaces(run: Run, kube: KubeClient) -> None:
    for ns in (await kube.list(namespace_path()))["items"]:
        name = ns["metadata"]["name"]
        if name.startswith("soak-"):
            await kube.delete(namespace_path(name))


def _report(
    run: Run,
    faults: Sequence[Fault],
    nemesis: Nemesis,
    workload: Workload,
    audited: Any,
    last_heal: float,
    settled_at: float | None,
    probes_s: float | None,
    run_s: float,
) -> JSON:
    checker = run.checker
    assert checker is not None
    if settled_at is None:
        checker.violations.append(
            _violation(
                "L1", run.now(), f"GPU pods not settled {L1_BOUND_S:.0f}s after the last heal"
            )
        )
    if probes_s is None:
        checker.violations.append(
            _violation("L1", run.now(), f"a probe pod did not run within {PROBE_BOUND_S:.0f}s")
        )
    for d in audited.disagreements:
        checker.violations.append(_violation("audit", run.now(), str(d)))
    first: dict[str, float] = {}
    ran: dict[str, float] = {}
    keys: dict[str, str] = {}
    holds: dict[tuple[str, str, int], list[float]] = {}
    for s in checker.samples:
        for p in s.pods:
            uid = str(p["metadata"]["uid"])
            keys[uid] = key_of(p)
            first.setdefault(uid, s.t)
            if p["status"]["phase"] in ("Running", "Succeeded"):
                ran.setdefault(uid, s.t)
        for node, lv in s.leases.items():
            if lv.holder:
                span = holds.setdefault((node, lv.holder, lv.token), [s.t, s.t])
                span[1] = s.t
    waits = sorted(ran[u] - first[u] for u in ran)
    longest_wait = max(ran, key=lambda u: ran[u] - first[u], default=None)
    real_holds = {k: v for k, v in holds.items() if not k[1].startswith("soak-operator/")}
    longest_hold = max(real_holds, key=lambda k: real_holds[k][1] - real_holds[k][0], default=None)
    failures = checker.failures()
    reasons: dict[str, int] = {}
    for _, reason, _ in failures.values():
        reasons[reason] = reasons.get(reason, 0) + 1
    by_kind = {k: nemesis.injected.get(k, 0) for k in KINDS if nemesis.injected.get(k)}
    return {
        "command": f"python -m bench.soak --minutes {run.args.minutes:g} --seed {run.args.seed}"
        + (f" --nodes {run.args.nodes}" if run.args.nodes != 4 else "")
        + (f" --kubelet {run.args.kubelet}" if run.args.kubelet != KubeletKind.REAL.value else "")
        + (f" --plant {run.args.plant}" if run.args.plant else ""),
        "seed": run.args.seed,
        "minutes": run.args.minutes,
        "kubelet": run.args.kubelet,
        "nodes": [
            {"name": s.name, "gpus": s.gpus, "split": s.gpu_split, "mig": [list(m) for m in s.mig]}
            for s in run.specs
        ],
        "lease_s": LEASE_S,
        "plant": run.args.plant,
        "faults": {
            "scheduled": len(faults),
            "injected": sum(by_kind.values()),
            "kinds": len(by_kind),
            "by_kind": by_kind,
            "restarts": nemesis.restarts,
        },
        "pods": {
            "created_by_workload": workload.created,
            "seen": len(first),
            "ran": len(ran),
            "failed": len(failures),
            "failed_reasons": reasons,
            "never_ran": len(first) - len(ran) - len(set(failures)),
        },
        "api_calls_failed": workload.failed_calls,
        "samples": len(checker.samples),
        "samples_missed": run.sample_errors,
        "last_heal_s": last_heal,
        "settled_s_after_last_heal": None
        if settled_at is None
        else round(settled_at - last_heal, 1),
        "l1_bound_s": L1_BOUND_S,
        "probes_ran_s": None if probes_s is None else round(probes_s, 1),
        "longest_wait": None
        if longest_wait is None
        else {
            "pod": keys[longest_wait],
            "seconds": round(ran[longest_wait] - first[longest_wait], 1),
            "p50_s": round(statistics.median(waits), 1),
        },
        "longest_hold": None
        if longest_hold is None
        else {
            "node": longest_hold[0],
            "holder": longest_hold[1],
            "token": longest_hold[2],
            "seconds": round(real_holds[longest_hold][1] - real_holds[longest_hold][0], 1),
        },
        "audit": {"disagreements": len(audited.disagreements), "notes": audited.notes},
        "violations": [
            {
                "invariant": v.invariant,
                "t": v.t,
                "message": v.message,
                "times_seen": v.times_seen,
                "history": v.history,
            }
            for v in checker.violations
        ],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
    }


def _violation(invariant: str, t: float, message: str) -> Any:
    from bench.soak_check import Violation

    return Violation(invariant, t, message)


def leaks(state_dir: Path, ports: Mapping[str, int]) -> list[str]:
    """What the stopped cluster left: processes naming its state folder, listening ports, unix
    sockets under it, the folder itself."""
    out: list[str] = []
    needle = str(state_dir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            shown = cmdline.replace(b"\0", b" ")[:160].decode(errors="replace")
            out.append(f"process {entry.name}: {shown}")
    for name, port in ports.items():
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                out.append(f"{name}'s port {port} still accepts connections")
    try:
        unix = Path("/proc/net/unix").read_text()
    except OSError:
        unix = ""
    out += [
        f"unix socket {line.split()[-1]}" for line in unix.splitlines() if str(state_dir) in line
    ]
    if state_dir.exists() and not os.environ.get("NODELOCK_KEEP_STATE"):
        out.append(f"state folder {state_dir} left")
    return out


def print_summary(result: JSON) -> None:
    f, p = result["faults"], result["pods"]
    print(f"\nfaults injected: {f['injected']} of {f['kinds']} kinds ({f['scheduled']} scheduled)")
    for kind, n in f["by_kind"].items():
        print(f"  {kind:28} {n}")
    print(
        f"pods: {p['seen']} seen, {p['ran']} ran, {p['failed']} failed, {p['never_ran']} never ran"
        f" (deleted first); created by the workload: {p['created_by_workload']}"
    )
    for reason, n in p["failed_reasons"].items():
        print(f"  failed {reason}: {n}")
    if result["longest_hold"]:
        h = result["longest_hold"]
        print(
            f"longest lock hold: {h['seconds']}s ({h['node']}, {h['holder']}, token {h['token']})"
        )
    if result["longest_wait"]:
        w = result["longest_wait"]
        print(f"longest wait to Running: {w['seconds']}s ({w['pod']}); median {w['p50_s']}s")
    print(
        f"settled {result['settled_s_after_last_heal']}s after the last heal "
        f"(bound {result['l1_bound_s']:.0f}s); probes ran in {result['probes_ran_s']}s; "
        f"audit: {result['audit']['disagreements']} disagreements; "
        f"samples: {result['samples']} ({result['samples_missed']} missed)"
    )
    print(f"leaks: {len(result['leaks'])}")
    for leak in result["leaks"]:
        print(f"  {leak}")
    print(f"violations: {len(result['violations'])}")
    for v in result["violations"]:
        print(f"[{v['invariant']}] t={v['t']:.1f}s {v['message']} (seen {v['times_seen']}x)")
        for line in v["history"]:
            print(f"    {line}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=3.0, help="churn and faults this long")
    parser.add_argument("--seed", type=int, default=7, help="fixes the fault schedule")
    parser.add_argument("--nodes", type=int, default=4, help="GPU nodes (at least 3)")
    parser.add_argument(
        "--kubelet",
        choices=[k.value for k in KubeletKind],
        default=KubeletKind.REAL.value,
        help="the nodes' kubelet: real (the release's kubelet, containers faked) or sim",
    )
    parser.add_argument(
        "--results-dir", type=Path, default=RESULTS, help="where soak.json goes (bench/results)"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write the results here instead of --results-dir"
    )
    parser.add_argument("--plant", choices=PLANTS, default=None, help="the checker's own test")
    parser.add_argument("--history", type=Path, default=None, help="write every sample (JSONL)")
    parser.add_argument("--verbose", action="store_true", help="print every workload action")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.nodes < 3:
        parser.error("--minutes must be positive and --nodes at least 3")
    try:
        with throwaway_cluster("nlsoak-") as cluster:
            specs = specs_for(args.nodes, cluster.settings().get("kubernetes_version"))
            start_gpu_side(cluster, specs, extender_env(args.plant), KubeletKind(args.kubelet))
            ports = dict(cluster.settings()["ports"])
            state_dir = cluster.state_dir
            result = asyncio.run(campaign(cluster, specs, args))
    except Exception as exc:  # the run could not be made: say why in one line, exit 2
        print(
            f"soak: the campaign could not run: {type(exc).__name__}: {exc} "
            "(NODELOCK_KEEP_STATE=1 keeps the cluster's logs)",
            file=sys.stderr,
        )
        return 2
    result["leaks"] = leaks(state_dir, ports)
    for leak in result["leaks"]:
        result["violations"].append(
            {"invariant": "leak", "t": None, "message": leak, "times_seen": 1, "history": []}
        )
    name = "soak.json" if not args.plant else f"soak-plant-{args.plant}.json"
    out = args.json or args.results_dir / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_summary(result)
    print(f"results: {out}")
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
