"""``nodelock locks`` against the real API server: list, show, break (with its warning)."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.cluster import Cluster
from handoff.wire import DEFAULT_PREFIX, GPU, DeviceID, format_inventory
from kube import KubeClient
from kube.client import event_path, lease_path, node_path, pod_path
from lockd import Holder, HolderKey, NodeLocks, NodeName, Outcome
from nodelock.locks import NEEDS_FORCE, CliError, run_locks

NODE = NodeName("gpu-cli-1")


def args(cluster: Cluster, namespace: str, action: str = "list", **kw: Any) -> argparse.Namespace:
    base: dict[str, Any] = {
        "kubeconfig": str(cluster.kubeconfig),
        "lock_namespace": namespace,
        "annotation_prefix": "nodelock.io/",
        "observe": None,
        "locks_action": action,
        "force": False,
    }
    base.update(kw)
    return argparse.Namespace(**base)


async def stuck_lock(kube: KubeClient, namespace: str) -> tuple[NodeLocks, Holder]:
    """A lock whose holder pod is bound to the node but never admitted, written an hour ago."""
    pod = await kube.create(
        pod_path(namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "stuck"},
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "main", "image": "example.invalid/none"}],
            },
        },
    )
    holder = Holder(HolderKey(f"{namespace}/stuck"), pod["metadata"]["uid"], {"assignment": "{}"})
    an_hour_ago = NodeLocks(
        kube, namespace=namespace, wall_clock=lambda: 1_714_564_800.0, prefix=DEFAULT_PREFIX
    )
    await an_hour_ago.acquire(NODE, holder)
    return an_hour_ago, holder


async def run(a: argparse.Namespace, *, answer: bool = False) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    asked: list[str] = []

    def confirm(question: str) -> bool:
        asked.append(question)
        return answer

    code = await run_locks(a, out=out, err=err, confirm=confirm)
    return code, out.getvalue(), err.getvalue() + "".join(f"asked: {q}\n" for q in asked)


async def test_list_says_why_a_lock_is_stuck(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    locks, holder = await stuck_lock(kube, namespace)
    free = await locks.acquire(NodeName("gpu-cli-2"), Holder(HolderKey("x/y"), "u"))
    await locks.release(free, outcome=Outcome.ALLOCATED)

    code, out, _ = await run(args(cluster, namespace))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "HOLDER", "TOKEN", "AGE", "EXPIRED", "STATE"]
    stuck = next(line for line in lines if line.startswith(NODE))
    assert stuck.split()[1:3] == [holder.key, "1"]
    assert "STUCK: holder pod is Pending on this node and not admitted" in stuck
    freed = next(line for line in lines if line.startswith("gpu-cli-2"))
    assert "free (last: x/y allocated, token 1)" in freed

    code, out, _ = await run(args(cluster, namespace, "show", node=NODE))
    assert code == 0
    assert f"holder:          {holder.key} (uid {holder.uid})" in out
    assert "in-handoff" in out


async def test_break_warns_asks_and_says_whose_lock(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    _, holder = await stuck_lock(kube, namespace)

    # the holder is Pending on the node, not admitted: refused without --force, even with --yes
    code, out, err = await run(args(cluster, namespace, "break", node=NODE, yes=True))
    assert code == NEEDS_FORCE
    assert "two pods could get the same GPUs" in err
    assert f"not breaking node {NODE}'s lock without --force" in err
    assert "asked:" not in err
    lease = await kube.get(lease_path(namespace, NODE))
    assert lease["spec"]["holderIdentity"] == holder.key

    brk = args(cluster, namespace, "break", node=NODE, yes=False, force=True)
    code, out, err = await run(brk)
    assert code == 1
    assert "two pods could get the same GPUs" in err
    assert f"asked: Break node {NODE}'s lock held by {holder.key}?" in err
    lease = await kube.get(lease_path(namespace, NODE))
    assert lease["spec"]["holderIdentity"] == holder.key  # declined: nothing changed

    code, out, err = await run(brk, answer=True)
    assert code == 0
    assert f"broke node {NODE}'s lock held by {holder.key} (uid {holder.uid}, token 1)" in out
    lease = await kube.get(lease_path(namespace, NODE))
    assert "holderIdentity" not in lease["spec"]
    assert lease["metadata"]["annotations"]["nodelock.io/last-outcome"] == "broken"
    # and where admins look: an Event on the holder pod and one on the node, naming who broke it
    selector = "reason=NodeLockBroken,involvedObject.name="
    [on_pod] = (await kube.list(event_path(namespace), field_selector=selector + "stuck"))["items"]
    assert on_pod["involvedObject"]["uid"] == holder.uid
    assert (
        f"{NODE}'s GPU lock held by {holder.key} (token 1) was broken by hand by"
        in (on_pod["message"])
    )
    on_node = (await kube.list(event_path("default"), field_selector=selector + NODE))["items"]
    assert [e["type"] for e in on_node] == ["Warning"]
    for event in on_node:  # the node outlives the test's namespace
        await kube.delete(event_path("default", event["metadata"]["name"]))

    code, out, _ = await run(args(cluster, namespace, "break", node=NODE, yes=True))
    assert code == 0
    assert "the lock is free; nothing to break" in out


async def unbound_holder(kube: KubeClient, namespace: str, name: str) -> Holder:
    """A pod no scheduler binds (the extender's bind of it could still be on its way)."""
    pod = await kube.create(
        pod_path(namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "schedulerName": "nodelock-test-nobody",
                "containers": [{"name": "main", "image": "example.invalid/none"}],
            },
        },
    )
    return Holder(HolderKey(f"{namespace}/{name}"), pod["metadata"]["uid"], {"assignment": "{}"})


