"""What the end-to-end tests share: making GPU pods, waiting on them, judging the invariants."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from devcluster.cluster import Cluster, throwaway_cluster
from devcluster.gpunodes import NodeSpec
from devcluster.invariants import Findings, allocated, check_locks_free, check_pods
from devcluster.namespaces import create_namespace
from devcluster.processes import Proc, alive, group_members, log_tail
from devcluster.realkubelet import (
    CheckpointEntry,
    RealNode,
    kubelet_records,
    read_checkpoint,
    read_containers,
)
from handoff.wire import DEFAULT_LOCK_NAMESPACE, MIG_RESOURCE_PREFIX, parse_inventory
from kube import failpoints
from kube.client import JSON, KubeClient, lease_path, namespace_path, node_path, pod_path
from kube.errors import Forbidden, NotFound

LEASE_S = 5
RESOURCE = "nvidia.com/gpu"
BYPASS = {"nodelock.io/bypass": "true"}  # the GPU pod policy's escape, on pod and namespace


@dataclass
class GPUCluster:
    """The e2e devcluster plus a client and the current test's namespace."""

    cluster: Cluster
    nodes: list[str]
    kube: KubeClient = field(init=False)
    namespace: str = field(init=False, default="")
    # pods of the current test that it makes fail or keep Pending on purpose (L1 leaves them)
    unadmitted: set[str] = field(init=False, default_factory=set)
    # nodes whose lock the current test's pods took (their Lease must exist, and end free)
    locked_nodes: set[str] = field(init=False, default_factory=set)

    async def new_namespace(self) -> str:
        self.namespace = await create_namespace(self.kube, f"e2e-{secrets.token_hex(3)}")
        self.unadmitted = set()
        self.locked_nodes = set()
        return self.namespace

    def expect_unadmitted(self, *names: str) -> None:
        """Say that these pods of the test end not admitted on purpose (Failed or Pending)."""
        self.unadmitted.update(names)

    async def cleanup(self, *, timeout_s: float = 60.0) -> None:
        """Delete the namespace, wait until its pods are gone and every lock is free, and raise
        ``AssertionError`` naming what is left after ``timeout_s``: S3, no lock held once its
        cause is gone, for the nodes in ``locked_nodes`` (their Leases must exist) and every
        other node lock."""
        with contextlib.suppress(NotFound):
            await self.kube.delete(namespace_path(self.namespace))
        deadline = time.monotonic() + timeout_s
        while True:
            pods = (await self.kube.list(pod_path(self.namespace)))["items"]
            leases = (await self.kube.list(lease_path(DEFAULT_LOCK_NAMESPACE)))["items"]
            found = Findings()
            check_locks_free(leases, found, nodes=self.locked_nodes)
            left = [*found.s3, *found.coverage]
            if not pods and not left:
                return
            if time.monotonic() > deadline:
                names = sorted(p["metadata"]["name"] for p in pods)
                raise AssertionError(
                    f"cleanup of {self.namespace} after {timeout_s:.0f}s: pods left {names}; "
                    f"locks: {left}"
                )
            await asyncio.sleep(0.25)

    async def create_pod(
        self,
        name: str,
        containers: Sequence[int],
        *,
        init: Sequence[int] = (),
        node: str | None = None,
        bind_directly: bool = False,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> JSON:
        """A pod whose containers ask for the given GPU counts (0: no GPU)."""
        return await self.kube.create(
            pod_path(self.namespace),
            gpu_pod(
                name,
                containers,
                init=init,
                node=node,
                bind_directly=bind_directly,
                annotations=annotations,
                labels=labels,
            ),
        )

    async def allow_bypass(self, *, timeout_s: float = 10.0) -> None:
        """Label the test's namespace so that pods labelled ``BYPASS`` in it are exempt from the
        GPU pod admission policy (what an administrator does for a pod placed by hand), and wait
        until the policy sees the label: it reads namespaces from the API server's informer, so
        a pod created at once may still be denied. The probe is a server-side dry run."""
        await self.kube.patch(
            namespace_path(self.namespace), {"metadata": {"labels": dict(BYPASS)}}
        )
        probe = gpu_pod("bypass-probe", [1], node=self.nodes[0], bind_directly=True, labels=BYPASS)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await self.kube.request(
                    "POST", pod_path(self.namespace), query=[("dryRun", "All")], body=probe
                )
                return
            except Forbidden:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    async def pod(self, name: str) -> JSON:
        return await self.kube.get(pod_path(self.namespace, name))

    async def wait_phase(
        self, name: str, phases: Sequence[str], *, timeout_s: float = 90.0
    ) -> JSON:
        deadline = time.monotonic() + timeout_s
        pod: JSON = {}
        while time.monotonic() < deadline:
            pod = await self.pod(name)
            if pod.get("status", {}).get("phase") in phases:
                return pod
            await asyncio.sleep(0.2)
        raise AssertionError(
            f"{name} did not reach {phases} in {timeout_s}s: "
            f"{json.dumps(pod.get('status', {}))[:600]} node={pod.get('spec', {}).get('nodeName')}"
        )

    async def wait_bound(self, name: str, *, timeout_s: float = 60.0) -> JSON:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pod = await self.pod(name)
            if pod["spec"].get("nodeName"):
                return pod
            await asyncio.sleep(0.2)
        raise AssertionError(f"{name} was not bound in {timeout_s}s")

    async def wait_gone(self, name: str, *, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                await self.pod(name)
            except NotFound:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"{name} still exists after {timeout_s}s")

    async def lease(self, node: str) -> JSON:
        return await self.kube.get(lease_path(DEFAULT_LOCK_NAMESPACE, node))

    async def wait_holder(self, node: str, holder: str | None, *, timeout_s: float = 60.0) -> JSON:
        """Wait until ``node``'s lock is held by ``holder`` (``None``: free)."""
        deadline = time.monotonic() + timeout_s
        lease: JSON = {}
        while time.monotonic() < deadline:
            try:
                lease = await self.lease(node)
            except NotFound:
                lease = {"spec": {}}
            if (lease["spec"].get("holderIdentity") or None) == holder:
                return lease
            await asyncio.sleep(0.1)
        raise AssertionError(f"lock of {node} never held by {holder}: {lease.get('spec')}")

    def key(self, name: str) -> str:
        return f"{self.namespace}/{name}"


@contextlib.contextmanager
def gpu_cluster_of_its_own(
    prefix: str, start: Callable[[Cluster], Sequence[NodeSpec]], *, version: str | None = None
) -> Iterator[GPUCluster]:
    """A devcluster of its own (``devcluster.cluster.throwaway_cluster``) of Kubernetes
    ``version`` (default: the default release) whose extender and GPU nodes ``start`` starts (it
    returns the nodes); stopped when the ``with`` block ends."""
    with throwaway_cluster(prefix, version=version) as cluster:
        yield GPUCluster(cluster, [spec.name for spec in start(cluster)])


@asynccontextmanager
async def for_one_test(c: GPUCluster, *, judge: bool = True) -> AsyncIterator[GPUCluster]:
    """``c`` with a client and a fresh namespace for one test.  With ``judge``, S1, S2 and L1
    (every GPU pod admitted but those the test names in ``expect_unadmitted``) are checked over
    all pods after the test, then the namespace is deleted and S3 checked: every lock free once
    the pods are gone (``GPUCluster.cleanup`` raises what is left).  Without, the test judges by
    itself and the namespace stays (its cluster goes with it)."""
    c.kube = await KubeClient.connect(str(c.cluster.kubeconfig))
    await c.new_namespace()
    try:
        yield c
        if judge:
            await assert_no_violations(c)
    finally:
        try:
            if judge:
                await c.cleanup()
        finally:
            await c.kube.close()


def gpu_pod(
    name: str,
    containers: Sequence[int],
    *,
    init: Sequence[int] = (),
    node: str | None = None,
    bind_directly: bool = False,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> JSON:
    def container(prefix: str, i: int, gpus: int) -> JSON:
        c: JSON = {"name": f"{prefix}{i}", "image": "registry.invalid/sim:never-pulled"}
        if gpus:
            c["resources"] = {"limits": {RESOURCE: str(gpus)}}
        return c

    spec: JSON = {
        "containers": [container("c", i, g) for i, g in enumerate(containers)],
        "terminationGracePeriodSeconds": 0,
    }
    if init:
        spec["initContainers"] = [container("init", i, g) for i, g in enumerate(init)]
    if node and bind_directly:
        spec["nodeName"] = node
    elif node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
        },
        "spec": spec,
    }


