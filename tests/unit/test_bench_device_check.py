"""``bench/device_check.sh`` set up from a ``.device/`` bundle (a lent machine with no package
index): a bundle that did not fully arrive, or a Python its wheels do not fit, stops the check
with a message that says what to do, before anything runs."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def checkout(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A tree holding the device check and a ``.device/`` of ``files`` with their checksums."""
    root = tmp_path / "tree"
    (root / "bench").mkdir(parents=True)
    shutil.copy(REPO / "bench" / "device_check.sh", root / "bench" / "device_check.sh")
    device = root / ".device"
    (device / "wheels").mkdir(parents=True)
    sums = []
    for name, data in files.items():
        (device / name).write_bytes(data)
        sums.append(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
    (device / "SHA256SUMS").write_text("".join(sums))
    return root


def device_check(root: Path, tmp_path: Path, python: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": python}
    return subprocess.run(
        ["bash", str(root / "bench" / "device_check.sh"), "--dry", "--bundle"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_a_part_not_carried_stops_the_check_naming_it(tmp_path: Path) -> None:
    root = checkout(tmp_path, {"cache.tar.xz.00": b"first", "cache.tar.xz.01": b"second"})
    (root / ".device" / "cache.tar.xz.00").unlink()  # the call that carried it went cold
    res = device_check(root, tmp_path, sys.executable)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "bundle in .device/ is incomplete" in res.stderr
    assert "cache.tar.xz.00" in res.stderr
    assert "==> bench.handoff" not in res.stdout


def other_python(tmp_path: Path) -> str:
    """A python3 that is not 3.12: this interpreter, or, when it is 3.12, a script that says it
    is 3.11 (the check asks the interpreter for its version and nothing else first)."""
    if sys.version_info[:2] != (3, 12):
        return sys.executable
    fake = tmp_path / "python3"
    fake.write_text('#!/bin/sh\ncase "$1" in -V) echo Python 3.11.0 ;; *) exit 1 ;; esac\n')
    fake.chmod(0o755)
    return str(fake)


def test_a_python_the_wheels_do_not_fit_stops_the_check(tmp_path: Path) -> None:
    root = checkout(tmp_path, {"cache.tar.xz.00": b"first"})
    python = other_python(tmp_path)
    res = device_check(root, tmp_path, python)
    version = subprocess.run([python, "-V"], capture_output=True, text=True, check=True).stdout
    assert res.returncode == 2, res.stdout + res.stderr
    assert "wheels are for CPython 3.12" in res.stderr
    assert version.strip() in res.stderr


def test_only_the_first_calls_parts_say_the_last_call_is_missing(tmp_path: Path) -> None:
    root = checkout(tmp_path, {"cache.tar.xz.00": b"first"})
    (root / ".device" / "SHA256SUMS").unlink()
    res = device_check(root, tmp_path, sys.executable)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "SHA256SUMS, carried with the last part and the wheels, is not here" in res.stderr
    assert "cache.tar.xz.00" in res.stderr


def test_no_venv_and_no_bundle_says_how_to_get_one(tmp_path: Path) -> None:
    root = checkout(tmp_path, {})
    shutil.rmtree(root / ".device")
    res = device_check(root, tmp_path, sys.executable)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "bench/device_bundle.sh" in res.stderr
