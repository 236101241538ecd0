"""The chart's pods' memory on containerd nodes: the device plugin at rest and with
``nodelock audit --node-local`` exec'd in its container, against the chart's request and limit.

    .venv/bin/python -m bench.pod_memory [--nodes 1] [--gpus-per-node 2] [--audits 3]

Starts a devcluster with containerd nodes and installs the chart from the local image, as
``nodelock demo --runtime containerd`` does (``devcluster.runtime.runtime_cluster``; needs root
and ``make runtime-deps``), waits ``--settle`` seconds, then reads each nodelock container's
memory cgroup from the host (cgroup v1: ``/sys/fs/cgroup/memory/k8s.io/<container id>/``; v2:
the directory named after the container under ``/sys/fs/cgroup``), the container id taken from
the pod's ``status.containerStatuses[].containerID``:

- **rss**: ``memory.stat`` ``rss`` (v2: ``anon``), the container's anonymous memory;
- **usage**: ``memory.usage_in_bytes`` (v2: ``memory.current``), page cache included;
- **peak**: ``memory.max_usage_in_bytes`` (v2: ``memory.peak``), the high-water mark of usage.

In order:

1. **at rest**: every pod of the chart (device plugin, extender, kube-scheduler) after the
   settle; the peak then is the start's;
2. **serving**: ``--pods`` single-GPU pods (default: every GPU) placed through the chart's
   kube-scheduler and running, so the plugin has served Allocate and holds their state;
3. **audit**: ``--audits`` times, the plugin container's peak reset (v1: ``0`` written to
   ``memory.max_usage_in_bytes``; v2: written to ``memory.peak``, where the kernel allows it),
   then ``kubectl exec -n nodelock-system <plugin pod> -- nodelock audit --node-local``
   (``devcluster.install.audit_plugin_pods``, as docs/install.md has an operator check a node)
   and the peak read again: the audit is a second Python process in the container's cgroup.
   The peak counts page cache too (the files the audit reads), which the kernel reclaims before
   it kills for the limit; cgroup v1 keeps no high-water mark of rss, so the rss is also read
   every 50 ms during each audit and its highest kept.

The baseline of the run is the plugin at rest: ``audit peak / rest usage`` is what the exec'd
audit adds.  Each figure is also given against the chart's ``devicePlugin.resources`` (request
and limit, read from ``deploy/helm/nodelock/values.yaml``) and the limit the container's cgroup
was given (it must be the chart's).  Prints a table, writes ``bench/results/pod_memory.json``
with the machine, the command, the date and the load averages at the start and at the end.
Exits 1 when an audit did not exit 0 (137: killed at the limit) or a chart container restarted
during the run: the peaks are then not the whole story.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench.scale import memory_mib
from devcluster import processes
from devcluster.binaries import ensure_control_plane
from devcluster.cluster import Cluster
from devcluster.errors import DevclusterError
from devcluster.install import NAMESPACE, PLUGIN_SELECTOR, audit_plugin_pods
from devcluster.runtime import runtime_cluster
from handoff.wire import DEFAULT_RESOURCE

RESULTS = Path(__file__).resolve().parent / "results"
VALUES = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "nodelock" / "values.yaml"
CGROUP_ROOT = Path("/sys/fs/cgroup")
MIB = 2**20
BENCH_NAMESPACE = "bench-memory"
SCHEDULER = "nodelock-scheduler"
# the chart's values key of each component, by the pod's app.kubernetes.io/component label
COMPONENT_VALUES = {
    "device-plugin": "devicePlugin",
    "extender": "extender",
    "scheduler": "scheduler",
}

# ---- pure parts ---------------------------------------------------------------------------


def parse_memory_stat(text: str) -> dict[str, int]:
    """``memory.stat``'s ``name value`` lines as a mapping (lines of another shape skipped)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


@dataclass(frozen=True)
class Memory:
    """One read of a container's memory cgroup, in bytes (``peak``/``limit`` None: no file, or
    no limit)."""

    version: int  # 1 or 2
    rss: int
    usage: int
    peak: int | None
    limit: int | None


# a limit at or above this is "no limit" (cgroup v1 writes PAGE_COUNTER_MAX pages in bytes)
UNLIMITED = 2**62


def _limit(raw: str | None) -> int | None:
    if raw is None or raw.strip() in ("", "max"):
        return None
    value = int(raw.strip())
    return None if value >= UNLIMITED else value