def assignment(pod: Mapping[str, Any]) -> dict[str, list[str]]:
    raw = pod["metadata"].get("annotations", {}).get("nodelock.io/assignment", "{}")
    value: dict[str, list[str]] = json.loads(raw)
    return value


def kubelet_devices(pod: Mapping[str, Any]) -> dict[str, list[str]]:
    """Device IDs kubelet's device manager allocated, per container."""
    return {c: sorted(v.get("deviceIDs", [])) for c, v in allocated(pod).items()}


async def held_locks(kube: KubeClient) -> dict[str, str]:
    leases = (await kube.list(lease_path(DEFAULT_LOCK_NAMESPACE)))["items"]
    return {
        le["metadata"]["name"]: le["spec"]["holderIdentity"]
        for le in leases
        if le.get("spec", {}).get("holderIdentity")
    }


def asks_for_devices(pod: Mapping[str, Any]) -> bool:
    """Whether any container of the pod names whole GPUs or MIG instances (read here, apart
    from the checker, so that a checker that filters pods out cannot pass)."""
    spec = pod.get("spec", {})
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        res = c.get("resources") or {}
        for r in [*(res.get("limits") or {}), *(res.get("requests") or {})]:
            if r == RESOURCE or r.startswith(MIG_RESOURCE_PREFIX):
                return True
    return False


