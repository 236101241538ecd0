"""The GPU side of a devcluster: the extender wired into kube-scheduler, and simulated GPU nodes.

A simulated node is two processes: ``nodelock-simkubelet`` (kubelet's own device manager, in a
mount namespace of its own where the node's directory is bound at the fixed kubelet socket path)
and our ``nodelock device-plugin`` with the simulated GPU backend, using that directory as its
plugin directory.  So the client of our plugin is real kubelet code; only container start is
simulated (docs/simkubelet.md).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devcluster import processes
from devcluster.admission import install_gpu_pod_policies
from devcluster.binaries import ensure_simkubelet
from devcluster.cluster import APISERVER_REQUEST_TIMEOUT_S, Cluster
from devcluster.errors import DevclusterError
from devcluster.hostlimits import ensure_inotify_instances
from devcluster.pki import ADMIN, SCHEDULER
from devcluster.realkubelet import BIND_PLUGIN_DIR, KubeletKind, start_kubelet
from devcluster.versions import resolve
from deviceplugin.simulated import DEFAULT_MEMORY_MIB, layout_numa_nodes
from handoff.topology import NumaPolicy
from handoff.wire import DEFAULT_RESOURCE, Keys
from scheduler_ext.binder import DEFAULT_WAIT_BUDGET_S
from scheduler_ext.config import DEFAULT_HTTP_TIMEOUT_S, ExtenderTLS, scheduler_config

MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL


def node_dir(state_dir: Path, node: str) -> Path:
    """A simulated node's own directory in the cluster's state directory."""
    return state_dir / "nodes" / node


def pod_resources_socket(state_dir: Path, node: str) -> Path:
    """Where the node's simulated kubelet serves kubelet's PodResources API (a real kubelet's
    ``/var/lib/kubelet/pod-resources/kubelet.sock``)."""
    return node_dir(state_dir, node) / "pod-resources" / "kubelet.sock"


def kubelet_checkpoint(state_dir: Path, node: str) -> Path:
    """The node's kubelet device checkpoint (in its device plugin directory)."""
    return node_dir(state_dir, node) / "device-plugins" / "kubelet_internal_checkpoint"


def simulated_nodes(state_dir: Path) -> list[str]:
    """The simulated nodes this state directory has held, by name."""
    nodes = state_dir / "nodes"
    return sorted(d.name for d in nodes.iterdir() if d.is_dir()) if nodes.is_dir() else []


def nodelock_command() -> list[str]:
    """How to run the ``nodelock`` CLI of this installation."""
    exe = Path(sys.executable).parent / "nodelock"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "nodelock.cli"]


@dataclass(frozen=True)
class NodeSpec:
    """A simulated GPU node."""

    name: str
    gpus: int
    model: str = "NVIDIA H100 80GB HBM3"
    memory_mib: int = DEFAULT_MEMORY_MIB
    layout: str | None = None  # a simulated GPU layout (deviceplugin.simulated.LAYOUTS)
    topology_policy: NumaPolicy = NumaPolicy.NONE  # the simulated kubelet's topology manager
    gpu_split: int = 1  # > 1: the device plugin shares each GPU as S virtual devices
    # (GPU index, MIG layout) of GPUs in MIG mode (deviceplugin.simulated.mig_layout)
    mig: tuple[tuple[int, str], ...] = ()
    # which pods the simulated kubelet's PodResources List returns: "active" (kubelet 1.34+) or
    # "all" (kubelet before 1.34: rejected and finished pods too; docs/simkubelet.md)
    pod_resources_list: str = "active"

    @property
    def numa_nodes(self) -> int:
        return 0 if self.layout is None else layout_numa_nodes(self.layout)

    @property
    def whole_gpus(self) -> int:
        """How many GPUs kubelet advertises as ``nvidia.com/gpu`` (not in MIG mode)."""
        return self.gpus - len(self.mig)


def node_names(count: int) -> list[str]:
    return [f"gpu-node-{i:02d}" for i in range(1, count + 1)]


