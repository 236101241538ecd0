"""Build the real Kubernetes control plane from its Go modules, once, and cache it by version.

``ensure_control_plane`` builds etcd, kube-apiserver, kube-scheduler, kube-controller-manager and
kubectl from the wrapper module in ``devcluster/gomod`` (Kubernetes ``KUBERNETES_VERSION`` with
its staging modules replaced by their published versions) into ``<cache>/k8s/<version>/``; with
``version=`` another release from ``devcluster.versions`` (its programs and kubelet, from its own
wrapper module, into ``<cache>/k8s/<tag>/``).
``ensure_simkubelet`` builds the simulated-node harness and ``ensure_cri`` the fake CRI runtime
a real kubelet runs against, each keyed by a hash of the module's sources; ``ensure_kubelet``
builds the real kubelet of a release into an entry of its own (``<cache>/kubelet/<tag>`` for the
default release, so the control plane's entry is untouched; another release's entry has it).

Guarantees: a second call with a complete cache builds nothing; a cache entry is used only when
every binary matches the SHA-256 recorded when it was built (a corrupt or partial entry is
reported and rebuilt, or refused with ``build=False``); a build goes to a temporary directory and
is renamed into place whole, so an interrupted build never leaves a half entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from devcluster.errors import DevclusterError
from devcluster.versions import DEFAULT_VERSION, resolve

GOMOD_DIR = Path(__file__).resolve().parent / "gomod"
KUBERNETES_VERSION = DEFAULT_VERSION
GO_MIN = (1, 26)

CONTROL_PLANE: dict[str, str] = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "etcd": "go.etcd.io/etcd/server/v3",
}
# another release's entry: its own Kubernetes programs and kubelet (etcd is the default entry's)
VERSIONED_CONTROL_PLANE: dict[str, str] = {
    **{name: pkg for name, pkg in CONTROL_PLANE.items() if name != "etcd"},
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
}
SIMKUBELET = ("nodelock-simkubelet", "./cmd/nodelock-simkubelet")
CRI = ("nodelock-cri", "./cmd/nodelock-cri")
KUBELET = ("kubelet", "k8s.io/kubernetes/cmd/kubelet")
KUBE_PROXY = ("kube-proxy", "k8s.io/kubernetes/cmd/kube-proxy")

Progress = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cache_root(override: str | os.PathLike[str] | None = None) -> Path:
    """The binary cache: ``override``, else ``$NODELOCK_CACHE``, else ``~/.cache/nodelock``."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get("NODELOCK_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nodelock"


