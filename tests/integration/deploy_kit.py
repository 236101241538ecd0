"""Test support for the deploy tests: the chart installed as a release of its own, real tokens.

``TestRelease`` renders ``deploy/helm/nodelock`` with a unique release name and namespace (so its
cluster-scoped objects, ClusterRoles and admission policies, have unique names too), with the
pod admission policies (the assignment's and the GPU pods') bound to one labelled workload
namespace only, so that they cannot touch other tests' pods on the session cluster.  ``install``
applies the identity and policy objects (never the workloads: no image runs here); ``uninstall``
deletes everything it applied.

Identities are real: ``token`` asks the API server for a service account token (TokenRequest),
optionally bound to a pod, which gives it the pod's node as the user extra
``authentication.kubernetes.io/node-name``, exactly as kubelet's projected tokens have it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devcluster.cluster import Cluster
from devcluster.helm import render

JSON = dict[str, Any]

TEST_LABEL = "nodelock-deploy-test"
# What ``install`` applies: identities, permissions, policies, configuration; no workloads.
INSTALLED_KINDS = (
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "Secret",
    "ConfigMap",
)
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
}


def discovered_apis(cluster: Cluster) -> tuple[str, ...]:
    """``helm template`` arguments that tell it what ``helm install`` learns from ``cluster``'s
    discovery: its version, and every group/version and group/version/kind it serves."""
    version = json.loads(cluster.kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"]
    listed: list[str] = []
    for gv in cluster.kubectl("api-versions").split():
        path = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        resources = json.loads(cluster.kubectl("get", "--raw", path))["resources"]
        listed += [gv, *sorted({f"{gv}/{r['kind']}" for r in resources if "/" not in r["name"]})]
    return ("--kube-version", version, *(a for api in listed for a in ("--api-versions", api)))


def parse_documents(rendered: str) -> list[JSON]:
    """The objects of a ``helm template`` output."""
    return [d for d in yaml.safe_load_all(rendered) if d]


@dataclass
class TestRelease:
    """One rendering of the chart for a test: release ``name`` in ``namespace`` (also the lock
    namespace), pod policy bound to ``workload_namespace`` only."""

    __test__ = False  # not a pytest test class

    name: str
    namespace: str
    workload_namespace: str
    tag: str
    objects: list[JSON] = field(default_factory=list)
    applied: list[JSON] = field(default_factory=list)

    @classmethod
    def render(
        cls,
        helm: Path,
        *,
        settings: Mapping[str, str] | None = None,
        tag: str | None = None,
        cluster: Cluster | None = None,
        scope_gpu_pods: bool = True,
    ) -> TestRelease:
        """``scope_gpu_pods=False`` keeps the chart's own scope of the GPU pod policies (the
        namespaces labelled ``nodelock.io/enabled=true``, which no other test labels)."""
        tag = tag or secrets.token_hex(4)
        name, namespace = f"nodelock-{tag}", f"nl-{tag}"
        values = {
            "createNamespace": "true",
            f"admission.podNamespaceSelector.matchLabels.{TEST_LABEL}": tag,
            **(
                {f"admission.gpuPods.namespaceSelector.matchLabels.{TEST_LABEL}": tag}
                if scope_gpu_pods
                else {}
            ),
            **(settings or {}),
        }
        release = cls(name, namespace, f"nl-{tag}-work", tag)
        # as `helm install` renders: with what the cluster's discovery lists
        args = discovered_apis(cluster) if cluster is not None else ()
        release.objects = parse_documents(
            render(helm, release=name, namespace=namespace, settings=values, extra_args=args)
        )
        return release

    @property
    def extender_sa(self) -> str:
        return f"{self.name}-extender"

    @property
    def device_plugin_sa(self) -> str:
        return f"{self.name}-device-plugin"

    @property
    def scheduler_sa(self) -> str:
        return f"{self.name}-scheduler"

    @property
    def sets_scheduler_name(self) -> bool:
        """Whether the rendering holds the MutatingAdmissionPolicy that gives GPU pods the
        extender's scheduler (rendered where the cluster serves its v1, Kubernetes >= 1.36)."""
        return bool(self.of_kind("MutatingAdmissionPolicy"))

    def user(self, service_account: str) -> str:
        return f"system:serviceaccount:{self.namespace}:{service_account}"

    def of_kind(self, *kinds: str) -> list[JSON]:
        return [o for o in self.objects if o["kind"] in kinds]

    def one(self, kind: str, name: str) -> JSON:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
        return found[0]

    def install(self, cluster: Cluster, *, kinds: Iterable[str] = INSTALLED_KINDS) -> None:
        """Create the workload namespace and apply the rendered objects of ``kinds``."""
        wanted = set(kinds)
        work = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.workload_namespace, "labels": {TEST_LABEL: self.tag}},
        }
        objs = [o for o in self.objects if o["kind"] in wanted]
        # namespaces first, then the rest in the chart's order
        objs.sort(key=lambda o: o["kind"] != "Namespace")
        self.applied = [work, *objs]
        apply(cluster, self.applied)
        # pods need their namespace's default ServiceAccount, which kube-controller-manager makes
        deadline = time.monotonic() + 30
        while not cluster.kubectl(
            "get",
            "serviceaccount",
            "default",
            "-n",
            self.workload_namespace,
            "--ignore-not-found",
            "-o",
            "name",
        ).strip():
            assert time.monotonic() < deadline, (
                "no default ServiceAccount in the workload namespace"
            )
            time.sleep(0.1)

    def uninstall(self, cluster: Cluster) -> None:
        """Delete what ``install`` applied (namespaces last, without waiting for them)."""
        rest = [o for o in self.applied if o["kind"] != "Namespace"]
        namespaces = [o for o in self.applied if o["kind"] == "Namespace"]
        for group in (rest, namespaces):
            if group:
                cluster.kubectl(
                    "delete",
                    "--ignore-not-found",
                    "--wait=false",
                    "-f",
                    "-",
                    input_text=_as_list(group),
                    check=False,
                )


