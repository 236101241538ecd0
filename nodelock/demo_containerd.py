"""``nodelock demo --runtime containerd``: the demo as an install.

nodelock as it ships on nodes with a real container runtime (``devcluster.runtime``): the image
built from ``deploy/Containerfile``, the Helm chart installed from ``deploy/helm/nodelock``, the
extender, the chart's kube-scheduler and the device plugin DaemonSet running as pods.  Then a
small GPU workload runs as real pods (a training Job, an inference Deployment, a burst of short
Jobs that must wait for GPUs), each container printing the devices it was given.  At the end it
shows, pod by pod, what each container printed (``kubectl logs``) against the assignment the
extender wrote, runs ``nodelock audit --node-local`` in every device plugin pod (the scheduler's
assignments against kubelet's PodResources and the plugin's answers), and checks:

- every container printed exactly its pod's assignment;
- no GPU of a node ran in two containers at overlapping times;
- no node lock is left held;
- the audit found no disagreement.

Exit code 0 when all hold, 1 when one fails.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

from devcluster.cluster import Cluster
from devcluster.install import NAMESPACE, audit_plugin_pods, shown
from devcluster.runtime import SYSTEM_NODE, RuntimeCluster, runtime_cluster
from devcluster.shape import purge
from handoff.wire import DEFAULT_RESOURCE, ContainerName, Keys, parse_assignment

DEMO_NAMESPACE = "demo"
SCHEDULER = "nodelock-scheduler"
WORKLOAD_LABEL = "demo.nodelock.io/workload"
PRINT_DEVICES = 'echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"'


@dataclass(frozen=True)
class RealWorkload:
    """One controller of the workload: ``replicas`` pods of ``gpus`` GPUs, each container
    printing its devices and then sleeping ``seconds`` (0: until deleted)."""

    kind: str  # Job | Deployment
    name: str
    replicas: int
    gpus: int
    seconds: int


def real_workload(total_gpus: int) -> list[RealWorkload]:
    """Training pods of 2 GPUs on half of the GPUs, inference pods of 1 GPU on a quarter, and a
    burst of short 1-GPU Jobs as many as half the GPUs: more than is free, so some wait."""
    quarter = max(1, total_gpus // 4)
    return [
        RealWorkload("Job", "train", quarter, 2, seconds=20),
        RealWorkload("Deployment", "inference", quarter, 1, seconds=0),
        RealWorkload("Job", "burst", max(1, total_gpus // 2), 1, seconds=3),
    ]


def manifest(w: RealWorkload, image: str) -> dict[str, Any]:
    """The workload's object: its pods name nodelock's scheduler and ask for ``w.gpus``."""
    sleep = f"sleep {w.seconds}" if w.seconds else "sleep 2147483647"
    labels = {"app": w.name, WORKLOAD_LABEL: w.name}
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "main",
                "image": image,
                "command": ["sh", "-c", f"{PRINT_DEVICES}; {sleep}"],
                "resources": {"limits": {DEFAULT_RESOURCE: str(w.gpus)}},
            }
        ],
    }
    template = {"metadata": {"labels": labels}, "spec": spec}
    if w.kind == "Deployment":
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": w.name},
            "spec": {
                "replicas": w.replicas,
                "selector": {"matchLabels": {"app": w.name}},
                "template": template,
            },
        }
    spec["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": w.name},
        "spec": {
            "completions": w.replicas,
            "parallelism": w.replicas,
            "backoffLimit": 0,
            "template": template,
        },
    }


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def done(pods: Sequence[Mapping[str, Any]], workloads: Sequence[RealWorkload]) -> bool:
    """Every Job's pods Succeeded and every Deployment's pods Running; or a pod Failed."""
    if any(_phase(p) == "Failed" for p in pods):
        return True
    count: Counter[tuple[str, str]] = Counter(
        (str(p["metadata"]["labels"].get(WORKLOAD_LABEL)), _phase(p)) for p in pods
    )
    for w in workloads:
        want = "Succeeded" if w.kind == "Job" else "Running"
        if count[w.name, want] < w.replicas:
            return False
    return True


def progress(now: float, pods: Sequence[Mapping[str, Any]], held: int) -> str:
    phases = Counter(_phase(p) for p in pods)
    unbound = sum(1 for p in pods if _phase(p) == "Pending" and not p["spec"].get("nodeName"))
    return (
        f"[{now:5.0f}s] GPU pods {len(pods):>2}: unbound {unbound:>2}  "
        f"running {phases['Running']:>2}  succeeded {phases['Succeeded']:>2}  "
        f"failed {phases['Failed']:>2}  | node locks held {held}"
    )


def assignment(pod: Mapping[str, Any]) -> list[str]:
    """The GPUs the extender assigned to the pod's container (empty: none written)."""
    raw = (pod["metadata"].get("annotations") or {}).get(Keys().assignment)
    if not raw:
        return []
    return [str(d) for d in parse_assignment(raw).get(ContainerName("main"), [])]


