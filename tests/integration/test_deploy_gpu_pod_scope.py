"""Where the chart's GPU pod policies act, enforced by the real kube-apiserver.

A fresh install judges (and, from Kubernetes 1.36, steers to nodelock's scheduler) only the GPU
pods of namespaces an operator labelled ``nodelock.io/enabled=true``: other schedulers' GPU pods
elsewhere are left alone.  And ``admission.gpuPods.denyVisibleDevicesInAllPods`` with
``devicePlugin.nvml.runtimeClassName`` (the plugin pods set ``NVIDIA_VISIBLE_DEVICES=all``) does
not deny the chart's own device plugin pods.  The release here keeps the chart's default scope;
only this module labels namespaces ``nodelock.io/enabled=true`` on the session cluster.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from devcluster.cluster import Cluster
from devcluster.helm import ensure_helm
from kube.client import KubeClient, pod_path
from kube.errors import Forbidden
from tests.integration.deploy_kit import JSON, TEST_LABEL, TestRelease, apply, eventually

OPT_IN = "nodelock.io/enabled"
DRY = [("dryRun", "All")]


@dataclass
class Scope:
    release: TestRelease
    opted_in: str  # a workload namespace labelled nodelock.io/enabled=true
    left_alone: str  # the release's workload namespace, not labelled


@pytest.fixture(scope="module")
def scope(cluster: Cluster) -> Iterator[Scope]:
    tag = secrets.token_hex(4)
    runtime_class = f"nl-{tag}"  # the device plugin's runtimeClassName must exist for its pods
    rel = TestRelease.render(
        ensure_helm(),
        tag=tag,
        cluster=cluster,
        scope_gpu_pods=False,
        settings={
            "admission.gpuPods.denyVisibleDevicesInAllPods": "true",
            "devicePlugin.nvml.runtimeClassName": runtime_class,
        },
    )
    rel.install(cluster)
    opted_in = f"nl-{tag}-in"
    extra: list[JSON] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": opted_in, "labels": {TEST_LABEL: tag, OPT_IN: "true"}},
        },
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": runtime_class},
            "handler": "nvidia",
        },
    ]
    apply(cluster, extra)
    # the operator opts the release namespace in too (every namespace judged, say)
    cluster.kubectl("label", "namespace", rel.namespace, f"{OPT_IN}=true")
    try:
        yield Scope(rel, opted_in, rel.workload_namespace)
    finally:
        cluster.kubectl(
            "delete", "runtimeclass", runtime_class, "--ignore-not-found", "--wait=false"
        )
        cluster.kubectl("delete", "namespace", opted_in, "--ignore-not-found", "--wait=false")
        rel.uninstall(cluster)


def gpu_pod(name: str, *, scheduler: str | None = None) -> JSON:
    spec: JSON = {
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/none",
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def create(kube: KubeClient, namespace: str, pod: JSON) -> JSON | str:
    """The pod as a server-side dry run admits it, or the refusal's message."""
    try:
        made: JSON = await kube.request("POST", pod_path(namespace), query=DRY, body=pod)
    except Forbidden as exc:
        return str(exc)
    return made


async def test_gpu_pods_of_namespaces_not_opted_in_are_left_alone(
    scope: Scope, kube: KubeClient
) -> None:
    policy = f"ValidatingAdmissionPolicy '{scope.release.name}-gpu-pods'"

    async def enforced() -> bool:
        answer = await create(kube, scope.opted_in, gpu_pod("probe", scheduler="volcano"))
        return isinstance(answer, str) and policy in answer

    await eventually(enforced, what="the GPU pod policy judges the opted-in namespace")
    # another scheduler's GPU pod, in a namespace nobody opted in: admitted as it is
    elsewhere = await create(kube, scope.left_alone, gpu_pod("volcano", scheduler="volcano"))
    assert isinstance(elsewhere, dict), elsewhere
    assert elsewhere["spec"]["schedulerName"] == "volcano"
    # one left at the default scheduler keeps it there (no steering outside opted-in namespaces)
    default = await create(kube, scope.left_alone, gpu_pod("default"))
    assert isinstance(default, dict), default
    assert default["spec"]["schedulerName"] == "default-scheduler"
    # in the opted-in namespace the same pods are judged: denied, or given nodelock's scheduler
    denied = await create(kube, scope.opted_in, gpu_pod("volcano", scheduler="volcano"))
    assert isinstance(denied, str)
    assert "a pod for scheduler volcano may not ask for nvidia.com/gpu" in denied
    steered = await create(kube, scope.opted_in, gpu_pod("default"))
    if scope.release.sets_scheduler_name:
        assert isinstance(steered, dict), steered
        assert steered["spec"]["schedulerName"] == "nodelock-scheduler"
    else:
        assert isinstance(steered, str)
        assert "a pod for scheduler default-scheduler may not ask" in steered


async def test_the_charts_own_device_plugin_pods_are_not_denied_their_visible_devices(
    scope: Scope, kube: KubeClient
) -> None:
    rel = scope.release
    ds = rel.one("DaemonSet", f"{rel.name}-device-plugin")
    template = ds["spec"]["template"]
    env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    plugin: JSON = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "device-plugin", "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }

    async def loaded() -> bool:
        answer = await create(kube, scope.opted_in, gpu_pod("probe", scheduler="volcano"))
        return isinstance(answer, str)

    await eventually(loaded, what="the GPU pod policy is enforced")
    admitted = await create(kube, rel.namespace, plugin)
    assert isinstance(admitted, dict), admitted
    # the same pod under another service account (the release's extender's) is any pod: denied,
    # every pod being judged
    impostor = copy.deepcopy(plugin)
    impostor["spec"]["serviceAccountName"] = rel.extender_sa
    denied = await create(kube, rel.namespace, impostor)
    assert isinstance(denied, str)
    assert "container device-plugin may not set NVIDIA_VISIBLE_DEVICES" in denied
