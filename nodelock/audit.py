"""``nodelock audit``: do the scheduler, kubelet and the device plugin agree, node by node?

For each node it reads the pods bound there and the node's GPU inventory from the API server,
kubelet's PodResources ``List`` from kubelet's socket, and the device plugin's answers from
kubelet's device checkpoint, then judges them with ``handoff.audit`` (docs/audit.md).  By default
it takes a second look after ``--second-look`` seconds and reports only what both looks saw, so a
pod that started or finished between two reads is not reported.

Where it runs: kubelet's socket and checkpoint are node-local files, so

- ``nodelock audit`` (devcluster) reads every simulated node's socket and checkpoint from the
  devcluster's state directory;
- ``nodelock audit --node-local`` audits the one node it runs on (``--node-name`` or
  ``$NODE_NAME``), e.g. ``kubectl exec`` into the device plugin pod, which mounts kubelet's
  directories.

Exit codes: 0 all agree, 1 some disagreement, 2 it could not run (one line on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devcluster.cluster import default_state_dir
from devcluster.errors import DevclusterError
from devcluster.gpunodes import kubelet_checkpoint, pod_resources_socket, simulated_nodes
from deviceplugin.kubeletview import (
    KUBELET_CHECKPOINT,
    POD_RESOURCES_SOCKET,
    KubeletViewError,
    list_pod_resources,
    read_checkpoint,
)
from handoff.audit import (
    Disagreement,
    KubeletPod,
    NodeViews,
    PluginAnswer,
    audit_node,
    confirmed,
    for_resource,
    pod_record,
    report_json,
    table,
)
from handoff.wire import DEFAULT_RESOURCE, Keys, MalformedAnnotation, parse_inventory
from kube.client import KubeClient, node_path, pod_path
from kube.errors import NotFound

DEFAULT_SECOND_LOOK_S = 1.0


@dataclass(frozen=True)
class NodeSource:
    """Where one node's kubelet records are."""

    node: str
    socket: Path
    checkpoint: Path | None  # None: do not read the plugin's answers


@dataclass(frozen=True)
class AuditResult:
    """The findings of an audit, the nodes it covered, and notes on what it could not read."""

    nodes: list[str]
    disagreements: list[Disagreement]
    notes: list[str]

    def text(self) -> str:
        lines = [table(self.disagreements, self.nodes)]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


async def _look(
    kube: KubeClient, sources: Sequence[NodeSource], *, keys: Keys, resource: str
) -> tuple[list[Disagreement], list[str]]:
    found: set[Disagreement] = set()
    notes: list[str] = []
    for src in sources:
        pods = await kube.list(pod_path(), field_selector=f"spec.nodeName={src.node}")
        records = [pod_record(p, keys) for p in pods["items"]]
        # resource -> its device IDs on the node (None: the inventory is unknown)
        devices: dict[str, frozenset[str] | None] = {resource: None}
        try:
            node = await kube.get(node_path(src.node))
            raw = (node.get("metadata", {}).get("annotations") or {}).get(keys.gpus)
            gpus = parse_inventory(raw, key=keys.gpus)
            known: dict[str, set[str]] = {resource: {g.id for g in gpus if not g.profile}}
            for g in gpus:  # MIG instances: a resource per profile (docs/mig.md)
                if g.profile:
                    known.setdefault(g.resource, set()).add(g.id)
            devices = {name: frozenset(ids) for name, ids in known.items()}
        except NotFound:
            notes.append(f"{src.node}: no such Node; devices not checked against an inventory")
        except MalformedAnnotation as exc:
            notes.append(f"{src.node}: devices not checked against the inventory: {exc}")
        for name, ids in sorted(devices.items()):
            kubelet: list[KubeletPod] | None = None
            error = ""
            try:
                kubelet = await asyncio.to_thread(list_pod_resources, src.socket, resource=name)
            except KubeletViewError as exc:
                error = str(exc)
            answers: list[PluginAnswer] | None = None
            if src.checkpoint is not None:
                try:
                    answers = read_checkpoint(src.checkpoint, resource=name)
                except KubeletViewError as exc:
                    notes.append(f"{src.node}: the plugin's answers were not compared: {exc}")
            views = NodeViews(
                node=src.node,
                pods=records if ids is None else for_resource(records, ids, keys),
                kubelet=kubelet,
                kubelet_error=error,
                answers=answers,
                inventory=ids,
                keys=keys,
            )
            found.update(audit_node(views))
    return sorted(found), list(dict.fromkeys(notes))


