"""The chart on every supported Kubernetes version: no object of an API the version lacks.

``helm template`` for each minor of the chart's ``kubeVersion``
(``devcluster.helm.supported_minors``), told what that version's discovery lists
(``--kube-version``, and ``--api-versions`` for each kind it serves, as ``helm install`` learns
them from a cluster), with the defaults and with every optional part on; each rendered object's
apiVersion and kind is checked against the APIs that version serves by default
(``deploy_kit.SERVED_FROM``, with its sources).  The MutatingAdmissionPolicy that sets GPU pods'
scheduler name is the one version-gated object: rendered from 1.36, where it is v1, and left out
before, where the GPU pod policy denies such pods instead (docs/install.md, "Supported Kubernetes
versions").  The plain manifests are the same for every version but that one file.  Needs Helm
(built once into the cache), no cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster.errors import DevclusterError
from devcluster.helm import (
    MANIFEST_SETTINGS,
    MANIFESTS_DIR,
    ensure_helm,
    manifest_files,
    render,
    supported_minors,
)
from tests.integration.deploy_kit import (
    CUSTOM_RESOURCES,
    JSON,
    SERVED_FROM,
    parse_documents,
    unserved,
)

pytestmark = pytest.mark.integration

MINORS = supported_minors()
MAP = ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy")
# The optional parts that need custom resources: Helm must be told their CRDs are there.
CRDS = tuple(
    arg
    for api, kinds in sorted(CUSTOM_RESOURCES.items())
    for kind in sorted(kinds)
    for arg in ("--api-versions", f"{api}/{kind}")
)
VARIANTS: dict[str, dict[str, str]] = {
    "defaults": {},
    "everything-optional": {
        "createNamespace": "true",
        "tls.source": "cert-manager",
        "metrics.service.enabled": "true",
        "metrics.serviceMonitor.enabled": "true",
        "prometheusRule.enabled": "true",
        "dashboards.enabled": "true",
        "devicePlugin.pools[0].name": "inference",
        "devicePlugin.pools[0].gpuSplit": "4",
        "admission.gpuPods.denyVisibleDevicesInAllPods": "true",
        "criticalPodsQuota.enabled": "true",
    },
    "default-scheduler-plain-http": {"scheduler.enabled": "false", "tls.enabled": "false"},
}


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_helm()


def discovery(minor: int) -> tuple[str, ...]:
    """What Helm learns from a 1.<minor> cluster's discovery, as ``helm template`` arguments: the
    version, and each kind of the table that version serves (Helm lists group/version/kind)."""
    served = sorted(f"{api}/{kind}" for (api, kind), first in SERVED_FROM.items() if first <= minor)
    return ("--kube-version", f"1.{minor}.0", *(a for s in served for a in ("--api-versions", s)))


def rendered(helm: Path, minor: int, settings: dict[str, str]) -> list[JSON]:
    args = (*discovery(minor), *CRDS)
    return parse_documents(render(helm, settings=settings, extra_args=args))


def kinds(objs: list[JSON]) -> set[tuple[str, str]]:
    return {(o["apiVersion"], o["kind"]) for o in objs}


def test_the_served_api_table_covers_every_supported_version() -> None:
    assert MINORS, "Chart.yaml's kubeVersion names no version"
    # every built-in kind the table knows is served from some version, none after the newest
    assert all(0 <= first <= MINORS[-1] for first in SERVED_FROM.values())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("minor", MINORS, ids=[f"1.{m}" for m in MINORS])
def test_every_rendered_object_is_of_an_api_the_version_serves(
    helm: Path, minor: int, variant: str
) -> None:
    objs = rendered(helm, minor, VARIANTS[variant])
    assert objs
    assert unserved(objs, minor) == []


@pytest.mark.parametrize("minor", MINORS, ids=[f"1.{m}" for m in MINORS])
def test_the_scheduler_name_policy_is_rendered_only_where_its_v1_is_served(
    helm: Path, minor: int
) -> None:
    objs = rendered(helm, minor, {})
    assert (MAP in kinds(objs)) == (minor >= 36)
    # the policy that denies GPU pods for other schedulers is there on every version
    names = {o["metadata"]["name"] for o in objs if o["kind"] == "ValidatingAdmissionPolicy"}
    assert "nodelock-gpu-pods" in names
    # turned off, or with nothing to set (the extender in the default scheduler): never
    assert MAP not in kinds(rendered(helm, minor, {"admission.gpuPods.setSchedulerName": "false"}))
    assert MAP not in kinds(rendered(helm, minor, {"scheduler.enabled": "false"}))


def test_without_a_cluster_the_policy_is_rendered_only_when_told_the_api(helm: Path) -> None:
    # `helm template` alone lists group versions, not kinds: it cannot know the kind is served
    offline = parse_documents(render(helm, extra_args=("--kube-version", f"1.{MINORS[-1]}.0")))
    assert MAP not in kinds(offline)
    told = ("--api-versions", f"{MAP[0]}/{MAP[1]}")
    assert MAP in kinds(
        parse_documents(render(helm, extra_args=("--kube-version", "1.36.0", *told)))
    )
    # ... and never for a version that cannot serve it, whatever it is told
    assert MAP not in kinds(
        parse_documents(render(helm, extra_args=("--kube-version", "1.35.0", *told)))
    )


def test_a_version_outside_the_chart_range_is_refused(helm: Path) -> None:
    for minor in (MINORS[0] - 1, MINORS[-1] + 1):
        with pytest.raises(DevclusterError, match="kubeVersion"):
            render(helm, extra_args=("--kube-version", f"1.{minor}.0"))


@pytest.mark.parametrize("minor", MINORS, ids=[f"1.{m}" for m in MINORS])
def test_plain_manifests_differ_by_version_only_in_the_scheduler_name_policy(
    helm: Path, minor: int
) -> None:
    files = manifest_files(render(helm, settings=MANIFEST_SETTINGS, extra_args=discovery(minor)))
    committed = {p.name: p.read_text() for p in MANIFESTS_DIR.glob("*.yaml")}
    gated = "25-admission-scheduler-name.yaml"
    assert (gated in files) == (minor >= 36)
    assert {k: v for k, v in files.items() if k != gated} == {
        k: v for k, v in committed.items() if k != gated
    }