def real_node(c: GPUCluster, name: str) -> RealNode:
    """The files of real-kubelet node ``name`` (``devcluster.realkubelet``)."""
    return RealNode(c.cluster.state_dir / "nodes" / name)


def checkpoint_entries(c: GPUCluster, node: str, uid: str) -> list[CheckpointEntry]:
    """Real-kubelet node ``node``'s device checkpoint entries for the pod of ``uid``."""
    path = real_node(c, node).plugin_dir / "kubelet_internal_checkpoint"
    return [e for e in read_checkpoint(path) if e.pod_uid == uid]


async def wait_allocatable(
    c: GPUCluster, counts: Mapping[str, str], *, node: str | None = None, timeout_s: float = 30.0
) -> None:
    """Wait until ``node``'s (default: the first node's) published allocatable holds ``counts``
    (resource -> count, as the Node shows it)."""
    path = node_path(node or c.nodes[0])
    deadline = time.monotonic() + timeout_s
    while True:
        allocatable = (await c.kube.get(path))["status"].get("allocatable", {})
        if all(allocatable.get(r) == n for r, n in counts.items()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"allocatable is {allocatable} after {timeout_s}s, not {counts}")
        await asyncio.sleep(0.2)


async def kubelet_findings(c: GPUCluster, *, expected_pods: int) -> Findings:
    """S1, S2 and L1 over the test's pods, judged from the real kubelets' own records: their
    device checkpoints and the container configs they handed the runtime."""
    pods = (await c.kube.list(pod_path(c.namespace)))["items"]
    records = kubelet_records(
        pods,
        checkpoints={
            n: read_checkpoint(real_node(c, n).plugin_dir / "kubelet_internal_checkpoint")
            for n in c.nodes
        },
        containers={n: read_containers(real_node(c, n).containers_record) for n in c.nodes},
    )
    return check_pods(
        pods,
        expected_pods=expected_pods,
        records=records,
        may_be_unadmitted={c.key(n) for n in c.unadmitted},
    )


