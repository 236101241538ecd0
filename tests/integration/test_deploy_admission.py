"""The chart's ValidatingAdmissionPolicies, enforced by the real kube-apiserver.

Every request here is made with a real credential: service account tokens from the TokenRequest
API (the device plugin's bound to a pod on a node, so the API server gives it the node claim
``authentication.kubernetes.io/node-name`` as kubelet's projected tokens have it), the devcluster's
kube-scheduler client certificate, and the admin.  The pod policy is bound to this module's
workload namespace only, so other tests' pods never meet it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import Cluster
from devcluster.helm import ensure_helm
from devcluster.pki import SCHEDULER
from handoff.wire import Keys
from kube.client import KubeClient, PatchType, lease_path, namespace_path, node_path, pod_path
from kube.errors import Forbidden, NotFound
from lockd.model import Holder, HolderKey, NodeName, Outcome
from nodelock.locks import run_locks
from tests.integration.deploy_kit import (
    JSON,
    TestRelease,
    apply,
    eventually,
    plain_node,
    pod_on_node,
    token,
    token_kubeconfig,
)
from tests.integration.extender_kit import new_locks, release_as_device_plugin

KEYS = Keys()
NOBODY_SCHEDULES = "nodelock-deploy-test-nobody"  # pods here are bound by the test only
GPU_SCHEDULER = "nodelock-scheduler"  # the chart's second scheduler: GPU pods must use it


@dataclass
class Setup:
    """The installed release, its nodes and the kubeconfigs of each identity."""

    release: TestRelease
    node_a: str
    node_b: str
    kubeconfigs: dict[str, Path]
    policies_loaded: bool = False


@pytest.fixture(scope="module")
def setup(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    rel = TestRelease.render(ensure_helm(), cluster=cluster)
    rel.install(cluster)
    node_a, node_b = f"nl-{rel.tag}-a", f"nl-{rel.tag}-b"
    work = rel.workload_namespace
    objs: list[JSON] = [plain_node(node_a, tag=rel.tag), plain_node(node_b, tag=rel.tag)]
    objs += [
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node, "namespace": rel.namespace},
            "spec": {},
        }
        for node in (node_a, node_b)
    ]
    # the device plugin's pod on node A (nothing runs it: it is what its token is bound to)
    plugin_pod = pod_on_node("device-plugin-a", node=node_a, service_account=rel.device_plugin_sa)
    plugin_pod["metadata"]["namespace"] = rel.namespace
    objs.append(plugin_pod)
    # a pod owner: may edit anything in its namespace (the built-in "edit" role)
    objs += [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "owner", "namespace": work},
        },
        # a person who may break locks: Leases in the lock namespace, pods to read (docs/install.md)
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "breaker", "namespace": work},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "lock-breaker", "namespace": rel.namespace},
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "verbs": ["get", "list", "watch", "update", "patch", "delete", "create"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "lock-breaker", "namespace": rel.namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "lock-breaker",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "breaker", "namespace": work}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "breaker-view", "namespace": work},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "view",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "breaker", "namespace": work}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "owner-edit", "namespace": work},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "owner", "namespace": work}],
        },
    ]
    apply(cluster, objs)
    tmp = tmp_path_factory.mktemp("deploy-admission")
    tokens = {
        "extender": token(cluster, rel.namespace, rel.extender_sa),
        "plugin-a": token(
            cluster, rel.namespace, rel.device_plugin_sa, bound_pod="device-plugin-a"
        ),
        "plugin-unbound": token(cluster, rel.namespace, rel.device_plugin_sa),
        "second-scheduler": token(cluster, rel.namespace, rel.scheduler_sa),
        "owner": token(cluster, work, "owner"),
        "breaker": token(cluster, work, "breaker"),
    }
    kubeconfigs = {
        k: token_kubeconfig(cluster, tmp / f"{k}.kubeconfig", v) for k, v in tokens.items()
    }
    kubeconfigs["kube-scheduler"] = cluster.pki.kubeconfig(
        tmp / "kube-scheduler.kubeconfig", SCHEDULER, cluster.api_url
    )
    kubeconfigs["admin"] = cluster.kubeconfig
    try:
        yield Setup(rel, node_a, node_b, kubeconfigs)
    finally:
        cluster.kubectl("delete", "node", node_a, node_b, "--ignore-not-found", "--wait=false")
        rel.uninstall(cluster)


@contextlib.asynccontextmanager
async def client(setup: Setup, who: str) -> AsyncIterator[KubeClient]:
    kube = await KubeClient.connect(str(setup.kubeconfigs[who]))
    try:
        yield kube
    finally:
        await kube.close()


def pod(name: str, annotations: dict[str, str] | None = None) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "schedulerName": NOBODY_SCHEDULES,
            "containers": [{"name": "main", "image": "registry.invalid/none"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def binding(name: str, node: str, annotations: dict[str, str] | None = None) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "annotations": annotations or {}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def assignment(devices: list[str], token_: int = 7) -> dict[str, str]:
    return {
        KEYS.assignment: json.dumps({"main": devices}),
        KEYS.token: str(token_),
        KEYS.bound_at: "2026-01-02T03:04:05.000000Z",
    }


async def forbidden(call: Any) -> str:
    """The message of the Forbidden that ``await call`` must raise."""
    with pytest.raises(Forbidden) as err:
        await call
    return str(err.value)


async def wait_policies(setup: Setup, admin: KubeClient) -> None:
    """Role bindings and new policies take a moment to load: wait until each identity's known
    allowed request is allowed and a known forbidden one is refused by its policy."""
    if setup.policies_loaded:
        return
    rel = setup.release
    work = rel.workload_namespace

    async def by_policy(call: Any) -> bool:
        try:
            await call
        except Forbidden as exc:
            return "ValidatingAdmissionPolicy" in str(exc)
        return False

    async def allowed(call: Any) -> bool:
        try:
            await call
        except Forbidden:
            return False
        return True

    async def steered(call: Any) -> bool:
        made = await call
        return bool(made["spec"]["schedulerName"] == GPU_SCHEDULER)

    dry = [("dryRun", "All")]
    async with (
        client(setup, "owner") as owner,
        client(setup, "extender") as extender,
        client(setup, "plugin-a") as plugin,
    ):
        checks = {
            "the pod owner may create pods": lambda: allowed(
                owner.request("POST", pod_path(work), query=dry, body=pod("probe"))
            ),
            "the extender may read Leases": lambda: allowed(
                extender.get(lease_path(rel.namespace, setup.node_a))
            ),
            "the device plugin may read Nodes": lambda: allowed(
                plugin.get(node_path(setup.node_b))
            ),
            "the assignment policy is enforced": lambda: by_policy(
                admin.request(
                    "POST", pod_path(work), query=dry, body=pod("probe", assignment(["GPU-p"]))
                )
            ),
            "the device plugin node-scope policy is enforced": lambda: by_policy(
                plugin.patch(node_path(setup.node_b), {"metadata": {"annotations": {"p": "1"}}})
            ),
            "the GPU pod policy is enforced": lambda: by_policy(
                owner.request(
                    "POST", pod_path(work), query=dry, body=gpu_pod("probe", node=setup.node_a)
                )
            ),
            # where the cluster serves MutatingAdmissionPolicy v1 (>= 1.36) it sets the
            # scheduler; below, the GPU pod policy denies the pod instead
            "the GPU pod scheduler policy steers, or the GPU pod policy denies": lambda: (
                steered(owner.request("POST", pod_path(work), query=dry, body=gpu_pod("probe")))
                if rel.sets_scheduler_name
                else by_policy(
                    owner.request("POST", pod_path(work), query=dry, body=gpu_pod("probe"))
                )
            ),
            "the lock guard policy is enforced": lambda: by_policy(
                admin.request(
                    "POST",
                    lease_path(rel.namespace),
                    query=dry,
                    body=held_lease("probe", holder=f"{work}/probe"),
                )
            ),
        }
        for what, check in checks.items():
            await eventually(check, what=what)
    setup.policies_loaded = True


@pytest.fixture
async def admin(setup: Setup, kube: KubeClient) -> KubeClient:
    await wait_policies(setup, kube)
    return kube


def gpu_pod(
    name: str,
    *,
    node: str | None = None,
    scheduler: str | None = None,
    labels: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    mounts: dict[str, str] | None = None,
    init: bool = False,
    gpus: int = 1,
    resource: str = "nvidia.com/gpu",
) -> JSON:
    """A pod asking for ``gpus`` of ``resource`` in one container (an init container when
    ``init``)."""
    ctr: JSON = {
        "name": "main",
        "image": "registry.invalid/none",
        "resources": {"limits": {resource: str(gpus)}},
    }
    if env:
        ctr["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if mounts:
        ctr["volumeMounts"] = [{"name": v, "mountPath": m} for m, v in mounts.items()]
    spec: JSON = {"containers": [ctr], "terminationGracePeriodSeconds": 0}
    if init:
        spec["initContainers"] = [dict(ctr, name="setup")]
        spec["containers"] = [{"name": "main", "image": "registry.invalid/none"}]
    if mounts:
        spec["volumes"] = [{"name": v, "emptyDir": {}} for v in mounts.values()]
    if node:
        spec["nodeName"] = node
    if scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


def held_lease(node: str, *, holder: str) -> JSON:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "labels": {"app.kubernetes.io/managed-by": "nodelock"},
            "annotations": {"nodelock.io/holder-uid": "u"},
        },
        "spec": {"holderIdentity": holder, "leaseTransitions": 1, "leaseDurationSeconds": 15},
    }


def annotations_of(obj: JSON) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


# ---- the assignment: only the extender writes it ----------------------------------------------


async def test_pod_owner_cannot_create_a_pod_with_an_assignment(
    setup: Setup, admin: KubeClient
) -> None:
    work = setup.release.workload_namespace
    async with client(setup, "owner") as owner:
        for key in (KEYS.assignment, KEYS.token, KEYS.bound_at):
            forged = {key: assignment(["GPU-forged"])[key]}
            message = await forbidden(owner.create(pod_path(work), pod("forged", forged)))
            assert "only the nodelock extender" in message
            assert f"system:serviceaccount:{work}:owner" in message
        # the policy does not get in the way of ordinary pods, with other annotations
        made = await owner.create(pod_path(work), pod("plain", {"team": "vision"}))
        assert annotations_of(made) == {"team": "vision"}


async def test_only_the_extender_binds_with_an_assignment_and_then_nobody_changes_it(
    setup: Setup, admin: KubeClient
) -> None:
    work = setup.release.workload_namespace
    written = assignment(["GPU-a-0", "GPU-a-1"])
    async with client(setup, "owner") as owner, client(setup, "extender") as extender:
        await owner.create(pod_path(work), pod("train"))
        bound = binding("train", setup.node_a, written)
        await extender.create(pod_path(work, "train", subresource="binding"), bound)
        got = await owner.get(pod_path(work, "train"))
        assert got["spec"]["nodeName"] == setup.node_a
        assert {k: annotations_of(got)[k] for k in written} == written

        path = pod_path(work, "train")
        change = {"metadata": {"annotations": {KEYS.assignment: json.dumps({"main": ["GPU-a-7"]})}}}
        remove = {"metadata": {"annotations": {KEYS.assignment: None}}}
        token_bump = {"metadata": {"annotations": {KEYS.token: "8"}}}
        for patch in (change, remove, token_bump):
            message = await forbidden(owner.patch(path, patch))
            assert "may not set, change or remove" in message
        # a full update that keeps the assignment is fine (labels, other annotations)
        await owner.patch(path, {"metadata": {"labels": {"step": "2"}, "annotations": {"x": "y"}}})
        # the status subresource can carry metadata too: not even cluster-admin gets through
        message = await forbidden(
            admin.patch(pod_path(work, "train", subresource="status"), change)
        )
        assert "nodelock-admin" in message
        final = await admin.get(path)
        assert {k: annotations_of(final)[k] for k in written} == written
        assert annotations_of(final)["x"] == "y"


async def test_a_binding_with_an_assignment_from_any_other_scheduler_is_refused(
    setup: Setup, admin: KubeClient
) -> None:
    work = setup.release.workload_namespace
    await admin.create(pod_path(work), pod("by-scheduler"))
    await admin.create(pod_path(work), pod("by-second-scheduler"))
    async with (
        client(setup, "kube-scheduler") as sched,
        client(setup, "second-scheduler") as second,
    ):
        for who, name in ((sched, "by-scheduler"), (second, "by-second-scheduler")):
            path = pod_path(work, name, subresource="binding")
            message = await forbidden(
                who.create(path, binding(name, setup.node_a, assignment(["GPU-x"])))
            )
            assert "only the nodelock extender" in message
            # the same scheduler binding without an assignment is untouched by the policy
            await who.create(path, binding(name, setup.node_a))
            assert (await admin.get(pod_path(work, name)))["spec"]["nodeName"] == setup.node_a


async def test_pods_outside_the_bound_namespaces_are_not_judged(
    setup: Setup, admin: KubeClient, namespace: str
) -> None:
    # this module's policy binding selects its own workload namespace only (that is what keeps it
    # from other tests); the chart's default selects every namespace
    made = await admin.create(pod_path(namespace), pod("elsewhere", assignment(["GPU-z"])))
    assert annotations_of(made)[KEYS.assignment] == json.dumps({"main": ["GPU-z"]})


# ---- the device plugin: its own node's Lease and Node only -------------------------------------


async def test_device_plugin_releases_only_its_own_nodes_lock(
    setup: Setup, admin: KubeClient
) -> None:
    ns = setup.release.namespace
    holder = Holder(HolderKey(f"{setup.release.workload_namespace}/p"), uid="0000-uid")
    async with (
        client(setup, "extender") as ext_kube,
        client(setup, "plugin-a") as plugin_kube,
        client(setup, "plugin-unbound") as unbound_kube,
    ):
        extender = new_locks(ext_kube, ns)
        plugin = new_locks(plugin_kube, ns)
        unbound = new_locks(unbound_kube, ns)
        # the extender takes both nodes' locks (it may write every Lease in the lock namespace)
        held_b = await extender.acquire(NodeName(setup.node_b), holder)
        await extender.acquire(NodeName(setup.node_a), holder)
        # node A's plugin may not release node B's lock ...
        with pytest.raises(Forbidden) as err:
            await release_as_device_plugin(plugin, setup.node_b)
        assert f"{setup.node_b} is not the node in its token ({setup.node_a})" in str(err.value)
        # ... nor may a plugin token without a node claim release any
        with pytest.raises(Forbidden) as err:
            await release_as_device_plugin(unbound, setup.node_a)
        assert "carries no node claim" in str(err.value)
        # its own node's lock it releases
        assert await release_as_device_plugin(plugin, setup.node_a) == holder.key
        lease_a = await admin.get(lease_path(ns, setup.node_a))
        assert lease_a["spec"].get("holderIdentity") is None
        lease_b = await admin.get(lease_path(ns, setup.node_b))
        assert lease_b["spec"]["holderIdentity"] == holder.key
        await extender.release(held_b, outcome=Outcome.BIND_FAILED)


async def test_device_plugin_writes_only_its_own_nodes_inventory(
    setup: Setup, admin: KubeClient
) -> None:
    inventory = json.dumps([{"id": "GPU-a-0", "index": 0, "healthy": True}])
    publish = {"metadata": {"annotations": {KEYS.gpus: inventory}}}
    async with client(setup, "plugin-a") as plugin, client(setup, "plugin-unbound") as unbound:
        # the merge patch InventoryPublisher sends, on its own Node
        await plugin.patch(node_path(setup.node_a), publish)
        assert annotations_of(await admin.get(node_path(setup.node_a)))[KEYS.gpus] == inventory
        await forbidden(plugin.patch(node_path(setup.node_b), publish))
        await forbidden(unbound.patch(node_path(setup.node_a), publish))
        # on its own Node, nothing but the inventory annotation
        patches: list[JSON] = [
            {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}},
            {"metadata": {"annotations": {"other": "x"}}},
            {"spec": {"unschedulable": False}},
            {"spec": {"taints": []}},
        ]
        for patch in patches:
            message = await forbidden(plugin.patch(node_path(setup.node_a), patch))
            assert f"only the {KEYS.gpus} annotation" in message
        with pytest.raises((Forbidden, NotFound)):
            await plugin.delete(node_path(setup.node_a))
        # the JSON patch form of a legitimate write passes too
        op = [{"op": "replace", "path": "/metadata/annotations/nodelock.io~1gpus", "value": "[]"}]
        await plugin.patch(node_path(setup.node_a), op, patch_type=PatchType.JSON)
    node_b = await admin.get(node_path(setup.node_b))
    assert KEYS.gpus not in annotations_of(node_b)


@pytest.mark.core  # the policy's CEL on the oldest supported release too
async def test_extender_changes_only_the_room_seen_annotation_of_a_pod(
    setup: Setup, admin: KubeClient
) -> None:
    """``extender.askAgainTurnedAway`` (the default) grants the extender ``patch`` on pods; the
    policy ``nodelock-extender-pod-updates`` leaves it only the ``room-seen`` annotation."""
    work = setup.release.workload_namespace
    room_seen = f"{KEYS.prefix}room-seen"
    await admin.create(pod_path(work), pod("turned-away", {"team": "vision"}))
    path = pod_path(work, "turned-away")
    async with client(setup, "extender") as extender:

        async def refused_by_policy() -> bool:
            try:
                await extender.patch(path, {"metadata": {"annotations": {"team": "x"}}})
            except Forbidden as exc:
                return "ValidatingAdmissionPolicy" in str(exc)
            return False

        await eventually(refused_by_policy, what="the extender pod-update policy is enforced")
        # the merge patch the extender sends (scheduler_ext/service.py), UID as a precondition
        uid = (await admin.get(path))["metadata"]["uid"]
        seen = {"metadata": {"uid": uid, "annotations": {room_seen: "n1 2026-12-06T00:00:00Z"}}}
        await extender.patch(path, seen)
        assert annotations_of(await admin.get(path)) == {
            "team": "vision",
            room_seen: "n1 2026-12-06T00:00:00Z",
        }
        patches: list[JSON] = [
            {"metadata": {"annotations": {"team": "x"}}},
            {"metadata": {"annotations": {"team": None}}},
            {"metadata": {"annotations": {"other": "x"}}},
            {"metadata": {"labels": {"app": "x"}}},
            {"metadata": {"finalizers": ["example.com/keep"]}},
            {"spec": {"activeDeadlineSeconds": 30}},
        ]
        for patch in patches:
            message = await forbidden(extender.patch(path, patch))
            assert f"only the {room_seen} annotation" in message, patch
    after = await admin.get(path)
    assert annotations_of(after) == {"team": "vision", room_seen: "n1 2026-12-06T00:00:00Z"}
    assert "activeDeadlineSeconds" not in after["spec"]
    await admin.delete(path, grace_period_seconds=0)


# ---- GPU pods go through the extender ----------------------------------------------------------

BYPASS = "nodelock.io/bypass"


async def test_gpu_pod_placed_by_hand_is_denied_naming_the_policy(
    setup: Setup, admin: KubeClient
) -> None:
    """Hole 1(a): a pod created with spec.nodeName would get the lock holder's GPUs."""
    work = setup.release.workload_namespace
    policy = f"ValidatingAdmissionPolicy '{setup.release.name}-gpu-pods'"
    async with client(setup, "owner") as owner:
        for pod_ in (
            gpu_pod("by-hand", node=setup.node_a),
            gpu_pod("by-hand-init", node=setup.node_a, init=True),
        ):
            message = await forbidden(owner.create(pod_path(work), pod_))
            assert policy in message
            assert f"a pod created with spec.nodeName {setup.node_a} may not ask for" in message
            assert f"{BYPASS}=true on the pod and on its namespace" in message
        # a static pod's mirror is created by kubelet with nodeName set: denied too
        mirror = gpu_pod("static", node=setup.node_a)
        mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
        message = await forbidden(admin.create(pod_path(work), mirror))
        assert f"a static pod (mirror pod of node {setup.node_a})" in message
        # a request of zero GPUs, or none, is not a GPU pod
        await owner.create(pod_path(work), gpu_pod("zero-gpus", node=setup.node_a, gpus=0))
        plain = pod_on_node("plain-by-hand", node=setup.node_a)
        await owner.create(pod_path(work), plain)


