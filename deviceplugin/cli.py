"""``nodelock device-plugin``: serve the kubelet device plugin for one node's GPUs."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from deviceplugin.answer import DEFAULT_DEVICE_MODE, DeviceMode
from deviceplugin.decide import MismatchPolicy
from deviceplugin.devices import DeviceBackend
from deviceplugin.endpoint import KUBELET_SOCKET
from deviceplugin.kubeletview import POD_RESOURCES_SOCKET
from deviceplugin.metrics import PluginMetrics
from deviceplugin.nvml import add_flags as add_nvml_flags
from deviceplugin.plugin import (
    DEFAULT_PLUGIN_DIR,
    DEFAULT_SOCKET,
    DEFAULT_STATE_DIR,
    DRA_CHECK_S,
    DevicePlugin,
    PluginConfig,
)
from deviceplugin.simulated import (
    DEFAULT_MEMORY_MIB,
    DEFAULT_MODEL,
    SimSpec,
    SimulatedBackend,
    parse_mig_flags,
)
from deviceplugin.simulated import inventory as sim_inventory
from handoff.flags import add_flags as add_handoff_flags
from handoff.sharing import check_split
from handoff.wire import DEFAULT_RESOURCE
from kube.client import KubeClient
from kube.opsport import OpsServer
from kube.process import configure_logging, run_until_signalled
from lockd.model import NodeName


class ConfigError(Exception):
    """A flag value the plugin cannot run with."""

    user_facing = True


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "device-plugin",
        help="serve the kubelet device plugin that gives pods exactly their assigned GPUs",
        description="Serve kubelet's device plugin API on a unix socket in the plugin "
        "directory: advertise the node's GPUs, steer kubelet to the node lock holder's "
        "assignment, answer Allocate with it, release the lock, publish the GPU inventory.",
    )
    p.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster)")
    add_nvml_flags(p)
    p.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="this node's name (default $NODE_NAME)",
    )
    p.add_argument(
        "--plugin-dir",
        type=Path,
        default=DEFAULT_PLUGIN_DIR,
        help=f"kubelet's device plugin directory, holding {KUBELET_SOCKET} "
        f"(default {DEFAULT_PLUGIN_DIR})",
    )
    p.add_argument(
        "--socket-name",
        default=DEFAULT_SOCKET,
        help=f"the plugin's socket file name (default {DEFAULT_SOCKET})",
    )
    p.add_argument(
        "--resource-name",
        default=DEFAULT_RESOURCE,
        help=f"extended resource to serve (default {DEFAULT_RESOURCE})",
    )
    p.add_argument(
        "--backend",
        choices=["nvml", "simulated"],
        default="nvml",
        help="nvml: the node's NVIDIA GPUs; simulated: GPUs from flags or --sim-file",
    )
    p.add_argument("--sim-gpus", type=int, default=8, help="simulated GPU count (default 8)")
    p.add_argument("--sim-model", default=DEFAULT_MODEL, help="simulated GPU model")
    p.add_argument(
        "--sim-memory-mib",
        type=int,
        default=DEFAULT_MEMORY_MIB,
        help=f"simulated GPU memory in MiB (default {DEFAULT_MEMORY_MIB})",
    )
    p.add_argument(
        "--sim-numa-nodes",
        type=int,
        default=0,
        help="spread simulated GPUs over this many NUMA nodes (default 0: no NUMA information)",
    )
    p.add_argument(
        "--sim-mig",
        action="append",
        default=[],
        metavar="INDEX=LAYOUT",
        help="put simulated GPU INDEX in MIG mode with the instances LAYOUT, '+'-joined "
        "[<n>x]<profile> parts, e.g. 0=7x1g.10gb or 1=3g.40gb+2g.20gb+2x1g.10gb; each profile is "
        "served as nvidia.com/mig-<profile> (repeatable)",
    )
    p.add_argument(
        "--sim-file",
        type=Path,
        default=None,
        help="JSON file describing the simulated GPUs; edits (e.g. health) are picked up live",
    )
    add_handoff_flags(p)
    p.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"directory of the node-local checkpoint (default {DEFAULT_STATE_DIR})",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve /metrics, /healthz and /readyz (registered with kubelet) over plain HTTP on "
        "this port; nothing else is served there (default 0: off)",
    )
    p.add_argument(
        "--metrics-address",
        default="::",
        help="address of the --metrics-port server (default ::, every address of IPv4 and IPv6; "
        "0.0.0.0 for IPv4 only)",
    )
    p.add_argument(
        "--device-mode",
        choices=[m.value for m in DeviceMode],
        default=DEFAULT_DEVICE_MODE.value,
        help="how devices reach the container: cdi (default: CDI names nvidia.com/gpu=<UUID>, "
        "which a container's own NVIDIA_VISIBLE_DEVICES cannot widen; the node needs a CDI spec "
        "naming GPUs by UUID) or device-nodes (device nodes; the NVIDIA runtime's environment "
        "mode). Both also set NVIDIA_VISIBLE_DEVICES",
    )
    p.add_argument(
        "--cdi",
        dest="device_mode",
        action="store_const",
        const=DeviceMode.CDI.value,
        help="the same as --device-mode=cdi (kept for existing command lines)",
    )
    p.add_argument(
        "--mismatch-policy",
        choices=[m.value for m in MismatchPolicy],
        default=MismatchPolicy.REFUSE.value,
        help="when kubelet picks other devices than the assignment: refuse (default: the pod "
        "fails admission and is recreated) or serve the assignment anyway",
    )
    p.add_argument(
        "--events",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write a Kubernetes Event for each refused Allocate, on the node lock's holder pod "
        "(else the node), at most one per pod and refusal kind a minute (default on)",
    )
    p.add_argument(
        "--gpu-split",
        type=int,
        default=1,
        metavar="S",
        help="share GPUs: advertise S virtual devices per GPU so up to S pods hold memory/core "
        "slices of one GPU (nvidia.com/gpumem, nvidia.com/gpucores; docs/sharing.md). "
        "Default 1: whole GPUs only",
    )
    p.add_argument(
        "--pod-resources-socket",
        default=str(POD_RESOURCES_SOCKET),
        help="kubelet's PodResources socket: Allocate asks it which pod kubelet admits (default "
        f"{POD_RESOURCES_SOCKET}; an empty value: ask the API server for the node's pods instead)",
    )
    p.add_argument(
        "--dra-check-period",
        type=float,
        default=DRA_CHECK_S,
        metavar="SECONDS",
        help="the plugin refuses to start when a DRA driver also publishes its resource for this "
        "node (a DeviceClass with that extendedResourceName, a ResourceSlice for the node), and "
        "checks again this often while running, stopping if one appears (default "
        f"{DRA_CHECK_S:g}; 0: at start only; docs/install.md)",
    )
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    p.set_defaults(func=_run)


def config_from_args(args: argparse.Namespace) -> PluginConfig:
    """The plugin's configuration from parsed flags; raises ``ConfigError`` if unusable."""
    if not args.node_name:
        raise ConfigError("--node-name is required (or set $NODE_NAME)")
    if "/" in args.socket_name or not args.socket_name:
        raise ConfigError(f"--socket-name {args.socket_name!r} must be a plain file name")
    if not 0 <= args.metrics_port <= 65535:
        raise ConfigError("--metrics-port must be a port number (0 = off)")
    if not args.dra_check_period >= 0:
        raise ConfigError("--dra-check-period must be >= 0 seconds (0: at start only)")
    try:
        check_split(args.gpu_split)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return PluginConfig(
        gpu_split=args.gpu_split,
        node=NodeName(args.node_name),
        plugin_dir=args.plugin_dir,
        socket_name=args.socket_name,
        resource=args.resource_name,
        lock_namespace=args.lock_namespace,
        prefix=args.annotation_prefix,
        state_dir=args.state_dir,
        mode=DeviceMode(args.device_mode),
        policy=MismatchPolicy(args.mismatch_policy),
        events=args.events,
        pod_resources_socket=Path(args.pod_resources_socket) if args.pod_resources_socket else None,
        dra_check_s=args.dra_check_period,
    )