def node_specs(
    nodes: int,
    gpus_per_node: int,
    *,
    gpu_topology: str | None = None,
    topology_policy: NumaPolicy = NumaPolicy.NONE,
    gpu_split: int = 1,
    shared_nodes: int | None = None,
    gpu_memory_mib: int | None = None,
    mig: tuple[tuple[int, str], ...] = (),
) -> list[NodeSpec]:
    """The simulated nodes of a devcluster, in name order.

    ``shared_nodes`` None: every node shares its GPUs with ``gpu_split``; N: the last N nodes do
    and the others keep whole GPUs (split 1).  Raises ``ValueError`` for N outside 0..nodes.
    """
    if shared_nodes is not None and not 0 <= shared_nodes <= nodes:
        raise ValueError(f"shared nodes must be between 0 and {nodes}, not {shared_nodes}")
    sharing_from = 0 if shared_nodes is None else nodes - shared_nodes
    return [
        NodeSpec(
            n,
            gpus_per_node,
            layout=gpu_topology,
            topology_policy=topology_policy,
            gpu_split=gpu_split if i >= sharing_from else 1,
            memory_mib=DEFAULT_MEMORY_MIB if gpu_memory_mib is None else gpu_memory_mib,
            mig=mig,
        )
        for i, n in enumerate(node_names(nodes))
    ]


def start_extender(
    cluster: Cluster,
    *,
    replicas: int = 1,
    policy: str = "binpack",
    lock_aware: bool = True,
    extra_args: list[str] | None = None,
    bind_wait_budget_s: float = DEFAULT_WAIT_BUDGET_S,
    http_timeout_s: float = DEFAULT_HTTP_TIMEOUT_S,
    tls: bool = False,
    timeout_s: float = 60.0,
) -> str:
    """Start extender replica(s) (behind a round-robin proxy when more than one), wire them into
    kube-scheduler, and return the URL the scheduler calls.  Each replica's plain-HTTP metrics
    and probe port is recorded in the settings (``extender.metrics``, one URL per replica).
    The bind wait budget and
    kube-scheduler's ``httpTimeout`` are set together: the extender is told the timeout the
    scheduler is configured with, and refuses to start if the budget cannot fit in it.

    With ``tls`` the extender serves HTTPS and requires kube-scheduler's client certificate, as
    the shipped configuration does (one replica: the proxy speaks plain HTTP)."""
    tls_args: list[str] = []
    scheduler_tls: ExtenderTLS | None = None
    if tls:
        if replicas > 1:
            raise DevclusterError("an HTTPS extender runs as one replica here (the proxy is HTTP)")
        cert, key = extender_serving_cert(cluster)
        tls_args = [f"--tls-cert={cert}", f"--tls-key={key}", f"--client-ca={cluster.pki.ca_cert}"]
        scheduler_tls = ExtenderTLS(
            ca_file=str(cluster.pki.ca_cert),
            cert_file=str(cluster.pki.client_cert(SCHEDULER)),
            key_file=str(cluster.pki.client_key(SCHEDULER)),
        )
    scheme = "https" if tls else "http"
    urls = []
    metrics_urls = []
    ports = []
    for i in range(replicas):
        port = processes.free_port()
        metrics_port = processes.free_port()
        name = "extender" if replicas == 1 else f"extender-{i}"
        argv = [
            *nodelock_command(),
            "extender",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--listen=127.0.0.1:{port}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={metrics_port}",
            f"--policy={policy}",
            "--lock-aware" if lock_aware else "--no-lock-aware",
            f"--bind-wait-budget={bind_wait_budget_s:g}",
            f"--scheduler-http-timeout={http_timeout_s:g}",
            f"--apiserver-request-timeout={APISERVER_REQUEST_TIMEOUT_S}",
            "--ask-again-turned-away",  # as the chart runs it (extender.askAgainTurnedAway)
            *tls_args,
            *(extra_args or []),
        ]
        cluster.start_component(name, argv)
        wait_ok(cluster, name, f"http://127.0.0.1:{metrics_port}/readyz", timeout_s)
        urls.append(f"{scheme}://127.0.0.1:{port}")
        metrics_urls.append(f"http://127.0.0.1:{metrics_port}")
        ports.append(port)
    url = urls[0]
    if replicas > 1:
        lb_port = processes.free_port()
        argv = [sys.executable, "-m", "devcluster.lb", f"--listen={lb_port}"]
        argv += [f"--backend=127.0.0.1:{p}" for p in ports]
        cluster.start_component("extender-lb", argv)
        url = f"http://127.0.0.1:{lb_port}"
        wait_ok(cluster, "extender-lb", f"{url}/readyz", timeout_s)
    config = scheduler_config(
        url, kubeconfig=str(cluster.kubeconfig), tls=scheduler_tls, http_timeout_s=http_timeout_s
    )
    cluster.restart_scheduler({"extenders": config["extenders"]})
    data = cluster.state.load()
    data["settings"]["extender"] = {
        "url": url,
        "replicas": urls,
        "metrics": metrics_urls,
        "http_timeout_s": http_timeout_s,
    }
    cluster.state.save(data)
    return url


