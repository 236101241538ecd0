"""A real local Kubernetes control plane on 127.0.0.1, for tests, benchmarks and the demo.

``Cluster(state_dir).up()`` starts etcd, kube-apiserver (TLS with generated certificates,
Node+RBAC authorization, NodeRestriction, ValidatingAdmissionPolicy (on by default), service
account token signing), kube-controller-manager and kube-scheduler (from a
KubeSchedulerConfiguration file), each as its own process on free loopback ports, and returns
once the API answers ``/readyz``.  The processes outlive the caller; ``down()`` stops all of them.

Not a production cluster: etcd runs without fsync and without TLS, on loopback only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devcluster import processes
from devcluster.binaries import Binaries, ensure_control_plane
from devcluster.errors import DevclusterError
from devcluster.pki import ADMIN, APISERVER_KUBELET_CLIENT, CONTROLLER_MANAGER, PKI, SCHEDULER
from devcluster.processes import Proc, StateFile
from handoff.wire import DEFAULT_LOCK_NAMESPACE

APISERVER_REQUEST_TIMEOUT_S = 15  # kube-apiserver's --request-timeout here (default 60 s)
CONTROL_PLANE_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


def default_state_dir() -> Path:
    """``$NODELOCK_DEVCLUSTER_DIR``, else ``<user cache>/nodelock/devcluster``."""
    env = os.environ.get("NODELOCK_DEVCLUSTER_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nodelock" / "devcluster"


@dataclass(frozen=True)
class ComponentStatus:
    """One component as ``status`` reports it."""

    name: str
    pid: int
    running: bool
    log: str


class Cluster:
    """One devcluster, identified by its state directory."""

    def __init__(self, state_dir: Path, *, binaries: Binaries | None = None) -> None:
        self.state_dir = state_dir.resolve()
        self._binaries = binaries
        self.pki = PKI(self.state_dir / "pki")
        self.state = StateFile(self.state_dir / "state.json")
        self.log_dir = self.state_dir / "logs"

    # ---- paths and settings -------------------------------------------------------------

    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            stored = self.state.load()["settings"].get("binaries")
            if not stored:
                raise DevclusterError(f"no devcluster has been started in {self.state_dir}")
            etcd = self.state.load()["settings"].get("etcd_binaries")
            self._binaries = Binaries(Path(stored), etcd_directory=Path(etcd) if etcd else None)
        return self._binaries

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (``system:masters``)."""
        return self.state_dir / "admin.kubeconfig"

    @property
    def scheduler_config(self) -> Path:
        return self.state_dir / "kube-scheduler-config.yaml"

    def settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = self.state.load()["settings"]
        return settings

    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.settings()['ports']['kube-apiserver']}"

    # ---- lifecycle ----------------------------------------------------------------------

    def running(self) -> dict[str, Proc]:
        """The recorded components that still run."""
        return {n: p for n, p in self.state.procs().items() if processes.alive(p)}

    def up(
        self,
        *,
        apiserver_port: int | None = None,
        advertise_address: str | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        """Start the control plane and wait until the API server is ready.

        ``advertise_address`` is where nodes in their own network namespaces reach the API
        server (``devcluster.netns``): the ``kubernetes`` Service's endpoints name it (the
        endpoint reconciler runs); without it they name nothing and only this machine's
        processes reach the API server, on 127.0.0.1."""
        live = self.running()
        if live:
            names = ", ".join(f"{n} (pid {p.pid})" for n, p in live.items())
            raise DevclusterError(
                f"a devcluster is already running in {self.state_dir}: {names}. "
                f"Stop it with `nodelock devcluster down --state-dir {self.state_dir}`"
            )
        binaries = self.binaries
        if apiserver_port is not None:
            processes.check_port_free(apiserver_port, "kube-apiserver")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state.save({"components": {}, "settings": {}})
        self.pki.ensure()
        ports = {
            "etcd": processes.free_port(),
            "etcd-peer": processes.free_port(),
            "kube-apiserver": apiserver_port or processes.free_port(),
            "kube-controller-manager": processes.free_port(),
            "kube-scheduler": processes.free_port(),
        }
        data = self.state.load()
        data["settings"] = {
            "ports": ports,
            "binaries": str(binaries.directory),
            "etcd_binaries": str(binaries.etcd.parent),
            "kubernetes_version": binaries.kubernetes_version,
        }
        if advertise_address:
            data["settings"]["advertise_address"] = advertise_address
        self.state.save(data)
        self.pki.kubeconfig(self.kubeconfig, ADMIN, self.api_url)
        try:
            self._start("etcd", self._etcd_argv(ports))
            self._wait_http(f"http://127.0.0.1:{ports['etcd']}/health", "etcd", timeout_s)
            self._start("kube-apiserver", self._apiserver_argv(ports))
            self.wait_ready(timeout_s)
            self._bootstrap()
            self._start("kube-controller-manager", self._controller_manager_argv(ports))
            self.write_scheduler_config({})
            self._start("kube-scheduler", self._scheduler_argv(ports))
            for name in ("kube-controller-manager", "kube-scheduler"):
                self._wait_http(f"https://127.0.0.1:{ports[name]}/healthz", name, timeout_s)
        except BaseException:
            self.down()
            raise

    def down(self) -> list[str]:
        """Stop every component this state directory started; names of those stopped.  Nodes
        with a container runtime go first, their containers and network with them
        (``devcluster.runtime.stop_runtime_nodes``)."""
        from devcluster.runtime import stop_runtime_nodes  # runtime builds on this module

        before = set(self.state.procs())
        if self.state.path.exists():
            stop_runtime_nodes(self)
        procs = self.state.procs()
        order = [n for n in procs if n not in CONTROL_PLANE_ORDER]
        order += [n for n in reversed(CONTROL_PLANE_ORDER) if n in procs]
        stopped = []
        for name in order:
            processes.stop(procs[name])
            self.state.remove(name)
            stopped.append(name)
        return sorted(before - set(procs)) + stopped

    def status(self) -> list[ComponentStatus]:
        return [
            ComponentStatus(n, p.pid, processes.alive(p), p.log)
            for n, p in self.state.procs().items()
        ]

    # ---- components ---------------------------------------------------------------------

    def _start(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> Proc:
        proc = processes.spawn(name, argv, log_dir=self.log_dir, env=env)
        self.state.put(proc)
        return proc

    def start_component(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> Proc:
        """Start an extra component (extender, device plugin, simulated node) under this cluster."""
        existing = self.state.procs().get(name)
        if existing is not None and processes.alive(existing):
            raise DevclusterError(f"{name} is already running (pid {existing.pid})")
        return self._start(name, argv, env=env)

    def stop_component(self, name: str, *, forget: bool = True) -> None:
        """Stop one component (and its process group); forget it, or keep it to restart later."""
        proc = self.state.procs().get(name)
        if proc is not None:
            processes.stop(proc)
            if forget:
                self.state.remove(name)

    def kill_component(self, name: str) -> None:
        """SIGKILL one component at once, the way a crash would end it; it stays recorded."""
        proc = self.state.procs().get(name)
        if proc is not None and processes.alive(proc):
            for pid in processes.group_members(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)

    def restart_component(
        self,
        name: str,
        *,
        env: Mapping[str, str] | None = None,
        argv: Sequence[str] | None = None,
    ) -> Proc:
        """Stop a component and start it again with the same command line and environment,
        unless ``argv`` or ``env`` replaces them."""
        proc = self.state.procs()[name]
        processes.stop(proc)
        return self._start(
            name, proc.argv if argv is None else argv, env=proc.env if env is None else env
        )

    def restart_apiserver(self, *, timeout_s: float = 120.0) -> None:
        """Restart kube-apiserver on the same port and wait until it is ready again."""
        self.restart_component("kube-apiserver")
        self.wait_ready(timeout_s)

    def write_scheduler_config(self, extra: Mapping[str, Any]) -> Path:
        """Write the KubeSchedulerConfiguration; ``extra`` is merged at the top level."""
        config: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self._component_kubeconfig(SCHEDULER))},
            "leaderElection": {"leaderElect": False},
        }
        config.update(extra)
        self.scheduler_config.write_text(yaml.safe_dump(config, sort_keys=False))
        return self.scheduler_config

    def restart_scheduler(self, extra: Mapping[str, Any], *, timeout_s: float = 60.0) -> None:
        """Restart kube-scheduler with ``extra`` merged into its configuration."""
        self.write_scheduler_config(extra)
        self.restart_component("kube-scheduler")
        port = self.settings()["ports"]["kube-scheduler"]
        self._wait_http(f"https://127.0.0.1:{port}/healthz", "kube-scheduler", timeout_s)

    def _component_kubeconfig(self, ident: Any) -> Path:
        path = self.state_dir / f"{ident.name}.kubeconfig"
        return self.pki.kubeconfig(path, ident, self.api_url)  # the port changes on every up

    def _etcd_argv(self, ports: Mapping[str, int]) -> list[str]:
        client = f"http://127.0.0.1:{ports['etcd']}"
        peer = f"http://127.0.0.1:{ports['etcd-peer']}"
        return [
            str(self.binaries.etcd),
            "--name=devcluster",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=devcluster={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

    def _apiserver_argv(self, ports: Mapping[str, int]) -> list[str]:
        pki = self.pki
        issuer = "https://kubernetes.default.svc.cluster.local"
        return [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
            "--bind-address=127.0.0.1",
            *self._advertise_args(),
            f"--secure-port={ports['kube-apiserver']}",
            f"--cert-dir={self.state_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--service-account-issuer={issuer}",
            f"--api-audiences={issuer}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--service-cluster-ip-range=10.0.0.0/24",
            f"--kubelet-client-certificate={pki.client_cert(APISERVER_KUBELET_CLIENT)}",
            f"--kubelet-client-key={pki.client_key(APISERVER_KUBELET_CLIENT)}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--allow-privileged=true",
            "--profiling=false",
            f"--request-timeout={APISERVER_REQUEST_TIMEOUT_S}s",
            "--v=1",
        ]

    def _advertise_args(self) -> list[str]:
        address = self.settings().get("advertise_address")
        if address:
            return [f"--advertise-address={address}", "--endpoint-reconciler-type=lease"]
        return ["--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none"]

    def _controller_manager_argv(self, ports: Mapping[str, int]) -> list[str]:
        kubeconfig = self._component_kubeconfig(CONTROLLER_MANAGER)
        return [
            str(self.binaries.kube_controller_manager),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kube-controller-manager']}",
            f"--cert-dir={self.state_dir / 'controller-manager-certs'}",
            f"--service-account-private-key-file={self.pki.sa_key}",
            f"--root-ca-file={self.pki.ca_cert}",
            f"--cluster-signing-cert-file={self.pki.ca_cert}",
            f"--cluster-signing-key-file={self.pki.ca_key}",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--v=1",
        ]

    def _scheduler_argv(self, ports: Mapping[str, int]) -> list[str]:
        kubeconfig = self._component_kubeconfig(SCHEDULER)
        return [
            str(self.binaries.kube_scheduler),
            f"--config={self.scheduler_config}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kube-scheduler']}",
            f"--cert-dir={self.state_dir / 'scheduler-certs'}",
            "--v=1",
        ]

    # ---- readiness ----------------------------------------------------------------------

    def _admin_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.client_cert(ADMIN)), str(self.pki.client_key(ADMIN)))
        return ctx

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until kube-apiserver answers ``/readyz`` with 200."""
        self._wait_http(
            f"{self.api_url}/readyz", "kube-apiserver", timeout_s, ctx=self._admin_ssl()
        )

    def _wait_http(
        self, url: str, name: str, timeout_s: float, *, ctx: ssl.SSLContext | None = None
    ) -> None:
        if ctx is None and url.startswith("https"):
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            proc = self.state.procs().get(name)
            if proc is not None and not processes.alive(proc):
                raise DevclusterError(
                    f"{name} exited while starting; the end of {proc.log}:\n"
                    + processes.log_tail(proc)
                )
            try:
                with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.25)
        proc = self.state.procs().get(name)
        tail = processes.log_tail(proc) if proc else ""
        raise DevclusterError(
            f"{name} was not ready at {url} within {timeout_s:.0f}s (last answer: {last})"
            + (f"; the end of {proc.log}:\n{tail}" if proc else "")
        )

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        """Run the real kubectl against this cluster as admin; returns its output."""
        cmd = [str(self.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        res = subprocess.run(
            cmd, input=input_text, capture_output=True, text=True, timeout=120, check=False
        )
        if check and res.returncode != 0:
            raise DevclusterError(f"kubectl {' '.join(args)} failed: {res.stderr.strip()}")
        return res.stdout

    def _bootstrap(self) -> None:
        """Objects every devcluster has: the lock namespace."""
        manifest = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": DEFAULT_LOCK_NAMESPACE,
                "labels": {"app.kubernetes.io/part-of": "nodelock"},
            },
        }
        self.kubectl("apply", "-f", "-", input_text=json.dumps(manifest))


@contextlib.contextmanager
def throwaway_cluster(prefix: str, *, version: str | None = None) -> Iterator[Cluster]:
    """A control plane of its own for a test session or a benchmark run, of Kubernetes
    ``version`` (``devcluster.versions``; default the default release).

    Its state folder is new, under /tmp (unix socket paths must stay short), named ``prefix``
    and a random tail.  The cluster is up inside the ``with`` block and stopped when the block
    ends, however it ends (SIGTERM included: ``processes.sigterm_unwinds``); the folder is
    removed then, unless ``$NODELOCK_KEEP_STATE`` is set (to read the components' logs after a
    failure).
    """
    state = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    cluster = Cluster(state, binaries=ensure_control_plane(version=version))
    with processes.sigterm_unwinds():
        try:
            cluster.up()
            yield cluster
        finally:
            cluster.down()
            if not os.environ.get("NODELOCK_KEEP_STATE"):
                shutil.rmtree(state, ignore_errors=True)
