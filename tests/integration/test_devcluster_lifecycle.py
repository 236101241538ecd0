"""devcluster as a person uses it: up, status, down leaving nothing behind, and clear errors."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from devcluster.binaries import KUBERNETES_VERSION, cache_root

NODELOCK = str(Path(sys.executable).parent / "nodelock")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [NODELOCK, *args], capture_output=True, text=True, timeout=300, env=env, check=False
    )


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_up_down_up_leaves_no_process_behind(tmp_path: Path) -> None:
    state = tmp_path / "dc"
    for round_ in range(2):
        up = run("devcluster", "up", "--state-dir", str(state), "--no-build")
        assert up.returncode == 0, up.stderr
        assert f"export KUBECONFIG={state.resolve()}/admin.kubeconfig" in up.stdout
        status = run("devcluster", "status", "--state-dir", str(state))
        assert status.returncode == 0, status.stdout
        components = json.loads((state / "state.json").read_text())["components"]
        pids = {name: c["pid"] for name, c in components.items()}
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}
        assert all(pid_alive(p) for p in pids.values()), f"round {round_}: {pids}"

        down = run("devcluster", "down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr
        assert not [n for n, p in pids.items() if pid_alive(p)]
        # nothing else of ours runs from this state directory either
        leftovers = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and pid_alive(int(entry.name)):
                try:
                    cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if str(state.resolve()) in cmdline:
                    leftovers.append(cmdline)
        assert leftovers == []
    assert run("devcluster", "status", "--state-dir", str(state)).returncode == 1


def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = run(
            "devcluster",
            "up",
            "--state-dir",
            str(tmp_path / "dc"),
            "--apiserver-port",
            str(port),
            "--no-build",
        )
    assert res.returncode == 2
    assert f"port {port} on 127.0.0.1" in res.stderr
    assert "already in use" in res.stderr
    assert "Traceback" not in res.stderr


def test_missing_go_toolchain_is_a_clear_error(tmp_path: Path) -> None:
    env = dict(os.environ, PATH="/usr/bin:/bin")
    res = run("devcluster", "build", "--cache-dir", str(tmp_path / "empty-cache"), env=env)
    assert res.returncode == 2
    assert "Go toolchain was not found" in res.stderr
    assert "Traceback" not in res.stderr


def test_corrupt_cache_is_a_clear_error(tmp_path: Path) -> None:
    real = cache_root() / "k8s" / KUBERNETES_VERSION
    fake = tmp_path / "cache" / "k8s" / KUBERNETES_VERSION
    fake.mkdir(parents=True)
    (fake / "MANIFEST.json").write_text((real / "MANIFEST.json").read_text())
    for name in json.loads((real / "MANIFEST.json").read_text())["sha256"]:
        (fake / name).write_bytes(b"truncated download")
        (fake / name).chmod(0o755)
    res = run(
        "devcluster",
        "up",
        "--state-dir",
        str(tmp_path / "dc"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-build",
    )
    assert res.returncode == 2
    assert "does not match the checksum" in res.stderr
    assert "nodelock devcluster build" in res.stderr
    assert "Traceback" not in res.stderr

    (fake / "MANIFEST.json").write_text("{not json")
    res = run(
        "devcluster",
        "up",
        "--state-dir",
        str(tmp_path / "dc"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-build",
    )
    assert res.returncode == 2
    assert "manifest" in res.stderr
    assert "Traceback" not in res.stderr


def test_up_with_gpu_nodes_waits_until_every_node_reports_its_gpus(tmp_path: Path) -> None:
    deep = run(
        "devcluster", "up", "--state-dir", str(tmp_path / ("d" * 60)), "--no-build", "--nodes", "1"
    )
    assert deep.returncode == 2
    assert "choose a shorter --state-dir" in deep.stderr
    assert "Traceback" not in deep.stderr

    state = Path(tempfile.mkdtemp(prefix="nlt-", dir="/tmp"))  # unix socket paths are short
    up = run(
        "devcluster",
        "up",
        "--state-dir",
        str(state),
        "--no-build",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
    )
    try:
        assert up.returncode == 0, up.stderr
        assert "2 GPU nodes x 2 GPUs ready" in up.stdout
        assert f"export KUBECONFIG={state.resolve()}/admin.kubeconfig" in up.stdout
        settings = json.loads((state / "state.json").read_text())
        kubectl = Path(settings["settings"]["binaries"]) / "kubectl"
        nodes = json.loads(
            subprocess.run(
                [
                    str(kubectl),
                    f"--kubeconfig={state}/admin.kubeconfig",
                    "get",
                    "nodes",
                    "-o",
                    "json",
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout
        )["items"]
        # already there when `up` returns: kubelet's count and the plugin's inventory
        assert sorted(n["metadata"]["name"] for n in nodes) == ["gpu-node-01", "gpu-node-02"]
        for n in nodes:
            assert n["status"]["allocatable"]["nvidia.com/gpu"] == "2"
            assert len(json.loads(n["metadata"]["annotations"]["nodelock.io/gpus"])) == 2
        pids = [c["pid"] for c in settings["components"].values()]
        assert {"extender", "kubelet-gpu-node-01", "deviceplugin-gpu-node-02"} <= set(
            settings["components"]
        )
    finally:
        down = run("devcluster", "down", "--state-dir", str(state))
        shutil.rmtree(state, ignore_errors=True)
    assert down.returncode == 0, down.stderr
    assert not [p for p in pids if pid_alive(p)]