def _as_list(objs: Iterable[JSON]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)})


def apply(cluster: Cluster, objs: Iterable[JSON], *, dry_run: bool = False) -> str:
    """``kubectl apply`` the objects as admin (server-side dry run when asked)."""
    args = ["apply", "-f", "-"] + (["--dry-run=server"] if dry_run else [])
    return cluster.kubectl(*args, input_text=_as_list(objs))


def token(
    cluster: Cluster,
    namespace: str,
    service_account: str,
    *,
    bound_pod: str | None = None,
) -> str:
    """A real token of the service account (TokenRequest), bound to a pod when given."""
    args = ["create", "token", service_account, "-n", namespace, "--duration=1h"]
    if bound_pod is not None:
        args += ["--bound-object-kind=Pod", f"--bound-object-name={bound_pod}"]
    return cluster.kubectl(*args).strip()


def token_kubeconfig(cluster: Cluster, path: Path, bearer: str) -> Path:
    """A kubeconfig that authenticates with ``bearer`` against the devcluster."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "devcluster",
                "cluster": {
                    "server": cluster.api_url,
                    "certificate-authority": str(cluster.pki.ca_cert),
                },
            }
        ],
        "users": [{"name": "sa", "user": {"token": bearer}}],
        "contexts": [{"name": "sa", "context": {"cluster": "devcluster", "user": "sa"}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def pod_on_node(name: str, *, node: str, service_account: str = "default") -> JSON:
    """A pod already bound to ``node`` (no kubelet runs it; it anchors a bound token)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": "registry.invalid/none"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def plain_node(name: str, *, tag: str) -> JSON:
    """A Node object no pod will be scheduled to (unschedulable, tainted for this test)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {TEST_LABEL: tag}},
        "spec": {
            "unschedulable": True,
            "taints": [{"key": TEST_LABEL, "value": tag, "effect": "NoSchedule"}],
        },
    }


async def eventually(
    attempt: Callable[[], Awaitable[bool]], *, what: str, timeout_s: float = 30.0
) -> None:
    """Retry ``attempt`` until it returns True (the API server loads new policies and role
    bindings asynchronously); fail with ``what`` after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await attempt():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f}s: {what}")
        await asyncio.sleep(0.2)


