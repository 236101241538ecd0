"""Build the Helm CLI from its Go module, once, and cache it by version next to the control plane.

``ensure_helm`` builds ``helm.sh/helm/v4/cmd/helm`` (``HELM_VERSION``, pinned with its whole
dependency graph in ``devcluster/gomod-helm``, a module separate from the control plane's) into
``<cache>/helm/<version>/helm`` and returns that path.  ``render`` runs ``helm template`` on the
chart in ``deploy/helm/nodelock``; ``python -m devcluster.helm manifests`` regenerates the plain
manifests in ``deploy/manifests`` from it (for the newest supported Kubernetes version,
``MANIFEST_ARGS``), the devcluster's copy of the GPU pod admission policies
(``devcluster/admission.yaml``) and the chart's README (every value of ``values.schema.json``,
its description and default), and copies ``dashboards/alerts.yaml`` into the chart.  The
supported Kubernetes versions are the chart's ``kubeVersion`` (``supported_minors``).

Guarantees, the same as ``devcluster.binaries``: a second call with a complete cache builds
nothing; the cached binary is used only when it matches the SHA-256 recorded when it was built (a
corrupt entry is rebuilt, or refused with ``build=False``); a build goes to a temporary directory
that is renamed into place whole.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devcluster.binaries import KUBERNETES_VERSION, GoModule, Progress, _ensure, _stderr, cache_root
from devcluster.errors import DevclusterError

GOMOD_HELM_DIR = Path(__file__).resolve().parent / "gomod-helm"
HELM_VERSION = "v4.3.2"
HELM_PACKAGE = "helm.sh/helm/v4/cmd/helm"
_VERSION_PKG = "helm.sh/helm/v4/internal/version"


def helm_ldflags() -> str:
    """The link flags Helm's own Makefile sets for a release build of ``HELM_VERSION``."""
    return (
        f"-s -w -X {_VERSION_PKG}.version={HELM_VERSION} -X {_VERSION_PKG}.metadata="
        f" -X {_VERSION_PKG}.gitTreeState=clean"
    )


def ensure_helm(
    *, cache: str | os.PathLike[str] | None = None, build: bool = True, progress: Progress = _stderr
) -> Path:
    """Path of the ``helm`` binary for ``HELM_VERSION``, built if not cached."""
    module = GoModule(GOMOD_HELM_DIR, helm_ldflags(), env=(("CGO_ENABLED", "0"),))
    entry = _ensure(
        cache_root(cache) / "helm" / HELM_VERSION,
        {"helm": HELM_PACKAGE},
        what=f"Helm {HELM_VERSION}",
        build=build,
        progress=progress,
        module=module,
    )
    return entry / "helm"


# ---- rendering the chart ----------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parent.parent
CHART_DIR = REPO_ROOT / "deploy" / "helm" / "nodelock"
MANIFESTS_DIR = REPO_ROOT / "deploy" / "manifests"
ALERTS_SOURCE = REPO_ROOT / "dashboards" / "alerts.yaml"
CHART_ALERTS = CHART_DIR / "files" / "alerts.yaml"
CHART_DASHBOARDS = CHART_DIR / "files" / "dashboards"
CHART_VALUES = CHART_DIR / "values.yaml"
CHART_README = CHART_DIR / "README.md"
CHART_SCHEMA = CHART_DIR / "values.schema.json"
CHART_YAML = CHART_DIR / "Chart.yaml"

MANIFEST_RELEASE = "nodelock"
MANIFEST_NAMESPACE = "nodelock-system"
# What the plain manifests add to the chart's defaults: the Namespace object (Helm users pass
# --create-namespace instead), and certificates from Secrets the operator creates (a generated
# CA and key must never be committed), and kube-scheduler's tag (the chart takes the cluster's
# version, which a plain `helm template` does not know: the devcluster's Kubernetes version).
MANIFEST_SETTINGS: dict[str, str] = {
    "createNamespace": "true",
    "tls.source": "secret",
    "scheduler.image.tag": KUBERNETES_VERSION,
}
# The cluster the plain manifests are rendered for: the newest supported version, with the API its
# discovery lists that the chart asks for, so they hold every object the chart renders anywhere.
# Only 25-admission-scheduler-name.yaml depends on it (MutatingAdmissionPolicy v1, Kubernetes >=
# 1.36): on an older cluster it is left out (docs/install.md, "Plain manifests"); every other file
# is the same for every supported version (tests/integration/test_deploy_versions.py).
MUTATING_POLICY_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
MANIFEST_ARGS: tuple[str, ...] = (
    "--kube-version",
    KUBERNETES_VERSION,
    "--api-versions",
    MUTATING_POLICY_API,
)

