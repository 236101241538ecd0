"""nodelock installed on devcluster's containerd nodes with its Helm chart, as an operator installs
it (docs/install.md): the chart from ``deploy/helm/nodelock``, the images devcluster built
(``devcluster.images``), the device plugin's simulated backend in place of NVML.

``install`` runs ``helm upgrade --install`` with a values file it writes next to the cluster's
files, waits until the chart's pods are ready, and returns the command it ran, so it can be
shown and repeated; ``uninstall`` runs ``helm uninstall``.  The values a devcluster needs beyond
the chart's defaults are ``devcluster_values``: nothing that changes what the chart does on a
cluster, only where its images come from and which backend serves GPUs.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from devcluster.cluster import Cluster
from devcluster.errors import DevclusterError
from devcluster.helm import CHART_DIR, REPO_ROOT, ensure_helm
from devcluster.images import Image, NodeImages
from handoff.wire import DEFAULT_LOCK_NAMESPACE

RELEASE = "nodelock"
NAMESPACE = DEFAULT_LOCK_NAMESPACE
PLUGIN_SELECTOR = "nodelock.io/device-plugin=true"  # the chart's device plugin pods
VALUES_FILE = "nodelock-values.yaml"


def devcluster_values(
    images: NodeImages, *, gpus_per_node: int, nodelock: Image | None = None
) -> dict[str, Any]:
    """The chart values for devcluster's nodes: the local images (``nodelock`` replaces the
    nodelock image, as an upgrade does), ``gpus_per_node`` simulated GPUs a node."""
    image = nodelock or images.nodelock
    return {
        "image": {"repository": image.repository, "tag": image.tag, "pullPolicy": "IfNotPresent"},
        "scheduler": {
            "image": {
                "repository": images.scheduler.repository,
                "tag": images.scheduler.tag,
                "pullPolicy": "IfNotPresent",
            }
        },
        "devicePlugin": {
            "backend": "simulated",
            "extraArgs": [f"--sim-gpus={gpus_per_node}"],
        },
    }


def helm_argv(helm: Path, *args: str, kubeconfig: Path, namespace: str = NAMESPACE) -> list[str]:
    return [str(helm), f"--kubeconfig={kubeconfig}", f"--namespace={namespace}", *args]


def _run(argv: Sequence[str], *, what: str, timeout_s: float) -> str:
    try:
        res = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            cwd=REPO_ROOT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DevclusterError(f"{what} failed: {exc}") from exc
    if res.returncode != 0:
        raise DevclusterError(f"{what} failed (exit {res.returncode}): {res.stderr.strip()}")
    return res.stdout


def write_values(cluster: Cluster, values: Mapping[str, Any], name: str = VALUES_FILE) -> Path:
    path = cluster.state_dir / name
    path.write_text(yaml.safe_dump(dict(values), sort_keys=False))
    return path


def install(
    cluster: Cluster,
    values_file: Path,
    *,
    extra: Sequence[str] = (),
    timeout_s: float = 300.0,
) -> list[str]:
    """``helm upgrade --install`` the chart with ``values_file`` (and ``extra`` arguments), wait
    until its pods are ready; the command run."""
    helm = ensure_helm()
    argv = helm_argv(
        helm,
        "upgrade",
        "--install",
        RELEASE,
        str(CHART_DIR.relative_to(REPO_ROOT)),
        "--create-namespace",
        f"--values={values_file}",
        *extra,
        "--wait",
        f"--timeout={int(timeout_s)}s",
        kubeconfig=cluster.kubeconfig,
    )
    try:
        _run(argv, what="helm upgrade --install", timeout_s=timeout_s + 30)
    except DevclusterError as exc:
        pods = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide", check=False)
        raise DevclusterError(f"{exc}\nthe chart's pods:\n{pods}") from exc
    return argv


def uninstall(cluster: Cluster, *, timeout_s: float = 180.0) -> list[str]:
    """``helm uninstall`` the release and wait until its objects are gone; the command run."""
    argv = helm_argv(
        ensure_helm(),
        "uninstall",
        RELEASE,
        "--wait",
        f"--timeout={int(timeout_s)}s",
        kubeconfig=cluster.kubeconfig,
    )
    _run(argv, what="helm uninstall", timeout_s=timeout_s + 30)
    return argv


def shown(argv: Sequence[str]) -> str:
    """A command as a person types it."""
    return " ".join(shlex.quote(a) for a in argv)


def audit_plugin_pods(cluster: Cluster) -> list[tuple[str, int, str]]:
    """``nodelock audit --node-local`` run with ``kubectl exec`` in every device plugin pod, as
    docs/install.md has an operator check a node: (node, exit code, output), by node name."""
    listed = json.loads(
        cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", PLUGIN_SELECTOR, "-o", "json")
    )
    out = []
    for pod in sorted(listed["items"], key=lambda p: str(p["spec"].get("nodeName"))):
        res = subprocess.run(
            [
                str(cluster.binaries.kubectl),
                f"--kubeconfig={cluster.kubeconfig}",
                *("exec", "-n", NAMESPACE, pod["metadata"]["name"], "--"),
                *("nodelock", "audit", "--node-local"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        out.append((str(pod["spec"].get("nodeName")), res.returncode, res.stdout + res.stderr))
    return out
