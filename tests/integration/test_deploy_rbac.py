"""Least privilege, asked of the real authorizer: the chart's RBAC installed on the devcluster.

Two views: SubjectAccessReviews (the API server's RBAC authorizer decides each access: every one
the parts need is allowed, a list of dangerous ones is denied), and SelfSubjectRulesReviews made
with each service account's own token (everything it may do, minus what any service account may
do, is exactly what the parts need: nothing else).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from devcluster.cluster import Cluster
from devcluster.helm import ensure_helm
from kube.client import KubeClient
from tests.integration.deploy_kit import TestRelease, eventually, token

SAR_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


@pytest.fixture(scope="module")
def release(cluster: Cluster) -> Iterator[TestRelease]:
    rel = TestRelease.render(ensure_helm(), cluster=cluster)
    rel.install(cluster)
    # a service account with no bindings: what any service account may do
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", rel.namespace)
    try:
        yield rel
    finally:
        rel.uninstall(cluster)


@dataclass(frozen=True)
class Access:
    """One access: ``"verb resource[.group][/subresource][:name] [in NAMESPACE]"``, where the
    namespace may be LOCK (the lock namespace) or OTHER (a workload namespace)."""

    verb: str
    resource: str
    group: str
    subresource: str
    name: str
    namespace: str

    @classmethod
    def parse(cls, text: str, release: TestRelease) -> Access:
        words = text.split()
        verb, what = words[0], words[1]
        namespace = words[3] if len(words) == 4 else ""
        namespace = {"LOCK": release.namespace, "OTHER": release.workload_namespace}.get(
            namespace, namespace
        )
        what, _, name = what.partition(":")
        what, _, sub = what.partition("/")
        resource, _, group = what.partition(".")
        return cls(verb, resource, group, sub, name, namespace)


async def allowed(kube: KubeClient, release: TestRelease, sa: str, access: Access) -> bool:
    """The RBAC authorizer's answer for the service account ``sa`` of the release."""
    attributes = {
        "verb": access.verb,
        "group": access.group,
        "resource": access.resource,
        "subresource": access.subresource,
        "name": access.name,
        "namespace": access.namespace,
    }
    review = await kube.create(
        SAR_PATH,
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": release.user(sa),
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{release.namespace}",
                    "system:authenticated",
                ],
                "resourceAttributes": {k: v for k, v in attributes.items() if v},
            },
        },
    )
    return bool(review["status"].get("allowed"))