async def test_gpu_pod_for_another_scheduler_is_denied_and_default_ones_are_steered(
    setup: Setup, admin: KubeClient
) -> None:
    work = setup.release.workload_namespace
    async with client(setup, "owner") as owner:
        message = await forbidden(
            owner.create(pod_path(work), gpu_pod("elsewhere", scheduler="volcano"))
        )
        assert "a pod for scheduler volcano may not ask for nvidia.com/gpu" in message
        assert "(nodelock-scheduler)" in message
        # left at the default scheduler, a GPU pod is given the nodelock scheduler where the
        # cluster serves MutatingAdmissionPolicy v1; below, it is denied, naming the scheduler
        if setup.release.sets_scheduler_name:
            made = await owner.create(pod_path(work), gpu_pod("steered"))
            assert made["spec"]["schedulerName"] == "nodelock-scheduler"
        else:
            message = await forbidden(owner.create(pod_path(work), gpu_pod("steered")))
            assert "a pod for scheduler default-scheduler may not ask for" in message
            assert "(nodelock-scheduler)" in message
        made = await owner.create(pod_path(work), gpu_pod("named", scheduler="nodelock-scheduler"))
        assert made["spec"]["schedulerName"] == "nodelock-scheduler"
        # ... and a pod without GPUs is left alone
        plain = pod("no-gpu")
        del plain["spec"]["schedulerName"]
        made = await owner.create(pod_path(work), plain)
        assert made["spec"]["schedulerName"] == "default-scheduler"


