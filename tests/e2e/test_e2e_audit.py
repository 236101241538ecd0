"""``nodelock audit`` end to end: after a burst the scheduler's assignments, kubelet's
PodResources (served by the simulated kubelets with kubelet's own server code) and the plugin's
answers (kubelet's device checkpoint) agree; an edited record shows up as exactly that
disagreement."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import grpc

from devcluster.gpunodes import kubelet_checkpoint, nodelock_command, pod_resources_socket
from deviceplugin.kubeletview import list_pod_resources
from deviceplugin.simulated import simulated_id
from handoff.audit import Kind
from kube.client import JSON, pod_path
from nodelock.audit import AuditResult, audit, devcluster_sources
from proto import deviceplugin_v1beta1_pb2 as dp_pb
from proto import podresources_v1_pb2 as pr_pb
from proto import podresources_v1_pb2_grpc as pr_grpc
from tests.e2e.kit import RESOURCE, GPUCluster, assignment, kubelet_devices

# (name, GPUs per container, GPUs per init container): 10 of the 12 GPUs, with shapes that take
# several containers and an init container whose devices the app container reuses
BURST: list[tuple[str, list[int], list[int]]] = [
    ("one", [1], []),
    ("two", [2], []),
    ("pair", [1, 1], []),
    ("plain", [0, 1], []),
    ("reuse", [1], [1]),
    ("three", [1], []),
    ("four", [2], []),
    ("five", [1], []),
]


async def _burst(e2e: GPUCluster) -> dict[str, JSON]:
    for name, containers, init in BURST:
        await e2e.create_pod(name, containers, init=init)
    pods = await asyncio.gather(*(e2e.wait_phase(n, ["Running"]) for n, _, _ in BURST))
    return {p["metadata"]["name"]: p for p in pods}


async def _audit(e2e: GPUCluster) -> AuditResult:
    return await audit(e2e.kube, devcluster_sources(e2e.cluster.state_dir))


async def test_burst_then_all_three_views_agree(e2e: GPUCluster) -> None:
    pods = await _burst(e2e)
    state = e2e.cluster.state_dir
    # kubelet's PodResources (List, Get, GetAllocatableResources) answers what the harness
    # recorded of kubelet's device manager; List and Get leave out init containers that are not
    # sidecars
    for name, pod in pods.items():
        node = pod["spec"]["nodeName"]
        socket = pod_resources_socket(state, node)
        want = {c: ids for c, ids in kubelet_devices(pod).items() if not c.startswith("init")}
        entry = next(
            p for p in list_pod_resources(socket, resource=RESOURCE) if p.key == e2e.key(name)
        )
        assert {c: sorted(ids) for c, ids in entry.containers.items() if ids} == want, name
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = pr_grpc.PodResourcesListerStub(channel)
            one = stub.Get(pr_pb.GetPodResourcesRequest(pod_name=name, pod_namespace=e2e.namespace))
            allocatable = stub.GetAllocatableResources(pr_pb.AllocatableResourcesRequest())
        got = {
            c.name: sorted(i for d in c.devices for i in d.device_ids)
            for c in one.pod_resources.containers
            if c.devices
        }
        assert got == want, name
        ids = sorted(i for d in allocatable.devices for i in d.device_ids)
        assert ids == sorted(simulated_id(node, i) for i in range(4))
    result = await _audit(e2e)
    assert result.disagreements == []
    assert result.notes == []
    assert sorted(result.nodes) == sorted(e2e.nodes)

    proc = await asyncio.create_subprocess_exec(
        *nodelock_command(),
        "audit",
        f"--state-dir={state}",
        "-o",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    doc = json.loads(out)
    assert doc["agree"] is True
    assert doc["disagreements"] == []


async def test_an_edited_assignment_is_reported_as_exactly_that(e2e: GPUCluster) -> None:
    pods = await _burst(e2e)
    # a pod without init containers on a node with a GPU left free (10 of 12 GPUs are taken)
    free: dict[str, list[str]] = {}
    for node in e2e.nodes:
        used = {d for p in pods.values() if p["spec"]["nodeName"] == node for d in _all(p)}
        free[node] = sorted(d for i in range(4) if (d := simulated_id(node, i)) not in used)
    name = next(n for n, _, init in BURST if not init and free[pods[n]["spec"]["nodeName"]])
    node = pods[name]["spec"]["nodeName"]
    edited = assignment(pods[name])
    container = next(iter(edited))
    given = edited[container][0]
    edited[container][0] = free[node][0]
    # the record edited: the scheduler's assignment of one container (the devcluster does not
    # install the assignment guard, so the administrator may); put back afterwards, so that the
    # fixture's own S2 check judges the pod as it was
    original = pods[name]["metadata"]["annotations"]["nodelock.io/assignment"]
    path = pod_path(e2e.namespace, name)
    await e2e.kube.patch(
        path, {"metadata": {"annotations": {"nodelock.io/assignment": json.dumps(edited)}}}
    )
    try:
        result = await _audit(e2e)
        proc = await asyncio.create_subprocess_exec(
            *nodelock_command(),
            "audit",
            f"--state-dir={e2e.cluster.state_dir}",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
    finally:
        await e2e.kube.patch(
            path, {"metadata": {"annotations": {"nodelock.io/assignment": original}}}
        )
    assert [(d.node, d.kind, d.pod, d.container, d.devices) for d in result.disagreements] == [
        (
            node,
            Kind.KUBELET_DIFFERS,
            e2e.key(name),
            container,
            tuple(sorted([given, free[node][0]])),
        )
    ]
    assert proc.returncode == 1
    assert "kubelet-differs" in out.decode()
    assert e2e.key(name) in out.decode()
    # put back, the views agree again
    assert (await _audit(e2e)).disagreements == []


async def test_an_edited_plugin_answer_is_reported_as_exactly_that(e2e: GPUCluster) -> None:
    pods = await _burst(e2e)
    pod = pods["two"]
    node = pod["spec"]["nodeName"]
    path = kubelet_checkpoint(e2e.cluster.state_dir, node)
    given = sorted(assignment(pod)["c0"])
    # the record edited: the plugin's answer for container c0 of "two" as kubelet keeps it
    # (kubelet reads its checkpoint only when it starts; it rewrites it on its next change)
    other = next(d for i in range(4) if (d := simulated_id(node, i)) not in given)
    original = path.read_bytes()
    _rewrite_answer(path, pod["metadata"]["uid"], "c0", [given[0], other])
    try:
        result = await _audit(e2e)
    finally:
        path.write_bytes(original)
    assert [(d.node, d.kind, d.pod, d.container, d.devices) for d in result.disagreements] == [
        (node, Kind.ANSWER_DIFFERS, e2e.key("two"), "c0", tuple(sorted([given[1], other])))
    ]


def _all(pod: JSON) -> set[str]:
    return {d for ids in assignment(pod).values() for d in ids}


def _rewrite_answer(path: Path, uid: str, container: str, devices: list[str]) -> None:
    raw = json.loads(path.read_text())
    entries = [
        e
        for e in raw["Data"]["PodDeviceEntries"]
        if e["PodUID"] == uid and e["ContainerName"] == container
    ]
    assert len(entries) == 1, entries
    resp = dp_pb.ContainerAllocateResponse()
    resp.ParseFromString(base64.b64decode(entries[0]["AllocResp"]))
    resp.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(devices)
    del resp.cdi_devices[:]
    resp.cdi_devices.extend(dp_pb.CDIDevice(name=f"{RESOURCE}={d}") for d in devices)
    entries[0]["AllocResp"] = base64.b64encode(resp.SerializeToString()).decode()
    path.write_text(json.dumps(raw))
