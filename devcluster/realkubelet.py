"""Real kubelets as the GPU nodes of a devcluster: the ``kubelet`` binary of the cluster's
Kubernetes release against a CRI runtime that fakes only container execution.

A real node is three processes: ``nodelock-cri`` (devcluster/gomod/cmd/nodelock-cri: Kubernetes'
in-memory fake runtime that records every container config kubelet hands it), ``kubelet`` and our
device plugin (started by ``devcluster.gpunodes``).  kubelet runs with its own root directory
(``<state>/nodes/<node>``), its own ports on 127.0.0.1, a client certificate for
``system:node:<node>`` (group ``system:nodes``: the Node authorizer and NodeRestriction apply as on
a real node), a static pod directory (``<root>/manifests``) and a configuration without cgroups
per QoS class, node allocatable enforcement or swap checks, in a private mount namespace where
``<root>/device-plugins`` is bound at the fixed ``/var/lib/kubelet/device-plugins`` (the device
manager's socket path is compiled in).  So kubelet's ``device-plugins/`` and ``pod-resources/``
sockets are where a real node has them, relative to its root directory, and the device plugin
runs against it as in production.

What is real: node registration, its Lease and status, admission (topology manager, device
manager, Allocate, the checkpoint ``kubelet_internal_checkpoint``), the pod workers, the status
manager, the PodResources API, restart handling.  What is not: containers (no process, image,
cgroup, or network; see nodelock-cri), and the machine kubelet reads through cadvisor is this one.

Guarantees: the files of a node stay in its directory; a kubelet that cannot start is reported
with the end of its log (``DevclusterError``), never left half started.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devcluster import processes
from devcluster.binaries import ensure_cri, ensure_kubelet
from devcluster.cluster import Cluster
from devcluster.errors import DevclusterError
from devcluster.hostlimits import ensure_inotify_instances
from devcluster.invariants import ContainerRecord, PodRecord
from devcluster.pki import Identity
from handoff.wire import DEFAULT_RESOURCE, MIG_RESOURCE_PREFIX

KUBELET_DIR = "/var/lib/kubelet/device-plugins"
# binds $0 at kubelet's fixed device-plugin directory, then runs the rest
BIND_PLUGIN_DIR = f'mkdir -p {KUBELET_DIR} && mount --bind "$0" {KUBELET_DIR} && exec "$@"'
CONTAINERS_RECORD = "containers.jsonl"
CRI_SOCKET = "cri.sock"


class KubeletKind(enum.Enum):
    """Which kubelet runs a devcluster's GPU nodes."""

    SIM = "sim"  # nodelock-simkubelet: kubelet's device manager in a harness of ours
    REAL = "real"  # the kubelet binary against nodelock-cri


def node_identity(node: str) -> Identity:
    """The client identity kubelet of ``node`` uses, as the Node authorizer expects it."""
    return Identity(f"kubelet-{node}", f"system:node:{node}", ("system:nodes",))


@dataclass(frozen=True)
class RealNode:
    """Where a real-kubelet node keeps its files (its root directory is ``root``)."""

    root: Path

    @property
    def plugin_dir(self) -> Path:
        return self.root / "device-plugins"

    @property
    def cri_socket(self) -> Path:
        return self.root / CRI_SOCKET

    @property
    def containers_record(self) -> Path:
        """What kubelet handed the runtime: one JSON object a line (nodelock-cri)."""
        return self.root / CONTAINERS_RECORD

    @property
    def config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def manifests(self) -> Path:
        """kubelet's ``staticPodPath``: a pod manifest written here is a static pod."""
        return self.root / "manifests"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"


