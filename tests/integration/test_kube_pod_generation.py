"""The API server's ``metadata.generation`` of a pod, the fact ``deviceplugin.decide``'s
``_calls_no_more`` reads: absent before 1.33; 1 at creation from 1.33, raised once more by the
first graceful deletion (``BeforeDelete`` in the apiserver's ``pkg/registry/rest/delete.go``) and
not by a shorter grace period after it."""

from __future__ import annotations

import pytest

from devcluster.cluster import Cluster
from devcluster.versions import resolve
from kube.client import KubeClient, pod_path

pytestmark = [pytest.mark.core]


async def test_graceful_deletion_raises_a_pods_generation_once(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    path = pod_path(namespace, "p")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        # bound (an unbound pod is deleted at once) to a node with no kubelet: it stays
        # Terminating for its whole grace period
        "spec": {"nodeName": "no-kubelet-here", "containers": [{"name": "c", "image": "x"}]},
    }
    created = await kube.create(pod_path(namespace), pod)
    try:
        await kube.delete(path, grace_period_seconds=300)
        deleting = await kube.get(path)
        assert deleting["metadata"].get("deletionTimestamp")
        await kube.delete(path, grace_period_seconds=200)  # shorter: the grace period only
        shorter = await kube.get(path)
        assert shorter["metadata"]["deletionGracePeriodSeconds"] == 200
        generations = [p["metadata"].get("generation") for p in (created, deleting, shorter)]
        if resolve(cluster.binaries.kubernetes_version).minor >= 33:
            assert generations == [1, 2, 2]
        else:
            assert generations == [None, None, None]
    finally:
        await kube.delete(path, grace_period_seconds=0)
