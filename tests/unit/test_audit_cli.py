"""``nodelock audit``: where it looks, and one-line errors for what a person must fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster.errors import DevclusterError
from nodelock.audit import NodeSource, devcluster_sources
from nodelock.cli import main


def test_devcluster_sources_are_each_simulated_nodes_socket_and_checkpoint(tmp_path: Path) -> None:
    for node in ("gpu-node-02", "gpu-node-01"):
        (tmp_path / "nodes" / node / "device-plugins").mkdir(parents=True)
    found = devcluster_sources(tmp_path)
    assert found == [
        NodeSource(
            n,
            tmp_path / "nodes" / n / "pod-resources" / "kubelet.sock",
            tmp_path / "nodes" / n / "device-plugins" / "kubelet_internal_checkpoint",
        )
        for n in ("gpu-node-01", "gpu-node-02")
    ]
    assert [s.node for s in devcluster_sources(tmp_path, ["gpu-node-02"])] == ["gpu-node-02"]
    with pytest.raises(DevclusterError, match="no simulated node gpu-node-09"):
        devcluster_sources(tmp_path, ["gpu-node-09"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--node-local"], "--node-local needs --node-name or $NODE_NAME"),
        (["--second-look", "-1"], "--second-look must not be negative"),
        (["--state-dir", "{tmp}"], "has no simulated GPU nodes"),
    ],
)
def test_what_a_person_must_fix_is_one_line_and_exit_2(
    argv: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["audit", *(a.format(tmp=tmp_path) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("nodelock: ")
    assert message in err