# ---- which APIs each Kubernetes version serves ------------------------------------------------

# (apiVersion, kind) -> the first Kubernetes 1.x minor whose kube-apiserver serves it by default.
# Sources: the kind's Go type in k8s.io/api (staging/src/k8s.io/api in kubernetes) at the
# release's v0.<minor>.0 tag, and kube-apiserver's default resource configuration
# (pkg/controlplane/instance.go, DefaultAPIResourceConfigSource: stable versions on, beta and
# alpha versions of admissionregistration off by default, kubernetes v1.37.2).
SERVED_FROM: dict[tuple[str, str], int] = {
    # core/v1 (api/core/v1/types.go): served since 1.0
    **{
        ("v1", k): 0
        for k in ("Namespace", "ServiceAccount", "Secret", "ConfigMap", "Service", "ResourceQuota")
    },
    # apps/v1 (api/apps/v1/types.go): GA in 1.9
    ("apps/v1", "Deployment"): 9,
    ("apps/v1", "DaemonSet"): 9,
    # rbac/v1 (api/rbac/v1/types.go): GA in 1.8
    **{
        ("rbac.authorization.k8s.io/v1", k): 8
        for k in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    },
    # policy/v1 (api/policy/v1/types.go): GA in 1.21
    ("policy/v1", "PodDisruptionBudget"): 21,
    # admissionregistration/v1 ValidatingAdmissionPolicy[Binding]: in api/admissionregistration/
    # v1/types.go from k8s.io/api v0.30.0, absent at v0.29.0 (only v1alpha1, v1beta1): GA in 1.30
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): 30,
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): 30,
    # admissionregistration/v1 MutatingAdmissionPolicy[Binding]: in api/admissionregistration/v1/
    # types.go from k8s.io/api v0.36.0, absent at v0.35.0 (v1beta1 from v0.34.0, v1alpha1 from
    # v0.32.0, both off by default); the MutatingAdmissionPolicy feature gate is GA and on from
    # 1.36 (k8s.io/apiserver pkg/features/kube_features.go, v0.37.2)
    ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy"): 36,
    ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicyBinding"): 36,
}
# What kube-scheduler reads from the chart's ConfigMap: KubeSchedulerConfiguration v1 is in
# k8s.io/kube-scheduler config/v1 from v0.25.0 (v0.24.0 has only v1beta2 and v1beta3).
SCHEDULER_CONFIG_FROM: dict[str, int] = {"kubescheduler.config.k8s.io/v1": 25}
# Kinds of custom resources: served wherever their operator's CRDs are installed, and rendered
# only when Helm sees them (the chart fails with a message naming the CRDs otherwise).
CUSTOM_RESOURCES: dict[str, set[str]] = {
    "cert-manager.io/v1": {"Certificate", "Issuer"},
    "monitoring.coreos.com/v1": {"ServiceMonitor", "PrometheusRule"},
}


def unserved(objs: Iterable[JSON], minor: int) -> list[str]:
    """The objects (and kube-scheduler configurations) that Kubernetes 1.<minor> does not serve by
    default, as "apiVersion kind name"; a kind the table does not know is unserved too."""
    missing = []
    for obj in objs:
        api, kind = obj["apiVersion"], obj["kind"]
        name = f"{api} {kind} {obj['metadata']['name']}"
        if kind in CUSTOM_RESOURCES.get(api, set()):
            continue
        if SERVED_FROM.get((api, kind), minor + 1) > minor:
            missing.append(name)
        if kind == "ConfigMap":
            for text in (obj.get("data") or {}).values():
                doc = yaml.safe_load(text) if "KubeSchedulerConfiguration" in text else None
                if doc and SCHEDULER_CONFIG_FROM.get(doc["apiVersion"], minor + 1) > minor:
                    missing.append(f"{name}: {doc['apiVersion']} {doc['kind']}")
    return missing
