"""``nodelock locks`` against the real API server: list, show, break (with its warning)."""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
from typing import Any

import pytest

from devcluster.cluster import Cluster
from lockd import Holder, HolderKey, KubeClient, NodeLocks, NodeName, Outcome
from lockd.cli import CliError, run_locks
from lockd.kube import lease_path, pod_path

NODE = NodeName("gpu-cli-1")


def args(cluster: Cluster, namespace: str, action: str = "list", **kw: Any) -> argparse.Namespace:
    base: dict[str, Any] = {
        "kubeconfig": str(cluster.kubeconfig),
        "lock_namespace": namespace,
        "annotation_prefix": "nodelock.io/",
        "observe": None,
        "locks_action": action,
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
    an_hour_ago = NodeLocks(kube, namespace=namespace, wall_clock=lambda: 1_714_564_800.0)
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

    code, out, err = await run(args(cluster, namespace, "break", node=NODE, yes=False))
    assert code == 1
    assert "two pods could get the same GPUs" in err
    assert f"asked: Break node {NODE}'s lock held by {holder.key}?" in err
    lease = await kube.get(lease_path(namespace, NODE))
    assert lease["spec"]["holderIdentity"] == holder.key  # declined: nothing changed

    code, out, err = await run(args(cluster, namespace, "break", node=NODE, yes=False), answer=True)
    assert code == 0
    assert f"broke node {NODE}'s lock held by {holder.key} (uid {holder.uid}, token 1)" in out
    lease = await kube.get(lease_path(namespace, NODE))
    assert "holderIdentity" not in lease["spec"]
    assert lease["metadata"]["annotations"]["nodelock.io/last-outcome"] == "broken"

    code, out, _ = await run(args(cluster, namespace, "break", node=NODE, yes=True))
    assert code == 0
    assert "the lock is free; nothing to break" in out


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
