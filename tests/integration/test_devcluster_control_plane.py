"""The control plane devcluster starts is the real one: conditional writes, scheduling, kubectl."""

from __future__ import annotations

import asyncio
import json

import pytest

from devcluster.cluster import Cluster
from kube.client import KubeClient, lease_path, node_path, pod_path
from kube.errors import Conflict


async def test_lease_with_stale_resource_version_gets_409(kube: KubeClient, namespace: str) -> None:
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "n1", "namespace": namespace},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }
    created = await kube.create(lease_path(namespace), lease)
    stale_rv = created["metadata"]["resourceVersion"]
    created["spec"]["holderIdentity"] = "b"
    updated = await kube.replace(lease_path(namespace, "n1"), created)
    assert updated["metadata"]["resourceVersion"] != stale_rv

    updated["spec"]["holderIdentity"] = "c"
    updated["metadata"]["resourceVersion"] = stale_rv
    with pytest.raises(Conflict):
        await kube.replace(lease_path(namespace, "n1"), updated)
    current = await kube.get(lease_path(namespace, "n1"))
    assert current["spec"]["holderIdentity"] == "b"


async def test_real_scheduler_binds_a_pod_to_a_node_the_test_created(
    kube: KubeClient, namespace: str
) -> None:
    node_name = f"node-{namespace}"
    await kube.create(
        node_path(),
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node_name, "labels": {"test": namespace}},
            "status": {
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "10"},
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "10"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "Test"}],
            },
        },
    )
    try:
        await kube.create(
            pod_path(namespace),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p"},
                "spec": {
                    "nodeSelector": {"test": namespace},
                    # the node lifecycle controller lifts the not-ready taint only after a
                    # heartbeat period; this node has no kubelet, so tolerate it
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "c", "image": "none"}],
                },
            },
        )
        bound_to = None
        for _ in range(240):
            pod = await kube.get(pod_path(namespace, "p"))
            bound_to = pod["spec"].get("nodeName")
            if bound_to:
                break
            await asyncio.sleep(0.25)
        assert bound_to == node_name
    finally:
        await kube.delete(node_path(node_name))


def test_kubectl_get_leases_all_namespaces(cluster: Cluster) -> None:
    out = json.loads(cluster.kubectl("get", "leases", "-A", "-o", "json"))
    assert out["kind"] == "List"
    # kube-controller-manager and kube-scheduler run without leader election, but the API
    # server keeps its own identity Lease in kube-system
    assert any(i["metadata"]["namespace"] == "kube-system" for i in out["items"])
