"""The containerd nodes' network on this machine: a cluster's teardown removes only the network it
made, so a stale state directory cannot take down another cluster that took the index since."""

from __future__ import annotations

import os
import shutil

import pytest

from devcluster import netns
from devcluster.processes import free_port

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None,
    reason="node networks need root, ip and iptables (make runtime-deps)",
)


def test_a_teardown_by_another_state_directory_leaves_the_network_alone() -> None:
    net = netns.allocate(free_port(), "/tmp/nl-owner")
    try:
        assert netns.bridge_owner(net.bridge) == "/tmp/nl-owner"
        netns.teardown(net, 1, "/tmp/nl-stale")
        assert netns.bridge_owner(net.bridge) == "/tmp/nl-owner"
    finally:
        netns.teardown(net, 1, "/tmp/nl-owner")
    assert netns.bridge_owner(net.bridge) is None
