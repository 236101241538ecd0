"""The device plugin's answer mode on the command line: CDI unless asked otherwise.

CDI by default because a container's own ``NVIDIA_VISIBLE_DEVICES`` comes after the plugin's in
the environment kubelet builds, so under the NVIDIA runtime's environment mode a pod could widen
its devices to every GPU of the node; CDI names cannot be overridden from the pod spec.
"""

from __future__ import annotations

import argparse

import pytest

from deviceplugin import cli
from deviceplugin.answer import DeviceMode


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nodelock")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub)
    return parser.parse_args(["device-plugin", "--node-name=n1", *flags])


@pytest.mark.parametrize(
    ("flags", "mode"),
    [
        ((), DeviceMode.CDI),
        (("--device-mode=cdi",), DeviceMode.CDI),
        (("--device-mode=device-nodes",), DeviceMode.DEVICE_NODES),
        (("--cdi",), DeviceMode.CDI),  # the old flag still means CDI
    ],
)
def test_device_mode_flags(flags: tuple[str, ...], mode: DeviceMode) -> None:
    assert cli.config_from_args(parse(*flags)).mode is mode


def test_unknown_device_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--device-mode=env")
    assert "invalid choice: 'env'" in capsys.readouterr().err
