"""What a stopped campaign cluster left behind is found: a process naming its state folder, a
unix socket bound under it, a port still listening, the folder itself; nothing when it is all
gone."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.soak import leaks


def test_a_left_process_socket_port_and_folder_are_reported(tmp_path: Path) -> None:
    state = tmp_path / "nlsoak-x"
    state.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", str(state)],
    )
    # until the child has exec'd, /proc shows the parent's command line
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    for _ in range(500):
        if str(state).encode() in cmdline.read_bytes():
            break
        time.sleep(0.01)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(state / "kubelet.sock"))
    unix.listen()
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    port = tcp.getsockname()[1]
    try:
        found = leaks(state, {"kube-apiserver": port})
        assert any(f.startswith(f"process {proc.pid}:") for f in found), found
        assert f"unix socket {state / 'kubelet.sock'}" in found
        assert f"kube-apiserver's port {port} still accepts connections" in found
        assert f"state folder {state} left" in found
    finally:
        proc.kill()
        proc.wait()
        unix.close()
        tcp.close()
    (state / "kubelet.sock").unlink()
    state.rmdir()
    assert leaks(state, {"kube-apiserver": port}) == []