async def test_mig_pods_go_through_the_extender_too(setup: Setup, admin: KubeClient) -> None:
    """A pod asking for MIG instances only is a GPU pod: placed by hand it would be served the
    lock holder's devices just the same."""
    work = setup.release.workload_namespace
    mig = "nvidia.com/mig-1g.10gb"
    async with client(setup, "owner") as owner:
        message = await forbidden(
            owner.create(pod_path(work), gpu_pod("mig-by-hand", node=setup.node_a, resource=mig))
        )
        assert f"a pod created with spec.nodeName {setup.node_a} may not ask for" in message
        assert "or MIG instances" in message
        message = await forbidden(
            owner.create(
                pod_path(work), gpu_pod("mig-elsewhere", scheduler="volcano", resource=mig)
            )
        )
        assert "a pod for scheduler volcano may not ask for" in message
        if setup.release.sets_scheduler_name:  # Kubernetes >= 1.36
            made = await owner.create(pod_path(work), gpu_pod("mig-steered", resource=mig))
            assert made["spec"]["schedulerName"] == "nodelock-scheduler"
        else:
            message = await forbidden(
                owner.create(pod_path(work), gpu_pod("mig-default", resource=mig))
            )
            assert "a pod for scheduler default-scheduler may not ask for" in message
        # zero instances, or a resource that only looks alike, is not a GPU pod
        await owner.create(
            pod_path(work), gpu_pod("mig-zero", node=setup.node_a, resource=mig, gpus=0)
        )
        await owner.create(
            pod_path(work), gpu_pod("other", node=setup.node_a, resource="example.com/mig-1g")
        )