def extender_serving_cert(cluster: Cluster) -> tuple[Path, Path]:
    """The extender's HTTPS certificate and key (for 127.0.0.1, signed by the cluster's CA),
    issued once per cluster."""
    where = cluster.state_dir / "extender-tls"
    cert, key = where / "tls.crt", where / "tls.key"
    if not (cert.exists() and key.exists()):
        where.mkdir(parents=True, exist_ok=True)
        cluster.pki.issue(
            cert, key, common_name="nodelock-extender", ips=["127.0.0.1"], server=True
        )
    return cert, key


def start_node(
    cluster: Cluster,
    spec: NodeSpec,
    *,
    plugin_args: list[str] | None = None,
    kubelet: KubeletKind = KubeletKind.SIM,
) -> None:
    """Start a node's kubelet (the simulated harness, or a real kubelet: devcluster.realkubelet),
    then its device plugin."""
    if kubelet is KubeletKind.REAL:
        _start_real_kubelet(cluster, spec)
        start_device_plugin(cluster, spec, extra_args=plugin_args)
        return
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        raise DevclusterError("simulated GPU nodes need `unshare` and `mount` (util-linux)")
    simkubelet = ensure_simkubelet()
    node_dir = cluster.state_dir / "nodes" / spec.name
    plugin_dir = node_dir / "device-plugins"
    longest = plugin_dir / "nodelock-gpu.sock"
    if len(str(longest).encode()) > MAX_SOCKET_PATH:
        raise DevclusterError(
            f"the state directory {cluster.state_dir} is too deep for the nodes' unix sockets "
            f"({longest} is {len(str(longest).encode())} bytes, at most {MAX_SOCKET_PATH} "
            "work): choose a shorter --state-dir"
        )
    plugin_dir.mkdir(parents=True, exist_ok=True)
    # kubelet's device manager watches the plugin directory; no root needed for these nodes
    ensure_inotify_instances(strict=False)
    kubelet_argv = [
        *processes.in_private_mounts(BIND_PLUGIN_DIR, str(plugin_dir)),
        str(simkubelet),
        f"--kubeconfig={cluster.kubeconfig}",
        f"--node-name={spec.name}",
        f"--resource-name={DEFAULT_RESOURCE}",
        f"--pod-resources-socket={pod_resources_socket(cluster.state_dir, spec.name)}",
        f"--pod-resources-list={spec.pod_resources_list}",
    ]
    if spec.topology_policy is not NumaPolicy.NONE and spec.numa_nodes == 0:
        raise DevclusterError(
            f"topology manager policy {spec.topology_policy.value} needs a GPU layout with NUMA "
            "nodes (--gpu-topology)"
        )
    if spec.numa_nodes:
        kubelet_argv.append(f"--numa-nodes={spec.numa_nodes}")
    if spec.topology_policy is not NumaPolicy.NONE:
        # the policy is kubelet configuration; the node label is how the extender learns it
        kubelet_argv += [
            f"--topology-manager-policy={spec.topology_policy.value}",
            f"--labels={Keys().numa_policy}={spec.topology_policy.value}",
        ]
    cluster.start_component(f"kubelet-{spec.name}", kubelet_argv)
    deadline = time.monotonic() + 30
    while not (plugin_dir / "kubelet.sock").exists():
        if time.monotonic() > deadline:
            raise DevclusterError(
                f"the simulated kubelet of {spec.name} did not create its socket; see "
                f"{cluster.log_dir / ('kubelet-' + spec.name + '.log')}"
            )
        time.sleep(0.05)
    start_device_plugin(cluster, spec, extra_args=plugin_args)