READ = ("get", "list", "watch")
EXTENDER_NEEDS = [
    *(f"{verb} pods" for verb in READ),  # cluster-wide (its cache)
    "get pods in OTHER",
    *(f"{verb} nodes" for verb in READ),
    "create pods/binding in OTHER",
    # the room-seen annotation of a pod filter turned away (extender.askAgainTurnedAway, the
    # default); the admission policy nodelock-extender-pod-updates confines it to that
    "patch pods in OTHER",
    *(f"{verb} leases.coordination.k8s.io in LOCK" for verb in (*READ, "create", "update")),
    "create events in OTHER",  # a bind waiting or refused, on the pod
    "patch events in OTHER",  # the same Event counted up (no event storm)
    "create events in default",  # a takeover, on the Node
]
DEVICE_PLUGIN_NEEDS = [
    *(f"{verb} pods" for verb in READ),  # its node's pods, by fieldSelector
    "get pods in OTHER",
    "get nodes",
    "patch nodes",  # its inventory annotation (admission confines it to its own Node)
    *(f"{verb} leases.coordination.k8s.io in LOCK" for verb in (*READ, "update")),
    "create events in OTHER",  # an Allocate refused, on the holder pod
    "patch events in OTHER",
    "create events in default",  # or on the Node
    # is the node's resource also published by a DRA driver? (deviceplugin/dra.py)
    *(
        f"{verb} {r}.resource.k8s.io"
        for r in ("deviceclasses", "resourceslices")
        for verb in ("get", "list")
    ),
]
SCHEDULER_NEEDS = [
    "create pods/binding in OTHER",
    "list nodes",
    "update leases.coordination.k8s.io:nodelock-scheduler in kube-system",
    "get configmaps:extension-apiserver-authentication in kube-system",
]
DANGEROUS = [
    "get secrets in LOCK",
    "list secrets",
    "get secrets in kube-system",
    "get configmaps in LOCK",
    "create pods in OTHER",
    "update pods in OTHER",
    "patch pods in OTHER",
    "delete pods in OTHER",
    "deletecollection pods in OTHER",
    "update pods/status in OTHER",
    "patch pods/status in OTHER",
    "create pods/eviction in OTHER",
    "create pods/exec in OTHER",
    "update pods/ephemeralcontainers in OTHER",
    "list leases.coordination.k8s.io",
    "get leases.coordination.k8s.io in kube-system",
    "update leases.coordination.k8s.io in kube-node-lease",
    "create leases.coordination.k8s.io in OTHER",
    "update leases.coordination.k8s.io in OTHER",
    "delete leases.coordination.k8s.io in LOCK",
    "deletecollection leases.coordination.k8s.io in LOCK",
    "patch leases.coordination.k8s.io in LOCK",
    "create nodes",
    "delete nodes",
    "update nodes/status",
    "patch nodes/status",
    "create serviceaccounts/token in LOCK",
    "impersonate users",
    "impersonate groups",
    "impersonate serviceaccounts in LOCK",
    "create clusterrolebindings.rbac.authorization.k8s.io",
    "bind clusterroles.rbac.authorization.k8s.io",
    "escalate clusterroles.rbac.authorization.k8s.io",
    "create rolebindings.rbac.authorization.k8s.io in LOCK",
    "update validatingadmissionpolicies.admissionregistration.k8s.io",
    "delete validatingadmissionpolicybindings.admissionregistration.k8s.io",
    "create deployments.apps in LOCK",
    "patch daemonsets.apps in LOCK",
    "create certificatesigningrequests.certificates.k8s.io",
    "delete events in OTHER",
    "update events in OTHER",
]
EVENTS = {("", "events", "", "create"), ("", "events", "", "patch")}
DRA_READ = {
    ("resource.k8s.io", r, "", v)
    for r in ("deviceclasses", "resourceslices")
    for v in ("get", "list")
}
EXTENDER_DENIED = [
    *(d for d in DANGEROUS if d != "patch pods in OTHER"),
    "update nodes",
    "patch nodes",
]
DEVICE_PLUGIN_DENIED = [
    *DANGEROUS,
    "create leases.coordination.k8s.io in LOCK",
    "create pods/binding in OTHER",
    "list nodes",
    "watch nodes",
    "update nodes",
    "create resourceslices.resource.k8s.io",
    "update resourceslices.resource.k8s.io",
    "delete resourceslices.resource.k8s.io",
    "create deviceclasses.resource.k8s.io",
    "create resourceclaims.resource.k8s.io in OTHER",
]


async def wrong_answers(
    kube: KubeClient, release: TestRelease, sa: str, accesses: list[str], *, expect: bool
) -> list[str]:
    wrong = []
    for text in accesses:
        if await allowed(kube, release, sa, Access.parse(text, release)) != expect:
            wrong.append(text)
    return wrong


async def wait_bindings_loaded(kube: KubeClient, release: TestRelease) -> None:
    """RBAC's informers see new bindings a moment after they are written."""
    probes = [
        (release.extender_sa, "create leases.coordination.k8s.io in LOCK"),
        (release.device_plugin_sa, "update leases.coordination.k8s.io in LOCK"),
        (release.extender_sa, "create pods/binding in OTHER"),
        (release.device_plugin_sa, "patch nodes"),
        (release.scheduler_sa, "create pods/binding in OTHER"),
    ]

    async def loaded() -> bool:
        for sa, text in probes:
            if not await allowed(kube, release, sa, Access.parse(text, release)):
                return False
        return True

    await eventually(loaded, what="the release's role bindings take effect")


