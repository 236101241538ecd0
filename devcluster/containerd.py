"""containerd 1.7 for devcluster's nodes: Debian trixie's package, unpacked into the cache.

Debian bookworm's containerd (1.6) applies no CDI devices, so the chart's default device mode
(CDI names ``nvidia.com/gpu=<UUID>``) could not be shown reaching a container.  containerd 1.7's
CRI plugin applies them (``enable_cdi``).  Debian trixie packages containerd 1.7; its binaries
need only the C library (glibc >= 2.34, bookworm has 2.36) and runc, which bookworm's
``runc`` package provides.  So the package is fetched with apt from trixie, through a private apt
configuration (its own source list, lists and archive directories under the cache: the machine's
apt sources and installed packages are untouched), its signature checked by apt against the
machine's ``debian-archive-keyring``, and unpacked with ``dpkg-deb -x`` into
``<cache>/containerd/<Debian version>/``.

Guarantees: ``ensure_containerd`` returns the directory holding ``containerd``,
``containerd-shim-runc-v2`` and ``ctr`` of a 1.7 release, fetching it only when the cache has
none; a failure names the step and apt's message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from devcluster.binaries import cache_root
from devcluster.errors import DevclusterError

SUITE = "trixie"
SERIES = "1.7."  # the containerd release series the nodes run
BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
_SOURCES = f"""Types: deb
URIs: http://deb.debian.org/debian
Suites: {SUITE}
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def _cached(root: Path) -> Path | None:
    """The bin directory of the newest cached 1.7 package, if one is complete."""
    found = sorted(
        (d for d in root.glob(f"{SERIES}*") if all((d / "usr/bin" / b).exists() for b in BINARIES)),
        key=lambda d: d.stat().st_mtime,
    )
    return found[-1] / "usr" / "bin" if found else None


def _apt(work: Path, *args: str) -> str:
    options = [
        "-o", "Dir::Etc::SourceList=/dev/null",
        "-o", f"Dir::Etc::SourceParts={work / 'sources'}",
        "-o", f"Dir::State::Lists={work / 'lists'}",
        "-o", f"Dir::Cache={work / 'cache'}",
        "-o", "Dir::State::status=/dev/null",
        "-o", "APT::Architecture=amd64",
        "-o", "APT::Sandbox::User=root",
    ]  # fmt: skip
    try:
        res = subprocess.run(
            [args[0], *options, *args[1:]],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DevclusterError(f"{' '.join(args)} failed: {exc}") from exc
    if res.returncode != 0:
        raise DevclusterError(
            f"{' '.join(args)} (Debian {SUITE}'s containerd) failed (exit {res.returncode}): "
            f"{res.stderr.strip()[-2000:]}"
        )
    return res.stdout


def ensure_containerd(cache: str | os.PathLike[str] | None = None) -> Path:
    """The bin directory of containerd 1.7 (Debian trixie's package), fetched once."""
    root = cache_root(cache) / "containerd"
    found = _cached(root)
    if found is not None:
        return found
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise DevclusterError("containerd 1.7 is fetched with apt-get and dpkg-deb (Debian)")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".fetch-") as tmp:
        work = Path(tmp)
        for sub in ("sources", "lists/partial", "cache/archives/partial"):
            (work / sub).mkdir(parents=True)
        (work / "sources" / f"{SUITE}.sources").write_text(_SOURCES)
        _apt(work, "apt-get", "update", "-qq")
        shown = _apt(work, "apt-cache", "show", "--no-all-versions", "containerd").splitlines()
        versions = [line.split(":", 1)[1].strip() for line in shown if line.startswith("Version:")]
        deb_version = versions[0] if versions else ""
        if not deb_version.startswith(SERIES):
            raise DevclusterError(f"Debian {SUITE} has containerd {deb_version!r}, not {SERIES}x")
        _apt(work, "apt-get", "download", "-qq", f"containerd={deb_version}")
        debs = list(work.glob("containerd_*.deb"))
        if len(debs) != 1:
            raise DevclusterError(f"apt-get download left {debs} in {work}")
        unpacked = work / "unpacked"
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], check=True)
        target = root / deb_version.replace("~", "_")
        shutil.rmtree(target, ignore_errors=True)
        unpacked.rename(target)
    found = _cached(root)
    if found is None:
        raise DevclusterError(f"containerd {deb_version}'s package lacks one of {BINARIES}")
    return found
