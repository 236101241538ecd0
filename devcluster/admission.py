"""The GPU pod admission policies of a devcluster, as a real cluster has them from the chart.

``install_gpu_pod_policies`` applies ``devcluster/admission.yaml`` — the chart's
``admission-gpu-pods.yaml`` rendered for the devcluster's wiring (the extender in the default
scheduler, so the scheduler name GPU pods must use is ``default-scheduler``), regenerated and
checked by ``python -m devcluster.helm manifests`` and ``tests/integration/test_deploy_chart.py``
— and returns once the API server enforces it: a GPU pod created with ``spec.nodeName`` (placed by
hand, bypassing the extender) is denied.  Pods labelled ``nodelock.io/bypass=true`` in a namespace
labelled the same are exempt (what the tests that bind a pod by hand on purpose use).

Guarantee: when it returns, a server-side dry run of such a pod has been denied by the policy
(the API server loads new policies asynchronously; applying alone does not mean enforcing).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from devcluster.cluster import Cluster
from devcluster.errors import DevclusterError
from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_RESOURCE

POLICIES = Path(__file__).resolve().parent / "admission.yaml"
POLICY_NAME = "nodelock-gpu-pods"


def _probe_pod(node: str) -> str:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "nodelock-policy-probe", "namespace": DEFAULT_LOCK_NAMESPACE},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "probe",
                    "image": "registry.invalid/probe",
                    "resources": {"limits": {DEFAULT_RESOURCE: "1"}},
                }
            ],
        },
    }
    return json.dumps(pod)


def install_gpu_pod_policies(cluster: Cluster, *, timeout_s: float = 60.0) -> None:
    """Apply the GPU pod policies and wait until the API server enforces them."""
    cluster.kubectl("apply", "-f", str(POLICIES))
    deadline = time.monotonic() + timeout_s
    answer = ""
    while time.monotonic() < deadline:
        answer = _dry_run(cluster, _probe_pod("nodelock-policy-probe-node"))
        if POLICY_NAME in answer and "denied" in answer:
            return
        time.sleep(0.2)
    raise DevclusterError(
        f"the admission policy {POLICY_NAME} was not enforced within {timeout_s:.0f}s "
        f"(last answer to a probe: {answer.strip() or 'admitted'})"
    )


def _dry_run(cluster: Cluster, manifest: str) -> str:
    """kubectl's stderr for a server-side dry-run create ('' when admitted)."""
    cmd = [
        str(cluster.binaries.kubectl),
        f"--kubeconfig={cluster.kubeconfig}",
        "create",
        "--dry-run=server",
        "-f",
        "-",
    ]
    res = subprocess.run(
        cmd, input=manifest, capture_output=True, text=True, timeout=60, check=False
    )
    return res.stderr if res.returncode != 0 else ""