@dataclass(frozen=True)
class Binaries:
    """Paths of the built programs (etcd may come from another release's entry)."""

    directory: Path
    etcd_directory: Path | None = None

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def etcd(self) -> Path:
        return (self.etcd_directory or self.directory) / "etcd"

    @property
    def kubernetes_version(self) -> str:
        """The release the entry was built for: its directory's name (``<cache>/k8s/<tag>``)."""
        return self.directory.name

    @property
    def kube_apiserver(self) -> Path:
        return self.path("kube-apiserver")

    @property
    def kube_scheduler(self) -> Path:
        return self.path("kube-scheduler")

    @property
    def kube_controller_manager(self) -> Path:
        return self.path("kube-controller-manager")

    @property
    def kubectl(self) -> Path:
        return self.path("kubectl")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_entry(entry: Path, names: Sequence[str]) -> str | None:
    """Why the cache entry is unusable, or None when every binary matches its manifest."""
    manifest_path = entry / "MANIFEST.json"
    if not entry.is_dir():
        return "not built yet"
    try:
        manifest = json.loads(manifest_path.read_text())
        recorded = manifest["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its manifest {manifest_path} is missing or unreadable ({exc.__class__.__name__})"
    for name in names:
        binary = entry / name
        if not binary.is_file():
            return f"{name} is missing"
        if not isinstance(recorded, dict) or recorded.get(name) != _sha256(binary):
            return f"{name} does not match the checksum recorded when it was built"
        if not os.access(binary, os.X_OK):
            return f"{name} is not executable"
    return None


def go_toolchain() -> str:
    """Path of a usable ``go``, or a DevclusterError saying what to install."""
    go = shutil.which("go")
    if go is None:
        raise DevclusterError(
            "the Go toolchain was not found on PATH. devcluster builds the Kubernetes "
            f"{KUBERNETES_VERSION} control plane from its Go modules and needs Go "
            f">= {GO_MIN[0]}.{GO_MIN[1]}; install Go and make sure `go version` works"
        )
    try:
        out = subprocess.run(
            [go, "version"], check=True, capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise DevclusterError(f"`{go} version` failed: {exc}") from exc
    m = re.search(r"go(\d+)\.(\d+)", out)
    if m is None or (int(m.group(1)), int(m.group(2))) < GO_MIN:
        raise DevclusterError(
            f"{out.strip()} is too old: building Kubernetes {KUBERNETES_VERSION} needs Go "
            f">= {GO_MIN[0]}.{GO_MIN[1]}"
        )
    return go


def _ldflags() -> str:
    return resolve(None).ldflags()


def _default_binary_name(package: str) -> str:
    """The file name ``go build -o DIR/`` gives a main package (a ``/vN`` suffix is dropped)."""
    parts = package.rstrip("/").split("/")
    if len(parts) > 1 and re.fullmatch(r"v\d+", parts[-1]):
        return parts[-2]
    return parts[-1]


@dataclass(frozen=True)
class GoModule:
    """Where and how a set of binaries is built: the module directory, link flags, env."""

    directory: Path = GOMOD_DIR
    ldflags: str = ""
    env: tuple[tuple[str, str], ...] = ()


def _go_build(
    packages: dict[str, str],
    out_dir: Path,
    *,
    what: str,
    progress: Progress,
    module: GoModule | None = None,
) -> None:
    """Build ``packages`` (binary name -> package) into ``out_dir`` in one ``go build``."""
    module = module or GoModule(ldflags=_ldflags())
    go = go_toolchain()
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "-mod=readonly")
    env.update(module.env)
    started = time.monotonic()
    progress(f"devcluster: building {what} with {go} (minutes on a cold cache)...")
    cmd = [go, "build", "-v", "-trimpath", "-ldflags", module.ldflags, "-o", f"{out_dir}/"]
    try:
        proc = subprocess.Popen(
            [*cmd, *packages.values()],
            cwd=module.directory,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    except OSError as exc:
        raise DevclusterError(f"could not run {go}: {exc}") from exc
    lines: list[str] = []
    compiled = [0]
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(15):
            elapsed = time.monotonic() - started
            progress(f"  {compiled[0]} packages compiled so far ({elapsed:.0f}s)")

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if not line.startswith(("#", " ", "go: ")):
            compiled[0] += 1
    rc = proc.wait()
    stop.set()
    if rc != 0:
        tail = "".join(lines[-25:])
        raise DevclusterError(f"building {what} failed (exit {rc}):\n{tail}")
    for name, package in packages.items():
        built = out_dir / _default_binary_name(package)
        if built.name != name:
            built.rename(out_dir / name)
    progress(f"devcluster: built {what} in {time.monotonic() - started:.0f}s")


def _ensure(
    entry: Path,
    packages: dict[str, str],
    *,
    what: str,
    build: bool,
    progress: Progress,
    module: GoModule | None = None,
) -> Path:
    """``entry`` holding ``packages`` built and checksummed, building them if needed."""
    problem = verify_entry(entry, list(packages))
    if problem is None:
        return entry
    if not build:
        raise DevclusterError(
            f"the cached {what} in {entry} is unusable: {problem}. "
            "Run `nodelock devcluster build` to (re)build it"
        )
    if problem != "not built yet":
        progress(f"devcluster: the cached {what} in {entry} is unusable ({problem}); rebuilding")
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        _go_build(packages, tmp, what=what, progress=progress, module=module)
        sums = {name: _sha256(tmp / name) for name in packages}
        (tmp / "MANIFEST.json").write_text(json.dumps({"sha256": sums}, indent=1))
        if entry.exists():
            shutil.rmtree(entry)
        tmp.rename(entry)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


def ensure_control_plane(
    *,
    cache: str | os.PathLike[str] | None = None,
    build: bool = True,
    progress: Progress = _stderr,
    version: str | None = None,
) -> Binaries:
    """The control-plane binaries for ``version`` (default ``KUBERNETES_VERSION``), built if not
    cached.

    Another release (``devcluster.versions``) is built from its own wrapper module into
    ``<cache>/k8s/<tag>`` with its kubelet; etcd, which does not depend on the Kubernetes
    release, is the default entry's.
    """
    release = resolve(version)
    default_entry = _ensure(
        cache_root(cache) / "k8s" / KUBERNETES_VERSION,
        CONTROL_PLANE,
        what=f"Kubernetes {KUBERNETES_VERSION} control plane",
        build=build,
        progress=progress,
    )
    if release.is_default:
        return Binaries(default_entry)
    entry = _ensure(
        cache_root(cache) / "k8s" / release.tag,
        VERSIONED_CONTROL_PLANE,
        what=f"Kubernetes {release.tag} control plane and kubelet",
        build=build,
        progress=progress,
        module=GoModule(release.gomod, release.ldflags()),
    )
    return Binaries(entry, etcd_directory=default_entry)


def simkubelet_key() -> str:
    """Hash of everything the harness is built from: go.mod, go.sum and its Go sources."""
    h = hashlib.sha256(KUBERNETES_VERSION.encode())
    files = [GOMOD_DIR / "go.mod", GOMOD_DIR / "go.sum"]
    files += sorted((GOMOD_DIR / "cmd").rglob("*.go")) if (GOMOD_DIR / "cmd").is_dir() else []
    for f in files:
        h.update(str(f.relative_to(GOMOD_DIR)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def ensure_simkubelet(
    *, cache: str | os.PathLike[str] | None = None, build: bool = True, progress: Progress = _stderr
) -> Path:
    """Path of the simulated-kubelet harness binary, built if not cached."""
    name, package = SIMKUBELET
    entry = cache_root(cache) / "simkubelet" / simkubelet_key()
    return (
        _ensure(
            entry, {name: package}, what="simulated-node harness", build=build, progress=progress
        )
        / name
    )


def ensure_cri(
    *, cache: str | os.PathLike[str] | None = None, build: bool = True, progress: Progress = _stderr
) -> Path:
    """Path of the fake CRI runtime (``nodelock-cri``) real kubelets run against, built if not
    cached."""
    name, package = CRI
    entry = cache_root(cache) / "nodelock-cri" / simkubelet_key()
    what = "fake CRI runtime"
    return _ensure(entry, {name: package}, what=what, build=build, progress=progress) / name


def ensure_kubelet(
    *,
    cache: str | os.PathLike[str] | None = None,
    build: bool = True,
    progress: Progress = _stderr,
    version: str | None = None,
) -> Path:
    """Path of the real kubelet of ``version`` (default ``KUBERNETES_VERSION``), built if not
    cached: the default release's in ``<cache>/kubelet/<tag>`` (the control plane's entry keeps
    its checksums), another release's from that release's entry (``ensure_control_plane``)."""
    release = resolve(version)
    if not release.is_default:
        binaries = ensure_control_plane(
            cache=cache, build=build, progress=progress, version=version
        )
        return binaries.path("kubelet")
    name, package = KUBELET
    entry = cache_root(cache) / "kubelet" / release.tag
    what = f"Kubernetes {release.tag} kubelet"
    return _ensure(entry, {name: package}, what=what, build=build, progress=progress) / name


def ensure_kube_proxy(
    *,
    cache: str | os.PathLike[str] | None = None,
    build: bool = True,
    progress: Progress = _stderr,
    version: str | None = None,
) -> Path:
    """Path of kube-proxy of ``version`` (default ``KUBERNETES_VERSION``), built if not cached
    into ``<cache>/kube-proxy/<tag>`` from that release's wrapper module (containerd nodes run
    it; the other entries keep their checksums)."""
    release = resolve(version)
    name, package = KUBE_PROXY
    module = None if release.is_default else GoModule(release.gomod, release.ldflags())
    entry = cache_root(cache) / "kube-proxy" / release.tag
    what = f"Kubernetes {release.tag} kube-proxy"
    return (
        _ensure(entry, {name: package}, what=what, build=build, progress=progress, module=module)
        / name
    )
