"""Nodes with a real container runtime: kubelet, containerd, runc, CNI and kube-proxy, each node in
its own network and mount namespace, for installing nodelock as it ships (image, chart, pods).

``up_runtime_nodes`` adds to a running devcluster control plane one node without GPUs
(``node-system``) and ``gpu_nodes`` GPU nodes (``gpu-node-01`` ...: where the chart's device
plugin DaemonSet runs, once they are labelled, and serves simulated GPUs).  A node is:

- a network namespace on the cluster's bridge (``devcluster.netns``) and a mount namespace, held
  open by a ``netns-<name>`` process (entered with ``nsenter``, not ``ip netns exec``, which would
  remount ``/sys`` without the cgroup hierarchies kubelet and runc use), in which
  ``<node dir>/kubelet`` is ``/var/lib/kubelet``, ``<node dir>/nodelock`` is
  ``/var/lib/nodelock`` and ``<node dir>/pod-logs`` is ``/var/log/pods``: the paths the
  chart's hostPath volumes name are the node's own, as on a real machine;
- containerd 1.7 (Debian trixie's, ``devcluster.containerd``; with its own root, state and socket
  under the node directory; the CRI plugin's ``restrict_oom_score_adj`` on, as a sandbox that may
  not lower ``oom_score_adj`` needs; the overlayfs snapshotter; CDI on, with the node's
  ``/etc/cdi``), Debian's runc and CNI bridge plugin;
- on a GPU node, a CDI spec for its simulated GPUs (``cdi_spec``), as ``nvidia-ctk cdi generate``
  writes one for real GPUs: each device, named by its UUID under ``nvidia.com/gpu``, puts
  ``NODELOCK_SIMULATED_GPU_<index>=<UUID>`` into the container, so a container shows which CDI
  devices its runtime applied;
- kubelet of the cluster's release against that containerd (cgroupfs driver, no QoS cgroups,
  ``clusterDNS`` the gateway, where ``devcluster.clusterdns`` answers for Services).  A GPU node
  is a node like the others until it is labelled ``nodelock.io/enabled=true``, as docs/install.md
  moves a node over; ``runtime_cluster`` labels them when it installs the chart;
- kube-proxy of the cluster's release (iptables mode), so pods reach the API server through the
  ``kubernetes`` Service with their in-cluster configuration.

The images (``devcluster.images``) are imported into every node's containerd.  The API server
advertises the bridge's gateway address (``Cluster.up(node_network=...)``), so the ``kubernetes``
Service's endpoints are where the nodes reach it.

Guarantees: a node that cannot start is reported with the end of its log (``DevclusterError``);
``stop_runtime_nodes`` ends every container of the cluster's nodes, the runtimes, kubelets and
namespaces, and removes the network, whatever state they are in.  Not here: GPUs (the chart's
device plugin runs its simulated backend) and MIG instances (the CDI spec names whole GPUs).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devcluster import netns, processes, realkubelet
from devcluster.binaries import ensure_kube_proxy, ensure_kubelet
from devcluster.cluster import Cluster
from devcluster.containerd import ensure_containerd
from devcluster.errors import DevclusterError
from devcluster.hostlimits import ensure_inotify_instances
from devcluster.images import Image, NodeImages, ensure_node_images, tool
from devcluster.install import NAMESPACE, devcluster_values, write_values
from devcluster.install import install as install_chart
from devcluster.pki import Identity
from devcluster.realkubelet import node_identity
from deviceplugin.answer import CDI_KIND
from deviceplugin.simulated import simulated_id
from handoff.wire import DEFAULT_RESOURCE

SYSTEM_NODE = "node-system"
KUBELET_PORT, KUBELET_HEALTHZ_PORT = 10250, 10248  # kubelet's defaults: one kubelet a namespace
GPU_LABEL = "nodelock.io/enabled"
KUBE_PROXY = Identity("kube-proxy", "system:kube-proxy")
CNI_BIN_DIR = "/usr/lib/cni"
# node directory -> the path it is inside the node's mount namespace
NODE_MOUNTS = (
    ("kubelet", "/var/lib/kubelet"),
    ("nodelock", "/var/lib/nodelock"),
    ("pod-logs", "/var/log/pods"),
    ("run-containerd", "/run/containerd"),
    ("netns", "/run/netns"),
    ("cdi", "/etc/cdi"),
)
_HOLDER = (
    'set -e; d="$0"; for m in "$@"; do src="$d/${m%%=*}"; dst="${m#*=}"; '
    'mkdir -p "$src" "$dst"; mount --bind "$src" "$dst"; done; exec sleep infinity'
)
RUNTIME_TOOLS = ("runc", "ip", "iptables", "nsenter", "unshare")
CDI_SPEC = "nodelock-simulated.json"  # in the node's /etc/cdi
CDI_ENV_PREFIX = "NODELOCK_SIMULATED_GPU_"


@dataclass(frozen=True)
class RuntimeNode:
    """One node: its name, its index on the node network, whether it serves GPUs."""

    name: str
    index: int
    gpus: bool
    root: Path  # its directory, <state>/nodes/<name>
    containerd_bin: Path = Path("/usr/bin")  # containerd, its runc shim and ctr

    @property
    def kubelet_dir(self) -> Path:
        """``/var/lib/kubelet`` inside the node (kubelet's checkpoint is in device-plugins/)."""
        return self.root / "kubelet"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"


def node_list(
    state_dir: Path, gpu_nodes: int, containerd_bin: Path = Path("/usr/bin")
) -> list[RuntimeNode]:
    """The system node, then ``gpu_nodes`` GPU nodes (``gpu-node-01`` ...)."""
    names = [SYSTEM_NODE] + [f"gpu-node-{i:02d}" for i in range(1, gpu_nodes + 1)]
    return [
        RuntimeNode(name, i, i > 0, state_dir / "nodes" / name, containerd_bin)
        for i, name in enumerate(names)
    ]


def cdi_spec(node: str, gpus: int) -> dict[str, Any]:
    """The CDI spec of ``node``'s ``gpus`` simulated GPUs: one device per GPU, named by its UUID
    (the name the device plugin answers in CDI mode), whose only edit is an environment variable
    naming it."""
    return {
        "cdiVersion": "0.5.0",
        "kind": CDI_KIND,
        "devices": [
            {
                "name": str(simulated_id(node, i)),
                "containerEdits": {"env": [f"{CDI_ENV_PREFIX}{i}={simulated_id(node, i)}"]},
            }
            for i in range(gpus)
        ],
        "containerEdits": {},
    }


def containerd_config(node: RuntimeNode, *, sandbox_image: str) -> str:
    """containerd's configuration (version 2 of its format, containerd 1.7) for ``node``."""
    r = node.root / "containerd"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{r}/root"
state = "{r}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{node.containerd_socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{r}/opt"

[{cri}]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi"]
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{node.root / "cni" / "net.d"}"
"""


def cni_config(node: RuntimeNode, net: netns.NodeNetwork) -> dict[str, Any]:
    """The node's CNI network: a bridge in its namespace, host-local addresses from its pod
    range, masquerade for what leaves it."""
    return {
        "cniVersion": "1.0.0",
        "name": "devcluster",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(node.root / "cni" / "ipam"),
                    "ranges": [[{"subnet": net.pod_cidr(node.index)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(node: RuntimeNode, net: netns.NodeNetwork, *, ca_file: Path) -> dict[str, Any]:
    """kubelet's configuration: that of devcluster's other real kubelets (no cgroup work beyond
    the containers' own, ``realkubelet.kubelet_config``) with kubelet's usual ports and paths
    inside the node's namespaces, containerd, and the cluster DNS."""
    config = realkubelet.kubelet_config(
        port=KUBELET_PORT,
        healthz_port=KUBELET_HEALTHZ_PORT,
        node=realkubelet.RealNode(node.kubelet_dir),
        ca_file=ca_file,
        topology_policy="none",
    )
    for key in ("podLogsDir", "volumePluginDir"):  # /var/log/pods and kubelet's default
        del config[key]
    config.update(
        {
            "address": net.node_ip(node.index),
            "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
            "clusterDNS": [net.gateway],
            "clusterDomain": "cluster.local",
            "resolvConf": str(node.root / "resolv.conf"),
        }
    )
    return config


def kube_proxy_config(node: RuntimeNode, kubeconfig: Path) -> dict[str, Any]:
    """kube-proxy's configuration: iptables mode, conntrack settings left as they are."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node.name,
        "mode": "iptables",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def _node_kubeconfig(cluster: Cluster, path: Path, ident: Identity, net: netns.NodeNetwork) -> Path:
    """A kubeconfig reaching the API server at the gateway; its certificate names
    ``kubernetes``, not that address."""
    cluster.pki.kubeconfig(path, ident, f"https://{net.gateway}:{net.apiserver_port}")
    config = yaml.safe_load(path.read_text())
    config["clusters"][0]["cluster"]["tls-server-name"] = "kubernetes"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _enter(holder_pid: int, argv: Sequence[str]) -> list[str]:
    return ["nsenter", f"--target={holder_pid}", "--mount", "--net", "--", *argv]


def _holder_pid(cluster: Cluster, node: RuntimeNode) -> int:
    proc = cluster.state.procs().get(f"netns-{node.name}")
    if proc is None or not processes.alive(proc):
        raise DevclusterError(f"node {node.name}'s namespace holder is not running")
    return proc.pid


def start_node(
    cluster: Cluster,
    node: RuntimeNode,
    net: netns.NodeNetwork,
    images: NodeImages,
    *,
    gpus: int,
    timeout_s: float = 90.0,
) -> None:
    """Start ``node``'s namespaces and containerd, with the CDI spec of its ``gpus`` simulated
    GPUs on a GPU node (``start_kubelet`` does the rest, once the images are imported)."""
    node.root.mkdir(parents=True, exist_ok=True)
    (node.root / "cdi").mkdir(exist_ok=True)
    if node.gpus:
        (node.root / "cdi" / CDI_SPEC).write_text(json.dumps(cdi_spec(node.name, gpus), indent=1))
    (node.root / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
    (node.root / "cni" / "net.d" / "10-devcluster.conflist").write_text(
        json.dumps(cni_config(node, net), indent=1)
    )
    (node.root / "containerd").mkdir(exist_ok=True)
    (node.root / "containerd" / "config.toml").write_text(
        containerd_config(node, sandbox_image=images.pause.ref)
    )
    (node.root / "resolv.conf").write_text(f"nameserver {net.gateway}\n")
    holder = cluster.start_component(
        f"netns-{node.name}",
        [
            "nsenter",
            f"--net=/run/netns/{net.netns(node.index)}",
            "--",
            *processes.in_private_mounts(
                _HOLDER, str(node.root), *(f"{src}={dst}" for src, dst in NODE_MOUNTS)
            ),
        ],
    )
    _wait(cluster, holder.name, lambda: _mounted(holder.pid), timeout_s, "its mounts")
    cluster.start_component(
        f"containerd-{node.name}",
        _enter(
            holder.pid,
            [
                str(node.containerd_bin / "containerd"),
                f"--config={node.root / 'containerd' / 'config.toml'}",
            ],
        ),
        env={"PATH": f"{node.containerd_bin}:{os.environ.get('PATH', os.defpath)}"},  # its shim
    )
    _wait(
        cluster,
        f"containerd-{node.name}",
        node.containerd_socket.exists,
        timeout_s,
        str(node.containerd_socket),
    )


def start_kubelet(cluster: Cluster, node: RuntimeNode, net: netns.NodeNetwork) -> None:
    """Start ``node``'s kube-proxy and kubelet in its namespaces."""
    version = cluster.binaries.kubernetes_version
    kubelet = ensure_kubelet(version=version)
    kube_proxy = ensure_kube_proxy(version=version)
    holder_pid = _holder_pid(cluster, node)
    proxy_kubeconfig = _node_kubeconfig(
        cluster, node.root / "kube-proxy.kubeconfig", KUBE_PROXY, net
    )
    (node.root / "kube-proxy.yaml").write_text(
        yaml.safe_dump(kube_proxy_config(node, proxy_kubeconfig), sort_keys=False)
    )
    cluster.start_component(
        f"kube-proxy-{node.name}",
        _enter(holder_pid, [str(kube_proxy), f"--config={node.root / 'kube-proxy.yaml'}"]),
    )
    kubeconfig = _node_kubeconfig(
        cluster, node.root / "kubelet.kubeconfig", node_identity(node.name), net
    )
    (node.root / "kubelet-config.yaml").write_text(
        yaml.safe_dump(kubelet_config(node, net, ca_file=cluster.pki.ca_cert), sort_keys=False)
    )
    argv = [
        str(kubelet),
        f"--config={node.root / 'kubelet-config.yaml'}",
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node.name}",
        f"--node-ip={net.node_ip(node.index)}",
        f"--v={os.environ.get('NODELOCK_KUBELET_VERBOSITY', '1')}",
    ]
    cluster.start_component(f"kubelet-{node.name}", _enter(holder_pid, argv))


def _mounted(pid: int) -> bool:
    try:
        mounts = Path(f"/proc/{pid}/mounts").read_text()
    except OSError:
        return False
    return " /var/lib/kubelet " in mounts and " /etc/cdi " in mounts


def _wait(cluster: Cluster, name: str, ready: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        proc = cluster.state.procs().get(name)
        if proc is not None and not processes.alive(proc):
            raise DevclusterError(
                f"{name} exited while starting; the end of {proc.log}:\n" + processes.log_tail(proc)
            )
        if time.monotonic() > deadline:
            raise DevclusterError(f"{name}: {what} not ready within {timeout_s:.0f}s")
        time.sleep(0.1)


def import_images(node: RuntimeNode, images: NodeImages, *, extra: Sequence[Image] = ()) -> None:
    """Import every image (and ``extra`` ones) into ``node``'s containerd (namespace
    ``k8s.io``, unpacked), unless it has it."""
    have = netns.run(_ctr(node, "images", "list", "--quiet"))
    for image in [*images.all(), *extra]:
        if image.ref in have.split() or f"docker.io/{image.ref}" in have.split():
            continue
        netns.run(_ctr(node, "images", "import", "--no-unpack=false", str(image.archive)))


def _ctr(node: RuntimeNode, *args: str) -> list[str]:
    ctr = str(node.containerd_bin / "ctr")
    return [ctr, f"--address={node.containerd_socket}", "--namespace=k8s.io", *args]


def wait_nodes_ready(cluster: Cluster, nodes: Sequence[RuntimeNode], timeout_s: float) -> None:
    """Wait until every node is Ready."""
    deadline = time.monotonic() + timeout_s
    names = {n.name for n in nodes}
    while True:
        out = cluster.kubectl("get", "nodes", "-o", "json", check=False)
        ready = set()
        with contextlib.suppress(ValueError):
            for item in json.loads(out or "{}").get("items", []):
                conds = (item.get("status") or {}).get("conditions") or []
                if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
                    ready.add(item["metadata"]["name"])
        if names <= ready:
            return
        for n in nodes:
            proc = cluster.state.procs().get(f"kubelet-{n.name}")
            if proc is not None and not processes.alive(proc):
                raise DevclusterError(
                    f"kubelet of {n.name} exited; the end of {proc.log}:\n"
                    + processes.log_tail(proc)
                )
        if time.monotonic() > deadline:
            raise DevclusterError(
                f"nodes not Ready within {timeout_s:.0f}s: {sorted(names - ready)}; "
                f"see {cluster.log_dir}"
            )
        time.sleep(0.5)


def check_tools() -> None:
    """Every program containerd nodes need is here, or a DevclusterError naming the step."""
    for name in RUNTIME_TOOLS:
        tool(name)
    if not Path(CNI_BIN_DIR, "bridge").exists():
        raise DevclusterError(
            f"the CNI plugins are not in {CNI_BIN_DIR} (`make runtime-deps` installs Debian's "
            "containernetworking-plugins)"
        )
    if os.geteuid() != 0:
        raise DevclusterError("containerd nodes need root (network namespaces, mounts)")
    ensure_inotify_instances()


def up_runtime_nodes(
    cluster: Cluster,
    net: netns.NodeNetwork,
    images: NodeImages,
    *,
    gpu_nodes: int,
    gpus_per_node: int,
    containerd_bin: Path,
) -> list[RuntimeNode]:
    """Start the system node and ``gpu_nodes`` GPU nodes of ``gpus_per_node`` simulated GPUs
    (their CDI spec; the device plugin is the chart's) and the cluster DNS; return once every
    node is Ready."""
    nodes = node_list(cluster.state_dir, gpu_nodes, containerd_bin)
    if len(nodes) > netns.MAX_NODES:
        raise DevclusterError(f"at most {netns.MAX_NODES - 1} GPU nodes")
    cluster.start_component(
        "clusterdns",
        [
            sys.executable,
            "-m",
            "devcluster.clusterdns",
            f"--listen={net.gateway}:53",
            f"--kubeconfig={cluster.kubeconfig}",
        ],
    )
    for node in nodes:
        netns.add_node(net, node.index, len(nodes))
    for node in nodes:
        start_node(cluster, node, net, images, gpus=gpus_per_node)
    with ThreadPoolExecutor(len(nodes)) as pool:  # the import is most of a node's start
        for done in [pool.submit(import_images, node, images) for node in nodes]:
            done.result()
    for node in nodes:
        start_kubelet(cluster, node, net)
    wait_nodes_ready(cluster, nodes, timeout_s=120.0)
    return nodes


def stop_runtime_nodes(cluster: Cluster) -> None:
    """Stop every node of the cluster: containers first (each pod's processes, through its
    containerd shim), then kubelet, kube-proxy, containerd and the namespace holders; then
    remove the network.  Safe to call again, and on a half-started cluster."""
    settings = cluster.settings()
    network = settings.get("node_network")
    if not network:
        return
    net = netns.NodeNetwork.from_settings(network)
    nodes = node_list(cluster.state_dir, int(settings.get("runtime_gpu_nodes", 0)))
    procs = cluster.state.procs()
    for node in nodes:
        for part in ("kubelet", "kube-proxy"):
            proc = procs.get(f"{part}-{node.name}")
            if proc is not None:
                processes.stop(proc)
                cluster.state.remove(proc.name)
        _kill_containers(node)
        for part in ("containerd", "netns"):
            proc = procs.get(f"{part}-{node.name}")
            if proc is not None:
                processes.stop(proc)
                cluster.state.remove(proc.name)
    dns = procs.get("clusterdns")
    if dns is not None:
        processes.stop(dns)
        cluster.state.remove("clusterdns")
    netns.teardown(net, len(nodes), str(cluster.state_dir))


def _kill_containers(node: RuntimeNode) -> None:
    """SIGKILL every process a containerd shim of ``node`` started, then the shims."""
    address = str(node.containerd_socket)
    shims = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        shim = cmdline[0].endswith(b"containerd-shim-runc-v2")
        if shim and address.encode() in cmdline:
            shims.append(int(entry.name))
    children = [pid for pid, fields in processes.process_table() if int(fields[1]) in shims]
    for pid in [*children, *shims]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True)
class RuntimeCluster:
    """What ``runtime_cluster`` started: the images, the nodes, the helm command it ran."""

    images: NodeImages
    nodes: list[RuntimeNode]
    helm_command: list[str] | None


def runtime_cluster(
    cluster: Cluster,
    *,
    gpu_nodes: int,
    gpus_per_node: int,
    install: bool = True,
    apiserver_port: int | None = None,
    cache: str | os.PathLike[str] | None = None,
    timeout_s: float = 300.0,
) -> RuntimeCluster:
    """Build what containerd nodes run, start the control plane advertising the node network's
    gateway, the nodes, and (``install``, with GPU nodes) nodelock's chart; return once every
    GPU node reports its GPUs.  Anything that fails stops all of it again."""
    check_tools()
    version = cluster.binaries.kubernetes_version
    containerd_bin = ensure_containerd(cache)
    images = ensure_node_images(cluster.binaries, cache=cache)
    ensure_kubelet(cache=cache, version=version)
    ensure_kube_proxy(cache=cache, version=version)
    port = apiserver_port or processes.free_port()
    net = netns.allocate(port, str(cluster.state_dir))
    try:
        cluster.up(apiserver_port=port, advertise_address=net.gateway)
        data = cluster.state.load()
        data["settings"]["node_network"] = net.to_settings()
        data["settings"]["runtime_gpu_nodes"] = gpu_nodes
        cluster.state.save(data)
        nodes = up_runtime_nodes(
            cluster,
            net,
            images,
            gpu_nodes=gpu_nodes,
            gpus_per_node=gpus_per_node,
            containerd_bin=containerd_bin,
        )
        command = None
        if install and gpu_nodes:
            label_gpu_nodes(cluster, nodes)
            values = write_values(cluster, devcluster_values(images, gpus_per_node=gpus_per_node))
            command = install_chart(cluster, values, timeout_s=timeout_s)
            wait_gpus(cluster, [n for n in nodes if n.gpus], gpus_per_node, timeout_s=timeout_s)
    except BaseException:
        cluster.down()
        netns.teardown(net, gpu_nodes + 1, str(cluster.state_dir))
        raise
    return RuntimeCluster(images, nodes, command)


def label_gpu_nodes(cluster: Cluster, nodes: Sequence[RuntimeNode]) -> None:
    """Label the GPU nodes ``nodelock.io/enabled=true``, as docs/install.md moves a node over:
    the chart's device plugin DaemonSet runs there."""
    for node in nodes:
        if node.gpus:
            cluster.kubectl("label", "node", node.name, f"{GPU_LABEL}=true", "--overwrite")


def wait_gpus(
    cluster: Cluster, nodes: Sequence[RuntimeNode], gpus: int, *, timeout_s: float
) -> None:
    """Wait until each of ``nodes`` has ``gpus`` allocatable ``nvidia.com/gpu``."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = cluster.kubectl("get", "nodes", "-o", "json", check=False)
        have: dict[str, str] = {}
        with contextlib.suppress(ValueError):
            for item in json.loads(out or "{}").get("items", []):
                alloc = (item.get("status") or {}).get("allocatable") or {}
                have[item["metadata"]["name"]] = str(alloc.get(DEFAULT_RESOURCE, "0"))
        missing = [n.name for n in nodes if have.get(n.name) != str(gpus)]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise DevclusterError(
                f"{missing} did not report {gpus} {DEFAULT_RESOURCE} within {timeout_s:.0f}s "
                f"(allocatable: {have}); see `kubectl -n {NAMESPACE} get pods -o wide`"
            )
        time.sleep(0.5)