def kubelet_config(
    *, port: int, healthz_port: int, node: RealNode, ca_file: Path, topology_policy: str
) -> dict[str, Any]:
    """The KubeletConfiguration of a node: its ports on 127.0.0.1, its own directories, and no
    cgroup work (no QoS cgroups, nothing enforced on node allocatable, swap and cgroup v1
    accepted)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{node.cri_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "failCgroupV1": False,
        "localStorageCapacityIsolation": False,
        "podLogsDir": str(node.root / "pod-logs"),
        "volumePluginDir": str(node.root / "volume-plugins"),
        "topologyManagerPolicy": topology_policy,
        "staticPodPath": str(node.manifests),
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "1Mi"},
        "serializeImagePulls": False,
        # kubelet's default is 10s: how soon a plugin's devices reach the Node's allocatable
        "nodeStatusUpdateFrequency": "2s",
    }


def start_kubelet(
    cluster: Cluster,
    name: str,
    root: Path,
    *,
    labels: Mapping[str, str] | None = None,
    topology_policy: str = "none",
    version: str | None = None,
    timeout_s: float = 60.0,
) -> RealNode:
    """Start node ``name``'s fake runtime, then its real kubelet; return once kubelet's device
    manager serves its registration socket (the device plugin can then register)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        raise DevclusterError("real-kubelet nodes need `unshare` and `mount` (util-linux)")
    ensure_inotify_instances()
    kubelet = ensure_kubelet(version=version or cluster.binaries.kubernetes_version)
    cri = ensure_cri()
    node = RealNode(root)
    node.plugin_dir.mkdir(parents=True, exist_ok=True)
    node.manifests.mkdir(parents=True, exist_ok=True)
    cluster.pki.kubeconfig(node.kubeconfig, node_identity(name), cluster.api_url)
    config = kubelet_config(
        port=processes.free_port(),
        healthz_port=processes.free_port(),
        node=node,
        ca_file=cluster.pki.ca_cert,
        topology_policy=topology_policy,
    )
    node.config.write_text(yaml.safe_dump(config, sort_keys=False))
    cri_name = f"cri-{name}"
    if not _alive(cluster, cri_name):
        cluster.start_component(
            cri_name,
            [
                str(cri),
                f"--listen={node.cri_socket}",
                f"--record={node.containers_record}",
                f"--kubeconfig={cluster.kubeconfig}",
            ],
        )
    _wait_path(cluster, cri_name, node.cri_socket, timeout_s)
    argv = [
        *processes.in_private_mounts(BIND_PLUGIN_DIR, str(node.plugin_dir)),
        str(kubelet),
        f"--config={node.config}",
        f"--kubeconfig={node.kubeconfig}",
        f"--root-dir={node.root}",
        f"--hostname-override={name}",
        "--node-ip=127.0.0.1",
        f"--v={os.environ.get('NODELOCK_KUBELET_VERBOSITY', '1')}",
    ]
    if labels:
        argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    kubelet_name = f"kubelet-{name}"
    (node.plugin_dir / "kubelet.sock").unlink(missing_ok=True)
    cluster.start_component(kubelet_name, argv)
    _wait_path(cluster, kubelet_name, node.plugin_dir / "kubelet.sock", timeout_s)
    data = cluster.state.load()
    data["settings"]["kubelet"] = KubeletKind.REAL.value
    data["settings"].setdefault("kubelet_ports", {})[name] = config["port"]
    cluster.state.save(data)
    return node


def _alive(cluster: Cluster, name: str) -> bool:
    proc = cluster.state.procs().get(name)
    return proc is not None and processes.alive(proc)