def backend_from_args(args: argparse.Namespace) -> DeviceBackend:
    """The device backend named by ``--backend``."""
    if args.backend == "simulated":
        if args.sim_gpus < 0 or args.sim_memory_mib < 0 or args.sim_numa_nodes < 0:
            raise ConfigError("--sim-gpus, --sim-memory-mib and --sim-numa-nodes must be >= 0")
        try:
            spec = SimSpec(
                count=args.sim_gpus,
                model=args.sim_model,
                memory_mib=args.sim_memory_mib,
                numa_nodes=args.sim_numa_nodes,
                mig=parse_mig_flags(args.sim_mig),
            )
            sim_inventory(args.node_name, spec)  # a layout that cannot be is refused here
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        return SimulatedBackend(args.node_name, spec, sim_file=args.sim_file)
    from deviceplugin.nvml import NvmlBackend  # imports pynvml only when asked for

    return NvmlBackend.from_args(args)


async def _serve(args: argparse.Namespace, config: PluginConfig) -> None:
    backend = backend_from_args(args)
    async with await KubeClient.connect(args.kubeconfig) as kube:
        metrics = PluginMetrics()
        plugin = DevicePlugin(config, kube=kube, backend=backend, metrics=metrics)
        ops = OpsServer(metrics.registry, plugin.waiting_for)
        if args.metrics_port:
            await ops.start(args.metrics_address, args.metrics_port)
        try:
            await run_until_signalled(plugin.run())
        finally:
            await ops.stop()


def _run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    config = config_from_args(args)
    asyncio.run(_serve(args, config))
    return 0
