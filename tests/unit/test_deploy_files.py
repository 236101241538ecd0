"""deploy/ as files: how a ``helm template`` output is split into the plain manifests, that the
image build file and the chart's file list keep up with the project, that every chart value is
described with its default, that what the chart's files cite exists, and that docs/install.md
states the supported versions and the RBAC verbs the chart has (no Helm, no cluster)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from devcluster.errors import DevclusterError
from devcluster.helm import (
    CHART_ALERTS,
    CHART_DIR,
    CHART_README,
    CHART_SCHEMA,
    CHART_VALUES,
    MANIFEST_FILES,
    MANIFEST_SETTINGS,
    MANIFESTS_DIR,
    REPO_ROOT,
    SCHEDULER_MANIFEST,
    SECTION,
    chart_kube_version,
    chart_readme,
    chart_values,
    helm_ldflags,
    manifest_files,
    split_documents,
    supported_minors,
    values_leaves,
)
from scheduler_ext.config import MIG_PROFILES

INSTALL_DOC = REPO_ROOT / "docs" / "install.md"

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
    assert "COPY pyproject.toml README.md constraints.txt ./" in containerfile
    assert "pip install -c constraints.txt ." in containerfile
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


# ---- the chart's values: described, with their defaults, in values.schema.json ----------------


def _schema() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(CHART_SCHEMA.read_text())
    return loaded


def test_every_chart_value_is_described_with_its_default() -> None:
    described = chart_values(_schema())
    values = values_leaves(yaml.safe_load(CHART_VALUES.read_text()))
    leaves = {v.key: v for v in described if v.default is not SECTION}
    assert set(leaves) == set(values)
    for key, value in values.items():
        assert leaves[key].default == value, f"{key}: the schema's default differs from values.yaml"
    for v in described:
        # a complete sentence (or several): the configuration reference prints it as it is
        assert len(v.description) >= 20, v.key
        assert v.description.endswith("."), v.key


def test_the_chart_readme_lists_every_value_with_its_default() -> None:
    readme = chart_readme(CHART_SCHEMA.read_text())
    for v in chart_values(_schema()):
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{v.key}` |"))
        if v.default is not SECTION:
            assert f"`{json.dumps(v.default)}`".replace("|", "\\|") in row, v.key


def test_node_selector_and_tolerations_of_the_device_plugin_show_their_defaults() -> None:
    props = {v.key: v for v in chart_values(_schema())}
    assert props["devicePlugin.nodeSelector"].default == {"nodelock.io/enabled": "true"}
    tolerated = {t["key"] for t in props["devicePlugin.tolerations"].default}  # type: ignore[attr-defined]
    assert tolerated == {"nvidia.com/gpu", "nodelock.io/enabled", "CriticalAddonsOnly"}
    for key in ("devicePlugin.nodeSelector", "devicePlugin.tolerations"):
        assert "Default" in props[key].description, key


# ---- the supported Kubernetes versions: Chart.yaml's kubeVersion, said the same everywhere ------


def test_supported_versions_are_one_range_read_from_the_chart() -> None:
    minors = supported_minors()
    assert minors == list(range(minors[0], minors[-1] + 1))
    assert len(minors) >= 2
    install = INSTALL_DOC.read_text()
    assert f"`{chart_kube_version()}`" in install
    matrix = re.findall(r"^\| 1\.(\d+) \|", install, flags=re.MULTILINE)
    assert [int(m) for m in matrix] == minors, "docs/install.md's support matrix"
    assert f"`{chart_kube_version()}`" in CHART_README.read_text()


# ---- what deploy/ cites exists ------------------------------------------------------------------

CITING = [
    CHART_VALUES,
    CHART_SCHEMA,
    CHART_README,
    CHART_DIR / "Chart.yaml",
    *sorted((CHART_DIR / "templates").iterdir()),
]
_PATH = re.compile(r"\b((?:deploy|docs|dashboards|devcluster|tests)/[\w./-]*\w)")
_DOC_HEADING = re.compile(r"(docs/[\w-]+\.md|[\w-]+\.md), \\?\"([^\"\\]+)\\?\"")


def _headings(doc: Path) -> set[str]:
    """A page's headings, each also without its section number ("7. Security model")."""
    found = {m.strip() for m in re.findall(r"^#+ (.+)$", doc.read_text(), flags=re.MULTILINE)}
    return found | {re.sub(r"^\d+(\.\d+)*\.? ", "", h) for h in found}


