"""nodelock as it ships: the image built from deploy/Containerfile, installed with the Helm chart
on nodes with a real container runtime (containerd, runc, CNI, kube-proxy; devcluster.runtime),
and what an operator does with it on day two.

One cluster for the module: ``node-system`` and two GPU nodes of 4 simulated GPUs, started bare
(``--no-install``), then, in order: the install as docs/install.md writes it, GPU pods whose real
containers print the devices they were given (the device plugin's environment and the CDI devices
containerd applied from the node's CDI spec), a GPU node without its CDI spec, an upgrade to a new
image while a burst of GPU pods runs, a device plugin pod deleted during a burst, a GPU node
drained and relabelled, and the uninstall; then the plain manifests of deploy/manifests installed
as docs/install.md writes it, used and deleted.  The chart and the manifests are never installed
at once: the manifests come after the chart's uninstall, on the same cluster (a second one would
cost its start again).  Each test leaves the cluster as the next one expects it.

The module is marked ``core``: `make test` runs it on the oldest supported release too.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devcluster import processes
from devcluster.binaries import cache_root, ensure_control_plane
from devcluster.cluster import Cluster
from devcluster.images import Builder, ensure_nodelock
from devcluster.install import (
    NAMESPACE,
    audit_plugin_pods,
    devcluster_values,
    install,
    uninstall,
    write_values,
)
from devcluster.realkubelet import read_checkpoint
from devcluster.runtime import (
    CDI_ENV_PREFIX,
    CDI_SPEC,
    RuntimeCluster,
    RuntimeNode,
    import_images,
    runtime_cluster,
)
from deviceplugin.answer import CDI_KIND
from handoff.wire import DEFAULT_RESOURCE, ContainerName, Keys, parse_assignment

pytestmark = pytest.mark.core

GPUS_PER_NODE = 4
GPU_NODES = 2
SCHEDULER = "nodelock-scheduler"
# what the device plugin's environment says, then what the runtime applied from the node's CDI
# spec (devcluster.runtime.cdi_spec: one variable per CDI device)
PRINTED = "devices printed"
PRINT_DEVICES = (
    'echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; '
    f'env | grep "^{CDI_ENV_PREFIX}" | sort; echo "{PRINTED}"'
)


@dataclass
class Shipped:
    cluster: Cluster
    started: RuntimeCluster

    def kubectl(self, *args: str, check: bool = True) -> str:
        return self.cluster.kubectl(*args, check=check)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    @property
    def gpu_nodes(self) -> list[RuntimeNode]:
        return [n for n in self.started.nodes if n.gpus]

    def node(self, name: str) -> RuntimeNode:
        return next(n for n in self.started.nodes if n.name == name)


@pytest.fixture(scope="module")
def shipped(kubernetes_version: str | None) -> Iterator[Shipped]:
    state = Path(tempfile.mkdtemp(prefix="nls-", dir="/tmp"))
    cluster = Cluster(state, binaries=ensure_control_plane(version=kubernetes_version))
    with processes.sigterm_unwinds():
        try:
            started = runtime_cluster(
                cluster, gpu_nodes=GPU_NODES, gpus_per_node=GPUS_PER_NODE, install=False
            )
            yield Shipped(cluster, started)
        finally:
            cluster.down()
            if not os.environ.get("NODELOCK_KEEP_STATE"):
                shutil.rmtree(state, ignore_errors=True)


def gpu_pod(name: str, *, command: str, restart: str = "Never") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "gpu-test"}},
        "spec": {
            "schedulerName": SCHEDULER,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": "IMAGE",
                    "command": ["sh", "-c", command],
                    "resources": {"limits": {DEFAULT_RESOURCE: 1}},
                }
            ],
        },
    }


def create_pods(s: Shipped, namespace: str, pods: list[dict[str, Any]]) -> None:
    image = s.started.images.base.ref
    for pod in pods:
        pod["spec"]["containers"][0]["image"] = image
    items = {"apiVersion": "v1", "kind": "List", "items": pods}
    s.cluster.kubectl("apply", "-n", namespace, "-f", "-", input_text=json.dumps(items))


def wait_pods(
    s: Shipped, namespace: str, done: Any, *, timeout_s: float, what: str
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        pods: list[dict[str, Any]] = s.json("get", "pods", "-n", namespace)["items"]
        if pods and all(done(p) for p in pods):
            return pods
        if time.monotonic() > deadline:
            phases = {p["metadata"]["name"]: p["status"].get("phase") for p in pods}
            events = s.kubectl("get", "events", "-n", namespace, check=False)
            pytest.fail(f"pods not {what} within {timeout_s:.0f}s: {phases}\n{events}")
        time.sleep(1)


def new_namespace(s: Shipped) -> str:
    name = f"gpu-{secrets.token_hex(3)}"
    s.kubectl("create", "namespace", name)
    return name


def printed(s: Shipped, namespace: str, pod: str, *, timeout_s: float = 30) -> str:
    """The container's log once PRINT_DEVICES has run to its end (a container is Running
    before its command has printed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = s.kubectl("logs", "-n", namespace, pod)
        if PRINTED in out.splitlines():
            return out
        if time.monotonic() > deadline:
            pytest.fail(f"{namespace}/{pod} printed no {PRINTED!r} within {timeout_s:.0f}s: {out}")
        time.sleep(0.5)


