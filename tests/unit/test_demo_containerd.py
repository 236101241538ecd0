"""``nodelock demo --runtime containerd``: its command line, workload and checks (plain data; the
demo itself runs on containerd nodes, docs/containerd-nodes.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from devcluster.errors import DevclusterError
from handoff.wire import DEFAULT_RESOURCE, Keys
from nodelock.cli import build_parser
from nodelock.demo import CONTAINERD_SHAPE, DEFAULT_SHAPE, demo_shape
from nodelock.demo_containerd import (
    done,
    manifest,
    overlaps,
    printed,
    real_workload,
)


def shape(*argv: str) -> Any:
    return demo_shape(build_parser({}).parse_args(["demo", *argv]))


def test_each_runtime_has_its_own_default_size() -> None:
    assert shape() == DEFAULT_SHAPE
    small = shape("--runtime", "containerd")
    assert (small.nodes, small.gpus_per_node) == (CONTAINERD_SHAPE.nodes, 4)
    assert shape("--runtime", "containerd", "--nodes", "3").nodes == 3
    assert shape("--nodes", "3").shared_nodes == DEFAULT_SHAPE.shared_nodes


@pytest.mark.parametrize(
    "extra", [["--shared-nodes", "1"], ["--gpu-split", "2"], ["--kubelet", "real"]]
)
def test_containerd_refuses_what_its_nodes_do_not_do(extra: list[str]) -> None:
    with pytest.raises(DevclusterError, match="does not take"):
        shape("--runtime", "containerd", *extra)


def test_the_workload_asks_for_more_gpus_than_the_cluster_has_so_the_burst_waits() -> None:
    workloads = real_workload(8)
    need = sum(w.replicas * w.gpus for w in workloads)
    assert need > 8
    assert sum(w.replicas * w.gpus for w in workloads if w.name != "burst") <= 8
    job = manifest(workloads[0], "img")
    spec = job["spec"]["template"]["spec"]
    assert spec["schedulerName"] == "nodelock-scheduler"
    assert spec["containers"][0]["resources"]["limits"][DEFAULT_RESOURCE] == "2"
    assert "NVIDIA_VISIBLE_DEVICES" in spec["containers"][0]["command"][-1]


def _pod(name: str, node: str, gpus: list[str], state: dict[str, Any], phase: str) -> Any:
    return {
        "metadata": {
            "name": name,
            "labels": {"demo.nodelock.io/workload": name.split("-")[0]},
            "annotations": {Keys().assignment: json.dumps({"main": gpus})},
        },
        "spec": {"nodeName": node},
        "status": {"phase": phase, "containerStatuses": [{"state": state}]},
    }


def _ran(start: str, end: str) -> dict[str, Any]:
    return {"terminated": {"startedAt": start, "finishedAt": end}}


def test_a_gpu_in_two_containers_at_once_is_found_and_one_after_the_other_is_not() -> None:
    now = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    t = "2026-01-01T00:00:{:02d}Z".format
    a = _pod("burst-a", "n1", ["GPU-1"], _ran(t(0), t(10)), "Succeeded")
    b = _pod("burst-b", "n1", ["GPU-1"], _ran(t(10), t(20)), "Succeeded")
    c = _pod("burst-c", "n1", ["GPU-1"], {"running": {"startedAt": t(15)}}, "Running")
    other = _pod("burst-d", "n2", ["GPU-1"], _ran(t(0), t(30)), "Succeeded")
    assert overlaps([a, b, other], now) == []
    assert overlaps([a, b, c], now) == ["n1 GPU-1: burst-b and burst-c"]


def test_a_log_line_gives_the_devices_a_container_saw() -> None:
    assert printed("NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-2\n") == ["GPU-1", "GPU-2"]
    assert printed("nothing here") is None


def test_the_workload_is_done_when_jobs_succeeded_and_deployments_run() -> None:
    workloads = real_workload(4)  # train 1x2, inference 1x1, burst 2x1
    running = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    ended = _ran("2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z")
    pods = [
        _pod("train-a", "n1", ["G1", "G2"], ended, "Succeeded"),
        _pod("inference-a", "n1", ["G3"], running, "Running"),
        _pod("burst-a", "n1", ["G4"], ended, "Succeeded"),
    ]
    assert not done(pods, workloads)
    pods.append(_pod("burst-b", "n1", ["G4"], ended, "Succeeded"))
    assert done(pods, workloads)
