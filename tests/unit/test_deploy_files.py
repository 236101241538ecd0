"""deploy/ as files: how a ``helm template`` output is split into the plain manifests, and that
the image build file and the chart's file list keep up with the project (no Helm, no cluster)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from devcluster.errors import DevclusterError
from devcluster.helm import (
    CHART_ALERTS,
    CHART_DIR,
    MANIFEST_FILES,
    REPO_ROOT,
    helm_ldflags,
    manifest_files,
    split_documents,
)

RENDERED = """---
# Source: nodelock/templates/serviceaccounts.yaml
apiVersion: v1
kind: ServiceAccount
metadata:
  name: a
---
# Source: nodelock/templates/extender.yaml
apiVersion: v1
kind: Service
metadata:
  name: b
---
# Source: nodelock/templates/rbac-extender.yaml
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: c
"""


def test_documents_are_split_by_their_source_template() -> None:
    docs = split_documents(RENDERED)
    assert [t for t, _ in docs] == ["serviceaccounts.yaml", "extender.yaml", "rbac-extender.yaml"]
    assert [yaml.safe_load(d)["metadata"]["name"] for _, d in docs] == ["a", "b", "c"]


def test_manifest_files_group_templates_and_keep_their_order() -> None:
    files = manifest_files(RENDERED)
    assert list(files) == ["10-rbac.yaml", "30-extender.yaml"]
    rbac = [d for d in yaml.safe_load_all(files["10-rbac.yaml"]) if d]
    assert [d["metadata"]["name"] for d in rbac] == ["a", "c"]
    assert files["10-rbac.yaml"].startswith("# Generated from deploy/helm/nodelock")


def test_a_template_without_a_manifest_file_is_an_error() -> None:
    text = "---\n# Source: nodelock/templates/new-part.yaml\nkind: ConfigMap\n"
    with pytest.raises(DevclusterError, match=r"new-part\.yaml"):
        manifest_files(text)


def test_every_chart_template_has_a_manifest_file() -> None:
    templates = {p.name for p in (CHART_DIR / "templates").glob("*.yaml")}
    assert templates == set(MANIFEST_FILES)


def test_chart_alert_rules_are_a_prometheus_rules_file() -> None:
    rules = yaml.safe_load(CHART_ALERTS.read_text())
    assert rules["groups"]
    for group in rules["groups"]:
        assert group["name"]
        for rule in group["rules"]:
            assert rule["expr"]
            assert rule.get("alert") or rule.get("record")


def test_image_build_copies_every_package_the_project_installs() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in patterns}
    containerfile = (REPO_ROOT / "deploy" / "Containerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+)/ \1/$", containerfile, flags=re.MULTILINE))
    assert copied == packages
    assert "COPY pyproject.toml README.md ./" in containerfile
    assert pyproject["project"]["readme"] == "README.md"
    assert re.search(r'^ENTRYPOINT \["nodelock"\]$', containerfile, flags=re.MULTILINE)
    assert "nodelock" in pyproject["project"]["scripts"]


def test_helm_is_built_with_its_release_version() -> None:
    flags = helm_ldflags()
    assert "-X helm.sh/helm/v4/internal/version.version=v4." in flags
    gomod = (REPO_ROOT / "devcluster" / "gomod-helm" / "go.mod").read_text()
    version = re.search(r"helm\.sh/helm/v4 (v\S+)", gomod)
    assert version is not None
    assert f"version={version.group(1)} " in flags + " "
    assert re.search(r"^tool helm\.sh/helm/v4/cmd/helm$", gomod, flags=re.MULTILINE)


def test_manifests_directory_holds_only_generated_files() -> None:
    for path in Path(REPO_ROOT / "deploy" / "manifests").iterdir():
        assert path.name in set(MANIFEST_FILES.values()), path
        assert path.read_text().startswith("# Generated from deploy/helm/nodelock")
