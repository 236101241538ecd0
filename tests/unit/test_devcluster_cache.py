"""The binary cache accepts an entry only when every binary matches its recorded checksum."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from devcluster.binaries import _default_binary_name, verify_entry


def make_entry(directory: Path, files: dict[str, bytes]) -> None:
    directory.mkdir(parents=True)
    sums = {}
    for name, data in files.items():
        (directory / name).write_bytes(data)
        (directory / name).chmod(0o755)
        sums[name] = hashlib.sha256(data).hexdigest()
    (directory / "MANIFEST.json").write_text(json.dumps({"sha256": sums}))


def test_complete_entry_is_accepted(tmp_path: Path) -> None:
    make_entry(tmp_path / "e", {"etcd": b"a", "kubectl": b"b"})
    assert verify_entry(tmp_path / "e", ["etcd", "kubectl"]) is None


def test_missing_entry_is_not_built_yet(tmp_path: Path) -> None:
    assert verify_entry(tmp_path / "nope", ["etcd"]) == "not built yet"


def test_changed_binary_is_rejected(tmp_path: Path) -> None:
    make_entry(tmp_path / "e", {"etcd": b"a", "kubectl": b"b"})
    (tmp_path / "e" / "kubectl").write_bytes(b"b but truncated")
    problem = verify_entry(tmp_path / "e", ["etcd", "kubectl"])
    assert problem is not None
    assert "kubectl" in problem


def test_missing_binary_and_bad_manifest_are_rejected(tmp_path: Path) -> None:
    make_entry(tmp_path / "e", {"etcd": b"a"})
    assert verify_entry(tmp_path / "e", ["etcd", "kubectl"]) == "kubectl is missing"
    (tmp_path / "e" / "MANIFEST.json").write_text("[]")
    problem = verify_entry(tmp_path / "e", ["etcd"])
    assert problem is not None


def test_go_build_output_names() -> None:
    assert _default_binary_name("go.etcd.io/etcd/server/v3") == "server"
    assert _default_binary_name("k8s.io/kubernetes/cmd/kube-apiserver") == "kube-apiserver"