@pytest.mark.parametrize(
    ("part", "needs", "denied"),
    [
        ("extender", EXTENDER_NEEDS, EXTENDER_DENIED),
        ("device-plugin", DEVICE_PLUGIN_NEEDS, DEVICE_PLUGIN_DENIED),
    ],
)
async def test_each_part_is_allowed_what_it_needs_and_denied_what_is_dangerous(
    kube: KubeClient, release: TestRelease, part: str, needs: list[str], denied: list[str]
) -> None:
    sa = f"{release.name}-{part}"
    await wait_bindings_loaded(kube, release)
    assert await wrong_answers(kube, release, sa, needs, expect=True) == []
    assert await wrong_answers(kube, release, sa, denied, expect=False) == []


async def test_second_scheduler_gets_the_scheduler_roles_and_its_own_leader_lease(
    kube: KubeClient, release: TestRelease
) -> None:
    sa = release.scheduler_sa
    await wait_bindings_loaded(kube, release)
    assert await wrong_answers(kube, release, sa, SCHEDULER_NEEDS, expect=True) == []
    others = [
        "get secrets in LOCK",
        "update leases.coordination.k8s.io in LOCK",
    ]
    assert await wrong_answers(kube, release, sa, others, expect=False) == []


# ---- nothing else: the whole rule set, as each service account sees it with its own token -----

Rule = tuple[str, str, str, str]  # (group, resource, resourceName or "", verb)


def rules_review(cluster: Cluster, bearer: str, namespace: str) -> set[Rule]:
    """What the holder of ``bearer`` may do in ``namespace`` (SelfSubjectRulesReview)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
    }
    res = subprocess.run(
        [
            str(cluster.binaries.kubectl),
            f"--server={cluster.api_url}",
            f"--certificate-authority={cluster.pki.ca_cert}",
            f"--token={bearer}",
            "--kubeconfig=/dev/null",
            "create",
            "--validate=false",
            "-o",
            "json",
            "-f",
            "-",
        ],
        input=json.dumps(review),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    status = json.loads(res.stdout)["status"]
    assert not status.get("incomplete"), status
    out: set[Rule] = set()
    for rule in status["resourceRules"]:
        for group in rule.get("apiGroups") or [""]:
            for resource in rule.get("resources") or []:
                for name in rule.get("resourceNames") or [""]:
                    for verb in rule["verbs"]:
                        out.add((group, resource, name, verb))
    return out


@pytest.mark.parametrize(
    ("part", "lock_ns", "other_ns"),
    [
        (
            "extender",
            {
                *((g, r, "", v) for g, r in (("", "pods"), ("", "nodes")) for v in READ),
                ("", "pods/binding", "", "create"),
                ("", "pods", "", "patch"),
                *(("coordination.k8s.io", "leases", "", v) for v in (*READ, "create", "update")),
                *EVENTS,
            },
            {
                *((g, r, "", v) for g, r in (("", "pods"), ("", "nodes")) for v in READ),
                ("", "pods/binding", "", "create"),
                ("", "pods", "", "patch"),
                *EVENTS,
            },
        ),
        (
            "device-plugin",
            {
                *(("", "pods", "", v) for v in READ),
                ("", "nodes", "", "get"),
                ("", "nodes", "", "patch"),
                *(("coordination.k8s.io", "leases", "", v) for v in (*READ, "update")),
                *EVENTS,
                *DRA_READ,
            },
            {
                *(("", "pods", "", v) for v in READ),
                ("", "nodes", "", "get"),
                ("", "nodes", "", "patch"),
                *EVENTS,
                *DRA_READ,
            },
        ),
    ],
)
def test_a_parts_token_may_do_nothing_else(
    cluster: Cluster,
    release: TestRelease,
    part: str,
    lock_ns: set[Rule],
    other_ns: set[Rule],
) -> None:
    baseline = token(cluster, release.namespace, "nobody")
    bearer = token(cluster, release.namespace, f"{release.name}-{part}")
    for namespace, expected in (
        (release.namespace, lock_ns),
        (release.workload_namespace, other_ns),
    ):
        deadline = time.monotonic() + 30  # until the new role bindings are loaded
        while True:
            everyone = rules_review(cluster, baseline, namespace)
            own = rules_review(cluster, bearer, namespace) - everyone
            if own == expected or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert own == expected, f"{part} in {namespace}"