# Which manifest file each chart template goes to (apply order: the file names sort).
MANIFEST_FILES: dict[str, str] = {
    "namespace.yaml": "00-namespace.yaml",
    "resourcequota.yaml": "00-namespace.yaml",
    "serviceaccounts.yaml": "10-rbac.yaml",
    "rbac-extender.yaml": "10-rbac.yaml",
    "rbac-device-plugin.yaml": "10-rbac.yaml",
    "rbac-scheduler.yaml": "10-rbac.yaml",
    "admission-assignment.yaml": "20-admission.yaml",
    "admission-device-plugin.yaml": "20-admission.yaml",
    "admission-extender-pods.yaml": "20-admission.yaml",
    "admission-gpu-pods.yaml": "20-admission.yaml",
    "admission-locks.yaml": "20-admission.yaml",
    "admission-scheduler-name.yaml": "25-admission-scheduler-name.yaml",
    "tls.yaml": "30-extender.yaml",
    "certmanager.yaml": "30-extender.yaml",
    "extender.yaml": "30-extender.yaml",
    "device-plugin.yaml": "40-device-plugin.yaml",
    "scheduler.yaml": "50-scheduler.yaml",
    "metrics.yaml": "60-monitoring.yaml",
    "prometheusrule.yaml": "60-monitoring.yaml",
    "dashboards.yaml": "60-monitoring.yaml",
}
_HEADER = (
    "# Generated from deploy/helm/nodelock by `python -m devcluster.helm manifests`: helm template "
    "with the\n# chart's default values and {settings};\n# for Kubernetes {kube_version}, "
    'which serves MutatingAdmissionPolicy v1 (docs/install.md, "Plain manifests").\n'
    "# Do not edit: change the chart and regenerate (tests/integration/test_deploy_chart.py checks "
    "they agree).\n"
)


