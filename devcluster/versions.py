"""The Kubernetes versions a devcluster can run, and the Go module each is built from.

A version is built from a wrapper module that pins ``k8s.io/kubernetes`` at one patch release
and every staging module it needs (``k8s.io/api``, ``k8s.io/kubelet``, ...) at the matching
``v0.X.Y``: ``devcluster/gomod`` for the default release (it also holds the simulated-node
harness), ``devcluster/gomod-k8s/v1.X`` for the others. Each patch release below is one whose
every needed staging module the Go module proxy serves; a minor with no such release cannot be
built here without patching Kubernetes and is refused with the reason.

Guarantees: ``resolve`` accepts ``1.33``, ``v1.33`` and ``v1.33.13`` (only the pinned patch) and
returns the same ``Release`` for each, and ``oldest`` for the oldest supported release; anything
else is a ``DevclusterError`` naming what is supported. Pure data: nothing here builds or runs
anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from devcluster.errors import DevclusterError

DEVCLUSTER_DIR = Path(__file__).resolve().parent
DEFAULT_VERSION = "v1.37.2"

# minor -> the patch release built for it. Checked with `go list -m -versions k8s.io/<module>`
# and `go mod download` against the Go module proxy on 2026-12-01 and 2026-12-02: the newest
# patch of each minor whose staging modules are all served. 1.32: v1.32.13 lacks endpointslice
# v0.32.13 (403 on its zip), v1.32.12 is not served, v1.32.11 lacks csi-translation-lib and kms,
# v1.32.10 lacks several; v1.32.9 has every module. 1.31: v1.31.14 lacks endpointslice,
# kube-controller-manager, kube-proxy and kube-scheduler at v0.31.14, v1.31.13 lacks kube-proxy,
# v1.31.11 lacks apiserver, cli-runtime, kubectl and k8s.io/kubernetes itself; v1.31.9 lacks only
# cloud-provider v0.31.9, whose stand-in is in SAME_SOURCE.
RELEASES: dict[int, str] = {
    31: "v1.31.9",
    32: "v1.32.9",
    33: "v1.33.13",
    34: "v1.34.4",
    35: "v1.35.4",
    36: "v1.36.3",
    37: "v1.37.2",
}

# minor -> staging modules the proxy does not serve at the release's own version, built from
# another patch of the same source. k8s.io/cloud-provider v0.31.7 and v0.31.10 differ only in
# go.mod and go.sum (`diff -r` of the two module zips), so v0.31.9 between them has that same
# Go source; the wrapper module's other replaces pin every module it requires at v0.31.9.
SAME_SOURCE: dict[int, dict[str, str]] = {
    31: {"k8s.io/cloud-provider": "v0.31.10"},
}

# minors in the chart's range that cannot be built from served modules, and why
UNBUILDABLE: dict[int, str] = {}


@dataclass(frozen=True)
class Release:
    """One buildable Kubernetes patch release."""

    tag: str  # "v1.33.13"

    @property
    def minor(self) -> int:
        return int(self.tag.lstrip("v").split(".")[1])

    @property
    def is_default(self) -> bool:
        return self.tag == DEFAULT_VERSION

    @property
    def gomod(self) -> Path:
        """The wrapper module the control plane (and kubelet) of this release is built from."""
        if self.is_default:
            return DEVCLUSTER_DIR / "gomod"
        return DEVCLUSTER_DIR / "gomod-k8s" / f"v1.{self.minor}"

    def ldflags(self) -> str:
        """Link flags stamping the version the binaries report (``kubectl version``, /version)."""
        major, minor = self.tag.lstrip("v").split(".")[:2]
        pairs = {
            "k8s.io/component-base/version.gitVersion": self.tag,
            "k8s.io/component-base/version.gitMajor": major,
            "k8s.io/component-base/version.gitMinor": minor,
            "k8s.io/client-go/pkg/version.gitVersion": self.tag,
        }
        return "-s -w " + " ".join(f"-X {k}={v}" for k, v in pairs.items())


def supported() -> str:
    return ", ".join(f"1.{m} ({tag})" for m, tag in sorted(RELEASES.items()))


def resolve(spec: str | None) -> Release:
    """The release ``spec`` names (None: the default), or a DevclusterError saying why not."""
    if spec is None or spec == "":
        return Release(DEFAULT_VERSION)
    if spec == "oldest":
        return Release(RELEASES[min(RELEASES)])
    m = re.fullmatch(r"v?1\.(\d+)(?:\.(\d+))?", spec.strip())
    if m is None:
        raise DevclusterError(
            f"{spec!r} is not a Kubernetes version: give a minor such as 1.33 or a release "
            f"such as v1.33.13; supported: {supported()}"
        )
    minor = int(m.group(1))
    if minor in UNBUILDABLE:
        raise DevclusterError(f"Kubernetes 1.{minor} cannot be built here: {UNBUILDABLE[minor]}")
    tag = RELEASES.get(minor)
    if tag is None:
        raise DevclusterError(f"Kubernetes 1.{minor} is not supported; supported: {supported()}")
    if m.group(2) is not None and f"v1.{minor}.{m.group(2)}" != tag:
        raise DevclusterError(
            f"v1.{minor}.{m.group(2)} is not the pinned 1.{minor} release; devcluster builds "
            f"{tag} (the release whose staging modules the Go module proxy serves)"
        )
    return Release(tag)