def memory_from_files(version: int, files: Mapping[str, str]) -> Memory:
    """A ``Memory`` from a cgroup directory's files (name -> content; absent: not there)."""
    stat = parse_memory_stat(files.get("memory.stat", ""))
    if version == 1:
        rss_key, usage, peak, limit = (
            "rss",
            "memory.usage_in_bytes",
            "memory.max_usage_in_bytes",
            "memory.limit_in_bytes",
        )
    elif version == 2:
        rss_key, usage, peak, limit = "anon", "memory.current", "memory.peak", "memory.max"
    else:
        raise ValueError(f"cgroup version {version}: only 1 and 2 are known")
    if rss_key not in stat:
        raise ValueError(f"memory.stat has no {rss_key!r} (cgroup v{version})")
    if usage not in files:
        raise ValueError(f"no {usage} (cgroup v{version})")
    raw_peak = files.get(peak)
    return Memory(
        version=version,
        rss=stat[rss_key],
        usage=int(files[usage].strip()),
        peak=int(raw_peak.strip()) if raw_peak is not None else None,
        limit=_limit(files.get(limit)),
    )


def container_id(status_id: str) -> str:
    """The id in a container status's ``containerID`` (``containerd://<id>``)."""
    _runtime, sep, cid = status_id.partition("://")
    if not sep or not cid:
        raise ValueError(f"containerID {status_id!r} is not <runtime>://<id>")
    return cid


@dataclass(frozen=True)
class ChartMemory:
    """A component's ``resources`` memory in the chart's values, in MiB."""

    request_mib: float | None
    limit_mib: float | None


def chart_memory(values_text: str, key: str) -> ChartMemory:
    """``<key>.resources`` requests/limits memory of the chart's values, in MiB."""
    resources = (yaml.safe_load(values_text).get(key) or {}).get("resources") or {}

    def mib(part: str) -> float | None:
        raw = (resources.get(part) or {}).get("memory")
        return None if raw is None else memory_mib(str(raw))

    return ChartMemory(request_mib=mib("requests"), limit_mib=mib("limits"))


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def mib(value: int | None) -> float | None:
    return None if value is None else value / MIB


def plugin_figures(
    rest: Memory,
    serving: Memory,
    audit_peaks: Sequence[int],
    audit_rss: Sequence[int],
    chart: ChartMemory,
) -> dict[str, Any]:
    """The device plugin's figures, in MiB, and their ratios: to the chart's request (at rest)
    and limit (the peaks), and the audit's peaks to the plugin's own at rest (the run's
    baseline).  ``audit_peaks``: the cgroup's peak usage in each audit; ``audit_rss``: the
    highest rss sampled in each."""
    peak = max(audit_peaks) if audit_peaks else None
    rss = max(audit_rss) if audit_rss else None
    return {
        "rest_rss_mib": mib(rest.rss),
        "rest_usage_mib": mib(rest.usage),
        "start_peak_mib": mib(rest.peak),
        "serving_rss_mib": mib(serving.rss),
        "serving_usage_mib": mib(serving.usage),
        "audit_peak_mib": mib(peak),
        "audit_peaks_mib": [p / MIB for p in audit_peaks],
        "audit_rss_mib": mib(rss),
        "audit_rss_each_mib": [r / MIB for r in audit_rss],
        "chart_request_mib": chart.request_mib,
        "chart_limit_mib": chart.limit_mib,
        "cgroup_limit_mib": mib(rest.limit),
        "rest_rss_vs_request": ratio(rest.rss / MIB, chart.request_mib),
        "rest_usage_vs_request": ratio(rest.usage / MIB, chart.request_mib),
        "serving_usage_vs_request": ratio(serving.usage / MIB, chart.request_mib),
        "start_peak_vs_limit": ratio(mib(rest.peak), chart.limit_mib),
        "audit_peak_vs_limit": ratio(mib(peak), chart.limit_mib),
        "audit_peak_vs_rest_usage": ratio(mib(peak), rest.usage / MIB),
        "audit_rss_vs_limit": ratio(mib(rss), chart.limit_mib),
        "audit_rss_vs_rest_rss": ratio(mib(rss), rest.rss / MIB),
    }


# ---- the cgroup on this machine -----------------------------------------------------------


