"""``nodelock devcluster build|up|down|status``: a real local control plane to poke at."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from devcluster.binaries import (
    KUBERNETES_VERSION,
    ensure_control_plane,
    ensure_cri,
    ensure_kube_proxy,
    ensure_kubelet,
    ensure_simkubelet,
)
from devcluster.cluster import Cluster, default_state_dir
from devcluster.containerd import ensure_containerd
from devcluster.errors import DevclusterError
from devcluster.gpunodes import up_gpu_cluster
from devcluster.helm import ensure_helm
from devcluster.images import ensure_node_images
from devcluster.install import shown
from devcluster.realkubelet import KubeletKind
from devcluster.runtime import SYSTEM_NODE, runtime_cluster
from devcluster.shape import (
    SHAPE_FORMAT,
    Shape,
    check_resume,
    has_data,
    mig_layouts,
    purge,
    read_shape,
    shape_of,
    write_shape,
)
from devcluster.versions import supported
from deviceplugin.simulated import (
    DEFAULT_MEMORY_MIB,
    LAYOUTS,
    SimSpec,
    layout_of,
    parse_mig_flags,
)
from deviceplugin.simulated import inventory as sim_inventory
from handoff.sharing import check_split
from handoff.topology import NumaPolicy


def register(sub: Any) -> None:
    p = sub.add_parser(
        "devcluster", help="a real local Kubernetes control plane for tests and demos"
    )
    dsub = p.add_subparsers(dest="devcluster_command", required=True, metavar="ACTION")

    def version_flag(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--kubernetes-version",
            default=None,
            metavar="VERSION",
            help=f"the Kubernetes release to build and run: a minor (1.33) or a pinned release "
            f"(v1.33.13); supported: {supported()} (default {KUBERNETES_VERSION})",
        )

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--state-dir",
            type=Path,
            default=None,
            help=f"where the cluster keeps its files (default {default_state_dir()})",
        )
        q.add_argument(
            "--cache-dir",
            default=None,
            help="binary cache (default $NODELOCK_CACHE or ~/.cache/nodelock)",
        )

    b = dsub.add_parser(
        "build",
        help=f"build (or verify) every binary devcluster runs: the Kubernetes "
        f"{KUBERNETES_VERSION} control plane, kubelet and kube-proxy, the simulated-node harness, "
        "the fake CRI runtime and helm",
    )
    common(b)
    version_flag(b)
    b.add_argument(
        "--images",
        action="store_true",
        help="also fetch the containerd 1.7 containerd nodes run (Debian trixie's package) and "
        "build the images they run (nodelock's from deploy/Containerfile, its base, the pod "
        "sandbox, kube-scheduler) and print each one's build time and size "
        "(docs/containerd-nodes.md; needs root and `make runtime-deps`)",
    )
    b.set_defaults(func=_build)

    u = dsub.add_parser("up", help="start the control plane and wait until it is ready")
    common(u)
    version_flag(u)
    u.add_argument(
        "--apiserver-port",
        type=int,
        default=None,
        help="kube-apiserver's port on 127.0.0.1 (default: a free one)",
    )
    u.add_argument(
        "--no-build",
        action="store_true",
        help="fail instead of building when the binaries are not cached",
    )
    u.add_argument(
        "--nodes",
        type=int,
        default=0,
        help="simulated GPU nodes to start, with the extender wired into kube-scheduler "
        "(default 0: control plane only)",
    )
    u.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per simulated node")
    u.add_argument(
        "--extender-replicas",
        type=int,
        default=1,
        help="extender replicas behind one address (default 1)",
    )
    u.add_argument(
        "--extender-tls",
        action="store_true",
        help="serve the extender over HTTPS and require kube-scheduler's client certificate, "
        "as the shipped configuration does (one replica; default: plain HTTP)",
    )
    u.add_argument(
        "--policy",
        choices=["binpack", "spread"],
        default="binpack",
        help="the extender's device-choice policy",
    )
    u.add_argument(
        "--gpu-topology",
        choices=list(LAYOUTS),
        default=None,
        help="simulated GPU layout of every node: links and NUMA nodes (default: none reported)",
    )
    u.add_argument(
        "--topology-manager-policy",
        choices=[p.value for p in NumaPolicy],
        default=NumaPolicy.NONE.value,
        help="the simulated kubelets' topology manager policy (needs --gpu-topology unless none)",
    )
    u.add_argument(
        "--gpu-split",
        type=int,
        default=1,
        metavar="S",
        help="share every GPU as S virtual devices (memory/core slices, docs/sharing.md; "
        "default 1: whole GPUs)",
    )
    u.add_argument(
        "--shared-nodes",
        type=int,
        default=None,
        metavar="N",
        help="with --gpu-split: only the last N nodes share their GPUs, the others keep them "
        "whole (default: every node shares)",
    )
    u.add_argument(
        "--mig",
        action="append",
        default=[],
        metavar="INDEX=LAYOUT",
        help="put GPU INDEX of every node in MIG mode with the instances LAYOUT, e.g. "
        "0=7x1g.10gb or 0=3g.40gb+2g.20gb+2x1g.10gb; served as nvidia.com/mig-<profile> "
        "(repeatable; docs/deviceplugin.md)",
    )
    u.add_argument(
        "--gpu-memory-mib",
        type=int,
        default=None,
        help="memory of each simulated GPU in MiB (default 81559; 81920 is 80 GiB)",
    )
    u.add_argument(
        "--kubelet",
        choices=[k.value for k in KubeletKind],
        default=KubeletKind.SIM.value,
        help="what runs the GPU nodes: sim, the simulated kubelet (kubelet's device manager in "
        "a harness), or real, the kubelet binary against a fake container runtime "
        "(docs/simkubelet.md; default sim)",
    )
    u.add_argument(
        "--runtime",
        choices=["containerd"],
        default=None,
        help="containerd: every node a real kubelet with containerd, runc, CNI and kube-proxy in "
        "its own network namespace (--nodes GPU nodes and one node without GPUs), nodelock "
        "installed with its Helm chart from the image built from deploy/Containerfile "
        "(docs/containerd-nodes.md; needs root and `make runtime-deps`)",
    )
    u.add_argument(
        "--no-install",
        action="store_true",
        help="with --runtime containerd: leave the nodes bare, for the install steps of "
        "docs/install.md",
    )
    u.set_defaults(func=_up)

    d = dsub.add_parser("down", help="stop everything the cluster started")
    common(d)
    d.add_argument(
        "--purge",
        action="store_true",
        help="also remove the state directory: etcd's data (Nodes, pods, Leases), the "
        "certificates and the logs, so the next up starts empty (in any shape)",
    )
    d.set_defaults(func=_down)

    s = dsub.add_parser("status", help="say what runs")
    common(s)
    s.set_defaults(func=_status)


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir) if args.state_dir else default_state_dir()


def _build(args: argparse.Namespace) -> int:
    """Build (or verify) every Go binary, so later steps (``go vet``, tests) find the modules."""
    binaries = ensure_control_plane(cache=args.cache_dir, version=args.kubernetes_version)
    print(f"Kubernetes {binaries.kubernetes_version} binaries are in {binaries.directory}")
    print(f"the simulated-node harness is {ensure_simkubelet(cache=args.cache_dir)}")
    print(f"the fake CRI runtime for real kubelets is {ensure_cri(cache=args.cache_dir)}")
    kubelet = ensure_kubelet(cache=args.cache_dir, version=args.kubernetes_version)
    print(f"kubelet {binaries.kubernetes_version} is {kubelet}")
    proxy = ensure_kube_proxy(cache=args.cache_dir, version=args.kubernetes_version)
    print(f"kube-proxy {binaries.kubernetes_version} (containerd nodes) is {proxy}")
    print(f"helm is {ensure_helm(cache=args.cache_dir)}")
    if args.images:
        print(f"containerd 1.7 (containerd nodes) is in {ensure_containerd(args.cache_dir)}")
        lines: list[str] = []
        started = time.monotonic()
        images = ensure_node_images(binaries, cache=args.cache_dir, progress=lines.append)
        for line in lines:
            print(line)
        for image in images.all():
            size = image.archive.stat().st_size / 2**20
            print(f"image {image.ref}: {size:.0f} MiB ({image.archive})")
        print(f"images ready in {time.monotonic() - started:.0f}s")
    return 0


def _up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    binaries = ensure_control_plane(
        cache=args.cache_dir, build=not args.no_build, version=args.kubernetes_version
    )
    cluster = Cluster(_state_dir(args), binaries=binaries)
    if args.runtime is not None:
        return _up_runtime(args, cluster, started)
    if args.no_install:
        raise DevclusterError("--no-install goes with --runtime containerd")
    if args.nodes < 0 or args.gpus_per_node < 1 or args.extender_replicas < 1:
        raise DevclusterError("--nodes must be >= 0, --gpus-per-node and --extender-replicas >= 1")
    try:
        check_split(args.gpu_split)
    except ValueError as exc:
        raise DevclusterError(str(exc)) from exc
    if args.shared_nodes is not None and not 0 <= args.shared_nodes <= args.nodes:
        raise DevclusterError(f"--shared-nodes must be between 0 and --nodes ({args.nodes})")
    shared = args.nodes if args.shared_nodes is None else args.shared_nodes
    if args.gpu_split == 1:
        shared = 0  # nothing to share
    if args.gpu_memory_mib is not None and args.gpu_memory_mib < 1:
        raise DevclusterError("--gpu-memory-mib must be positive")
    if args.extender_tls and args.extender_replicas > 1:
        raise DevclusterError("--extender-tls serves one extender replica (--extender-replicas 1)")
    try:
        mig = parse_mig_flags(args.mig)
        sim_inventory(
            "check",
            SimSpec(
                count=args.gpus_per_node,
                memory_mib=args.gpu_memory_mib or DEFAULT_MEMORY_MIB,
                mig=mig,
            ),
        )
    except ValueError as exc:
        raise DevclusterError(f"--mig: {exc}") from exc
    policy = NumaPolicy(args.topology_manager_policy)
    if policy is not NumaPolicy.NONE and args.gpu_topology is None:
        raise DevclusterError(f"--topology-manager-policy {policy.value} needs --gpu-topology")
    if args.gpu_topology is not None:
        try:
            layout_of(args.gpu_topology, args.gpus_per_node)
        except ValueError as exc:
            raise DevclusterError(f"--gpu-topology: {exc}") from exc
    wanted = (
        Shape(
            args.nodes,
            args.gpus_per_node,
            args.gpu_topology,
            args.gpu_split,
            shared,
            mig=mig_layouts(mig),
            gpu_memory_mib=args.gpu_memory_mib,
        )
        if args.nodes
        else Shape(0, 0)
    )
    state_dir = cluster.state_dir
    check_resume(
        read_shape(state_dir), has_data=has_data(state_dir), wanted=wanted, state_dir=state_dir
    )
    t0 = time.monotonic()
    cluster.up(apiserver_port=args.apiserver_port)
    write_shape(state_dir, wanted)
    if args.nodes:
        try:
            up_gpu_cluster(
                cluster,
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                extender_replicas=args.extender_replicas,
                policy=args.policy,
                gpu_topology=args.gpu_topology,
                topology_policy=policy,
                gpu_split=args.gpu_split,
                shared_nodes=shared,
                gpu_memory_mib=args.gpu_memory_mib,
                mig=mig,
                extender_tls=args.extender_tls,
                kubelet=KubeletKind(args.kubelet),
            )
        except BaseException:
            cluster.down()
            raise
    now = time.monotonic()
    what = f"{args.nodes} GPU nodes x {args.gpus_per_node} GPUs" if args.nodes else "control plane"
    print(
        f"devcluster is up in {cluster.state_dir}: {what} ready in {now - t0:.1f}s "
        f"({now - started:.1f}s in all)"
    )
    for st in cluster.status():
        print(f"  {st.name:<26} pid {st.pid:<8} log {st.log}")
    print(f"\nPoint kubectl at it:\n  export KUBECONFIG={cluster.kubeconfig}")
    print(f"  export PATH={binaries.directory}:$PATH   # kubectl {binaries.kubernetes_version}")
    print(f"Stop it with:\n  nodelock devcluster down --state-dir {cluster.state_dir}")
    return 0


# what `up --runtime containerd` does not combine with: the simulated nodes' shapes and wiring
_NOT_WITH_RUNTIME: dict[str, object] = {
    "gpu_topology": None,
    "gpu_split": 1,
    "shared_nodes": None,
    "mig": [],
    "gpu_memory_mib": None,
    "extender_replicas": 1,
    "extender_tls": False,
    "kubelet": KubeletKind.SIM.value,
    "policy": "binpack",
    "topology_manager_policy": NumaPolicy.NONE.value,
}


def _up_runtime(args: argparse.Namespace, cluster: Cluster, started: float) -> int:
    """``up --runtime containerd``: containerd nodes, and the chart installed unless
    ``--no-install``."""
    changed = [
        "--" + k.replace("_", "-") for k, v in _NOT_WITH_RUNTIME.items() if getattr(args, k) != v
    ]
    if changed:
        raise DevclusterError(
            f"--runtime containerd does not take {', '.join(changed)}: its GPU nodes serve "
            "whole simulated GPUs through the chart's device plugin, configured by its values"
        )
    if args.nodes < 0 or args.gpus_per_node < 1:
        raise DevclusterError("--nodes must be >= 0 and --gpus-per-node >= 1")
    if has_data(cluster.state_dir):
        raise DevclusterError(
            f"{cluster.state_dir} holds an earlier cluster; containerd nodes start from an empty "
            f"state: `nodelock devcluster down --purge --state-dir {cluster.state_dir}` first"
        )
    t0 = time.monotonic()
    up_containerd = runtime_cluster(
        cluster,
        gpu_nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        install=not args.no_install,
        apiserver_port=args.apiserver_port,
        cache=args.cache_dir,
    )
    now = time.monotonic()
    print(
        f"devcluster is up in {cluster.state_dir}: {args.nodes} GPU nodes x "
        f"{args.gpus_per_node} GPUs and {SYSTEM_NODE}, on containerd, ready in {now - t0:.1f}s "
        f"({now - started:.1f}s in all)"
    )
    print(f"images: {', '.join(i.ref for i in up_containerd.images.all())}")
    if up_containerd.helm_command:
        print(f"nodelock installed with:\n  {shown(up_containerd.helm_command)}")
    else:
        print(f"nodelock is not installed; its image is {up_containerd.images.nodelock.ref}")
    print(f"\nPoint kubectl at it:\n  export KUBECONFIG={cluster.kubeconfig}")
    kubectl_dir = cluster.binaries.directory
    print(f"  export PATH={kubectl_dir}:$PATH   # kubectl {cluster.binaries.kubernetes_version}")
    print(f"Stop it with:\n  nodelock devcluster down --purge --state-dir {cluster.state_dir}")
    return 0


def _down(args: argparse.Namespace) -> int:
    cluster = Cluster(_state_dir(args))
    stopped = cluster.down()
    if stopped:
        print(f"stopped {', '.join(stopped)}")
    else:
        print(f"nothing was running in {cluster.state_dir}")
    if getattr(args, "purge", False) and purge(cluster.state_dir):
        print(f"removed {cluster.state_dir}")
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = Cluster(_state_dir(args))
    rows = cluster.status()
    if not rows:
        print(f"no devcluster in {cluster.state_dir}")
        return 1
    recorded = read_shape(cluster.state_dir)
    if recorded is not None and recorded.get("format") == SHAPE_FORMAT:
        try:
            print(f"shape: {shape_of(recorded).describe()}")
        except (KeyError, TypeError, ValueError) as exc:
            print(f"shape: not readable ({exc!r})")
    for st in rows:
        state = "running" if st.running else "NOT RUNNING"
        print(f"{st.name:<26} pid {st.pid:<8} {state:<12} log {st.log}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0 if all(st.running for st in rows) else 1