async def assert_no_violations(c: GPUCluster, *, require_admitted: bool = True) -> None:
    """S1 and S2 over every pod in the cluster, from the simulated kubelets' records (S1 on
    shared GPUs against the nodes' published inventories), every GPU pod checked; with
    ``require_admitted``, L1 too (but for the pods named in ``c.expect_unadmitted``).  Records
    the nodes whose lock the pods took in ``c.locked_nodes``, for S3 at cleanup."""
    pods = (await c.kube.list(pod_path()))["items"]
    inventories = {}
    for node in (await c.kube.list(node_path()))["items"]:
        raw = node["metadata"].get("annotations", {}).get("nodelock.io/gpus")
        if raw:
            inventories[node["metadata"]["name"]] = parse_inventory(raw)
    gpu_pods = [p for p in pods if asks_for_devices(p)]
    found = check_pods(
        pods,
        expected_pods=len(gpu_pods),
        require_admitted=require_admitted,
        may_be_unadmitted={c.key(n) for n in c.unadmitted},
        inventories=inventories,
    )
    assert not found.s1, found.s1
    assert not found.s2, found.s2
    assert not found.l1, found.l1
    if gpu_pods:
        assert not found.coverage, found.coverage
    c.locked_nodes |= {
        p["spec"]["nodeName"]
        for p in gpu_pods
        if p.get("status", {}).get("phase") in ("Running", "Succeeded")
        and "nodelock.io/assignment" in p["metadata"].get("annotations", {})
    }


async def metric_value(url: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples with these labels, scraped from ``url``."""
    from nodelock.measure import metric_samples, metric_sum

    def fetch() -> str:
        import urllib.request

        with urllib.request.urlopen(url, timeout=5) as resp:
            text: str = resp.read().decode()
            return text

    text = await asyncio.to_thread(fetch)
    return metric_sum(metric_samples(text), name, **labels)


def extender_metrics_urls(c: GPUCluster) -> list[str]:
    """The base URL of every extender replica's plain-HTTP metrics port (not the proxy in front
    of them, nor their HTTPS port, which serves no metrics)."""
    urls: list[str] = c.cluster.settings()["extender"]["metrics"]
    return urls


async def extender_sum(c: GPUCluster, name: str, **labels: str) -> float:
    """A metric's samples with these labels, summed over every extender replica."""
    urls = extender_metrics_urls(c)
    return sum([await metric_value(f"{u}/metrics", name, **labels) for u in urls])


async def binds_over_timeout(c: GPUCluster) -> float:
    """Bind calls the extender replicas answered later than kube-scheduler's ``httpTimeout``
    (the one the cluster's extender was started with: a bound of the request-duration
    histogram's buckets, ``scheduler_ext.metrics.latency_buckets``; a missing bucket reads as
    every bind over)."""
    timeout_s = float(c.cluster.settings()["extender"]["http_timeout_s"])
    name = "nodelock_extender_request_duration_seconds"
    total = await extender_sum(c, f"{name}_count", verb="bind")
    within = await extender_sum(c, f"{name}_bucket", verb="bind", le=f"{timeout_s}")
    return total - within


def plugin_registrations(cluster: Cluster, node: str) -> int:
    """How many times the node's device plugin has registered with kubelet (from its log)."""
    log = cluster.log_dir / f"deviceplugin-{node}.log"
    try:
        return log.read_text(errors="replace").count("with kubelet (endpoint")
    except FileNotFoundError:
        return 0