async def test_escape_label_needs_the_pod_and_its_namespace(
    setup: Setup, admin: KubeClient
) -> None:
    work = setup.release.workload_namespace
    escaped = gpu_pod("escaped", node=setup.node_a, labels={BYPASS: "true"})
    async with client(setup, "owner") as owner:
        # a pod owner labels the pod: not enough (the namespace is an administrator's to label)
        await forbidden(owner.create(pod_path(work), escaped))
        await admin.patch(namespace_path(work), {"metadata": {"labels": {BYPASS: "true"}}})
        try:

            async def admitted() -> bool:
                try:
                    await owner.create(pod_path(work), escaped)
                except Forbidden:
                    return False
                return True

            await eventually(admitted, what="the escaped pod is admitted", timeout_s=10)
            # the namespace label alone exempts nothing
            await forbidden(owner.create(pod_path(work), gpu_pod("x", node=setup.node_a)))
        finally:
            await admin.patch(namespace_path(work), {"metadata": {"labels": {BYPASS: None}}})
    made = await admin.get(pod_path(work, "escaped"))
    assert made["spec"]["nodeName"] == setup.node_a


# ---- a container may not widen its devices (hole 9) --------------------------------------------


async def test_gpu_pod_may_not_set_nvidia_visible_devices(setup: Setup, admin: KubeClient) -> None:
    work = setup.release.workload_namespace
    # GPU pods that name the extender's scheduler, as they must below Kubernetes 1.36
    named = functools.partial(gpu_pod, scheduler=GPU_SCHEDULER)
    async with client(setup, "owner") as owner:
        for pod_ in (
            named("env-all", env={"NVIDIA_VISIBLE_DEVICES": "all"}),
            named("env-init", env={"NVIDIA_VISIBLE_DEVICES": "0,1"}, init=True),
        ):
            message = await forbidden(owner.create(pod_path(work), pod_))
            assert "may not set NVIDIA_VISIBLE_DEVICES" in message
        mount = named("mount", mounts={"/var/run/nvidia-container-devices/all": "devs"})
        message = await forbidden(owner.create(pod_path(work), mount))
        assert "container main may not mount under /var/run/nvidia-container-devices" in message
        # other NVIDIA variables (driver capabilities) are the pod's to choose
        caps = named("caps", env={"NVIDIA_DRIVER_CAPABILITIES": "compute,utility,video"})
        await owner.create(pod_path(work), caps)
        # a pod without GPUs is not judged by default (devicePlugin pods set it on purpose)
        plain = pod("plain-env")
        plain["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        await owner.create(pod_path(work), plain)
        # nor can an ephemeral container added to a GPU pod (kubectl debug) set it
        await owner.create(pod_path(work), named("debugged"))
        debug = await owner.get(pod_path(work, "debugged"))
        debug["spec"]["ephemeralContainers"] = [
            {
                "name": "debug",
                "image": "registry.invalid/none",
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
            }
        ]
        message = await forbidden(
            admin.replace(pod_path(work, "debugged", subresource="ephemeralcontainers"), debug)
        )
        assert "container debug may not set NVIDIA_VISIBLE_DEVICES" in message
        del debug["spec"]["ephemeralContainers"][0]["env"]
        await admin.replace(pod_path(work, "debugged", subresource="ephemeralcontainers"), debug)


# ---- held locks: only the parts change them; a person breaks one on the record ------------------


async def test_held_lock_is_changed_only_by_the_parts_or_a_recorded_break(
    setup: Setup, admin: KubeClient, tmp_path: Path
) -> None:
    """Hole 3(c): a person with RBAC on Leases (even cluster-admin) cannot hand a lock on, drop
    it or rewrite its assignment; `nodelock locks break` can, and the Lease names who and why."""
    rel = setup.release
    ns = rel.namespace
    node = NodeName(f"nl-{rel.tag}-c")
    holder = Holder(HolderKey(f"{rel.workload_namespace}/gone"), uid="u-1", data={"x": "1"})
    guard = f"ValidatingAdmissionPolicy '{rel.name}-lock-guard'"
    async with client(setup, "extender") as ext_kube, client(setup, "breaker") as breaker:
        extender = new_locks(ext_kube, ns)
        await extender.acquire(node, holder)
        path = lease_path(ns, node)
        breaker_user = f"system:serviceaccount:{rel.workload_namespace}:breaker"
        for who, kube in (("nodelock-admin", admin), (breaker_user, breaker)):
            for patch in (
                {"spec": {"holderIdentity": f"{rel.workload_namespace}/thief"}},
                {"spec": {"holderIdentity": None}},
                {"spec": {"leaseTransitions": 9}},
                {"metadata": {"annotations": {"nodelock.io/x": "2"}}},
                # a break that names someone else
                {
                    "spec": {"holderIdentity": None},
                    "metadata": {
                        "annotations": {
                            "nodelock.io/broken-by": "someone-else",
                            "nodelock.io/broken-reason": "r",
                            "nodelock.io/last-outcome": "broken",
                            "nodelock.io/last-holder": holder.key,
                        }
                    },
                },
            ):
                message = await forbidden(kube.patch(path, patch))
                assert guard in message
                assert f"{who} may not change the holder" in message
            message = await forbidden(kube.delete(path))
            assert f"may not delete node {node}'s lock while {holder.key} holds it" in message
        # other labels and annotations stay the administrator's
        await admin.patch(path, {"metadata": {"annotations": {"team": "ml"}}})

        # `nodelock locks break` as the breaker: recorded, admitted
        kubeconfig = setup.kubeconfigs["breaker"]
        code, out, err = await run_break(kubeconfig, ns, node, reason="node drained for repair")
        assert code == 0, err
        assert f"as {breaker_user}" in out
        lease = await admin.get(path)
        assert "holderIdentity" not in lease["spec"]
        ann = annotations_of(lease)
        assert ann["nodelock.io/broken-by"] == breaker_user
        assert ann["nodelock.io/broken-reason"] == "node drained for repair"
        assert ann["nodelock.io/last-outcome"] == "broken"
        assert ann["nodelock.io/last-holder"] == holder.key
        # a free lock is nobody's: may be deleted; and the extender takes it again
        again = await extender.acquire(node, holder)
        assert "nodelock.io/broken-by" not in annotations_of(await admin.get(path))
        await extender.release(again, outcome=Outcome.BIND_FAILED)
        await breaker.delete(path)
        # nobody but the parts creates a held lock
        message = await forbidden(
            admin.create(lease_path(ns), held_lease(node, holder=f"{rel.workload_namespace}/x"))
        )
        assert f"may not create node {node}'s lock held" in message


async def run_break(
    kubeconfig: Path, namespace: str, node: str, *, reason: str
) -> tuple[int, str, str]:
    args = argparse.Namespace(
        kubeconfig=str(kubeconfig),
        lock_namespace=namespace,
        annotation_prefix="nodelock.io/",
        observe=None,
        locks_action="break",
        node=node,
        yes=True,
        force=True,
        reason=reason,
    )
    out, err = io.StringIO(), io.StringIO()
    code = await run_locks(args, out=out, err=err, confirm=lambda _: False)
    return code, out.getvalue(), err.getvalue()