def logged_devices(s: Shipped, namespace: str, pod: str) -> list[str]:
    out = printed(s, namespace, pod)
    lines = [line for line in out.splitlines() if line.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert len(lines) == 1, out
    return [d for d in lines[0].split("=", 1)[1].split(",") if d]


def cdi_devices(s: Shipped, namespace: str, pod: str) -> list[str]:
    """The devices the container runtime applied from the node's CDI spec, in index order."""
    out = printed(s, namespace, pod)
    return [line.split("=", 1)[1] for line in out.splitlines() if line.startswith(CDI_ENV_PREFIX)]


def assigned(pod: dict[str, Any]) -> list[str]:
    raw = (pod["metadata"].get("annotations") or {}).get(Keys().assignment)
    return [str(d) for d in parse_assignment(raw)[ContainerName("main")]]


def test_the_chart_installs_from_the_local_image_and_its_pods_run(shipped: Shipped) -> None:
    s = shipped
    images = s.started.images
    for node in s.gpu_nodes:  # docs/install.md, "Node by node": the device plugin goes there
        s.kubectl("label", "node", node.name, "nodelock.io/enabled=true")
    values = write_values(s.cluster, devcluster_values(images, gpus_per_node=GPUS_PER_NODE))
    install(s.cluster, values)
    pods = s.json("get", "pods", "-n", NAMESPACE)["items"]
    by_app: dict[str, list[dict[str, Any]]] = {}
    for p in pods:
        component = p["metadata"]["labels"].get("app.kubernetes.io/component", "?")
        by_app.setdefault(component, []).append(p)
        assert p["status"]["phase"] == "Running", p["status"]
        for c in p["status"]["containerStatuses"]:
            assert c["ready"], c
            assert c["image"] in (
                images.nodelock.ref,
                images.scheduler.ref,
                f"docker.io/{images.nodelock.ref}",
            ), c["image"]
    plugin_nodes = sorted(p["spec"]["nodeName"] for p in by_app.get("device-plugin", []))
    assert plugin_nodes == sorted(n.name for n in s.gpu_nodes)
    assert len(by_app.get("extender", [])) == 2
    assert len(by_app.get("scheduler", [])) == 1
    for node in s.gpu_nodes:
        alloc = s.json("get", "node", node.name)["status"]["allocatable"]
        assert alloc[DEFAULT_RESOURCE] == str(GPUS_PER_NODE)


def test_gpu_pods_run_real_containers_with_exactly_their_devices(shipped: Shipped) -> None:
    s = shipped
    ns = new_namespace(s)
    try:
        count = GPU_NODES * GPUS_PER_NODE
        pods = [gpu_pod(f"gpu-{i}", command=f"{PRINT_DEVICES}; sleep 3600") for i in range(count)]
        # a container that names every GPU itself: its own variable wins over the plugin's (kubelet
        # puts the container's environment after the device plugin's), the CDI devices do not change
        widen = pods[0]["spec"]["containers"][0]
        widen["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        create_pods(s, ns, pods)
        pods = wait_pods(
            s, ns, lambda p: p["status"].get("phase") == "Running", timeout_s=180, what="Running"
        )
        seen: dict[str, str] = {}
        for pod in pods:
            name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
            devices = cdi_devices(s, ns, name)
            assert devices == assigned(pod)
            assert len(devices) == 1
            assert logged_devices(s, ns, name) == (["all"] if name == "gpu-0" else devices)
            entries = read_checkpoint(
                s.node(node).kubelet_dir / "device-plugins" / "kubelet_internal_checkpoint"
            )
            mine = [e for e in entries if e.pod_uid == pod["metadata"]["uid"]]
            assert [list(e.device_ids) for e in mine] == [devices]
            for d in devices:
                assert d not in seen, f"{d} given to {seen.get(d)} and {name}"
                seen[d] = name
        assert len(seen) == count
        audits = audit_plugin_pods(s.cluster)
        assert len(audits) == GPU_NODES
        for node, code, output in audits:
            assert code == 0, f"{node}: {output}"
    finally:  # the GPUs free for the tests after it, whatever happened
        s.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s")


def test_a_node_without_the_cdi_spec_fails_the_container_loudly_until_it_has_one(
    shipped: Shipped,
) -> None:
    """install.md's troubleshooting entry, on a real runtime: with no CDI spec naming the GPU,
    containerd refuses to create the container (``unresolvable CDI devices``) and gives it no
    device; once the spec is back, kubelet's next try starts it with its assigned GPU."""
    s = shipped
    ns = new_namespace(s)
    node = s.gpu_nodes[0]
    spec = node.root / "cdi" / CDI_SPEC
    saved = spec.read_text()
    spec.unlink()
    try:
        pod = gpu_pod("no-spec", command=f"{PRINT_DEVICES}; sleep 3600")
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
        create_pods(s, ns, [pod])

        def refused(p: dict[str, Any]) -> bool:
            for st in p["status"].get("containerStatuses") or []:
                waiting = (st.get("state") or {}).get("waiting") or {}
                if "unresolvable CDI devices" in waiting.get("message", ""):
                    return True
            return False

        (seen,) = wait_pods(s, ns, refused, timeout_s=90, what="refused by containerd")
        assert seen["status"]["phase"] == "Pending"
        assert f"{CDI_KIND}={assigned(seen)[0]}" in str(seen["status"]["containerStatuses"])
        spec.write_text(saved)
        (running,) = wait_pods(
            s, ns, lambda p: p["status"].get("phase") == "Running", timeout_s=120, what="Running"
        )
        assert cdi_devices(s, ns, "no-spec") == assigned(running)
    finally:
        spec.write_text(saved)
        s.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s")


def _condition_time(pod: dict[str, Any], kind: str) -> datetime:
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == kind)
    return datetime.fromisoformat(cond["lastTransitionTime"].replace("Z", "+00:00"))


def _started_finished(pod: dict[str, Any]) -> tuple[datetime, datetime] | None:
    state = pod["status"]["containerStatuses"][0]["state"].get("terminated")
    if not state:
        return None
    return (
        datetime.fromisoformat(state["startedAt"].replace("Z", "+00:00")),
        datetime.fromisoformat(state["finishedAt"].replace("Z", "+00:00")),
    )


def wait_no_lock_held(s: Shipped, *, timeout_s: float) -> None:
    """Until no node lock is held: every handoff under way has ended (``nodelock locks``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        leases = s.json("get", "leases", "-n", NAMESPACE)["items"]
        held = [x["metadata"]["name"] for x in leases if x["spec"].get("holderIdentity")]
        if not held:
            return
        assert time.monotonic() < deadline, f"locks still held: {held}"
        time.sleep(0.5)


def test_an_upgrade_during_a_burst_fails_no_pod_and_gives_no_gpu_twice(
    shipped: Shipped,
) -> None:
    """docs/install.md's upgrade, step by step, while GPU pods keep coming: scale the chart's
    scheduler to 0, wait until no lock is held, ``helm upgrade`` with ``scheduler.replicas=0``
    (``--wait``: the extender's and the device plugins' rollouts, the plugins one node at a time,
    each Ready once kubelet has its devices), then ``helm upgrade`` without it."""
    s = shipped
    images = s.started.images
    upgraded = ensure_nodelock(
        Builder(cache_root(None), print), images.base, revision="upgrade-test"
    )
    assert upgraded.ref != images.nodelock.ref
    for node in s.started.nodes:
        import_images(node, images, extra=(upgraded,))
    new = write_values(
        s.cluster,
        devcluster_values(images, gpus_per_node=GPUS_PER_NODE, nodelock=upgraded),
        "nodelock-values-upgrade.yaml",
    )
    paused = ["--set", "scheduler.replicas=0"]
    ns = new_namespace(s)
    burst = 16
    command = f"{PRINT_DEVICES}; sleep 2"
    create_pods(s, ns, [gpu_pod(f"b-{i}", command=command) for i in range(burst // 2)])
    # 1. pause: no new bind from here
    s.kubectl("-n", NAMESPACE, "scale", "deploy", "nodelock-scheduler", "--replicas=0")
    wait_no_lock_held(s, timeout_s=60)  # 2. the handoffs under way end
    errors: list[BaseException] = []

    def upgrade() -> None:
        try:
            install(s.cluster, new, extra=paused)  # 3. the new image, still paused
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    upgrading = threading.Thread(target=upgrade)
    upgrading.start()
    create_pods(s, ns, [gpu_pod(f"b-{i}", command=command) for i in range(burst // 2, burst)])
    upgrading.join(timeout=400)
    assert not upgrading.is_alive()
    assert errors == []
    resumed = datetime.now(UTC).replace(microsecond=0)  # conditions keep whole seconds
    install(s.cluster, new)  # 4. resume
    pods = wait_pods(
        s,
        ns,
        lambda p: p["status"].get("phase") in ("Succeeded", "Failed"),
        timeout_s=300,
        what="finished",
    )
    later = [p for p in pods if int(p["metadata"]["name"].split("-")[1]) >= burst // 2]
    assert all(_condition_time(p, "PodScheduled") >= resumed for p in later)
    check_burst(s, ns, pods)
    plugins = s.json("get", "pods", "-n", NAMESPACE, "-l", "nodelock.io/device-plugin=true")
    for p in plugins["items"]:
        assert p["spec"]["containers"][0]["image"] == upgraded.ref
    s.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s")


def check_burst(
    s: Shipped, namespace: str, pods: list[dict[str, Any]], *, rejected_ok: bool = False
) -> list[str]:
    """Every pod of a burst Succeeded with its assignment, no GPU ran in two containers of one
    node at once, and no node lock stays held.  ``rejected_ok``: a pod kubelet rejected at
    admission (it never ran) is allowed; the names of those are returned."""
    rejected = [
        p["metadata"]["name"]
        for p in pods
        if p["status"]["phase"] == "Failed"
        and p["status"].get("reason") == "UnexpectedAdmissionError"
        and not p["status"].get("containerStatuses")
    ]
    failed = {p["metadata"]["name"]: p["status"] for p in pods}
    unexpected = {n: st for n, st in failed.items() if st["phase"] != "Succeeded"}
    if rejected_ok:
        unexpected = {n: st for n, st in unexpected.items() if n not in rejected}
    assert unexpected == {}
    runs = []
    for pod in pods:
        if pod["metadata"]["name"] in rejected:
            continue
        devices = logged_devices(s, namespace, pod["metadata"]["name"])
        assert devices == assigned(pod) == cdi_devices(s, namespace, pod["metadata"]["name"])
        span = _started_finished(pod)
        assert span is not None
        runs.append((pod["spec"]["nodeName"], devices[0], span, pod["metadata"]["name"]))
    for a in runs:
        for b in runs:
            if a[3] < b[3] and a[:2] == b[:2]:
                assert a[2][1] <= b[2][0] or b[2][1] <= a[2][0], f"{a} and {b} overlap"
    # a rejected holder's lock is released once it expires (leaseDurationSeconds, 15 s by
    # default) and the extender's sweep sees it: no lock stays held beyond that
    wait_no_lock_held(s, timeout_s=45)
    return rejected


def test_a_device_plugin_pod_deleted_during_a_burst_gives_no_gpu_twice(shipped: Shipped) -> None:
    """An unplanned restart of a device plugin pod while GPU pods are bound to its node: a pod
    kubelet admits while no plugin serves is rejected at admission (UnexpectedAdmissionError,
    kubelet's device manager: pkg/kubelet/cm/devicemanager/manager.go at v1.37.2) and never
    runs; every pod that runs gets exactly its devices, none twice, and no lock stays held."""
    s = shipped
    ns = new_namespace(s)
    selector = "nodelock.io/device-plugin=true"
    node = s.gpu_nodes[0].name
    plugin = next(
        p["metadata"]["name"]
        for p in s.json("get", "pods", "-n", NAMESPACE, "-l", selector)["items"]
        if p["spec"]["nodeName"] == node
    )
    burst = 16
    command = f"{PRINT_DEVICES}; sleep 2"
    create_pods(s, ns, [gpu_pod(f"d-{i}", command=command) for i in range(burst // 2)])
    s.kubectl("delete", "pod", "-n", NAMESPACE, plugin, "--wait=false")
    create_pods(s, ns, [gpu_pod(f"d-{i}", command=command) for i in range(burst // 2, burst)])
    pods = wait_pods(
        s,
        ns,
        lambda p: p["status"].get("phase") in ("Succeeded", "Failed"),
        timeout_s=300,
        what="finished",
    )
    rejected = check_burst(s, ns, pods, rejected_ok=True)
    assert len(rejected) < burst
    again = [
        p
        for p in s.json("get", "pods", "-n", NAMESPACE, "-l", selector)["items"]
        if p["spec"]["nodeName"] == node
    ]
    assert [p["metadata"]["name"] != plugin for p in again] == [True]
    s.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s")


def gpu_deployment(name: str, replicas: int, *, command: str) -> dict[str, Any]:
    pod = gpu_pod(name, command=command, restart="Always")
    pod["metadata"]["labels"] = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
        },
    }


def wait_for(what: str, found: Any, *, timeout_s: float) -> Any:
    """Poll ``found`` until it returns something true; that value.  A timeout fails the test
    with ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = found()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s:.0f}s: {what}")
        time.sleep(1)


def live_pods(s: Shipped, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The pods of ``selector`` not being deleted."""
    pods = s.json("get", "pods", "-n", namespace, "-l", selector)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def running_on(s: Shipped, namespace: str, selector: str, count: int) -> Any:
    """``count`` live pods of ``selector``, all Running (else None): for ``wait_for``."""
    pods = live_pods(s, namespace, selector)
    if len(pods) == count and all(p["status"].get("phase") == "Running" for p in pods):
        return pods
    return None


def plugin_pod_on(s: Shipped, node: str) -> dict[str, Any] | None:
    pods = s.json("get", "pods", "-n", NAMESPACE, "-l", "nodelock.io/device-plugin=true")
    return next((p for p in pods["items"] if p["spec"].get("nodeName") == node), None)


def allocatable_gpus(s: Shipped, node: str) -> str:
    return str(s.json("get", "node", node)["status"]["allocatable"].get(DEFAULT_RESOURCE, "0"))


def check_running(s: Shipped, namespace: str, pods: list[dict[str, Any]]) -> None:
    """Each running container printed exactly its assignment, and no GPU of a node is in two."""
    seen: dict[tuple[str, str], str] = {}
    for pod in pods:
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        devices = logged_devices(s, namespace, name)
        assert devices == assigned(pod) == cdi_devices(s, namespace, name), name
        for d in devices:
            assert (node, d) not in seen, f"{node} {d} given to {seen.get((node, d))} and {name}"
            seen[node, d] = name


def test_a_gpu_node_drained_and_relabelled_moves_its_gpu_pods_and_leaves_no_lock(
    shipped: Shipped,
) -> None:
    """An operator's day two: ``kubectl drain`` a GPU node running GPU pods of a Deployment (the
    pods are evicted and run again on the other node; the device plugin pod, a DaemonSet's, is
    left where it is: kubectl's drain filters, k8s.io/kubectl pkg/drain/filters.go
    ``daemonSetFilter``, v0.37.2), ``kubectl uncordon``; then the node's
    ``nodelock.io/enabled`` label removed (the DaemonSet's nodeSelector: the controller deletes
    the plugin pod, pkg/controller/daemon/daemon_controller.go ``podsShouldBeOnNode``, v1.37.2;
    kubelet marks the plugin's devices unhealthy when its socket goes,
    pkg/kubelet/cm/devicemanager/manager.go ``PluginDisconnected``, so allocatable drops to 0)
    and a GPU pod finds no node while the other node is full; the label back: the plugin pod
    returns, and GPU pods are placed on the node again.  No GPU twice, no lock left."""
    s = shipped
    ns = new_namespace(s)
    try:
        app = "app=serve"
        command = f"{PRINT_DEVICES}; sleep 3600"
        deployment = gpu_deployment("serve", GPUS_PER_NODE, command=command)
        deployment["spec"]["template"]["spec"]["containers"][0]["image"] = s.started.images.base.ref
        s.cluster.kubectl("apply", "-n", ns, "-f", "-", input_text=json.dumps(deployment))
        pods = wait_for(
            "the Deployment's pods Running",
            lambda: running_on(s, ns, app, GPUS_PER_NODE),
            timeout_s=180,
        )
        on_node = [p["spec"]["nodeName"] for p in pods]
        drained = max(set(on_node), key=on_node.count)
        other = next(n.name for n in s.gpu_nodes if n.name != drained)
        plugin = plugin_pod_on(s, drained)
        assert plugin is not None

        res = subprocess.run(
            [
                str(s.cluster.binaries.kubectl),
                f"--kubeconfig={s.cluster.kubeconfig}",
                "drain",
                drained,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=180s",
            ],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert s.json("get", "node", drained)["spec"].get("unschedulable") is True
        left = [
            p["metadata"]["name"]
            for p in live_pods(s, ns, app)
            if p["spec"].get("nodeName") == drained
        ]
        assert left == []  # drain returns once the evicted pods are gone
        still = plugin_pod_on(s, drained)
        assert still is not None
        assert still["metadata"]["uid"] == plugin["metadata"]["uid"]
        moved = wait_for(
            "the evicted pods Running again on the other node",
            lambda: running_on(s, ns, app, GPUS_PER_NODE),
            timeout_s=180,
        )
        assert {p["spec"]["nodeName"] for p in moved} == {other}
        check_running(s, ns, moved)
        wait_no_lock_held(s, timeout_s=45)
        s.kubectl("uncordon", drained)

        s.kubectl("label", "node", drained, "nodelock.io/enabled-")
        wait_for(
            "the plugin pod gone from the unlabelled node",
            lambda: plugin_pod_on(s, drained) is None,
            timeout_s=120,
        )
        wait_for(
            "kubelet reporting no allocatable GPU without its plugin",
            lambda: allocatable_gpus(s, drained) == "0",
            timeout_s=120,
        )
        # the other node's GPUs are all taken: a GPU pod now has no node to go to
        create_pods(s, ns, [gpu_pod("waiting", command=command)])

        def failed_scheduling() -> bool:
            events = s.json(
                "get",
                "events",
                "-n",
                ns,
                "--field-selector",
                "involvedObject.name=waiting,reason=FailedScheduling",
            )["items"]
            return bool(events)

        wait_for("a FailedScheduling Event for the pod", failed_scheduling, timeout_s=60)
        assert not s.json("get", "pod", "-n", ns, "waiting")["spec"].get("nodeName")

        s.kubectl("label", "node", drained, "nodelock.io/enabled=true")
        wait_for(
            "the plugin pod back and Ready on the relabelled node",
            lambda: (
                (p := plugin_pod_on(s, drained)) is not None
                and all(
                    c["ready"] for c in p["status"].get("containerStatuses") or [{"ready": False}]
                )
            ),
            timeout_s=120,
        )
        s.kubectl("scale", "-n", ns, "deploy", "serve", f"--replicas={2 * GPUS_PER_NODE - 1}")
        everything = wait_for(
            "every GPU pod Running",
            lambda: running_on(s, ns, "app in (serve,gpu-test)", 2 * GPUS_PER_NODE),
            timeout_s=180,
        )
        placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in everything}
        assert placed["waiting"] == drained
        assert sorted(placed.values()).count(drained) == GPUS_PER_NODE
        check_running(s, ns, everything)
        wait_no_lock_held(s, timeout_s=45)
    finally:  # whatever failed, the next tests get both nodes schedulable, labelled and empty
        for node in s.gpu_nodes:
            s.kubectl("uncordon", node.name, check=False)
            s.kubectl("label", "node", node.name, "nodelock.io/enabled=true", "--overwrite")
        s.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", "--ignore-not-found")


def test_uninstall_removes_the_release_and_keeps_the_lock_namespace(shipped: Shipped) -> None:
    s = shipped
    uninstall(s.cluster)
    deadline = time.monotonic() + 120
    while s.json("get", "pods", "-n", NAMESPACE)["items"]:
        assert time.monotonic() < deadline, "the chart's pods are still there"
        time.sleep(1)
    assert s.kubectl("get", "daemonsets,deployments", "-n", NAMESPACE, "-o", "name").strip() == ""
    kept = s.kubectl("get", "namespace", NAMESPACE, "-o", "name").strip()
    assert kept == f"namespace/{NAMESPACE}"
    policies = s.kubectl(
        "get", "validatingadmissionpolicies,validatingadmissionpolicybindings", "-o", "name"
    )
    assert [line for line in policies.splitlines() if "nodelock" in line] == []


# ---- the plain manifests, as docs/install.md installs them -------------------------------------

INSTALL_DOC = Path(__file__).resolve().parents[2] / "docs" / "install.md"
MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "manifests"
MAP_FILE = "25-admission-scheduler-name.yaml"
# The one change these nodes need beyond the documented ones: no NVML here, so the device plugin
# serves simulated GPUs (docs/containerd-nodes.md, "The plain manifests"); the test ops make the
# patch fail if the manifest's arguments move.
SIMULATED_BACKEND = [
    {"op": "test", "path": "/spec/template/spec/containers/0/args/3", "value": "--backend=nvml"},
    {
        "op": "replace",
        "path": "/spec/template/spec/containers/0/args/3",
        "value": "--backend=simulated",
    },
    {
        "op": "add",
        "path": "/spec/template/spec/containers/0/args/-",
        "value": f"--sim-gpus={GPUS_PER_NODE}",
    },
    {"op": "remove", "path": "/spec/template/spec/initContainers"},
]


def doc_lines(start: str, *, containing: str = "") -> list[str]:
    """The lines of docs/install.md that begin with ``start`` (and contain ``containing``),
    stripped, as an operator copies them."""
    return [
        line.strip()
        for line in INSTALL_DOC.read_text().splitlines()
        if line.strip().startswith(start) and containing in line
    ]


def doc_commands(start: str) -> list[str]:
    """The commands of docs/install.md written inline (between backquotes) that begin with
    ``start``."""
    lines = INSTALL_DOC.read_text().splitlines()
    inline = [c for line in lines if "```" not in line for c in re.findall(r"`([^`]+)`", line)]
    return [c for c in inline if c.startswith(start)]


def doc_block(first: str) -> str:
    """The ```sh block of docs/install.md whose first line begins with ``first``."""
    text = INSTALL_DOC.read_text()
    for block in text.split("```sh\n")[1:]:
        body = block.split("```", 1)[0]
        if body.lstrip().startswith(first):
            return body
    raise AssertionError(f"docs/install.md has no sh block starting {first!r}")


def sh(s: Shipped, script: str, *, cwd: Path, bash: bool = False) -> str:
    """Run an operator's shell lines against the cluster (its kubectl first on PATH)."""
    env = {
        "PATH": f"{s.cluster.binaries.directory}:{os.environ['PATH']}",
        "KUBECONFIG": str(s.cluster.kubeconfig),
        "HOME": str(cwd),
    }
    res = subprocess.run(
        ["bash" if bash else "sh", "-ec", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, f"{script}\n{res.stdout}\n{res.stderr}"
    return res.stdout


def mirror(node: RuntimeNode, have: str, name: str) -> None:
    """Give a node's containerd the image ``have`` also under ``name``: install.md's "keep the
    name and mirror it", for nodes that reach no registry."""
    ctr = ["ctr", f"--address={node.containerd_socket}", "--namespace=k8s.io", "images"]
    listed = subprocess.run(
        [*ctr, "list", "--quiet"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    source = have if have in listed else f"docker.io/{have}"
    assert source in listed, listed
    subprocess.run([*ctr, "tag", "--force", source, name], check=True, timeout=60)


def manifest_image(path: Path, prefix: str) -> str:
    [image] = {
        line.split("image:", 1)[1].strip()
        for line in path.read_text().splitlines()
        if line.strip().startswith("image:") and prefix in line
    }
    return image


def test_the_plain_manifests_install_run_gpu_pods_and_delete_cleanly(shipped: Shipped) -> None:
    """docs/install.md's "Plain manifests", after the chart is uninstalled (the two never run
    at once): the manifests copied, kube-scheduler's tag set by the page's ``sed`` line to the
    API server's version, the images mirrored under the names the files carry, the TLS Secrets
    made by the page's openssl lines, the files applied in order (without the
    MutatingAdmissionPolicy before 1.36); the extender, scheduler and plugin pods Ready, GPU pods
    whose containers print exactly their assignment; then the page's uninstall: no lock held,
    the files deleted, the lock namespace last, and nothing of nodelock left."""
    s = shipped
    work = Path(tempfile.mkdtemp(prefix="nl-manifests-", dir="/tmp"))
    copy = work / "deploy" / "manifests"
    shutil.copytree(MANIFESTS, copy)
    minor = int(s.cluster.binaries.kubernetes_version.lstrip("v").split(".")[1])
    with_map = minor >= 36

    # kube-scheduler's tag: the page's two lines, as written
    [version_line] = doc_lines("KUBE_VERSION=$(kubectl get --raw /version")
    [sed_line] = doc_lines("sed -i", containing="50-scheduler.yaml")
    sh(s, f"{version_line}\n{sed_line}", cwd=work)
    scheduler_image = manifest_image(copy / "50-scheduler.yaml", "kube-scheduler")
    assert (
        scheduler_image == f"registry.k8s.io/kube-scheduler:{s.cluster.binaries.kubernetes_version}"
    )
    nodelock_image = manifest_image(copy / "30-extender.yaml", "nodelock")
    assert manifest_image(copy / "40-device-plugin.yaml", "nodelock") == nodelock_image
    images = s.started.images
    for node in s.started.nodes:
        mirror(node, images.nodelock.ref, nodelock_image)
        mirror(node, images.scheduler.ref, scheduler_image)
    plugin_file = copy / "40-device-plugin.yaml"
    (work / "simulated.json").write_text(json.dumps(SIMULATED_BACKEND))
    patched = sh(
        s,
        f"kubectl patch --local -f {plugin_file} --type=json --patch-file=simulated.json -o yaml",
        cwd=work,
    )
    plugin_file.write_text(patched)
    for node in s.gpu_nodes:  # docs/install.md, "Node by node": the device plugin goes there
        s.kubectl("label", "node", node.name, "nodelock.io/enabled=true", "--overwrite")
    [namespace_line] = doc_lines("kubectl apply -f deploy/manifests/00-namespace.yaml")
    sh(s, namespace_line, cwd=work)
    tls = doc_block("NS=nodelock-system; SVC=")
    sh(s, tls, cwd=work, bash=True)  # process substitution: the page's lines are bash
    if with_map:
        [apply_line] = doc_lines("kubectl apply -f deploy/manifests/ ")
    else:  # "leave that file out on an older cluster"
        [apply_line] = doc_lines(
            "ls deploy/manifests/*.yaml | grep -v " + MAP_FILE.removesuffix(".yaml")
        )
    sh(s, apply_line.split("#")[0], cwd=work)
    for workload in (
        "deploy/nodelock-extender",
        "deploy/nodelock-scheduler",
        "ds/nodelock-device-plugin",
    ):
        sh(s, f"kubectl -n {NAMESPACE} rollout status {workload} --timeout=180s", cwd=work)
    # the runtime reports an image by any of its names: the pods name the manifests' images
    for p in s.json("get", "pods", "-n", NAMESPACE)["items"]:
        assert {c["image"] for c in p["spec"]["containers"]} <= {nodelock_image, scheduler_image}
        assert all(c["ready"] for c in p["status"]["containerStatuses"]), p["status"]
    for node in s.gpu_nodes:
        wait_for(
            f"{node.name} reporting {GPUS_PER_NODE} GPUs",
            lambda n=node.name: allocatable_gpus(s, n) == str(GPUS_PER_NODE),
            timeout_s=120,
        )

    ns = new_namespace(s)
    count = GPU_NODES * GPUS_PER_NODE
    try:
        create_pods(
            s,
            ns,
            [gpu_pod(f"gpu-{i}", command=f"{PRINT_DEVICES}; sleep 3600") for i in range(count)],
        )
        pods = wait_for(
            "every GPU pod Running",
            lambda: running_on(s, ns, "app=gpu-test", count),
            timeout_s=180,
        )
        check_running(s, ns, pods)
        assert all(len(logged_devices(s, ns, p["metadata"]["name"])) == 1 for p in pods)
    finally:
        s.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s")

    # docs/install.md, "Uninstall", with plain manifests
    s.kubectl("-n", NAMESPACE, "scale", "deploy", "nodelock-scheduler", "--replicas=0")
    wait_no_lock_held(s, timeout_s=45)
    [delete] = doc_commands("kubectl delete -f deploy/manifests/50-scheduler.yaml")
    if not with_map:
        delete = delete.replace(f" -f deploy/manifests/{MAP_FILE}", "")
    sh(s, delete, cwd=work)
    [unannotate] = doc_commands("kubectl annotate nodes --all")
    sh(s, unannotate, cwd=work)
    [delete_namespace] = doc_commands(f"kubectl delete namespace {NAMESPACE}")
    sh(s, delete_namespace, cwd=work)
    kinds = (
        "clusterroles,clusterrolebindings,"
        "validatingadmissionpolicies,validatingadmissionpolicybindings"
    )
    if with_map:
        kinds += ",mutatingadmissionpolicies,mutatingadmissionpolicybindings"
    left = [
        line for line in s.kubectl("get", kinds, "-o", "name").splitlines() if "nodelock" in line
    ]
    assert left == []
    assert (
        s.kubectl("get", "namespace", NAMESPACE, "--ignore-not-found", "-o", "name").strip() == ""
    )
    shutil.rmtree(work, ignore_errors=True)