def _wait_path(cluster: Cluster, name: str, path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        proc = cluster.state.procs().get(name)
        if proc is not None and not processes.alive(proc):
            raise DevclusterError(
                f"{name} exited while starting; the end of {proc.log}:\n" + processes.log_tail(proc)
            )
        if time.monotonic() > deadline:
            raise DevclusterError(
                f"{name} did not create {path} within {timeout_s:.0f}s; see {cluster.log_dir}"
            )
        time.sleep(0.05)


def read_containers(path: Path) -> list[dict[str, Any]]:
    """What kubelet handed the runtime, in order (``nodelock-cri``'s record); a line cut short
    by a crash of the runtime is skipped."""
    out: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


@dataclass(frozen=True)
class CheckpointEntry:
    """One entry of kubelet's device checkpoint: the devices of one resource one container of a
    pod was allocated (``PodDevicesEntry`` in kubelet's
    ``pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go``, v1.31.9 and v1.37.2)."""

    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def read_checkpoint(path: Path) -> list[CheckpointEntry]:
    """The entries of kubelet's ``kubelet_internal_checkpoint`` (none when there is no file).
    A file kubelet wrote in another format is a ``DevclusterError`` naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except ValueError as exc:
        raise DevclusterError(f"kubelet's checkpoint {path} is not JSON: {exc}") from exc
    try:
        entries = data["Data"]["PodDeviceEntries"] or []
        out = []
        for e in entries:
            per_numa = e["DeviceIDs"] or {}
            ids = sorted({str(d) for devs in per_numa.values() for d in devs or []})
            out.append(
                CheckpointEntry(
                    str(e["PodUID"]), str(e["ContainerName"]), str(e["ResourceName"]), tuple(ids)
                )
            )
    except (KeyError, TypeError, AttributeError) as exc:
        raise DevclusterError(f"kubelet's checkpoint {path} has an unknown shape: {exc!r}") from exc
    return out


def kubelet_records(
    pods: Iterable[Mapping[str, Any]],
    *,
    checkpoints: Mapping[str, Sequence[CheckpointEntry]],
    containers: Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[str, PodRecord]:
    """Pod key -> what the real kubelet of its node gave each container, for
    ``devcluster.invariants.check_pods``: the devices from kubelet's checkpoint (node ->
    entries), and the ``NVIDIA_VISIBLE_DEVICES`` kubelet handed the runtime in the container's
    last recorded config (node -> ``read_containers``).

    A container kubelet allocated devices to but never handed to the runtime has visible
    ``""`` once its pod is Running or Succeeded (an S2 violation), ``None`` before (not known
    yet).  A pod of which kubelet's checkpoint has no entry but whose containers kubelet handed
    the runtime (a finished pod kubelet has dropped, or a running one after kubelet restarted
    without its checkpoint) is recorded with the devices its runtime configs named
    (``NVIDIA_VISIBLE_DEVICES``): what it runs or ran with.  Those IDs count for the one device
    resource the container asks for (``MIG-`` IDs for its MIG resource, the others for
    ``nvidia.com/gpu``, when it asks for both); a container whose IDs cannot be told apart so (two
    MIG profiles) is left out."""
    out: dict[str, PodRecord] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if not uid or not node:
            continue
        phase = (pod.get("status") or {}).get("phase", "Pending")
        devices: dict[str, dict[str, list[str]]] = {}
        for entry in checkpoints.get(node, ()):
            if entry.pod_uid == uid and entry.device_ids:
                devices.setdefault(entry.container, {})[entry.resource] = list(entry.device_ids)
        visible: dict[str, str] = {}
        for rec in containers.get(node, ()):
            if rec.get("podUID") == uid:
                envs = rec.get("envs") or {}
                if "NVIDIA_VISIBLE_DEVICES" in envs:
                    visible[str(rec.get("container"))] = str(envs["NVIDIA_VISIBLE_DEVICES"])
        ran = phase in ("Running", "Succeeded")
        record: dict[str, ContainerRecord] = {}
        for container, per_resource in devices.items():
            seen = visible.get(container)
            record[container] = ContainerRecord(
                per_resource, seen if seen is not None else ("" if ran else None)
            )
        if not record:
            asked = _device_resources(pod)
            for container, env in visible.items():
                per_resource = _by_resource([d for d in env.split(",") if d], asked[container])
                if per_resource:
                    record[container] = ContainerRecord(per_resource, env)
        if record:
            out[f"{meta.get('namespace')}/{meta.get('name')}"] = record
    return out


def _device_resources(pod: Mapping[str, Any]) -> dict[str, set[str]]:
    """Container name -> the device resources it asks for (``nvidia.com/gpu``, MIG)."""
    spec = pod.get("spec") or {}
    out: dict[str, set[str]] = defaultdict(set)
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            out[str(c.get("name"))] |= {
                str(r)
                for r in res.get(part) or {}
                if r == DEFAULT_RESOURCE or str(r).startswith(MIG_RESOURCE_PREFIX)
            }
    return out


def _by_resource(ids: Sequence[str], asked: set[str]) -> dict[str, list[str]]:
    """Device IDs a container's runtime config named, per resource it asks for; {} when that
    cannot be told (no resource, or two MIG resources)."""
    mig = sorted(r for r in asked if r != DEFAULT_RESOURCE)
    if not ids or not asked or len(mig) > 1:
        return {}
    if len(asked) == 1:
        return {next(iter(asked)): list(ids)}
    out: dict[str, list[str]] = {}
    for d in ids:
        out.setdefault(mig[0] if d.startswith("MIG-") else DEFAULT_RESOURCE, []).append(d)
    return out


def records_under(state_dir: Path, pods: Sequence[Mapping[str, Any]]) -> dict[str, PodRecord]:
    """What the real kubelets of ``state_dir``'s nodes gave ``pods``, read afresh: each pod's
    node's device checkpoint and the container configs its kubelet handed the runtime
    (``kubelet_records``).  Read after the pods, so a record may be newer than its pod."""
    nodes = {str((p.get("spec") or {}).get("nodeName") or "") for p in pods} - {""}
    checkpoints: dict[str, list[CheckpointEntry]] = {}
    containers: dict[str, list[dict[str, Any]]] = {}
    for node in sorted(nodes):
        real = RealNode(state_dir / "nodes" / node)
        path = real.plugin_dir / "kubelet_internal_checkpoint"
        checkpoints[node] = read_checkpoint(path) if path.exists() else []
        containers[node] = read_containers(real.containers_record)
    return kubelet_records(pods, checkpoints=checkpoints, containers=containers)