def render(
    helm: Path,
    *,
    release: str = MANIFEST_RELEASE,
    namespace: str = MANIFEST_NAMESPACE,
    settings: Mapping[str, str] | None = None,
    chart: Path = CHART_DIR,
    extra_args: Sequence[str] = (),
) -> str:
    """``helm template`` of the chart with ``settings`` (``--set key=value``) and ``extra_args``
    (e.g. ``--api-versions``); raises on failure."""
    cmd = [str(helm), "template", release, str(chart), "--namespace", namespace, *extra_args]
    for key, value in (settings or {}).items():
        cmd += ["--set", f"{key}={value}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if res.returncode != 0:
        raise DevclusterError(f"helm template failed: {res.stderr.strip()}")
    return res.stdout


def split_documents(rendered: str) -> list[tuple[str, str]]:
    """The documents of a ``helm template`` output as (template file name, document text)."""
    out = []
    for doc in re.split(r"^---\s*$", rendered, flags=re.MULTILINE):
        m = re.search(r"^# Source: [^/]+/templates/(.+)$", doc, flags=re.MULTILINE)
        body = doc.strip("\n")
        if m is None or not body.strip():
            continue
        out.append((m.group(1), body + "\n"))
    return out


# What one file needs the operator to change before applying it, said at its top.
SCHEDULER_MANIFEST = "50-scheduler.yaml"
_FILE_NOTES: dict[str, str] = {
    SCHEDULER_MANIFEST: (
        "# kube-scheduler must not be newer than the API server: set the image tag below "
        "({tag}) to your\n# cluster's version before applying "
        '(docs/install.md, "Plain manifests", has the one-line sed).\n'
    ),
}


def manifest_files(rendered: str) -> dict[str, str]:
    """The plain manifests (file name -> text) from a ``helm template`` output."""
    settings = ", ".join(f"{k}={v}" for k, v in MANIFEST_SETTINGS.items())
    files: dict[str, list[str]] = {}
    for template, doc in split_documents(rendered):
        name = MANIFEST_FILES.get(template)
        if name is None:
            raise DevclusterError(
                f"the chart's template {template} has no manifest file: add it to MANIFEST_FILES"
            )
        files.setdefault(name, []).append(doc)
    header = _HEADER.format(settings=settings, kube_version=KUBERNETES_VERSION)
    notes = {
        name: note.format(tag=MANIFEST_SETTINGS["scheduler.image.tag"])
        for name, note in _FILE_NOTES.items()
    }
    return {
        name: header + notes.get(name, "") + "---\n" + "---\n".join(docs)
        for name, docs in sorted(files.items())
    }


# The devcluster's own copy of the GPU pod policies (devcluster.admission applies it): the chart's
# admission-gpu-pods.yaml for the devcluster's wiring, the extender in the default scheduler.
DEVCLUSTER_POLICIES = REPO_ROOT / "devcluster" / "admission.yaml"
DEVCLUSTER_TEMPLATES = ("admission-gpu-pods.yaml",)
# Every namespace is judged there (the chart judges only opted-in namespaces by default): a
# devcluster is nodelock's alone, and its tests create GPU pods in namespaces of their own.
DEVCLUSTER_SETTINGS: dict[str, str] = {
    "scheduler.enabled": "false",
    "admission.gpuPods.namespaceSelector.matchExpressions[0].key": "kubernetes.io/metadata.name",
    "admission.gpuPods.namespaceSelector.matchExpressions[0].operator": "Exists",
}
_DEVCLUSTER_HEADER = (
    "# Generated from deploy/helm/nodelock by `python -m devcluster.helm manifests`: the chart's "
    "{templates}\n# with {settings}\n# (the devcluster's extender is in the default scheduler).\n"
    "# Do not edit: change the chart and regenerate (tests/integration/test_deploy_chart.py).\n"
)


def devcluster_policies(rendered: str) -> str:
    """The devcluster's policy file from a ``helm template`` with ``DEVCLUSTER_SETTINGS``."""
    docs = [doc for template, doc in split_documents(rendered) if template in DEVCLUSTER_TEMPLATES]
    if not docs:
        raise DevclusterError(f"the chart rendered none of {', '.join(DEVCLUSTER_TEMPLATES)}")
    header = _DEVCLUSTER_HEADER.format(
        templates=", ".join(DEVCLUSTER_TEMPLATES),
        settings=",\n#   ".join(f"{k}={v}" for k, v in DEVCLUSTER_SETTINGS.items()),
    )
    return header + "---\n" + "---\n".join(docs)


def chart_copies() -> dict[Path, Path]:
    """The chart's copies of the observability files (copy -> source): the alert rules and the
    Grafana dashboards (shipped as ConfigMaps)."""
    copies = {CHART_ALERTS: ALERTS_SOURCE} if ALERTS_SOURCE.exists() else {}
    for source in sorted(ALERTS_SOURCE.parent.glob("*.json")):
        copies[CHART_DASHBOARDS / source.name] = source
    return copies


def alerts_in_step() -> bool:
    """Whether the chart's alert rules and dashboards are the observability part's files, and
    its README is the one generated from its values.schema.json."""
    for copy, source in chart_copies().items():
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            return False
    stale = [p for p in CHART_DASHBOARDS.glob("*.json") if p not in chart_copies()]
    return not stale and CHART_README.read_text() == chart_readme(CHART_SCHEMA.read_text())


# ---- the chart's values, described by values.schema.json ---------------------------------------


@dataclass(frozen=True)
class ChartValue:
    """One value of the chart as ``values.schema.json`` describes it: its dotted ``key``, its
    ``description``, and its ``default`` (``SECTION`` for an object whose members are listed)."""

    key: str
    description: str
    default: object


SECTION = object()


def chart_values(schema: Mapping[str, Any]) -> list[ChartValue]:
    """Every value of the chart, sections first then their members, in the schema's order.
    A property with ``properties`` of its own is a section; any other is a value."""
    out: list[ChartValue] = []

    def walk(props: Mapping[str, Any], prefix: str) -> None:
        for name, prop in props.items():
            key = f"{prefix}{name}"
            members = prop.get("properties")
            is_section = bool(members) and "default" not in prop
            default = SECTION if is_section else prop.get("default", SECTION)
            out.append(ChartValue(key, str(prop.get("description", "")), default))
            if is_section:
                walk(members, f"{key}.")

    walk(schema["properties"], "")
    return out


def values_leaves(values: object) -> dict[str, object]:
    """The values of a parsed ``values.yaml`` by dotted key, down to the members of the sections
    that ``values.schema.json`` lists (a map of free keys, e.g. a node selector, is one value)."""
    schema = json.loads(CHART_SCHEMA.read_text())
    sections = {v.key for v in chart_values(schema) if v.default is SECTION}
    out: dict[str, object] = {}

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict) and (path == "" or path in sections):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else key)
        else:
            out[path] = node

    walk(values, "")
    return out