def printed(log: str) -> list[str] | None:
    """The devices a container's log says it saw (None: it printed no such line)."""
    lines = [x for x in log.splitlines() if x.startswith("NVIDIA_VISIBLE_DEVICES=")]
    if len(lines) != 1:
        return None
    return [d for d in lines[0].split("=", 1)[1].split(",") if d]


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def overlaps(pods: Sequence[Mapping[str, Any]], now: datetime) -> list[str]:
    """GPUs of one node in two containers at overlapping times (from the containers' start and
    finish times; a running container runs until ``now``)."""
    runs: list[tuple[str, str, datetime, datetime, str]] = []
    for pod in pods:
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        if not statuses:
            continue
        state = statuses[0].get("state") or {}
        if "running" in state:
            start, end = _time(state["running"]["startedAt"]), now
        elif "terminated" in state and state["terminated"].get("startedAt"):
            start = _time(state["terminated"]["startedAt"])
            end = _time(state["terminated"]["finishedAt"])
        else:
            continue
        for gpu in assignment(pod):
            runs.append((pod["spec"]["nodeName"], gpu, start, end, pod["metadata"]["name"]))
    found = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if a[:2] == b[:2] and a[2] < b[3] and b[2] < a[3]:
                found.append(f"{a[0]} {a[1]}: {a[4]} and {b[4]}")
    return found


