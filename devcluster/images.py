"""Container images for devcluster's containerd nodes, built on this machine and cached by content.

No registry is reachable from here, so every image a containerd node runs is built locally and
imported into each node's containerd (``devcluster.runtime``):

- **the base**: a Debian bookworm root made by ``mmdebstrap --variant=minbase`` with python3.11,
  its venv module and ``python`` (``python-is-python3``): the Containerfile's ``PYTHON_IMAGE``;
- **nodelock**: ``deploy/Containerfile`` built by ``buildah bud`` on that base from the
  repository's files, the way an operator builds it (its ``.dockerignore`` applies);
- **the pod sandbox**: ``nodelock-pause`` (``devcluster/gomod/cmd/nodelock-pause``), containerd's
  ``sandbox_image``;
- **kube-scheduler** of the cluster's release (the binary devcluster built) on the base, for the
  chart's second scheduler.

Each image is a docker-archive tar in ``<cache>/images/`` named by a key of everything it is made
from (sources, package list, base), so a second call builds nothing and a changed source builds a
new image under a new tag.  A build writes a temporary file that is renamed into place whole.  The
build trusts the machine's CA bundle (mounted read-only, never copied into an image), so pip
reaches PyPI where the machine's TLS goes through a proxy of its own.

Needs, as root: ``mmdebstrap`` and ``buildah`` (``make runtime-deps`` installs them with the
container runtime); a missing tool is a ``DevclusterError`` naming that step.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from devcluster.binaries import (
    GOMOD_DIR,
    Binaries,
    GoModule,
    Progress,
    _ensure,
    _ldflags,
    _stderr,
    cache_root,
    simkubelet_key,
)
from devcluster.errors import DevclusterError

REPO_ROOT = Path(__file__).resolve().parent.parent
CONTAINERFILE = REPO_ROOT / "deploy" / "Containerfile"
# what the Containerfile's COPY lines take (tests/unit/test_deploy_files.py keeps them in step)
IMAGE_SOURCES = ("pyproject.toml", "README.md", "constraints.txt", ".dockerignore")
IMAGE_PACKAGES = (
    "kube",
    "lockd",
    "handoff",
    "scheduler_ext",
    "deviceplugin",
    "devcluster",
    "nodelock",
    "proto",
)
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3.11", "python3.11-venv", "python-is-python3", "ca-certificates")
# documentation, manuals and translations: nothing in the images reads them
BASE_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")
PAUSE = ("nodelock-pause", "./cmd/nodelock-pause")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TOOLS_STEP = "make runtime-deps"
KEEP_NODELOCK_IMAGES = 4  # the newest builds of nodelock's image kept in the cache


@dataclass(frozen=True)
class Image:
    """A built image: the reference pods name it by, and its docker-archive tar."""

    ref: str
    archive: Path

    @property
    def repository(self) -> str:
        return self.ref.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]


@dataclass(frozen=True)
class NodeImages:
    """Every image a containerd node of devcluster is given."""

    base: Image
    nodelock: Image
    pause: Image
    scheduler: Image

    def all(self) -> tuple[Image, ...]:
        return (self.base, self.nodelock, self.pause, self.scheduler)


def tool(name: str) -> str:
    """Path of ``name`` on PATH, or a DevclusterError naming the step that installs it."""
    found = shutil.which(name)
    if found is None:
        raise DevclusterError(
            f"`{name}` was not found: containerd nodes need it (`{TOOLS_STEP}` installs the "
            "Debian packages they use)"
        )
    return found


def _run(argv: Sequence[str], *, what: str, cwd: Path | None = None, timeout_s: float = 900) -> str:
    try:
        res = subprocess.run(
            list(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DevclusterError(f"{what} failed: {exc}") from exc
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-25:])
        raise DevclusterError(f"{what} failed (exit {res.returncode}):\n{tail}")
    return res.stdout


def _digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:12]


def context_files(root: Path = REPO_ROOT) -> list[Path]:
    """The files of the build context the Containerfile copies, sorted (bytecode left out)."""
    files = [root / name for name in IMAGE_SOURCES]
    for package in IMAGE_PACKAGES:
        files += sorted(
            p
            for p in (root / package).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        )
    return files


def nodelock_key(base: Image, *, revision: str = "", root: Path = REPO_ROOT) -> str:
    """Key of nodelock's image: the Containerfile, every context file, the base, the revision."""
    parts = [base.ref.encode(), revision.encode(), CONTAINERFILE.read_bytes()]
    for f in context_files(root):
        parts += [str(f.relative_to(root)).encode(), f.read_bytes()]
    return _digest(parts)