async def audit(
    kube: KubeClient,
    sources: Sequence[NodeSource],
    *,
    keys: Keys | None = None,
    resource: str = DEFAULT_RESOURCE,
    second_look_s: float = DEFAULT_SECOND_LOOK_S,
) -> AuditResult:
    """Audit ``sources``; with ``second_look_s`` > 0, report only what a second look confirms."""
    keys = keys or Keys()
    found, notes = await _look(kube, sources, keys=keys, resource=resource)
    if found and second_look_s > 0:
        await asyncio.sleep(second_look_s)
        again, notes = await _look(kube, sources, keys=keys, resource=resource)
        found = confirmed(found, again)
    return AuditResult([s.node for s in sources], found, notes)


def devcluster_sources(state_dir: Path, nodes: Sequence[str] = ()) -> list[NodeSource]:
    """Every simulated node of the devcluster in ``state_dir`` (or only ``nodes``)."""
    known = simulated_nodes(state_dir)
    if not known:
        raise DevclusterError(f"the devcluster in {state_dir} has no simulated GPU nodes")
    unknown = sorted(set(nodes) - set(known))
    if unknown:
        raise DevclusterError(f"no simulated node {', '.join(unknown)} in {state_dir}")
    return [
        NodeSource(n, pod_resources_socket(state_dir, n), kubelet_checkpoint(state_dir, n))
        for n in (nodes or known)
    ]


async def audit_devcluster(
    state_dir: Path, *, second_look_s: float = DEFAULT_SECOND_LOOK_S
) -> AuditResult:
    """Audit every simulated node of the devcluster in ``state_dir``."""
    sources = devcluster_sources(state_dir)
    async with await KubeClient.connect(str(state_dir / "admin.kubeconfig")) as kube:
        return await audit(kube, sources, second_look_s=second_look_s)


class AuditUsageError(ValueError):
    user_facing = True


def register(sub: Any) -> None:
    p = sub.add_parser(
        "audit",
        help="compare, per node, the scheduler's assignments with kubelet's PodResources and "
        "the device plugin's answers",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"devcluster mode: the devcluster's state directory (default {default_state_dir()})",
    )
    p.add_argument(
        "--node",
        action="append",
        default=[],
        help="devcluster mode: audit only this node (repeatable)",
    )
    p.add_argument(
        "--node-local",
        action="store_true",
        help="audit the node this runs on, from kubelet's socket and checkpoint on this host",
    )
    p.add_argument("--node-name", default=None, help="node-local mode: the node (or $NODE_NAME)")
    p.add_argument("--kubeconfig", default=None, help="node-local mode: API server credentials")
    p.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=POD_RESOURCES_SOCKET,
        help=f"node-local mode: kubelet's PodResources socket (default {POD_RESOURCES_SOCKET})",
    )
    p.add_argument(
        "--kubelet-checkpoint",
        type=Path,
        default=KUBELET_CHECKPOINT,
        help=f"node-local mode: kubelet's device checkpoint (default {KUBELET_CHECKPOINT})",
    )
    p.add_argument("--resource-name", default=DEFAULT_RESOURCE, help="the GPU resource")
    p.add_argument("--annotation-prefix", default=Keys().prefix, help="nodelock's annotations")
    p.add_argument(
        "--second-look",
        type=float,
        default=DEFAULT_SECOND_LOOK_S,
        help="seconds before a second look; only what both looks see is reported (0: one look)",
    )
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    if args.second_look < 0:
        raise AuditUsageError("--second-look must not be negative")
    keys = Keys(args.annotation_prefix)
    if args.node_local:
        node = args.node_name or os.environ.get("NODE_NAME")
        if not node:
            raise AuditUsageError("--node-local needs --node-name or $NODE_NAME")
        sources = [NodeSource(node, args.pod_resources_socket, args.kubelet_checkpoint)]
        kubeconfig = args.kubeconfig
    else:
        state = (args.state_dir or default_state_dir()).resolve()
        sources = devcluster_sources(state, args.node)
        kubeconfig = str(state / "admin.kubeconfig")

    async def run() -> AuditResult:
        async with await KubeClient.connect(kubeconfig) as kube:
            return await audit(
                kube,
                sources,
                keys=keys,
                resource=args.resource_name,
                second_look_s=args.second_look,
            )

    started = time.monotonic()
    result = asyncio.run(run())
    if args.output == "json":
        print(report_json(result.disagreements, result.nodes, result.notes))
    else:
        print(result.text())
        print(f"({time.monotonic() - started:.1f}s)", file=sys.stderr)
    return 1 if result.disagreements else 0