async def wait_registrations(
    cluster: Cluster, node: str, more_than: int, *, timeout_s: float = 30.0
) -> None:
    """Wait until the node's device plugin has registered more than ``more_than`` times; on
    timeout the error carries the end of the plugin's and kubelet's logs."""
    deadline = time.monotonic() + timeout_s
    while plugin_registrations(cluster, node) <= more_than:
        if time.monotonic() > deadline:
            procs = cluster.state.procs()
            tails = [
                f"--- the end of {proc.log}:\n{log_tail(proc, 40)}"
                for name in (f"deviceplugin-{node}", f"kubelet-{node}")
                if (proc := procs.get(name)) is not None
            ]
            raise AssertionError(
                "\n".join([f"the device plugin of {node} did not register again", *tails])
            )
        await asyncio.sleep(0.05)


def extender_metrics_url(argv: Sequence[str]) -> str:
    """The plain-HTTP metrics and probe URL of the extender started with ``argv``."""
    address = next(a for a in argv if a.startswith("--metrics-address=")).split("=", 1)[1]
    port = next(a for a in argv if a.startswith("--metrics-port=")).split("=", 1)[1]
    return f"http://{address}:{port}"


async def wait_http_ok(url: str, *, timeout_s: float = 30.0) -> None:
    import urllib.error
    import urllib.request

    def probe() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(probe):
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} never answered 200")
        await asyncio.sleep(0.1)


