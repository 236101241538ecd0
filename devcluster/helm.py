"""Build the Helm CLI from its Go module, once, and cache it by version next to the control plane.

``ensure_helm`` builds ``helm.sh/helm/v4/cmd/helm`` (``HELM_VERSION``, pinned with its whole
dependency graph in ``devcluster/gomod-helm``, a module separate from the control plane's) into
``<cache>/helm/<version>/helm`` and returns that path.  ``render`` runs ``helm template`` on the
chart in ``deploy/helm/nodelock``; ``python -m devcluster.helm manifests`` regenerates the plain
manifests in ``deploy/manifests`` from it, and the devcluster's copy of the GPU pod admission
policies (``devcluster/admission.yaml``), and copies ``dashboards/alerts.yaml`` into the chart.

Guarantees, the same as ``devcluster.binaries``: a second call with a complete cache builds
nothing; the cached binary is used only when it matches the SHA-256 recorded when it was built (a
corrupt entry is rebuilt, or refused with ``build=False``); a build goes to a temporary directory
that is renamed into place whole.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from devcluster.binaries import GoModule, Progress, _ensure, _stderr, cache_root
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

MANIFEST_RELEASE = "nodelock"
MANIFEST_NAMESPACE = "nodelock-system"
# What the plain manifests add to the chart's defaults: the Namespace object (Helm users pass
# --create-namespace instead), and certificates from Secrets the operator creates (a generated
# CA and key must never be committed).
MANIFEST_SETTINGS: dict[str, str] = {"createNamespace": "true", "tls.source": "secret"}

# Which manifest file each chart template goes to (apply order: the file names sort).
MANIFEST_FILES: dict[str, str] = {
    "namespace.yaml": "00-namespace.yaml",
    "serviceaccounts.yaml": "10-rbac.yaml",
    "rbac-extender.yaml": "10-rbac.yaml",
    "rbac-device-plugin.yaml": "10-rbac.yaml",
    "rbac-scheduler.yaml": "10-rbac.yaml",
    "admission-assignment.yaml": "20-admission.yaml",
    "admission-device-plugin.yaml": "20-admission.yaml",
    "admission-gpu-pods.yaml": "20-admission.yaml",
    "admission-locks.yaml": "20-admission.yaml",
    "tls.yaml": "30-extender.yaml",
    "extender.yaml": "30-extender.yaml",
    "device-plugin.yaml": "40-device-plugin.yaml",
    "scheduler.yaml": "50-scheduler.yaml",
    "metrics.yaml": "60-monitoring.yaml",
    "prometheusrule.yaml": "60-monitoring.yaml",
}
_HEADER = (
    "# Generated from deploy/helm/nodelock by `python -m devcluster.helm manifests`: helm template "
    "with the\n# chart's default values and {settings}.\n# Do not edit: change the chart and "
    "regenerate (tests/integration/test_deploy_chart.py checks they agree).\n"
)


def render(
    helm: Path,
    *,
    release: str = MANIFEST_RELEASE,
    namespace: str = MANIFEST_NAMESPACE,
    settings: Mapping[str, str] | None = None,
    chart: Path = CHART_DIR,
) -> str:
    """``helm template`` of the chart with ``settings`` (``--set key=value``); raises on failure."""
    cmd = [str(helm), "template", release, str(chart), "--namespace", namespace]
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
    header = _HEADER.format(settings=settings)
    return {name: header + "---\n" + "---\n".join(docs) for name, docs in sorted(files.items())}


# The devcluster's own copy of the GPU pod policies (devcluster.admission applies it): the chart's
# admission-gpu-pods.yaml for the devcluster's wiring, the extender in the default scheduler.
DEVCLUSTER_POLICIES = REPO_ROOT / "devcluster" / "admission.yaml"
DEVCLUSTER_TEMPLATES = ("admission-gpu-pods.yaml",)
DEVCLUSTER_SETTINGS: dict[str, str] = {"scheduler.enabled": "false"}
_DEVCLUSTER_HEADER = (
    "# Generated from deploy/helm/nodelock by `python -m devcluster.helm manifests`: the chart's "
    "{templates}\n# with {settings} (the devcluster's extender is in the default scheduler).\n"
    "# Do not edit: change the chart and regenerate (tests/integration/test_deploy_chart.py).\n"
)


def devcluster_policies(rendered: str) -> str:
    """The devcluster's policy file from a ``helm template`` with ``DEVCLUSTER_SETTINGS``."""
    docs = [doc for template, doc in split_documents(rendered) if template in DEVCLUSTER_TEMPLATES]
    if not docs:
        raise DevclusterError(f"the chart rendered none of {', '.join(DEVCLUSTER_TEMPLATES)}")
    header = _DEVCLUSTER_HEADER.format(
        templates=", ".join(DEVCLUSTER_TEMPLATES),
        settings=", ".join(f"{k}={v}" for k, v in DEVCLUSTER_SETTINGS.items()),
    )
    return header + "---\n" + "---\n".join(docs)


def alerts_in_step() -> bool:
    """Whether the chart's alert rules are the observability part's file (or its placeholder)."""
    if not ALERTS_SOURCE.exists():
        return True
    return CHART_ALERTS.read_bytes() == ALERTS_SOURCE.read_bytes()


def write_manifests(helm: Path) -> list[Path]:
    """Copy dashboards/alerts.yaml into the chart (when it exists) and regenerate
    deploy/manifests; returns the files written."""
    written = []
    if ALERTS_SOURCE.exists() and not alerts_in_step():
        shutil.copyfile(ALERTS_SOURCE, CHART_ALERTS)
        written.append(CHART_ALERTS)
    files = manifest_files(render(helm, settings=MANIFEST_SETTINGS))
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