class Demo:
    """The running demo: kubectl against the cluster, output to ``out``."""

    def __init__(self, cluster: Cluster, out: TextIO) -> None:
        self.cluster = cluster
        self.out = out

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def kubectl(self, *args: str, input_text: str | None = None) -> str:
        return self.cluster.kubectl(*args, input_text=input_text)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def pods(self) -> list[dict[str, Any]]:
        items = self.json("get", "pods", "-n", DEMO_NAMESPACE)["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def held(self) -> list[str]:
        leases = self.json("get", "leases", "-n", NAMESPACE)["items"]
        return [x["metadata"]["name"] for x in leases if x["spec"].get("holderIdentity")]

    def run(self, workloads: Sequence[RealWorkload], image: str, *, timeout_s: float) -> bool:
        """Create the workload and show progress until it is done; whether it finished."""
        self.kubectl("create", "namespace", DEMO_NAMESPACE)
        items = {
            "kind": "List",
            "apiVersion": "v1",
            "items": [manifest(w, image) for w in workloads],
        }
        self.kubectl("apply", "-n", DEMO_NAMESPACE, "-f", "-", input_text=json.dumps(items))
        t0 = time.monotonic()
        last = ""
        while True:
            pods = self.pods()
            line = progress(time.monotonic() - t0, pods, len(self.held()))
            if line.split("]", 1)[1] != last:
                self.say(line)
                last = line.split("]", 1)[1]
            if len(pods) >= sum(w.replicas for w in workloads) and done(pods, workloads):
                return True
            if time.monotonic() - t0 > timeout_s:
                self.say(f"timed out after {timeout_s:.0f}s")
                return False
            time.sleep(2)

    def wait_locks_free(self, timeout_s: float) -> list[str]:
        """Until no node lock is held (a lock is released when its pod's container is served);
        the ones still held after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (held := self.held()) and time.monotonic() < deadline:
            time.sleep(1)
        return held

    def audit(self) -> list[tuple[str, int, str]]:
        """``nodelock audit --node-local`` in every device plugin pod: (node, exit code, output)."""
        return audit_plugin_pods(self.cluster)


def report(demo: Demo, started: RuntimeCluster, finished: bool, t_up: float, t_run: float) -> bool:
    """Print the pod-by-pod table, the audit and the checks; whether every check passed."""
    pods = sorted(
        demo.pods(), key=lambda p: (p["spec"].get("nodeName") or "", p["metadata"]["name"])
    )
    rows = []
    wrong = []
    example = ""
    for pod in pods:
        name = pod["metadata"]["name"]
        given = assignment(pod)
        log = demo.cluster.kubectl("logs", "-n", DEMO_NAMESPACE, name, check=False)
        seen = printed(log)
        ok = seen is not None and seen == given and len(given) > 0
        if not ok:
            wrong.append(name)
        example = example or f"$ kubectl logs -n {DEMO_NAMESPACE} {name}\n{log.rstrip()}"
        rows.append(
            (
                name,
                str(pod["spec"].get("nodeName") or "-"),
                _phase(pod),
                ",".join(given) or "-",
                "same" if ok else (",".join(seen or []) or "nothing") + "  DIFFERS",
            )
        )
    demo.say("\nWhat each container printed (kubectl logs) against its pod's assignment:")
    demo.say(example)
    header = ("pod", "node", "phase", "assigned by the extender", "the container printed")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        demo.say(
            "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[4]
        )
    twice = overlaps(pods, datetime.now().astimezone())
    held = demo.wait_locks_free(timeout_s=30)
    demo.say("\nnodelock audit --node-local, in each device plugin pod (kubectl exec):")
    audits = demo.audit()
    for node, code, text in audits:
        demo.say(f"  {node}: exit {code}")
        demo.say("\n".join(f"    {line}" for line in text.rstrip().splitlines()))
    checks = [
        ("the workload ran to its end (Jobs succeeded, Deployment running)", finished, ""),
        (
            "every container printed exactly its assignment",
            not wrong,
            ", ".join(wrong),
        ),
        ("no GPU in two containers at once", not twice, "; ".join(twice)),
        ("no node lock left held", not held, ", ".join(held)),
        (
            "nodelock audit: scheduler, kubelet and plugin agree",
            bool(audits) and all(code == 0 for _, code, _ in audits),
            ", ".join(n for n, code, _ in audits if code != 0),
        ),
    ]
    demo.say("\n" + "=" * 78)
    demo.say("nodelock demo on containerd nodes")
    demo.say("=" * 78)
    gpu_nodes = [n for n in started.nodes if n.gpus]
    demo.say(
        f"cluster: {len(gpu_nodes)} GPU nodes and {SYSTEM_NODE}, each a real kubelet with "
        "containerd, runc, CNI and kube-proxy"
    )
    demo.say(f"nodelock image: {started.images.nodelock.ref} (deploy/Containerfile)")
    if started.helm_command:
        demo.say(f"installed with: {shown(started.helm_command)}")
    phases = Counter(_phase(p) for p in pods)
    counts = ", ".join(f"{n} {k.lower()}" for k, n in sorted(phases.items()))
    demo.say(f"GPU pods: {len(pods)} ({counts})")
    demo.say(f"time: cluster and install {t_up:.0f} s, workload {t_run:.0f} s")
    for what, ok, detail in checks:
        demo.say(f"  {'PASS' if ok else 'FAIL'}  {what}" + (f": {detail}" if detail else ""))
    return all(ok for _, ok, _ in checks)


def run_demo(
    cluster: Cluster,
    *,
    nodes: int,
    gpus_per_node: int,
    keep: bool,
    timeout_s: float,
    out: TextIO = sys.stdout,
) -> int:
    """The whole demo on ``cluster`` (not yet started); its exit code."""
    demo = Demo(cluster, out)
    t0 = time.monotonic()
    demo.say(
        f"nodelock demo on containerd nodes: building or reusing the images, starting "
        f"{nodes} GPU nodes x {gpus_per_node} GPUs and {SYSTEM_NODE}, installing the chart"
    )
    started = runtime_cluster(cluster, gpu_nodes=nodes, gpus_per_node=gpus_per_node)
    try:
        t_up = time.monotonic() - t0
        demo.say(f"ready in {t_up:.0f}s; nodelock installed with:")
        demo.say(f"  {shown(started.helm_command or [])}")
        demo.say(demo.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide").rstrip())
        workloads = real_workload(nodes * gpus_per_node)
        demo.say(
            "\nworkload: "
            + ", ".join(f"{w.kind} {w.name} {w.replicas}x{w.gpus} GPU" for w in workloads)
        )
        t1 = time.monotonic()
        finished = demo.run(workloads, started.images.base.ref, timeout_s=timeout_s)
        t_run = time.monotonic() - t1
        ok = report(demo, started, finished, t_up, t_run)
        demo.say(f"whole demo: {time.monotonic() - t0:.0f} s")
    except BaseException:
        if not keep:
            cluster.down()
        raise
    if keep:
        demo.say("\nThe cluster is still running. Look around:")
        demo.say(f"  export KUBECONFIG={cluster.kubeconfig}")
        demo.say(f"  export PATH={cluster.binaries.directory}:$PATH")
        demo.say(f"  kubectl get pods -n {DEMO_NAMESPACE} -o wide; kubectl get pods -n {NAMESPACE}")
        demo.say(f"  kubectl logs -n {DEMO_NAMESPACE} deploy/inference")
        demo.say(
            f"Stop it with: .venv/bin/nodelock devcluster down --purge --state-dir "
            f"{cluster.state_dir}"
        )
    else:
        cluster.down()
        demo.say("\ncluster stopped (run with --keep to leave it up and look around)")
    return 0 if ok else 1


def prepare(cluster: Cluster, out: TextIO = sys.stdout) -> None:
    """Stop and remove the previous demo cluster in the cluster's state directory: containerd
    nodes start from an empty state."""
    if cluster.running():
        print(f"stopping the previous demo cluster in {cluster.state_dir}", file=out)
    cluster.down()
    purge(cluster.state_dir)