async def test_break_of_a_young_lock_whose_holder_is_not_bound_needs_force(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    """The binding of a holder that is not bound yet may still land while its lock is young."""
    holder = await unbound_holder(kube, namespace, "binding")
    await NodeLocks(kube, namespace=namespace, prefix=DEFAULT_PREFIX).acquire(
        NODE, holder
    )  # just now

    code, out, err = await run(args(cluster, namespace, "break", node=NODE, yes=True))
    assert code == NEEDS_FORCE
    assert "is not bound yet" in err
    assert "binding of" in err
    assert "may still land" in err
    assert f"not breaking node {NODE}'s lock without --force" in err
    lease = await kube.get(lease_path(namespace, NODE))
    assert lease["spec"]["holderIdentity"] == holder.key

    code, out, err = await run(args(cluster, namespace, "break", node=NODE, yes=True, force=True))
    assert code == 0
    assert "may still land" in err  # still said, then done
    assert f"broke node {NODE}'s lock held by {holder.key}" in out
    assert "holderIdentity" not in (await kube.get(lease_path(namespace, NODE)))["spec"]


async def test_break_of_an_old_lock_whose_holder_is_not_bound_needs_no_force(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    holder = await unbound_holder(kube, namespace, "gave-up")
    an_hour_ago = NodeLocks(
        kube, namespace=namespace, wall_clock=lambda: 1_714_564_800.0, prefix=DEFAULT_PREFIX
    )
    await an_hour_ago.acquire(NODE, holder)

    code, out, err = await run(args(cluster, namespace, "break", node=NODE, yes=True))
    assert code == 0, err
    assert "WARNING" not in err
    assert f"broke node {NODE}'s lock held by {holder.key}" in out


async def test_observe_judges_expiry_by_observed_time(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    await stuck_lock(kube, namespace)  # renewTime an hour ago: expired by timestamps
    code, out, _ = await run(args(cluster, namespace, observe=0.5))
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith(NODE))
    # observed for about --observe seconds (more on a loaded machine), far below the duration
    unchanged = re.search(r"no \(unchanged (\d+)s of 15s\)", row)
    assert unchanged is not None, row
    assert int(unchanged.group(1)) < 15
    assert "in handoff:" in row


async def test_unknown_node_is_a_one_line_error(cluster: Cluster, namespace: str) -> None:
    with pytest.raises(CliError, match="has no lock"):
        await run(args(cluster, namespace, "show", node="no-such-node"))


def test_the_nodelock_command_prints_errors_as_one_line(cluster: Cluster) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nodelock.cli",
            "locks",
            "show",
            "no-such-node",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--lock-namespace",
            "no-such-namespace",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "nodelock: node no-such-node has no lock (no Lease no-such-node in namespace "
        "no-such-namespace)"
    ]


def kubectl_plugin(cluster: Cluster, *words: str) -> subprocess.CompletedProcess[str]:
    """The real kubectl running ``kubectl nodelock WORDS``: it finds the ``kubectl-nodelock``
    entry point (pyproject's console script) on $PATH."""
    scripts = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        [str(cluster.binaries.kubectl), "nodelock", *words],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


async def test_kubectl_nodelock_locks_as_json_and_yaml(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    _, holder = await stuck_lock(kube, namespace)
    where = [f"--kubeconfig={cluster.kubeconfig}", f"--lock-namespace={namespace}"]
    res = kubectl_plugin(cluster, "locks", "-o", "json", *where)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)  # nothing but the document on stdout
    assert (doc["apiVersion"], doc["kind"]) == ("v1", "List")
    [item] = doc["items"]
    assert item["node"] == NODE
    assert item["lease"]["namespace"] == namespace
    assert item["token"] == 1
    assert item["holder"] == {"pod": holder.key, "uid": holder.uid, "state": "in-handoff"}
    assert item["expiredJudgedBy"] == "timestamps"
    assert item["expired"].startswith("yes")
    assert item["state"].startswith("STUCK")
    assert item["ageSeconds"] > 3000  # written an hour ago
    as_yaml = kubectl_plugin(cluster, "locks", "-o", "yaml", *where)
    assert as_yaml.returncode == 0, as_yaml.stderr
    from_yaml = yaml.safe_load(as_yaml.stdout)
    [again] = from_yaml.pop("items")
    assert from_yaml == {"apiVersion": "v1", "kind": "List"}
    assert again.pop("ageSeconds") >= item.pop("ageSeconds")  # a moment later
    assert again == item
    shown = kubectl_plugin(cluster, "locks", "show", NODE, "-o", "json", *where)
    assert json.loads(shown.stdout)["holder"]["pod"] == holder.key
    # an empty namespace is an empty List, still one document
    empty = kubectl_plugin(
        cluster, "locks", "-o", "json", f"--kubeconfig={cluster.kubeconfig}", "--lock-namespace=x"
    )
    assert json.loads(empty.stdout)["items"] == []
    assert "usage: kubectl nodelock" in kubectl_plugin(cluster, "locks", "-o", "xml").stderr


async def test_show_lists_each_shared_gpus_slices(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    """A node that shares its GPUs (inventory split 4): ``show`` names each slice's pod and
    size, from the bound pods' assignments and requests, in the table and in JSON."""
    node = "gpu-cli-share"
    inventory = [
        GPU(DeviceID(f"GPU-share-{i}"), i, "H100", 81920, 0, True, split=4) for i in range(2)
    ]
    await kube.create(
        node_path(),
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node,
                "annotations": {"nodelock.io/gpus": format_inventory(inventory)},
            },
        },
    )
    try:
        for name, gpu, limits in [
            (
                "infer-a",
                "GPU-share-0::0",
                {"nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "30"},
            ),
            ("infer-b", "GPU-share-0::1", {"nvidia.com/gpumem": "20000"}),
            ("train", "GPU-share-1", {}),
        ]:
            await kube.create(
                pod_path(namespace),
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": name,
                        "annotations": {"nodelock.io/assignment": json.dumps({"main": [gpu]})},
                    },
                    "spec": {
                        "nodeName": node,
                        "containers": [
                            {
                                "name": "main",
                                "image": "example.invalid/none",
                                "resources": {"limits": {"nvidia.com/gpu": "1", **limits}},
                            }
                        ],
                    },
                },
            )
        locks = NodeLocks(kube, namespace=namespace, prefix=DEFAULT_PREFIX)
        done = await locks.acquire(NodeName(node), Holder(HolderKey("x/y"), "u"))
        await locks.release(done, outcome=Outcome.ALLOCATED)

        code, out, _ = await run(args(cluster, namespace, "show", node=node))
        assert code == 0
        assert "gpu GPU-share-0:" in out
        assert "40000/81920 MiB, 30/100% cores, 2/4 slices" in out
        assert re.search(rf"slice {namespace}/infer-a: +20000 MiB, 30% cores", out), out
        assert re.search(rf"slice {namespace}/train: +whole GPU", out), out

        code, out, _ = await run(args(cluster, namespace, "show", node=node, output="json"))
        assert code == 0
        gpus = {g["gpu"]: g for g in json.loads(out)["gpus"]}
        assert gpus["GPU-share-1"]["memoryCommittedMiB"] == 81920
        assert [h["pod"] for h in gpus["GPU-share-0"]["holders"]] == [
            f"{namespace}/infer-a",
            f"{namespace}/infer-b",
        ]
    finally:
        await kube.delete(node_path(node))
