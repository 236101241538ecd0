"""devcluster raises the inotify instance limit that real kubelets exhaust, and never lowers it."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster.errors import DevclusterError
from devcluster.hostlimits import INOTIFY_INSTANCES, ensure_inotify_instances, needed_raise


def test_a_default_limit_is_raised_and_a_higher_one_is_kept() -> None:
    assert needed_raise(128) == INOTIFY_INSTANCES
    assert needed_raise(INOTIFY_INSTANCES) is None
    assert needed_raise(INOTIFY_INSTANCES * 4) is None


def test_the_limit_file_is_written_only_when_it_is_lower(tmp_path: Path) -> None:
    limit = tmp_path / "max_user_instances"
    limit.write_text("128\n")
    ensure_inotify_instances(limit, wanted=1024)
    assert limit.read_text() == "1024\n"
    limit.write_text("65536\n")
    ensure_inotify_instances(limit, wanted=1024)
    assert limit.read_text() == "65536\n"


def test_an_unreadable_limit_is_an_error_that_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent" / "max_user_instances"
    with pytest.raises(DevclusterError, match="max_user_instances"):
        ensure_inotify_instances(missing)
    garbled = tmp_path / "garbled"
    garbled.write_text("many\n")
    with pytest.raises(DevclusterError, match="garbled"):
        ensure_inotify_instances(garbled)


# a kernel setting nobody may write, root included (mode 0444), that holds a number
READ_ONLY_SETTING = Path("/proc/sys/kernel/ngroups_max")


def test_a_limit_that_cannot_be_raised_fails_strictly_and_only_warns_otherwise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    wanted = int(READ_ONLY_SETTING.read_text()) + 1
    with pytest.raises(DevclusterError, match=f"sysctl -w fs.inotify.max_user_instances={wanted}"):
        ensure_inotify_instances(READ_ONLY_SETTING, wanted=wanted)
    ensure_inotify_instances(READ_ONLY_SETTING, wanted=wanted, strict=False)
    assert "warning" in capsys.readouterr().err
    assert int(READ_ONLY_SETTING.read_text()) == wanted - 1
