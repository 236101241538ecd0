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

    def up_from_cache() -> subprocess.CompletedProcess[str]:
        where = ["--state-dir", str(tmp_path / "dc"), "--cache-dir", str(tmp_path / "cache")]
        return run("devcluster", "up", *where, "--no-build")

    res = up_from_cache()
    assert res.returncode == 2
    assert "does not match the checksum" in res.stderr
    assert "nodelock devcluster build" in res.stderr
    assert "Traceback" not in res.stderr

    (fake / "MANIFEST.json").write_text("{not json")
    res = up_from_cache()
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
    proxied = run(
        "devcluster",
        "up",
        "--state-dir",
        str(tmp_path / "tls"),
        "--no-build",
        "--nodes",
        "1",
        "--extender-tls",
        "--extender-replicas",
        "2",
    )
    assert proxied.returncode == 2
    assert "--extender-tls serves one extender replica" in proxied.stderr
    assert "Traceback" not in proxied.stderr

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
        "--extender-tls",
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
        # --extender-tls: kube-scheduler calls the extender over HTTPS, as shipped
        assert settings["settings"]["extender"]["url"].startswith("https://127.0.0.1:")
        pids = [c["pid"] for c in settings["components"].values()]
        assert {"extender", "kubelet-gpu-node-01", "deviceplugin-gpu-node-02"} <= set(
            settings["components"]
        )
    finally:
        down = run("devcluster", "down", "--state-dir", str(state))
        shutil.rmtree(state, ignore_errors=True)
    assert down.returncode == 0, down.stderr
    assert not [p for p in pids if pid_alive(p)]


def test_up_resumes_only_its_own_shape_and_down_purge_starts_afresh(tmp_path: Path) -> None:
    state = tmp_path / "dc"
    dc = ["--state-dir", str(state)]
    assert run("devcluster", "up", *dc, "--no-build").returncode == 0
    status = run("devcluster", "status", *dc)
    assert "shape: a control plane without GPU nodes" in status.stdout
    assert run("devcluster", "down", *dc).returncode == 0
    # the same shape resumes (etcd's data comes back)
    again = run("devcluster", "up", *dc, "--no-build")
    assert again.returncode == 0, again.stderr
    assert run("devcluster", "down", *dc).returncode == 0
    # data of another shape is refused before anything starts, naming the way out
    other = run("devcluster", "up", *dc, "--no-build", "--nodes", "2", "--gpus-per-node", "4")
    assert other.returncode != 0
    [line] = other.stderr.strip().splitlines()  # one line, no traceback
    assert "holds a control plane without GPU nodes; up asks for 2 GPU nodes x 4 GPUs" in line
    assert f"nodelock devcluster down --purge --state-dir {state.resolve()}" in line
    assert not json.loads((state / "state.json").read_text())["components"]  # nothing started
    # a state directory from a version that recorded no shape is refused as well
    (state / "shape.json").unlink()
    old = run("devcluster", "up", *dc, "--no-build")
    assert old.returncode != 0
    assert "older nodelock version" in old.stderr
    # --purge removes it all; the next up starts empty
    purged = run("devcluster", "down", *dc, "--purge")
    assert purged.returncode == 0, purged.stderr
    assert not state.exists()
    fresh = run("devcluster", "up", *dc, "--no-build")
    assert fresh.returncode == 0, fresh.stderr
    assert run("devcluster", "down", *dc, "--purge").returncode == 0
    # --purge refuses a directory that is not a devcluster's
    stranger = tmp_path / "not-a-cluster"
    stranger.mkdir()
    (stranger / "precious.txt").write_text("keep me")
    refused = run("devcluster", "down", "--state-dir", str(stranger), "--purge")
    assert refused.returncode != 0
    assert "does not look like a devcluster state directory" in refused.stderr
    assert (stranger / "precious.txt").exists()