def _start_real_kubelet(cluster: Cluster, spec: NodeSpec) -> None:
    if spec.topology_policy is not NumaPolicy.NONE or spec.layout is not None:
        raise DevclusterError(
            "a real kubelet reads this machine's NUMA topology, not a simulated GPU layout: "
            "--gpu-topology and --topology-manager-policy need --kubelet sim"
        )
    root = cluster.state_dir / "nodes" / spec.name
    if len(str(root / "device-plugins" / "nodelock-gpu.sock").encode()) > MAX_SOCKET_PATH:
        raise DevclusterError(
            f"the state directory {cluster.state_dir} is too deep for the nodes' unix sockets: "
            "choose a shorter --state-dir"
        )
    start_kubelet(cluster, spec.name, root)


def start_device_plugin(
    cluster: Cluster, spec: NodeSpec, *, extra_args: list[str] | None = None
) -> None:
    """Start the node's device plugin with the simulated backend."""
    node_dir = cluster.state_dir / "nodes" / spec.name
    port = processes.free_port()
    layout_args: list[str] = []
    if spec.layout is not None:
        sim_file = node_dir / "sim.json"
        sim_file.write_text(json.dumps({"layout": spec.layout}) + "\n", encoding="utf-8")
        layout_args = [f"--sim-file={sim_file}"]
    argv = [
        *nodelock_command(),
        "device-plugin",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--node-name={spec.name}",
        f"--plugin-dir={node_dir / 'device-plugins'}",
        f"--state-dir={node_dir / 'plugin-state'}",
        "--backend=simulated",
        f"--sim-gpus={spec.gpus}",
        f"--sim-model={spec.model}",
        f"--sim-memory-mib={spec.memory_mib}",
        *([f"--gpu-split={spec.gpu_split}"] if spec.gpu_split > 1 else []),
        *[f"--sim-mig={index}={layout}" for index, layout in spec.mig],
        f"--metrics-port={port}",
        f"--pod-resources-socket={pod_resources_socket(cluster.state_dir, spec.name)}",
        *layout_args,
        *(extra_args or []),
    ]
    cluster.start_component(f"deviceplugin-{spec.name}", argv)
    data = cluster.state.load()
    data["settings"].setdefault("metrics", {})[f"deviceplugin-{spec.name}"] = port
    cluster.state.save(data)


def wait_nodes_ready(cluster: Cluster, specs: list[NodeSpec], *, timeout_s: float = 120.0) -> None:
    """Wait until every node reports its GPUs: allocatable count and the inventory annotation."""
    ctx = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
    ctx.load_cert_chain(str(cluster.pki.client_cert(ADMIN)), str(cluster.pki.client_key(ADMIN)))
    deadline = time.monotonic() + timeout_s
    pending = {s.name: s for s in specs}
    while pending:
        for name, spec in list(pending.items()):
            node = _get_json(f"{cluster.api_url}/api/v1/nodes/{name}", ctx)
            if node is None:
                continue
            alloc = node.get("status", {}).get("allocatable", {}).get(DEFAULT_RESOURCE)
            annotations = node.get("metadata", {}).get("annotations", {})
            if alloc == str(spec.whole_gpus * spec.gpu_split) and Keys().gpus in annotations:
                del pending[name]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise DevclusterError(
                f"nodes did not report their GPUs within {timeout_s:.0f}s: {sorted(pending)}; "
                f"see the logs in {cluster.log_dir}"
            )
        time.sleep(0.25)


def _get_json(url: str, ctx: ssl.SSLContext) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data
    except (urllib.error.URLError, OSError, ValueError):
        return None