_README_HEAD = """\
# The nodelock Helm chart

<!-- Generated from values.schema.json by `python -m devcluster.helm manifests`; do not edit. -->

GPU scheduler extender and kubelet device plugin that agree on exactly which GPUs a pod gets,
through per-node Lease locks with fencing tokens.

**Install it by [docs/install.md](../../../docs/install.md)**: the one install path, in the order
an operator works (requirements, preparing the nodes, install, a test pod, moving nodes over,
upgrade, uninstall, troubleshooting). The metrics and alerts are in `docs/metrics.md`, the Events
in `docs/events.md`.

Kubernetes versions: `{kube_version}` (the chart's `kubeVersion`).

`values.schema.json` describes every value below and checks them: a misspelt or unknown key
fails `helm install`, `helm template` and `helm lint`.

## Values

| key | default | description |
| --- | --- | --- |
"""


def _readme_text(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def _readme_default(value: object) -> str:
    if value is SECTION:
        return ""
    return "`" + json.dumps(value).replace("|", "\\|") + "`"


def chart_kube_version() -> str:
    """The chart's ``kubeVersion`` constraint, as written in Chart.yaml."""
    match = re.search(r'^kubeVersion:\s*"([^"]+)"', CHART_YAML.read_text(), flags=re.MULTILINE)
    if match is None:
        raise DevclusterError(f"{CHART_YAML} has no quoted kubeVersion")
    return match.group(1)


def supported_minors() -> list[int]:
    """The Kubernetes 1.x minors the chart supports, from its kubeVersion (">=1.A.0-0 <1.B.0-0")."""
    constraint = chart_kube_version()
    match = re.fullmatch(r">=1\.(\d+)\.0-0 <1\.(\d+)\.0-0", constraint)
    if match is None:
        raise DevclusterError(f"Chart.yaml kubeVersion {constraint!r} is not >=1.A.0-0 <1.B.0-0")
    return list(range(int(match.group(1)), int(match.group(2))))


def chart_readme(schema_text: str) -> str:
    """The chart's README: one row per value of ``values.schema.json`` (its dotted key, its
    default and its description); a section's row has no default."""
    rows = [
        f"| `{v.key}` | {_readme_default(v.default)} | {_readme_text(v.description)} |"
        for v in chart_values(json.loads(schema_text))
    ]
    return _README_HEAD.format(kube_version=chart_kube_version()) + "\n".join(rows) + "\n"


def write_manifests(helm: Path) -> list[Path]:
    """Copy dashboards/alerts.yaml into the chart (when it exists) and regenerate
    deploy/manifests; returns the files written."""
    written = []
    CHART_DASHBOARDS.mkdir(parents=True, exist_ok=True)
    copies = chart_copies()
    for stale in CHART_DASHBOARDS.glob("*.json"):
        if stale not in copies:
            stale.unlink()
    for copy, source in copies.items():
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            shutil.copyfile(source, copy)
            written.append(copy)
    readme = chart_readme(CHART_SCHEMA.read_text())
    if not CHART_README.exists() or CHART_README.read_text() != readme:
        CHART_README.write_text(readme)
        written.append(CHART_README)
    files = manifest_files(render(helm, settings=MANIFEST_SETTINGS, extra_args=MANIFEST_ARGS))
    MANIFESTS_DIR.mkdir(parents=True, exist_ok=True)
    for stale in MANIFESTS_DIR.glob("*.yaml"):
        if stale.name not in files:
            stale.unlink()
    wanted = {MANIFESTS_DIR / name: text for name, text in files.items()}
    wanted[DEVCLUSTER_POLICIES] = devcluster_policies(render(helm, settings=DEVCLUSTER_SETTINGS))
    for path, text in wanted.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m devcluster.helm [build|manifests]``: build Helm, or regenerate the manifests."""
    parser = argparse.ArgumentParser(prog="python -m devcluster.helm", description=main.__doc__)
    parser.add_argument("action", choices=["build", "manifests"])
    args = parser.parse_args(argv)
    try:
        helm = ensure_helm()
        if args.action == "build":
            print(helm)
            return 0
        for path in write_manifests(helm):
            print(f"wrote {path.relative_to(REPO_ROOT)}")
    except DevclusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
