"""Which build of nodelock is running: package version, git commit, Python and client versions.

``build_info()`` is what ``nodelock --version`` prints and what the ``nodelock_build_info``
gauge carries (``register_build_info``), so a log, a scrape and a bug report name the same build.

Guarantees: ``build_info()`` never raises; it runs ``git`` at most once per process (the answer
is cached) with a short timeout.  The version comes from the installed package's metadata, the
commit from ``git rev-parse`` on the checkout this code is loaded from — only when that checkout's
top directory is the one holding these very modules, so a wheel installed into a virtualenv that
happens to sit inside some other repository never reports that repository's commit.  Anything
that cannot be found is ``"unknown"``.  Not guaranteed: that the checkout has no uncommitted
changes (the commit names ``HEAD``, not the working tree).
"""

from __future__ import annotations

import functools
import platform
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

UNKNOWN = "unknown"
DISTRIBUTION = "nodelock"
KUBERNETES_CLIENT = "kubernetes_asyncio"
# The directory holding the ``lockd`` package: the repository root in a checkout.
SOURCE_ROOT = Path(__file__).resolve().parents[1]
GIT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class BuildInfo:
    """One build of nodelock, as labels (every field a plain string)."""

    version: str
    commit: str
    python: str
    kubernetes_client: str

    def describe(self) -> str:
        """One line for ``--version``: ``nodelock 0.1.0 (commit 1a2b…, Python 3.11.7, …)``."""
        return (
            f"nodelock {self.version} (commit {self.commit}, Python {self.python}, "
            f"{KUBERNETES_CLIENT} {self.kubernetes_client})"
        )


def distribution_version(name: str) -> str:
    """The installed version of distribution ``name``, or ``"unknown"``."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return UNKNOWN


def git_commit(source_root: Path = SOURCE_ROOT, *, timeout_s: float = GIT_TIMEOUT_S) -> str:
    """The commit checked out at ``source_root``, or ``"unknown"``: no git, not a checkout, a
    checkout whose top directory is not ``source_root``, or git too slow."""
    try:
        done = subprocess.run(
            ["git", "-C", str(source_root), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != 2:
        return UNKNOWN
    toplevel, commit = (line.strip() for line in lines)
    if Path(toplevel).resolve() != source_root.resolve():
        return UNKNOWN
    if len(commit) < 7 or any(c not in "0123456789abcdef" for c in commit):
        return UNKNOWN
    return commit


@functools.cache
def build_info() -> BuildInfo:
    """This process's build (computed once)."""
    return BuildInfo(
        version=distribution_version(DISTRIBUTION),
        commit=git_commit(),
        python=platform.python_version(),
        kubernetes_client=distribution_version(KUBERNETES_CLIENT),
    )


BUILD_INFO_LABELS = ("version", "commit", "python", "kubernetes_client")


def register_build_info(registry: CollectorRegistry, info: BuildInfo | None = None) -> None:
    """Add the gauge ``nodelock_build_info`` (always 1, the build in its labels) to
    ``registry``.  Registering on a registry that already has it changes nothing."""
    info = info if info is not None else build_info()
    try:
        gauge = Gauge(
            "nodelock_build_info",
            "Always 1; the running build in its labels: package version, git commit, Python "
            "version and Kubernetes client library version.",
            list(BUILD_INFO_LABELS),
            registry=registry,
        )
    except ValueError:  # "Duplicated timeseries": this registry has it already
        return
    gauge.labels(info.version, info.commit, info.python, info.kubernetes_client).set(1)