def cgroup_version(root: Path = CGROUP_ROOT) -> int:
    """1 when the memory controller is mounted on its own (v1, hybrid included), 2 when the
    unified hierarchy has it."""
    if (root / "memory" / "memory.stat").exists():
        return 1
    if "memory" in (root / "cgroup.controllers").read_text(encoding="utf-8").split():
        return 2
    raise DevclusterError(f"no memory cgroup controller under {root}")


def find_cgroup(root: Path, cid: str, *, max_depth: int = 6) -> Path:
    """The directory of container ``cid`` under ``root``: ``k8s.io/<cid>`` (containerd's
    cgroupfs path with kubelet's pod cgroups off), else the first one whose name holds the id
    (``cri-containerd-<cid>.scope`` under the systemd driver)."""
    direct = root / "k8s.io" / cid
    if direct.is_dir():
        return direct
    base = len(root.parts)
    for dirpath, dirnames, _ in os.walk(root):
        if len(Path(dirpath).parts) - base >= max_depth:
            dirnames.clear()
        for name in dirnames:
            if cid in name:
                return Path(dirpath) / name
    raise DevclusterError(f"no memory cgroup of container {cid} under {root}")


READ = (
    "memory.stat",
    "memory.usage_in_bytes",
    "memory.max_usage_in_bytes",
    "memory.limit_in_bytes",
    "memory.current",
    "memory.peak",
    "memory.max",
)


def read_memory(path: Path, version: int) -> Memory:
    files = {}
    for name in READ:
        f = path / name
        if f.exists():
            files[name] = f.read_text(encoding="utf-8")
    return memory_from_files(version, files)


class RssSampler:
    """The highest ``memory.stat`` rss of some cgroups, read every ``interval_s`` in a thread
    while the ``with`` block runs (cgroup v1 keeps no high-water mark of rss)."""

    def __init__(self, paths: Sequence[Path], version: int, interval_s: float = 0.05) -> None:
        self.paths, self.version, self.interval_s = list(paths), version, interval_s
        self.highest = dict.fromkeys(self.paths, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            for path in self.paths:
                rss = read_memory(path, self.version).rss
                self.highest[path] = max(self.highest[path], rss)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def reset_peak(path: Path, version: int) -> bool:
    """Restart the cgroup's high-water mark from its usage now; whether the kernel allowed it."""
    name = "memory.max_usage_in_bytes" if version == 1 else "memory.peak"
    try:
        (path / name).write_text("0" if version == 1 else "reset\n", encoding="utf-8")
    except OSError:
        return False
    return True


# ---- the run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Container:
    pod: str
    component: str
    name: str
    node: str
    cgroup: Path
    restarts: int


def chart_containers(cluster: Cluster, root: Path) -> list[Container]:
    listed = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json"))
    out = []
    for pod in listed["items"]:
        labels = pod["metadata"].get("labels") or {}
        component = str(labels.get("app.kubernetes.io/component", "?"))
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if not status.get("containerID"):
                raise DevclusterError(f"{pod['metadata']['name']}: {status['name']} not started")
            out.append(
                Container(
                    pod=pod["metadata"]["name"],
                    component=component,
                    name=status["name"],
                    node=str(pod["spec"].get("nodeName")),
                    cgroup=find_cgroup(root, container_id(status["containerID"])),
                    restarts=int(status.get("restartCount", 0)),
                )
            )
    return sorted(out, key=lambda c: (c.component, c.node, c.pod, c.name))


def plugin_pods(cluster: Cluster) -> set[str]:
    listed = json.loads(
        cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", PLUGIN_SELECTOR, "-o", "json")
    )
    return {p["metadata"]["name"] for p in listed["items"]}


def gpu_pod(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": SCHEDULER,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["sleep", "2147483647"],
                    "resources": {"limits": {DEFAULT_RESOURCE: "1"}},
                }
            ],
        },
    }


