"""``helm install``, ``upgrade`` and ``uninstall`` of the chart against the real API server.

What a rendering alone cannot show: the chart installs as a release, an upgrade keeps the
certificates Helm generated (``lookup``) so kube-scheduler's client certificate stays valid, and
an uninstall leaves the lock namespace and its Leases for the operator to delete last.  The
workloads select no node here (a node selector nothing matches), so no pod of the release runs.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devcluster.cluster import Cluster
from devcluster.helm import CHART_DIR, ensure_helm

# the chart installs on the oldest supported release too: `make test` runs these there again
pytestmark = pytest.mark.core

NOWHERE = "nodelock-deploy-test/nowhere"


@dataclass
class Installed:
    release: str
    namespace: str
    cluster: Cluster
    notes: str = ""  # what `helm install` printed

    def helm(self, *args: str) -> str:
        res = subprocess.run(
            [str(ensure_helm()), f"--kubeconfig={self.cluster.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        return res.stdout

    def get(self, kind: str, name: str, *, namespaced: bool = True) -> dict[str, object]:
        args = ["get", kind, name, "-o", "json"]
        out = self.cluster.kubectl(*args, *(["-n", self.namespace] if namespaced else []))
        result: dict[str, object] = json.loads(out)
        return result

    def exists(self, kind: str, name: str, *, namespaced: bool = True) -> bool:
        args = ["get", kind, name, "--ignore-not-found", "-o", "name"]
        out = self.cluster.kubectl(*args, *(["-n", self.namespace] if namespaced else []))
        return bool(out.strip())


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[Installed]:
    tag = secrets.token_hex(4)
    inst = Installed(f"nodelock-{tag}", f"nl-{tag}", cluster)
    nowhere = f"{NOWHERE.replace('/', '-')}=true"
    settings = [
        f"extender.nodeSelector.{nowhere}",
        f"scheduler.nodeSelector.{nowhere}",
        f"devicePlugin.nodeSelector.{nowhere}",
        f"admission.podNamespaceSelector.matchLabels.nodelock-deploy-test={tag}",
    ]
    inst.notes = inst.helm(
        "install",
        inst.release,
        str(CHART_DIR),
        "--namespace",
        inst.namespace,
        "--create-namespace",
        *(a for s in settings for a in ("--set", s)),
    )
    try:
        yield inst
    finally:
        subprocess.run(
            [
                str(ensure_helm()),
                f"--kubeconfig={cluster.kubeconfig}",
                "uninstall",
                inst.release,
                "-n",
                inst.namespace,
                "--ignore-not-found",
            ],
            capture_output=True,
            timeout=300,
            check=False,
        )
        cluster.kubectl("delete", "namespace", inst.namespace, "--wait=false", check=False)


def test_gpu_pods_are_given_the_scheduler_where_the_cluster_serves_the_mutating_policy(
    installed: Installed,
) -> None:
    # Helm asks the cluster's discovery (.Capabilities.APIVersions), not a version table
    resources = installed.cluster.kubectl(
        "api-resources", "--api-group=admissionregistration.k8s.io", "-o", "name"
    ).split()
    served = any(r.startswith("mutatingadmissionpolicies.") for r in resources)
    name = f"{installed.release}-gpu-pods-scheduler"
    if served:
        assert installed.exists("mutatingadmissionpolicy", name, namespaced=False)
        assert f"given it by MutatingAdmissionPolicy {name}" in installed.notes
    else:
        assert "serves no MutatingAdmissionPolicy v1" in installed.notes
    assert installed.exists(
        "validatingadmissionpolicy", f"{installed.release}-gpu-pods", namespaced=False
    )
    # the notes send the operator to the install page's next steps, not a path of their own
    assert "docs/install.md" in installed.notes
    assert '"Verify with a real GPU pod", then "Migrate node by node"' in installed.notes


def test_create_namespace_is_refused_by_helm_install_with_what_to_do_instead(
    installed: Installed,
) -> None:
    """Helm stores a release in its namespace before it creates any object, and adopts no
    Namespace it did not create: ``createNamespace=true`` cannot work with ``helm install``
    whether the namespace exists or not. The chart says so, before anything is created."""
    tag = secrets.token_hex(4)
    for namespace, create in ((f"nl-{tag}", True), (installed.namespace, False)):
        res = subprocess.run(
            [
                str(ensure_helm()),
                f"--kubeconfig={installed.cluster.kubeconfig}",
                "install",
                f"nodelock-{tag}",
                str(CHART_DIR),
                "--namespace",
                namespace,
                *(["--create-namespace"] if create else []),
                "--set",
                "createNamespace=true",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert res.returncode != 0, namespace
        assert "createNamespace=true renders the Namespace for `helm template`" in res.stderr
        assert "pass --create-namespace" in res.stderr
        assert not installed.exists(
            "validatingadmissionpolicy", f"nodelock-{tag}-gpu-pods", namespaced=False
        )
    # it failed while rendering, before Helm created the namespace it was asked to
    assert not installed.exists("namespace", f"nl-{tag}", namespaced=False)


def secret_data(inst: Installed, name: str) -> dict[str, str]:
    data = inst.get("secret", name)["data"]
    assert isinstance(data, dict)
    return {str(k): str(v) for k, v in data.items()}


def test_upgrade_keeps_the_generated_certificates(installed: Installed) -> None:
    ext_name, sched_name = f"{installed.release}-extender-tls", f"{installed.release}-scheduler-tls"
    before = (secret_data(installed, ext_name), secret_data(installed, sched_name))
    assert set(before[0]) == {"tls.crt", "tls.key", "ca.crt"}
    assert before[0]["ca.crt"] == before[1]["ca.crt"]
    deploy = installed.get("deployment", f"{installed.release}-extender")
    checksum = deploy["spec"]["template"]["metadata"]["annotations"]["checksum/tls"]  # type: ignore[index]

    installed.helm(
        "upgrade",
        installed.release,
        str(CHART_DIR),
        "--namespace",
        installed.namespace,
        "--reuse-values",
        "--set",
        "extender.policy=spread",
    )
    after = (secret_data(installed, ext_name), secret_data(installed, sched_name))
    assert after == before
    deploy = installed.get("deployment", f"{installed.release}-extender")
    template = deploy["spec"]["template"]  # type: ignore[index]
    assert template["metadata"]["annotations"]["checksum/tls"] == checksum
    assert "--policy=spread" in template["spec"]["containers"][0]["args"]


def test_the_upgrade_procedure_keeps_the_scheduler_stopped_until_its_last_step(
    installed: Installed, tmp_path: Path
) -> None:
    """docs/install.md, "Upgrade", as written: values saved with `helm get values`, the scheduler
    scaled to zero, an upgrade that keeps it there (a plain `helm upgrade` would set `replicas`
    back at once), then the same upgrade without the override starts it again; the device plugin
    DaemonSet never runs two pods on a node."""
    release, ns = installed.release, installed.namespace
    scheduler = f"{release}-scheduler"

    def replicas() -> object:
        return installed.get("deployment", scheduler)["spec"]["replicas"]  # type: ignore[index]

    values = tmp_path / "nodelock-values.yaml"
    values.write_text(installed.helm("get", "values", release, "-n", ns, "-o", "yaml"))
    installed.cluster.kubectl("-n", ns, "scale", "deploy", scheduler, "--replicas=0")
    chart = str(CHART_DIR)
    upgrade = ("upgrade", release, chart, "-n", ns, "-f", str(values), "--set", "image.tag=0.0.2")
    installed.helm(*upgrade, "--set", "scheduler.replicas=0")
    assert replicas() == 0
    ds = installed.get("daemonset", f"{release}-device-plugin")
    assert ds["spec"]["updateStrategy"] == {  # type: ignore[index]
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    template = ds["spec"]["template"]["spec"]  # type: ignore[index]
    assert template["containers"][0]["image"].endswith(":0.0.2")
    installed.helm(*upgrade)
    assert replicas() == 1
    # the values the operator installed with are still in effect
    extender = installed.get("deployment", f"{release}-extender")
    selector = extender["spec"]["template"]["spec"]["nodeSelector"]  # type: ignore[index]
    assert selector.get(NOWHERE.replace("/", "-")) == "true"


def test_uninstall_leaves_the_lock_namespace_and_its_leases(installed: Installed) -> None:
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "gpu-node-1",
            "namespace": installed.namespace,
            "labels": {"app.kubernetes.io/managed-by": "nodelock"},
        },
        "spec": {},
    }
    installed.cluster.kubectl("apply", "-f", "-", input_text=json.dumps(lease))
    release = installed.release
    cluster_scoped = [
        ("clusterrole", f"{release}-extender"),
        ("clusterrole", f"{release}-device-plugin"),
        ("validatingadmissionpolicy", f"{release}-assignment"),
        ("validatingadmissionpolicy", f"{release}-device-plugin-node-scope"),
    ]
    assert all(installed.exists(k, n, namespaced=False) for k, n in cluster_scoped)

    installed.helm("uninstall", release, "--namespace", installed.namespace, "--wait")
    assert not any(installed.exists(k, n, namespaced=False) for k, n in cluster_scoped)
    assert not installed.exists("deployment", f"{release}-extender")
    assert not installed.exists("secret", f"{release}-extender-tls")
    # the locks outlive the parts: the namespace and its Leases go last, by hand
    assert installed.exists("namespace", installed.namespace, namespaced=False)
    assert installed.exists("lease", "gpu-node-1")
