"""Kubernetes Events where admins look: a refused bind names the lock's holder on the waiting
pod, a refused Allocate says why on the node, and a burst of refusals stays a few Events."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from kube.client import KubeClient, event_path
from scheduler_ext.binder import DEFAULT_WAIT_BUDGET_S
from tests.e2e.kit import (
    BYPASS,
    GPUCluster,
    restart_plugin,
    slow_admission,
)


async def events_about(
    kube: KubeClient, namespace: str, kind: str, name: str, reason: str
) -> list[dict[str, Any]]:
    """The core/v1 Events about one object with ``reason`` (what ``kubectl describe`` lists)."""
    selector = f"involvedObject.kind={kind},involvedObject.name={name},reason={reason}"
    items: list[dict[str, Any]] = (await kube.list(event_path(namespace), field_selector=selector))[
        "items"
    ]
    return items


async def wait_events(
    kube: KubeClient, namespace: str, kind: str, name: str, reason: str, *, timeout_s: float = 30
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = await events_about(kube, namespace, kind, name, reason)
        if found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.3)


async def test_refused_bind_names_the_holder_on_the_waiting_pod(e2e: GPUCluster) -> None:
    node = e2e.nodes[2]
    stall = DEFAULT_WAIT_BUDGET_S + 4.0
    async with slow_admission(e2e, node, seconds=stall):
        await e2e.create_pod("holder", [1], node=node)
        await e2e.wait_holder(node, e2e.key("holder"))
        await e2e.create_pod("waiter", [1], node=node)
        refused = await wait_events(
            e2e.kube, e2e.namespace, "Pod", "waiter", "BindRefused", timeout_s=stall + 10
        )
        await e2e.wait_phase("waiter", ["Running"], timeout_s=stall + 60)
    assert refused, "no BindRefused event on the waiting pod"
    [event] = refused  # one Event per pod and reason, counted up, not one per bind
    assert event["type"] == "Warning"
    assert event["source"]["component"] == "nodelock-extender"
    assert e2e.key("holder") in event["message"], event["message"]
    assert node in event["message"]
    pod = await e2e.pod("waiter")
    assert event["involvedObject"]["uid"] == pod["metadata"]["uid"]  # kubectl describe pod
    # (WaitingForNodeLock comes only after a second of waiting; a bind refused sooner, as a
    # fail-fast refusal behind this stalled holder can be, writes none: see
    # tests/integration/test_extender_bind.py)
    # no event storm: every event about the waiter, whatever it went through, is a handful
    everything = (
        await e2e.kube.list(
            event_path(e2e.namespace),
            field_selector="involvedObject.kind=Pod,involvedObject.name=waiter",
        )
    )["items"]
    ours = [e for e in everything if e["source"].get("component", "").startswith("nodelock")]
    assert len(ours) <= 2 * 2, [(e["reason"], e["message"]) for e in ours]  # 2 replicas


async def test_refused_allocate_says_why_on_the_node(e2e: GPUCluster) -> None:
    """A pod placed by hand (admission bypassed by an administrator) holds no lock: the device
    plugin refuses its Allocate and says why, on the node (kubelet's Allocate names no pod)."""
    node = e2e.nodes[0]
    await e2e.allow_bypass()
    e2e.expect_unadmitted("by-hand")
    gpus = json.loads(
        (await e2e.kube.get(f"/api/v1/nodes/{node}"))["metadata"]["annotations"]["nodelock.io/gpus"]
    )
    forged = {"nodelock.io/assignment": json.dumps({"c0": [gpus[0]["id"]]})}
    # Node events live in "default", shared with every earlier test: only an Event this test's
    # refusal wrote (new, or one counted up since) is evidence.  A plugin started afresh has no
    # recent write to rate-limit against (kube/events.py), so its first refusal is written.
    await restart_plugin(e2e, node)  # served again: else kubelet refuses before any Allocate
    before = {
        e["metadata"]["uid"]: int(e.get("count") or 1)
        for e in await events_about(e2e.kube, "default", "Node", node, "AllocateRefused")
    }
    await e2e.create_pod(
        "by-hand", [1], node=node, bind_directly=True, annotations=forged, labels=BYPASS
    )
    await e2e.wait_phase("by-hand", ["Failed"])
    deadline = time.monotonic() + 30
    fresh: list[dict[str, Any]] = []
    while not fresh and time.monotonic() < deadline:
        fresh = [
            e
            for e in await events_about(e2e.kube, "default", "Node", node, "AllocateRefused")
            if int(e.get("count") or 1) > before.get(e["metadata"]["uid"], 0)
        ]
        await asyncio.sleep(0.3)
    assert len(fresh) == 1, f"not one AllocateRefused event from this refusal: {fresh}"
    [event] = fresh
    assert event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == node  # what `kubectl describe node` looks for
    assert event["source"]["component"] == "nodelock-device-plugin"
    assert "no-holder" in event["message"], event["message"]
    assert "no pod holds" in event["message"]