def place_pods(cluster: Cluster, count: int, image: str, *, timeout_s: float) -> float:
    """``count`` single-GPU pods through the chart's kube-scheduler, waited Running; seconds."""
    t0 = time.monotonic()
    cluster.kubectl("create", "namespace", BENCH_NAMESPACE)
    items = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [gpu_pod(f"gpu-{i:02d}", image) for i in range(count)],
    }
    cluster.kubectl("apply", "-n", BENCH_NAMESPACE, "-f", "-", input_text=json.dumps(items))
    while True:
        pods = json.loads(cluster.kubectl("get", "pods", "-n", BENCH_NAMESPACE, "-o", "json"))
        phases = [(p.get("status") or {}).get("phase") for p in pods["items"]]
        if len(phases) == count and all(ph == "Running" for ph in phases):
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise DevclusterError(f"GPU pods not Running within {timeout_s:.0f}s: {phases}")
        time.sleep(1)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _row(c: Container, m: Memory) -> dict[str, Any]:
    return {
        "pod": c.pod,
        "component": c.component,
        "container": c.name,
        "node": c.node,
        "restarts": c.restarts,
        **{
            k: (v / MIB if isinstance(v, int) and k != "version" else v)
            for k, v in asdict(m).items()
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    version = cgroup_version()
    root = CGROUP_ROOT / "memory" if version == 1 else CGROUP_ROOT
    values_text = VALUES.read_text(encoding="utf-8")
    state = Path(tempfile.mkdtemp(prefix="nlm-", dir="/tmp"))
    cluster = Cluster(state, binaries=ensure_control_plane(version=args.kubernetes_version))
    with processes.sigterm_unwinds():
        try:
            t0 = time.monotonic()
            started = runtime_cluster(
                cluster, gpu_nodes=args.nodes, gpus_per_node=args.gpus_per_node
            )
            up_s = time.monotonic() - t0
            print(f"cluster and chart up in {up_s:.0f}s; settling {args.settle:.0f}s", flush=True)
            time.sleep(args.settle)
            containers = chart_containers(cluster, root)
            plugins = plugin_pods(cluster)
            rest = {c: read_memory(c.cgroup, version) for c in containers}
            pods_n = args.pods if args.pods >= 0 else args.nodes * args.gpus_per_node
            placed_s = None
            if pods_n:
                placed_s = place_pods(
                    cluster, pods_n, started.images.base.ref, timeout_s=args.timeout
                )
                time.sleep(args.settle / 2)
            serving = {c: read_memory(c.cgroup, version) for c in containers}
            peaks: dict[Container, list[int]] = {c: [] for c in containers if c.pod in plugins}
            rss_peaks: dict[Container, list[int]] = {c: [] for c in peaks}
            audits = []
            reset_ok = True
            for _ in range(args.audits):
                for c in peaks:
                    reset_ok = reset_peak(c.cgroup, version) and reset_ok
                with RssSampler([c.cgroup for c in peaks], version) as sampler:
                    results = audit_plugin_pods(cluster)
                audits.append([{"node": n, "exit": code} for n, code, _ in results])
                for c in peaks:
                    peaks[c].append(read_memory(c.cgroup, version).peak or 0)
                    rss_peaks[c].append(sampler.highest[c.cgroup])
                for node, code, text in results:
                    if code != 0:
                        print(f"audit on {node}: exit {code}\n{text}", flush=True)
            after = chart_containers(cluster, root)
        finally:
            cluster.down()
            if not os.environ.get("NODELOCK_KEEP_STATE"):
                shutil.rmtree(state, ignore_errors=True)
    plugin_rows = []
    for c, audit_peaks in peaks.items():
        chart = chart_memory(values_text, "devicePlugin")
        plugin_rows.append(
            {
                "pod": c.pod,
                "node": c.node,
                **plugin_figures(rest[c], serving[c], audit_peaks, rss_peaks[c], chart),
            }
        )
    others = []
    for c in containers:
        if c.pod in plugins:
            continue
        key = COMPONENT_VALUES.get(c.component)
        chart = chart_memory(values_text, key) if key else ChartMemory(None, None)
        m = serving[c]
        others.append(
            {
                **_row(c, m),
                "chart_request_mib": chart.request_mib,
                "chart_limit_mib": chart.limit_mib,
                "usage_vs_request": ratio(m.usage / MIB, chart.request_mib),
                "peak_vs_limit": ratio(mib(m.peak), chart.limit_mib),
            }
        )
    return {
        "kubernetes_version": cluster.binaries.kubernetes_version,
        "cgroup_version": version,
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "gpu_pods": pods_n,
        "settle_s": args.settle,
        "cluster_up_s": up_s,
        "gpu_pods_running_s": placed_s,
        "peak_reset": reset_ok,
        "audits": audits,
        "restarts_after": {f"{c.pod}/{c.name}": c.restarts for c in after},
        "device_plugin": plugin_rows,
        "at_rest": [_row(c, rest[c]) for c in containers],
        "serving": others,
    }


def problems(result: Mapping[str, Any]) -> list[str]:
    """What makes the run's peaks untrustworthy: an audit that did not exit 0 (137: killed at
    the limit, its peak cut short) or a chart container that restarted during the run."""
    found = [
        f"audit {i + 1} on {a['node']}: exit {a['exit']}"
        for i, run in enumerate(result["audits"])
        for a in run
        if a["exit"] != 0
    ]
    before = {f"{r['pod']}/{r['container']}": r["restarts"] for r in result["at_rest"]}
    for name, restarts in result["restarts_after"].items():
        if restarts != before.get(name, restarts):
            found.append(f"{name} restarted ({before[name]} -> {restarts})")
    return found


def _f(v: float | None, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def report(result: Mapping[str, Any]) -> list[str]:
    lines = []
    for p in result["device_plugin"]:
        lines += [
            f"device plugin {p['pod']} on {p['node']} (chart: request "
            f"{_f(p['chart_request_mib'])} MiB, limit {_f(p['chart_limit_mib'])} MiB; cgroup "
            f"limit {_f(p['cgroup_limit_mib'])} MiB)",
            f"  at rest:   rss {_f(p['rest_rss_mib'])} MiB ({_f(p['rest_rss_vs_request'], '.2f')}"
            f" of the request), usage {_f(p['rest_usage_mib'])} MiB "
            f"({_f(p['rest_usage_vs_request'], '.2f')}), peak since start "
            f"{_f(p['start_peak_mib'])} MiB ({_f(p['start_peak_vs_limit'], '.2f')} of the limit)",
            f"  serving {result['gpu_pods']} GPU pods: rss {_f(p['serving_rss_mib'])} MiB, usage "
            f"{_f(p['serving_usage_mib'])} MiB ({_f(p['serving_usage_vs_request'], '.2f')} of "
            "the request)",
            f"  audit exec'd: peak {_f(p['audit_peak_mib'])} MiB "
            f"({_f(p['audit_peak_vs_limit'], '.2f')} of the limit, "
            f"{_f(p['audit_peak_vs_rest_usage'], '.2f')}x the usage at rest); each: "
            + ", ".join(f"{x:.0f}" for x in p["audit_peaks_mib"]),
            f"  audit exec'd: rss at most {_f(p['audit_rss_mib'])} MiB (sampled every 50 ms; "
            f"{_f(p['audit_rss_vs_limit'], '.2f')} of the limit, "
            f"{_f(p['audit_rss_vs_rest_rss'], '.2f')}x the rss at rest); each: "
            + ", ".join(f"{x:.0f}" for x in p["audit_rss_each_mib"]),
        ]
    for o in result["serving"]:
        lines.append(
            f"{o['component']} {o['pod']}/{o['container']}: rss {_f(o['rss'])} MiB, usage "
            f"{_f(o['usage'])} MiB ({_f(o['usage_vs_request'], '.2f')} of the request "
            f"{_f(o['chart_request_mib'])}), peak {_f(o['peak'])} MiB "
            f"({_f(o['peak_vs_limit'], '.2f')} of the limit {_f(o['chart_limit_mib'])})"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1, help="GPU nodes")
    parser.add_argument("--gpus-per-node", type=int, default=2)
    parser.add_argument("--pods", type=int, default=-1, help="GPU pods (default: every GPU)")
    parser.add_argument("--audits", type=int, default=3)
    parser.add_argument("--settle", type=float, default=30.0, help="seconds")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--kubernetes-version", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "pod_memory.json")
    args = parser.parse_args(argv)
    load_start = _load()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    result = run(args)
    load_end = _load()
    for line in report(result):
        print(line)
    print(f"load average at the start {load_start}, at the end {load_end} ({os.cpu_count()} CPUs)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    given = sys.argv[1:] if argv is None else argv
    args.out.write_text(
        json.dumps(
            {
                "machine": f"{platform.platform()}, {os.cpu_count()} CPUs",
                "command": " ".join(["python -m bench.pod_memory", *given]),
                "date": started_at,
                "load_average_start": load_start,
                "load_average_end": load_end,
                **result,
            },
            indent=2,
            default=str,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {args.out}")
    found = problems(result)
    for problem in found:
        print(f"FAIL {problem}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
