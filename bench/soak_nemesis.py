"""The fault campaign's nemesis: a fault schedule fixed by the seed (pure), and the thin code that
injects each fault into a devcluster and heals it.

``schedule(seed, ...)`` draws, with ``random.Random(seed)``, when each fault starts (a mean gap of
``mean_gap_s``), its kind, its target and how long it lasts; faults overlap whenever one starts
before the last has healed.  The same seed and arguments give the same schedule.

Kinds (``KINDS``):

- ``extender-kill``, ``plugin-kill``, ``scheduler-kill``, ``apiserver-kill``, ``etcd-kill``:
  SIGKILL to the component's process group, started again with the same command line after the
  fault's duration;
- ``kubelet-kill``: the same for a node's kubelet (real or simulated; a real node's fake
  runtime keeps running, as containers outlive kubelet), its device checkpoint kept;
  ``kubelet-kill-no-checkpoint``: its checkpoint (``kubelet_internal_checkpoint``) deleted
  before it starts again;
- ``pause``: SIGSTOP to an extender replica or a device plugin for longer than a lock's duration,
  then SIGCONT;
- ``clock-skew``: a device plugin or an extender replica restarted with its clock 30 s ahead or
  behind (libfaketime), restarted with the true clock when the fault heals;
- ``slow-allocate``: a device plugin restarted with the ``allocate.start=sleep:S`` failpoint
  (every Allocate takes S seconds, past a lock's duration);
- ``crash-point``: a component restarted with a failpoint that ends it at one step of a handoff
  (``bind.after-acquire``, ``bind.after-binding`` in an extender replica,
  ``allocate.after-checkpoint`` in a plugin); it is started again without it when it ended, or
  when the fault heals;
- ``lease-ghost``: an operator's hand edit of a free node lock: a holder that is no pod,
  with the next token, as an operator copying a Lease would write it;
- ``lease-break``: ``nodelock locks break NODE --yes`` while the lock may be held.

Every component that ends while no fault keeps it down (a crash-point that fired) is started
again by ``Nemesis.supervise``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devcluster import processes
from devcluster.cluster import Cluster
from devcluster.gpunodes import kubelet_checkpoint, nodelock_command
from handoff.wire import DEFAULT_LOCK_NAMESPACE
from kube.client import KubeClient, lease_path

KINDS = (
    "extender-kill",
    "plugin-kill",
    "kubelet-kill",
    "kubelet-kill-no-checkpoint",
    "scheduler-kill",
    "apiserver-kill",
    "etcd-kill",
    "pause",
    "clock-skew",
    "slow-allocate",
    "crash-point",
    "lease-ghost",
    "lease-break",
)
# how often each kind is drawn, relative to the others
WEIGHTS = {
    "extender-kill": 3,
    "plugin-kill": 3,
    "kubelet-kill": 2,
    "kubelet-kill-no-checkpoint": 1,
    "scheduler-kill": 2,
    "apiserver-kill": 1,
    "etcd-kill": 1,
    "pause": 2,
    "clock-skew": 1,
    "slow-allocate": 2,
    "crash-point": 2,
    "lease-ghost": 1,
    "lease-break": 1,
}
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
FAILPOINTS = "NODELOCK_FAILPOINTS"


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: starts ``at`` seconds into the run, lasts ``duration_s``."""

    at: float
    kind: str
    target: str  # component name, or node name for the lease faults
    duration_s: float
    detail: str = ""

    def text(self) -> str:
        extra = f" ({self.detail})" if self.detail else ""
        return f"{self.kind} {self.target}{extra} for {self.duration_s:.1f}s"