def wait_ready(
    cluster: Cluster, name: str, ready: Callable[[], bool], what: str, timeout_s: float
) -> None:
    """Wait until ``ready()``; raise ``DevclusterError`` with the log tail of component ``name``
    if it exits first, or naming ``what`` it was not when ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc = cluster.state.procs().get(name)
        if proc is not None and not processes.alive(proc):
            raise DevclusterError(
                f"{name} exited while starting; the end of {proc.log}:\n" + processes.log_tail(proc)
            )
        if ready():
            return
        time.sleep(0.1)
    raise DevclusterError(f"{name} was not {what} within {timeout_s:.0f}s")


def wait_ok(cluster: Cluster, name: str, url: str, timeout_s: float) -> None:
    """``wait_ready`` until ``url`` answers 200 (a component's ``/readyz``)."""

    def answers() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    wait_ready(cluster, name, answers, f"ready at {url}", timeout_s)


def listing_of(kubernetes_version: str | None) -> str:
    """Which pods kubelet of ``kubernetes_version`` returns from PodResources ``List`` by default.

    ``"active"`` from 1.34: the feature gate ``KubeletPodResourcesListUseActivePods`` exists and
    is on by default (``pkg/features/kube_features.go``, v1.34.4 line 1416 and v1.37.2 line
    1793: Deprecated, default true from 1.34; absent at v1.31.9 and v1.33.13). ``"all"`` before:
    1.31 to 1.33 have no such gate and ``List`` returns every pod in kubelet's pod manager
    (``pkg/kubelet/apis/podresources/server_v1.go``, v1.31.9 and v1.33.13 line 58).
    """
    return "all" if resolve(kubernetes_version).minor < 34 else "active"


def up_gpu_cluster(
    cluster: Cluster,
    *,
    nodes: int,
    gpus_per_node: int,
    extender_replicas: int = 1,
    policy: str = "binpack",
    lock_aware: bool = True,
    extender_args: list[str] | None = None,
    bind_wait_budget_s: float = DEFAULT_WAIT_BUDGET_S,
    http_timeout_s: float = DEFAULT_HTTP_TIMEOUT_S,
    plugin_args: list[str] | None = None,
    gpu_topology: str | None = None,
    topology_policy: NumaPolicy = NumaPolicy.NONE,
    gpu_split: int = 1,
    shared_nodes: int | None = None,
    gpu_memory_mib: int | None = None,
    mig: tuple[tuple[int, str], ...] = (),
    extender_tls: bool = False,
    pod_resources_list: str | None = None,
    kubelet: KubeletKind = KubeletKind.SIM,
) -> list[NodeSpec]:
    """Install the GPU pod admission policies (as the chart does on a real cluster), start the
    extender (``extender_tls``: over HTTPS, ``start_extender``; ``bind_wait_budget_s`` and
    kube-scheduler's ``http_timeout_s`` are set together) and ``nodes`` simulated GPU nodes, and
    wait until all report GPUs.

    ``gpu_topology`` names a simulated GPU layout for every node; ``topology_policy`` is the
    simulated kubelets' topology manager policy (published as a node label for the extender).
    ``gpu_split`` > 1 makes every node share its GPUs (S virtual devices each, docs/sharing.md),
    or only the last ``shared_nodes`` nodes when that is given (``node_specs``);
    ``gpu_memory_mib`` is each simulated GPU's memory (default: an H100's); ``mig`` puts GPUs
    of every node in MIG mode ((index, layout) pairs, ``deviceplugin.simulated.mig_layout``).
    ``pod_resources_list`` is which pods the simulated kubelets' PodResources List returns
    (``NodeSpec.pod_resources_list``); by default as kubelet of the cluster's release lists them
    (``listing_of``).
    ``kubelet`` says which kubelet runs the nodes (``KubeletKind.REAL``: devcluster.realkubelet).
    """
    try:
        specs = node_specs(
            nodes,
            gpus_per_node,
            gpu_topology=gpu_topology,
            topology_policy=topology_policy,
            gpu_split=gpu_split,
            shared_nodes=shared_nodes,
            gpu_memory_mib=gpu_memory_mib,
            mig=mig,
        )
    except ValueError as exc:
        raise DevclusterError(str(exc)) from exc
    listing = pod_resources_list or listing_of(cluster.settings().get("kubernetes_version"))
    specs = [dataclasses.replace(s, pod_resources_list=listing) for s in specs]
    install_gpu_pod_policies(cluster)
    start_extender(
        cluster,
        replicas=extender_replicas,
        policy=policy,
        lock_aware=lock_aware,
        extra_args=extender_args,
        bind_wait_budget_s=bind_wait_budget_s,
        http_timeout_s=http_timeout_s,
        tls=extender_tls,
    )
    for spec in specs:
        start_node(cluster, spec, plugin_args=plugin_args, kubelet=kubelet)
    wait_nodes_ready(cluster, specs)
    return specs
