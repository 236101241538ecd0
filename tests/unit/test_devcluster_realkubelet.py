"""Reading a real kubelet's records (its device checkpoint, the container configs it handed the
runtime) into the invariant checker's records, and the kubelet configuration of a node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devcluster.errors import DevclusterError
from devcluster.invariants import ContainerRecord, check_pods
from devcluster.realkubelet import (
    CheckpointEntry,
    RealNode,
    kubelet_config,
    kubelet_records,
    read_checkpoint,
    read_containers,
)

pytestmark = pytest.mark.unit


def _checkpoint(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text(
        json.dumps({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}, "Checksum": 1})
    )
    return path


def _pod(name: str, uid: str, assignment: dict[str, list[str]], *, phase: str = "Running") -> Any:
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": uid,
            "annotations": {"nodelock.io/assignment": json.dumps(assignment)},
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c0", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": phase},
    }


def _config(uid: str, container: str, visible: str) -> dict[str, Any]:
    return {"podUID": uid, "container": container, "envs": {"NVIDIA_VISIBLE_DEVICES": visible}}


def test_checkpoint_entries_are_read_per_container_and_resource(tmp_path: Path) -> None:
    path = _checkpoint(
        tmp_path / "cp",
        [
            {
                "PodUID": "u1",
                "ContainerName": "c0",
                "ResourceName": "nvidia.com/gpu",
                "DeviceIDs": {"0": ["GPU-b"], "1": ["GPU-a"]},
                "AllocResp": "",
            },
            {
                "PodUID": "u1",
                "ContainerName": "c0",
                "ResourceName": "x/y",
                "DeviceIDs": None,
                "AllocResp": "",
            },
        ],
    )
    assert read_checkpoint(path) == [
        CheckpointEntry("u1", "c0", "nvidia.com/gpu", ("GPU-a", "GPU-b")),
        CheckpointEntry("u1", "c0", "x/y", ()),
    ]
    assert read_checkpoint(tmp_path / "missing") == []


def test_a_checkpoint_of_another_shape_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "cp"
    bad.write_text(json.dumps({"Data": {"PodDeviceEntries": [{"PodUID": "u1"}]}}))
    with pytest.raises(DevclusterError, match="unknown shape"):
        read_checkpoint(bad)
    bad.write_text("{")
    with pytest.raises(DevclusterError, match="not JSON"):
        read_checkpoint(bad)


def test_container_record_lines_cut_short_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "containers.jsonl"
    path.write_text(json.dumps(_config("u1", "c0", "GPU-a")) + "\n" + '{"podUID": "u2", "con')
    assert read_containers(path) == [_config("u1", "c0", "GPU-a")]
    assert read_containers(tmp_path / "none") == []


def test_records_join_the_checkpoint_with_what_the_runtime_was_handed() -> None:
    pods = [_pod("a", "u1", {"c0": ["GPU-a"]}), _pod("b", "u2", {"c0": ["GPU-b"]})]
    checkpoints = {
        "n1": [
            CheckpointEntry("u1", "c0", "nvidia.com/gpu", ("GPU-a",)),
            CheckpointEntry("u2", "c0", "nvidia.com/gpu", ("GPU-b",)),
        ]
    }
    # the first config of u2 was replaced by a later one (a restarted container)
    containers = {
        "n1": [
            _config("u1", "c0", "GPU-a"),
            _config("u2", "c0", "GPU-x"),
            _config("u2", "c0", "GPU-b"),
        ]
    }
    records = kubelet_records(pods, checkpoints=checkpoints, containers=containers)
    assert records == {
        "ns/a": {"c0": ContainerRecord({"nvidia.com/gpu": ["GPU-a"]}, "GPU-a")},
        "ns/b": {"c0": ContainerRecord({"nvidia.com/gpu": ["GPU-b"]}, "GPU-b")},
    }
    assert check_pods(pods, expected_pods=2, records=records).ok


def test_a_device_handed_to_the_runtime_that_kubelet_did_not_allocate_is_s2() -> None:
    pods = [_pod("a", "u1", {"c0": ["GPU-a"]})]
    checkpoints = {"n1": [CheckpointEntry("u1", "c0", "nvidia.com/gpu", ("GPU-a",))]}
    records = kubelet_records(
        pods, checkpoints=checkpoints, containers={"n1": [_config("u1", "c0", "GPU-b")]}
    )
    found = check_pods(pods, expected_pods=1, records=records)
    assert found.s2


def test_a_running_container_never_handed_to_the_runtime_is_s2() -> None:
    pods = [_pod("a", "u1", {"c0": ["GPU-a"]})]
    checkpoints = {"n1": [CheckpointEntry("u1", "c0", "nvidia.com/gpu", ("GPU-a",))]}
    records = kubelet_records(pods, checkpoints=checkpoints, containers={})
    assert records["ns/a"]["c0"].visible == ""
    assert check_pods(pods, expected_pods=1, records=records).s2
    pending = [_pod("a", "u1", {"c0": ["GPU-a"]}, phase="Pending")]
    records = kubelet_records(pending, checkpoints=checkpoints, containers={})
    assert records["ns/a"]["c0"].visible is None


def test_two_pods_kubelet_gave_one_gpu_is_s1() -> None:
    pods = [_pod("a", "u1", {"c0": ["GPU-a"]}), _pod("b", "u2", {"c0": ["GPU-a"]})]
    checkpoints = {
        "n1": [
            CheckpointEntry("u1", "c0", "nvidia.com/gpu", ("GPU-a",)),
            CheckpointEntry("u2", "c0", "nvidia.com/gpu", ("GPU-a",)),
        ]
    }
    containers = {"n1": [_config("u1", "c0", "GPU-a"), _config("u2", "c0", "GPU-a")]}
    records = kubelet_records(pods, checkpoints=checkpoints, containers=containers)
    assert check_pods(pods, expected_pods=2, records=records).s1


def test_a_finished_pod_dropped_from_the_checkpoint_keeps_what_it_ran_with() -> None:
    pods = [_pod("a", "u1", {"c0": ["GPU-a"]}, phase="Succeeded")]
    records = kubelet_records(
        pods, checkpoints={"n1": []}, containers={"n1": [_config("u1", "c0", "GPU-a")]}
    )
    assert records == {"ns/a": {"c0": ContainerRecord({"nvidia.com/gpu": ["GPU-a"]}, "GPU-a")}}


def test_a_running_pod_after_its_checkpoint_was_lost_keeps_what_it_runs_with() -> None:
    """kubelet restarted without its checkpoint: its running pods have no entry there, and are
    judged from the configs kubelet handed the runtime (two pods given one GPU is still S1)."""
    pods = [_pod("a", "u1", {"c0": ["GPU-a"]}), _pod("b", "u2", {"c0": ["GPU-b"]})]
    containers = {"n1": [_config("u1", "c0", "GPU-a"), _config("u2", "c0", "GPU-a")]}
    records = kubelet_records(pods, checkpoints={"n1": []}, containers=containers)
    assert records["ns/a"] == {"c0": ContainerRecord({"nvidia.com/gpu": ["GPU-a"]}, "GPU-a")}
    found = check_pods(pods, expected_pods=2, records=records)
    assert found.s1
    assert found.s2


def test_runtime_ids_count_for_the_resource_the_container_asks_for() -> None:
    pod = _pod("a", "u1", {"c0": ["GPU-a", "MIG-1"]})
    limits = {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"}
    pod["spec"]["containers"][0]["resources"]["limits"] = limits
    records = kubelet_records(
        [pod], checkpoints={"n1": []}, containers={"n1": [_config("u1", "c0", "GPU-a,MIG-1")]}
    )
    assert records["ns/a"]["c0"].devices == {
        "nvidia.com/gpu": ["GPU-a"],
        "nvidia.com/mig-1g.10gb": ["MIG-1"],
    }
    limits["nvidia.com/mig-2g.20gb"] = "1"
    records = kubelet_records(
        [pod], checkpoints={"n1": []}, containers={"n1": [_config("u1", "c0", "GPU-a,MIG-1")]}
    )
    assert records == {}


def test_kubelet_config_keeps_the_node_in_its_own_directory(tmp_path: Path) -> None:
    node = RealNode(tmp_path / "n1")
    config = kubelet_config(
        port=1, healthz_port=2, node=node, ca_file=tmp_path / "ca.crt", topology_policy="none"
    )
    assert config["containerRuntimeEndpoint"] == f"unix://{node.cri_socket}"
    assert config["cgroupsPerQOS"] is False
    assert config["enforceNodeAllocatable"] == []
    assert config["failSwapOn"] is False
    assert config["failCgroupV1"] is False
    assert str(config["podLogsDir"]).startswith(str(node.root))
    assert (config["address"], config["port"], config["healthzPort"]) == ("127.0.0.1", 1, 2)