def schedule(
    seed: int,
    *,
    run_s: float,
    nodes: Sequence[str],
    replicas: Sequence[str],
    lease_s: float,
    mean_gap_s: float = 5.0,
) -> list[Fault]:
    """The faults of a run, in start order; none starts after ``run_s``, and every fault heals
    by ``run_s`` (its duration is cut)."""
    rng = random.Random(seed)
    kinds = list(WEIGHTS)
    weights = [WEIGHTS[k] for k in kinds]
    out: list[Fault] = []
    t = rng.uniform(2.0, mean_gap_s)
    while t < run_s - 3:
        kind = rng.choices(kinds, weights)[0]
        node = rng.choice(list(nodes))
        replica = rng.choice(list(replicas))
        detail = ""
        duration = rng.uniform(1.0, 6.0)
        if kind == "extender-kill":
            target = replica
        elif kind == "plugin-kill":
            target = f"deviceplugin-{node}"
        elif kind in ("kubelet-kill", "kubelet-kill-no-checkpoint"):
            target = f"kubelet-{node}"
        elif kind == "scheduler-kill":
            target = "kube-scheduler"
        elif kind == "apiserver-kill":
            target, duration = "kube-apiserver", rng.uniform(1.0, 4.0)
        elif kind == "etcd-kill":
            target, duration = "etcd", rng.uniform(1.0, 4.0)
        elif kind == "pause":
            target = rng.choice([replica, f"deviceplugin-{node}"])
            duration = lease_s + rng.uniform(1.0, 4.0)
        elif kind == "clock-skew":
            target = rng.choice([replica, f"deviceplugin-{node}"])
            detail = rng.choice(["+30s", "-30s"])
            duration = rng.uniform(8.0, 20.0)
        elif kind == "slow-allocate":
            target = f"deviceplugin-{node}"
            detail = f"allocate.start=sleep:{lease_s + rng.uniform(0.5, 3.0):.1f}"
            duration = rng.uniform(8.0, 20.0)
        elif kind == "crash-point":
            if rng.random() < 0.6:
                target = replica
                detail = rng.choice(["bind.after-acquire", "bind.after-binding"])
            else:
                target, detail = f"deviceplugin-{node}", "allocate.after-checkpoint"
            duration = rng.uniform(5.0, 15.0)
        else:  # lease-ghost, lease-break
            target = node
            duration = 0.0
        duration = max(0.0, min(duration, run_s - t))
        out.append(Fault(round(t, 2), kind, target, round(duration, 2), detail))
        t += rng.expovariate(1.0 / mean_gap_s)
    return out


