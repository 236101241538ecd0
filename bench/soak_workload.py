"""The fault campaign's workload: GPU objects that churn like a GPU cluster's (plain manifests and
a seeded driver).

Each step the driver picks one action with its own ``random.Random``: a burst of 1-GPU pods that
finish, a multi-GPU training pod (two containers, or one with several GPUs), a pod with a GPU init
container, shared-slice inference pods (``nvidia.com/gpumem``/``gpucores``, on the sharing node),
MIG-instance pods (on the MIG node), a Job whose pods finish, a Deployment scaled up and down, a
pod deleted while its handoff may be in flight, or a namespace deleted with everything in it.
Every bare pod and Job pod finishes (``sim.nodelock.io/run-seconds``, ``restartPolicy: Never``),
and the Deployments together never ask for more than ``MAX_DEPLOYMENT_GPUS``, so the GPU demand
drains once the driver stops: every pod left can then be placed (L1).

Every call the driver makes may fail while a fault takes the API server away; a failed call is
logged as such and the driver goes on.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kube.client import JSON, KubeClient, namespace_path, pod_path

IMAGE = "registry.invalid/sim:never-pulled"
RUN = "sim.nodelock.io/run-seconds"
MAX_DEPLOYMENT_GPUS = 3
MIG1 = "nvidia.com/mig-1g.10gb"
NAMESPACES_KEPT = 3
NAMESPACE_LIFE_S = 25.0


def container(name: str, limits: dict[str, str] | None = None) -> JSON:
    c: JSON = {"name": name, "image": IMAGE}
    if limits:
        c["resources"] = {"limits": limits}
    return c


def pod_spec(
    containers: list[JSON], *, init: list[JSON] | None = None, node: str | None = None
) -> JSON:
    spec: JSON = {
        "containers": containers,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
    }
    if init:
        spec["initContainers"] = init
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return spec


def bare_pod(name: str, spec: JSON, run_s: int, labels: dict[str, str] | None = None) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {RUN: str(run_s)}, "labels": labels or {}},
        "spec": spec,
    }


def job(name: str, *, completions: int, parallelism: int, gpus: int, run_s: int) -> JSON:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completions": completions,
            "parallelism": parallelism,
            "backoffLimit": 20,
            "template": {
                "metadata": {"annotations": {RUN: str(run_s)}, "labels": {"soak": name}},
                "spec": pod_spec([container("train", {"nvidia.com/gpu": str(gpus)})]),
            },
        },
    }


def deployment(name: str, replicas: int) -> JSON:
    spec = pod_spec([container("serve", {"nvidia.com/gpu": "1"})])
    spec["restartPolicy"] = "Always"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"soak": name}},
            "template": {"metadata": {"labels": {"soak": name}}, "spec": spec},
        },
    }


def jobs_path(ns: str, name: str | None = None) -> str:
    return f"/apis/batch/v1/namespaces/{ns}/jobs" + (f"/{name}" if name else "")


def deployments_path(ns: str, name: str | None = None) -> str:
    return f"/apis/apps/v1/namespaces/{ns}/deployments" + (f"/{name}" if name else "")


ACTIONS = (
    "burst",
    "multi",
    "init",
    "shared",
    "mig",
    "job",
    "scale",
    "delete-mid-handoff",
)


@dataclass
class Workload:
    """The seeded workload driver.  ``log(what)`` records each action in the history."""

    kube: KubeClient
    rng: random.Random
    log: Callable[[str], None]
    shared_node: str | None
    mig_node: str | None
    namespaces: list[tuple[str, float]] = field(default_factory=list)
    deployments: dict[tuple[str, str], int] = field(default_factory=dict)
    created: dict[str, int] = field(default_factory=dict)  # kind of object -> how many
    failed_calls: int = 0
    _n: int = 0

    def _name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}-{self._n}"

    async def _call(self, what: str, coro: Any) -> Any:
        try:
            return await coro
        except Exception as exc:  # the API server may be down: the action is lost, the run goes on
            self.failed_calls += 1
            self.log(f"{what} failed: {type(exc).__name__}: {str(exc)[:120]}")
            return None

    async def namespace(self) -> str:
        now = time.monotonic()
        if not self.namespaces or now - self.namespaces[-1][1] > NAMESPACE_LIFE_S:
            name = self._name("soak")
            made = await self._call(
                f"create namespace {name}",
                self.kube.create(namespace_path(), {"metadata": {"name": name}}),
            )
            if made is not None:
                self.namespaces.append((name, now))
                self.log(f"namespace {name} created")
            if len(self.namespaces) > NAMESPACES_KEPT:
                old, _ = self.namespaces.pop(0)
                self.deployments = {k: v for k, v in self.deployments.items() if k[0] != old}
                await self._call(f"delete namespace {old}", self.kube.delete(namespace_path(old)))
                self.log(f"namespace {old} deleted with everything in it")
        if not self.namespaces:
            raise RuntimeError("no namespace could be created")
        return self.namespaces[-1][0]

    async def _pod(self, ns: str, prefix: str, spec: JSON, what: str) -> str:
        name = self._name(prefix)
        body = bare_pod(name, spec, self.rng.randint(3, 15))
        made = await self._call(f"create pod {ns}/{name}", self.kube.create(pod_path(ns), body))
        if made is not None:
            self.created["pod"] = self.created.get("pod", 0) + 1
            self.log(f"pod {ns}/{name} created ({what})")
        return name

    async def step(self) -> None:
        try:
            ns = await self.namespace()
        except RuntimeError:
            return
        action = self.rng.choice(ACTIONS)
        gpu = "nvidia.com/gpu"
        if action == "burst":
            for _ in range(self.rng.randint(2, 5)):
                await self._pod(ns, "one", pod_spec([container("c", {gpu: "1"})]), "1 GPU")
        elif action == "multi":
            if self.rng.random() < 0.5:
                spec = pod_spec([container("a", {gpu: "1"}), container("b", {gpu: "1"})])
                await self._pod(ns, "pair", spec, "two containers x 1 GPU")
            else:
                n = self.rng.choice((2, 3))
                await self._pod(ns, "train", pod_spec([container("c", {gpu: str(n)})]), f"{n}")
        elif action == "init":
            spec = pod_spec([container("c", {gpu: "1"})], init=[container("setup", {gpu: "1"})])
            await self._pod(ns, "init", spec, "init container 1 GPU, app 1 GPU")
        elif action == "shared" and self.shared_node:
            for _ in range(self.rng.randint(1, 3)):
                limits = {gpu: "1", "nvidia.com/gpumem": "16000", "nvidia.com/gpucores": "25"}
                spec = pod_spec([container("infer", limits)], node=self.shared_node)
                await self._pod(ns, "slice", spec, "a slice of a shared GPU")
        elif action == "mig" and self.mig_node:
            spec = pod_spec([container("c", {MIG1: "1"})], node=self.mig_node)
            await self._pod(ns, "mig", spec, "one MIG 1g.10gb instance")
        elif action == "job":
            name = self._name("job")
            body = job(
                name,
                completions=self.rng.randint(2, 4),
                parallelism=2,
                gpus=1,
                run_s=self.rng.randint(3, 8),
            )
            if await self._call(f"create job {name}", self.kube.create(jobs_path(ns), body)):
                self.created["job"] = self.created.get("job", 0) + 1
                self.log(f"job {ns}/{name} created")
        elif action == "scale":
            await self._scale(ns)
        elif action == "delete-mid-handoff":
            name = await self._pod(ns, "gone", pod_spec([container("c", {gpu: "1"})]), "1 GPU")
            await asyncio.sleep(self.rng.uniform(0.1, 2.0))
            await self._call(f"delete pod {ns}/{name}", self.kube.delete(pod_path(ns, name)))
            self.log(f"pod {ns}/{name} deleted mid-handoff")

    async def _scale(self, ns: str) -> None:
        mine = [k for k in self.deployments if k[0] == ns]
        used = sum(self.deployments.values())
        if not mine:
            replicas = min(2, MAX_DEPLOYMENT_GPUS - used)
            if replicas <= 0:
                return
            name = self._name("serve")
            made = await self._call(
                f"create deployment {name}",
                self.kube.create(deployments_path(ns), deployment(name, replicas)),
            )
            if made is not None:
                self.deployments[(ns, name)] = replicas
                self.created["deployment"] = self.created.get("deployment", 0) + 1
                self.log(f"deployment {ns}/{name} created with {replicas} replicas")
            return
        key = self.rng.choice(mine)
        room = MAX_DEPLOYMENT_GPUS - used + self.deployments[key]
        replicas = self.rng.randint(0, room)
        made = await self._call(
            f"scale deployment {key[1]}",
            self.kube.patch(deployments_path(*key), {"spec": {"replicas": replicas}}),
        )
        if made is not None:
            self.deployments[key] = replicas
            self.log(f"deployment {key[0]}/{key[1]} scaled to {replicas}")