async def restart_extenders(
    cluster: Cluster,
    env: Mapping[str, str],
    *,
    only: Sequence[str] | None = None,
    env_for: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """Restart extender replicas (all, or ``only`` these) with ``env`` (or ``env_for[name]``)
    and wait until each is ready."""
    for name, proc in extender_replicas(cluster).items():
        if only is not None and name not in only:
            continue
        cluster.restart_component(name, env=(env_for or {}).get(name, env))
        await wait_http_ok(f"{extender_metrics_url(proc.argv)}/readyz")


@asynccontextmanager
async def slow_admission(e2e: GPUCluster, node: str, *, seconds: float) -> AsyncIterator[None]:
    """Within the block, the node's device plugin takes ``seconds`` over every Allocate (a slow
    admission: the holder stays Pending on the node, bound and not admitted)."""
    await restart_plugin(e2e, node, env={"NODELOCK_FAILPOINTS": f"allocate.start=sleep:{seconds}"})
    try:
        yield
    finally:
        await restart_plugin(e2e, node, env={})


async def restart_plugin(
    e2e: GPUCluster,
    node: str,
    *,
    env: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
) -> None:
    """Restart the node's device plugin (``env`` replacing its environment, ``argv`` its
    command line, when given) and wait until kubelet has its devices again: registered
    (``wait_registrations``) and served (``wait_devices_back``)."""
    seen = plugin_registrations(e2e.cluster, node)
    e2e.cluster.restart_component(f"deviceplugin-{node}", env=env, argv=argv)
    await wait_registrations(e2e.cluster, node, seen)
    await wait_devices_back(e2e, node)


def _devices_short(node: JSON) -> dict[str, tuple[str | None, str | None]]:
    """The node's device resources (extended resources in its capacity) whose published
    allocatable is not their capacity: resource -> (capacity, allocatable)."""
    status = node["status"]
    capacity, allocatable = status.get("capacity", {}), status.get("allocatable", {})
    return {
        r: (n, allocatable.get(r))
        for r, n in capacity.items()
        if "/" in r and allocatable.get(r) != n
    }


async def wait_devices_back(
    e2e: GPUCluster, node: str, *, settle_s: float = 1.0, timeout_s: float = 30.0
) -> None:
    """After the node's device plugin registered again (``wait_registrations``), wait until
    kubelet has its devices again: a pod admitted before then fails with kubelet's "no healthy
    devices present".  kubelet marks a resource's devices unhealthy when its plugin disconnects
    and healthy again from the new plugin's first ListAndWatch answer (``PluginDisconnected``,
    ``markResourceUnhealthy``, ``PluginListAndWatchReceiver`` in
    ``pkg/kubelet/cm/devicemanager/manager.go``, v1.31.9 and v1.37.2); the Node publishes that as
    allocatable below, then equal to, capacity at its next status sync.  Done when every device
    resource's allocatable equals its capacity, once it was seen below or ``settle_s`` after the
    registration (the Node may still show the value from before the restart until its sync)."""
    path = node_path(node)
    registered = time.monotonic()
    deadline = registered + timeout_s
    dropped = False
    while True:
        short = _devices_short(await e2e.kube.get(path))
        dropped = dropped or bool(short)
        if not short and (dropped or time.monotonic() - registered >= settle_s):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{node}: devices not back after {timeout_s}s: {short}")
        await asyncio.sleep(0.1)


# ---- proof that a fault happened ----------------------------------------------------------------


def exited_at(name: str) -> str:
    """The line a failpoint with the ``exit`` action logs as it ends its process."""
    assert failpoints.KNOWN[name] is failpoints.Action.EXIT, name
    return f"{failpoints.LINE.format(name=name)}exiting now"


def sleeping_at(name: str) -> str:
    """The start of the line a failpoint with a ``sleep`` action logs as it starts waiting."""
    assert failpoints.KNOWN[name] is failpoints.Action.SLEEP, name
    return f"{failpoints.LINE.format(name=name)}sleeping"


def log_count(c: GPUCluster, component: str, text: str) -> int:
    """How many times ``component``'s log holds ``text``."""
    try:
        return (c.cluster.log_dir / f"{component}.log").read_text(errors="replace").count(text)
    except FileNotFoundError:
        return 0


async def wait_log(
    c: GPUCluster, component: str, text: str, more_than: int, *, timeout_s: float = 60.0
) -> None:
    """Wait until ``component``'s log holds ``text`` more than ``more_than`` times."""
    deadline = time.monotonic() + timeout_s
    while log_count(c, component, text) <= more_than:
        if time.monotonic() > deadline:
            raise AssertionError(f"{component} never logged {text!r} in {timeout_s}s")
        await asyncio.sleep(0.1)


async def wait_any_log(
    c: GPUCluster, text: str, before: Mapping[str, int], *, timeout_s: float = 60.0
) -> list[str]:
    """Wait until one of the components in ``before`` (name -> count then) logs ``text`` again;
    the components that did."""
    deadline = time.monotonic() + timeout_s
    while True:
        logged = [n for n, count in before.items() if log_count(c, n, text) > count]
        if logged:
            return logged
        if time.monotonic() > deadline:
            raise AssertionError(f"none of {sorted(before)} logged {text!r} in {timeout_s}s")
        await asyncio.sleep(0.1)


def extender_replicas(cluster: Cluster) -> dict[str, Proc]:
    """The extender replicas' processes by name (not the proxy in front of them)."""
    return {
        name: proc
        for name, proc in cluster.state.procs().items()
        if name == "extender" or (name.startswith("extender-") and name != "extender-lb")
    }


def process_gone(proc: Proc) -> bool:
    """Whether the recorded process has ended (a zombie not yet reaped counts as ended)."""
    return not alive(proc) or not group_members(proc.pid)


async def wait_process_gone(proc: Proc, *, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not process_gone(proc):
        if time.monotonic() > deadline:
            raise AssertionError(f"{proc.name} (pid {proc.pid}) still runs after {timeout_s}s")
        await asyncio.sleep(0.05)


async def replica_binds(c: GPUCluster) -> dict[str, float]:
    """Bind calls each extender replica has answered so far (its own metrics port)."""
    return {
        name: await metric_value(
            f"{extender_metrics_url(proc.argv)}/metrics",
            "nodelock_extender_requests_total",
            verb="bind",
        )
        for name, proc in sorted(extender_replicas(c.cluster).items())
    }