@dataclass
class Nemesis:
    """Injects faults into ``cluster`` and heals them; ``log(kind, what, fault)`` records each
    step in the history."""

    cluster: Cluster
    kube: KubeClient
    log: Callable[[str, str, str], None]
    down: set[str] = field(default_factory=set)  # components a fault keeps stopped
    env_of: dict[str, dict[str, str]] = field(default_factory=dict)  # component -> fault's env
    injected: dict[str, int] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)  # components being started right now
    base_env: dict[str, dict[str, str]] = field(default_factory=dict)  # component -> always
    restarts: int = 0
    ghosts: int = 0

    async def run(self, faults: Sequence[Fault], started: float) -> None:
        """Inject every fault at its time; returns when the last has healed."""
        tasks = []
        for fault in faults:
            delay = started + fault.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._one(fault)))
        await asyncio.gather(*tasks)

    async def _one(self, fault: Fault) -> None:
        name = fault.target
        if (
            name in self.down
            or name in self.busy
            or name in self.env_of
            or (fault.kind.endswith("kill") and self._busy_control_plane())
        ):
            self.log("skip", f"{fault.text()}: its target is already under a fault", fault.kind)
            return
        self.injected[fault.kind] = self.injected.get(fault.kind, 0) + 1
        self.log("fault", fault.text(), fault.kind)
        try:
            await self._inject(fault)
        finally:
            self.log("heal", fault.text(), fault.kind)

    def _busy_control_plane(self) -> bool:
        return bool({"etcd", "kube-apiserver"} & self.down)

    async def _inject(self, fault: Fault) -> None:
        name, kind = fault.target, fault.kind
        if kind.endswith("kill"):
            self.down.add(name)
            try:
                self.cluster.kill_component(name)
                await asyncio.sleep(fault.duration_s)
                if kind == "kubelet-kill-no-checkpoint":
                    node = name.removeprefix("kubelet-")
                    with contextlib.suppress(FileNotFoundError):
                        kubelet_checkpoint(self.cluster.state_dir, node).unlink()
                await self._start(name)
            finally:
                self.down.discard(name)
        elif kind == "pause":
            self.down.add(name)
            try:
                self._signal(name, signal.SIGSTOP)
                await asyncio.sleep(fault.duration_s)
            finally:
                self._signal(name, signal.SIGCONT)
                self.down.discard(name)
        elif kind in ("clock-skew", "slow-allocate", "crash-point"):
            if kind == "clock-skew":
                env = {"LD_PRELOAD": str(FAKETIME), "FAKETIME": fault.detail}
            else:
                env = {FAILPOINTS: fault.detail}
            self.env_of[name] = env
            try:
                await self._start(name, env=env)
                await asyncio.sleep(fault.duration_s)
            finally:
                del self.env_of[name]
                await self._start(name)
        elif kind == "lease-ghost":
            await self._ghost(fault.target)
        elif kind == "lease-break":
            await self._break(fault.target)

    def _signal(self, name: str, sig: signal.Signals) -> None:
        proc = self.cluster.state.procs().get(name)
        if proc is None:
            return
        for pid in processes.group_members(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    async def _start(self, name: str, *, env: dict[str, str] | None = None) -> None:
        """(Re)start a component with ``env`` (none: the plain environment)."""
        self.restarts += 1
        self.busy.add(name)
        try:
            full = {**self.base_env.get(name, {}), **(env or {})}
            await asyncio.to_thread(self.cluster.restart_component, name, env=full)
            if name in ("kube-apiserver", "etcd"):
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.cluster.wait_ready, 60.0)
        finally:
            self.busy.discard(name)

    async def supervise(self) -> None:
        """Start again, every second, each component that ended while no fault keeps it down
        (a crash-point failpoint that fired); with its fault's environment while it lasts, so a
        crash point keeps crashing until its fault heals."""
        while True:
            await asyncio.sleep(1.0)
            for name, proc in self.cluster.state.procs().items():
                if name in self.down or name in self.busy or processes.alive(proc):
                    continue
                self.log("restart", f"{name} had ended; started again", "")
                with contextlib.suppress(Exception):
                    await self._start(name, env=self.env_of.get(name))

    async def _ghost(self, node: str) -> None:
        """Hand-edit a free lock to a holder that is no pod (an operator copying a Lease)."""
        path = lease_path(DEFAULT_LOCK_NAMESPACE, node)
        try:
            lease = await self.kube.get(path)
        except Exception as exc:
            self.log("skip", f"lease-ghost {node}: {type(exc).__name__}", "lease-ghost")
            return
        spec = lease.setdefault("spec", {})
        if spec.get("holderIdentity"):
            self.log("skip", f"lease-ghost {node}: held by {spec['holderIdentity']}", "")
            return
        self.ghosts += 1
        spec["holderIdentity"] = f"soak-operator/ghost-{self.ghosts}"
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["leaseDurationSeconds"] = spec.get("leaseDurationSeconds") or 5
        spec["renewTime"] = spec["acquireTime"] = _now()
        try:
            await self.kube.replace(path, lease)
        except Exception as exc:
            self.log("skip", f"lease-ghost {node}: {type(exc).__name__}: {exc}", "")

    async def _break(self, node: str) -> None:
        cmd = [
            *nodelock_command(),
            "locks",
            f"--kubeconfig={self.cluster.kubeconfig}",
            "break",
            node,
            "--yes",
            "--reason=soak: an operator breaks the lock",
        ]
        res = await asyncio.to_thread(
            subprocess.run, cmd, capture_output=True, text=True, timeout=60, check=False
        )
        said = (res.stdout + res.stderr).strip().splitlines()
        self.log("note", f"nodelock locks break {node}: {said[-1] if said else res.returncode}", "")


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