class Builder:
    """buildah with its own storage under the image cache (vfs: no mount privileges needed)."""

    def __init__(self, cache: Path, progress: Progress) -> None:
        self.dir = cache / "images"
        self.progress = progress
        self._argv = [
            tool("buildah"),
            f"--root={self.dir / 'storage'}",
            f"--runroot={self.dir / 'run'}",
            "--storage-driver=vfs",
        ]

    def run(self, *args: str, what: str, cwd: Path | None = None) -> str:
        return _run([*self._argv, *args], what=what, cwd=cwd)

    def archive(self, name: str, key: str) -> Path:
        return self.dir / f"{name}-{key}.tar"

    def export(self, ref: str, archive: Path) -> Image:
        """Write the image ``ref`` as a docker-archive at ``archive``, whole or not at all."""
        tmp = archive.with_name(f".{archive.name}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        self.run("push", "--quiet", ref, f"docker-archive:{tmp}:{ref}", what=f"exporting {ref}")
        tmp.rename(archive)
        return Image(ref, archive)

    def prune(self, name: str, ref_prefix: str, *, keep: int) -> None:
        """Forget all but the ``keep`` newest archives of ``name`` and their images, and the
        intermediate images builds leave: a changed source builds a new image every time."""
        archives = sorted(
            self.dir.glob(f"{name}-*.tar"), key=lambda a: a.stat().st_mtime, reverse=True
        )
        for old in archives[keep:]:
            key = old.name[len(name) + 1 : -len(".tar")]
            subprocess.run(
                [*self._argv, "rmi", f"{ref_prefix}{key}"], capture_output=True, check=False
            )
            old.unlink(missing_ok=True)
        subprocess.run([*self._argv, "rmi", "--prune"], capture_output=True, check=False)

    def has(self, ref: str) -> bool:
        res = subprocess.run(
            [*self._argv, "inspect", "--type", "image", ref], capture_output=True, check=False
        )
        return res.returncode == 0

    def load(self, image: Image) -> None:
        """Make ``image`` known to buildah's storage again (a later build names it as base)."""
        if not self.has(image.ref):
            self.run("pull", "--quiet", f"docker-archive:{image.archive}", what="loading the base")
            self.run("tag", self._loaded_id(image), image.ref, what="tagging the base")

    def _loaded_id(self, image: Image) -> str:
        out = self.run(
            "images", "--quiet", "--no-trunc", "--filter", "dangling=true", what="listing"
        )
        ids = [line.strip() for line in out.splitlines() if line.strip()]
        if not ids:
            raise DevclusterError(f"loading {image.archive} left no image in buildah's storage")
        return ids[0]


def ensure_base(builder: Builder) -> Image:
    """The base image: Debian bookworm minbase with python3.11 and its venv module."""
    key = _digest(
        [BASE_SUITE.encode(), *(p.encode() for p in BASE_PACKAGES), *map(str.encode, BASE_EXCLUDES)]
    )
    ref = f"localhost/nodelock-base:{BASE_SUITE}-{key}"
    archive = builder.archive("base", key)
    if archive.is_file():
        return Image(ref, archive)
    builder.dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    builder.progress(f"devcluster: making the base image's Debian {BASE_SUITE} root (mmdebstrap)")
    with tempfile.TemporaryDirectory(dir=builder.dir) as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        _run(
            [
                tool("mmdebstrap"),
                "--variant=minbase",
                "--include=" + ",".join(BASE_PACKAGES),
                *(f"--dpkgopt=path-exclude={p}" for p in BASE_EXCLUDES),
                BASE_SUITE,
                str(rootfs),
            ],
            what=f"mmdebstrap {BASE_SUITE}",
        )
        container = builder.run("from", "scratch", what="buildah from scratch").strip()
        try:
            builder.run("add", "--quiet", container, str(rootfs), "/", what="adding the root")
            builder.run("config", "--cmd", "/bin/sh", container, what="buildah config")
            builder.run("commit", "--quiet", container, ref, what="committing the base")
        finally:
            builder.run("rm", container, what="buildah rm")
    image = builder.export(ref, archive)
    builder.progress(f"devcluster: built {ref} in {time.monotonic() - started:.0f}s")
    return image


def ensure_nodelock(builder: Builder, base: Image, *, revision: str = "") -> Image:
    """nodelock's image from ``deploy/Containerfile`` on ``base``; ``revision`` labels a build
    of the same sources as a different image (what an upgrade rolls out)."""
    key = nodelock_key(base, revision=revision)
    ref = f"localhost/nodelock:0.1.0-{key}"
    archive = builder.archive("nodelock", key)
    if archive.is_file():
        return Image(ref, archive)
    builder.load(base)
    started = time.monotonic()
    builder.progress(f"devcluster: building {ref} from deploy/Containerfile (buildah bud)")
    argv = ["bud", "--quiet", "--pull=never", "--isolation=chroot", "--layers=false"]
    if HOST_CA_BUNDLE.is_file():
        argv.append(f"--volume={HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro")
    argv += [
        f"--build-arg=PYTHON_IMAGE={base.ref}",
        f"--label=org.opencontainers.image.revision={revision or key}",
        f"--file={CONTAINERFILE}",
        f"--tag={ref}",
        str(REPO_ROOT),
    ]
    builder.run(*argv, what="building deploy/Containerfile", cwd=REPO_ROOT)
    image = builder.export(ref, archive)
    builder.progress(f"devcluster: built {ref} in {time.monotonic() - started:.0f}s")
    builder.prune("nodelock", "localhost/nodelock:0.1.0-", keep=KEEP_NODELOCK_IMAGES)
    return image


def _binary_image(
    builder: Builder, *, name: str, key: str, binary: Path, base: Image | None
) -> Image:
    """An image of one binary at /usr/local/bin/<name>, its entry point; on ``base`` or on
    nothing (a static binary)."""
    ref = f"localhost/{name}:{key}"
    archive = builder.archive(name, key)
    if archive.is_file():
        return Image(ref, archive)
    builder.dir.mkdir(parents=True, exist_ok=True)
    if base is not None:
        builder.load(base)
    container = builder.run("from", base.ref if base else "scratch", what="buildah from").strip()
    try:
        target = f"/usr/local/bin/{name}"
        builder.run("copy", "--quiet", container, str(binary), target, what=f"copying {name}")
        builder.run("config", "--entrypoint", f'["{target}"]', container, what="buildah config")
        builder.run("commit", "--quiet", container, ref, what=f"committing {name}")
    finally:
        builder.run("rm", container, what="buildah rm")
    return builder.export(ref, archive)


def ensure_pause(builder: Builder, cache: Path, progress: Progress) -> Image:
    """The pod sandbox image: the static ``nodelock-pause`` binary alone."""
    name, package = PAUSE
    module = GoModule(GOMOD_DIR, _ldflags(), env=(("CGO_ENABLED", "0"),))
    entry = _ensure(
        cache / "nodelock-pause" / simkubelet_key(),
        {name: package},
        what="pod sandbox (pause)",
        build=True,
        progress=progress,
        module=module,
    )
    return _binary_image(builder, name=name, key=simkubelet_key(), binary=entry / name, base=None)


def ensure_scheduler(builder: Builder, binaries: Binaries, base: Image) -> Image:
    """kube-scheduler of ``binaries``' release on ``base``, tagged with the release."""
    binary = binaries.kube_scheduler
    key = f"{binaries.kubernetes_version}-{_digest([base.ref.encode(), binary.read_bytes()])}"
    return _binary_image(builder, name="kube-scheduler", key=key, binary=binary, base=base)


def ensure_node_images(
    binaries: Binaries,
    *,
    cache: str | os.PathLike[str] | None = None,
    revision: str = "",
    progress: Progress = _stderr,
) -> NodeImages:
    """Every image a containerd node runs, built when not cached."""
    root = cache_root(cache)
    builder = Builder(root, progress)
    base = ensure_base(builder)
    return NodeImages(
        base=base,
        nodelock=ensure_nodelock(builder, base, revision=revision),
        pause=ensure_pause(builder, root, progress),
        scheduler=ensure_scheduler(builder, binaries, base),
    )