@pytest.mark.parametrize("path", CITING, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_chart_files_cite_files_and_headings_that_exist(path: Path) -> None:
    text = path.read_text()
    for cited in _PATH.findall(text):
        assert (REPO_ROOT / cited).exists() or list(REPO_ROOT.glob(cited)), cited
    for doc, quoted in _DOC_HEADING.findall(text):
        heading = re.sub(r"\s*\n\s*(#\s*)?", " ", quoted)  # a heading wrapped in a comment
        target = REPO_ROOT / (doc if doc.startswith("docs/") else f"docs/{doc}")
        assert heading in _headings(target), f"{doc} has no heading {heading!r}"


def test_chart_notes_name_only_headings_of_the_install_page() -> None:
    notes = (CHART_DIR / "templates" / "NOTES.txt").read_text()
    assert "docs/install.md" in notes
    quoted = re.findall(r'"([A-Z][^"{}]+)"', notes)
    assert quoted, "NOTES.txt names the install page's headings"
    for heading in quoted:
        assert heading in _headings(INSTALL_DOC), heading


# ---- docs/install.md's permissions are the chart's RBAC ----------------------------------------

_SCOPES = {
    "cluster-wide": "",
    "cluster-wide (its cache)": "",
    "the lock namespace": "nodelock-system",
}


def _documented_permissions() -> tuple[set[tuple[str, str, str, str]], set[tuple[str, str]]]:
    """(identity, resource, verb, namespace) from the Permissions table, and (identity, role) of
    the rows that grant a built-in role's own verbs."""
    section = INSTALL_DOC.read_text().split("### Permissions", 1)[1].split("\n### ", 1)[0]
    rules: set[tuple[str, str, str, str]] = set()
    roles: set[tuple[str, str]] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        who, what, verbs, where = cells
        identity = who.strip("`")
        if verbs == "the roles' own":
            roles |= {(identity, name) for name in re.findall(r"`([^`]+)`", what)}
            continue
        resources = re.findall(r"`([^`]+)`", what.split("(")[0])  # (a named object of it)
        namespace = _SCOPES.get(where, where.strip("`"))
        for verb in verbs.split(", "):
            rules |= {(identity, r, verb, namespace) for r in resources}
    return rules, roles


def _manifest_permissions() -> tuple[set[tuple[str, str, str, str]], set[tuple[str, str]]]:
    docs = [d for d in yaml.safe_load_all((MANIFESTS_DIR / "10-rbac.yaml").read_text()) if d]
    defined = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"].endswith("Role")}
    rules: set[tuple[str, str, str, str]] = set()
    roles: set[tuple[str, str]] = set()
    for binding in (d for d in docs if d["kind"].endswith("Binding")):
        namespace = binding["metadata"].get("namespace", "")
        ref = (binding["roleRef"]["kind"], binding["roleRef"]["name"])
        for subject in binding["subjects"]:
            if ref not in defined:
                roles.add((subject["name"], ref[1]))
                continue
            for rule in defined[ref]["rules"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        rules.add((subject["name"], resource, verb, namespace))
    return rules, roles


def test_install_page_states_the_verbs_the_chart_grants() -> None:
    documented_rules, documented_roles = _documented_permissions()
    granted_rules, granted_roles = _manifest_permissions()
    assert documented_rules == granted_rules, (
        f"docs/install.md only: {sorted(documented_rules - granted_rules)}; "
        f"the chart only: {sorted(granted_rules - documented_rules)}"
    )
    assert documented_roles == granted_roles


# ---- what the operator changes in the plain manifests, and the values kept in step with code -----


def test_the_install_pages_sed_line_sets_kube_schedulers_tag_in_the_manifest(
    tmp_path: Path,
) -> None:
    """kube-scheduler must not be newer than the API server: 50-scheduler.yaml says to set its
    tag, and the one-line ``sed`` of docs/install.md, run as written, does exactly that."""
    scheduler = MANIFESTS_DIR / SCHEDULER_MANIFEST
    text = scheduler.read_text()
    tag = MANIFEST_SETTINGS["scheduler.image.tag"]
    assert text.count("image: registry.k8s.io/kube-scheduler:") == 1
    assert f"image: registry.k8s.io/kube-scheduler:{tag}\n" in text
    assert f"set the image tag below ({tag}) to your" in text.split("---")[0]
    [line] = [
        line.strip()
        for line in INSTALL_DOC.read_text().splitlines()
        if line.strip().startswith("sed -i") and SCHEDULER_MANIFEST in line
    ]
    copy = tmp_path / "deploy" / "manifests" / SCHEDULER_MANIFEST
    copy.parent.mkdir(parents=True)
    copy.write_text(text)
    env = {"PATH": os.environ["PATH"], "KUBE_VERSION": "v1.31.9"}
    subprocess.run(["sh", "-c", line], cwd=tmp_path, env=env, check=True, timeout=30)
    changed = copy.read_text()
    assert "image: registry.k8s.io/kube-scheduler:v1.31.9\n" in changed
    assert changed.replace("v1.31.9\n", f"{tag}\n") == text


def test_the_mig_profiles_value_defaults_to_the_extenders_list() -> None:
    values = yaml.safe_load(CHART_VALUES.read_text())
    assert tuple(values["migProfiles"]) == MIG_PROFILES
