"""``nodelock demo --kubelet``: the flag reaches the GPU cluster the demo starts (plain data)."""

from __future__ import annotations

import pytest

from devcluster.realkubelet import KubeletKind
from nodelock.cli import build_parser
from nodelock.demo import gpu_cluster_options


def test_real_kubelets_reach_the_gpu_cluster() -> None:
    args = build_parser({}).parse_args(["demo", "--kubelet", "real", "--nodes", "2"])
    options = gpu_cluster_options(args)
    assert options["kubelet"] is KubeletKind.REAL
    assert options["nodes"] == 2


def test_simulated_kubelets_stay_the_default() -> None:
    assert gpu_cluster_options(build_parser({}).parse_args(["demo"]))["kubelet"] is KubeletKind.SIM


def test_the_environment_names_the_kubelet_too() -> None:
    args = build_parser({"NODELOCK_KUBELET": "real"}).parse_args(["demo"])
    assert gpu_cluster_options(args)["kubelet"] is KubeletKind.REAL


def test_an_unknown_kubelet_is_refused() -> None:
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["demo", "--kubelet", "kind"])
