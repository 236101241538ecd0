"""``devcluster.gpunodes.node_specs``: which simulated nodes share their GPUs (plain data)."""

from __future__ import annotations

import pytest

from devcluster.gpunodes import node_specs


def test_without_shared_nodes_every_node_gets_the_split() -> None:
    specs = node_specs(3, 8, gpu_split=4)
    assert [s.gpu_split for s in specs] == [4, 4, 4]
    assert [s.name for s in specs] == ["gpu-node-01", "gpu-node-02", "gpu-node-03"]


def test_the_last_shared_nodes_share_and_the_others_keep_whole_gpus() -> None:
    specs = node_specs(5, 8, gpu_split=4, shared_nodes=2, gpu_memory_mib=81920)
    assert [(s.name, s.gpu_split) for s in specs] == [
        ("gpu-node-01", 1),
        ("gpu-node-02", 1),
        ("gpu-node-03", 1),
        ("gpu-node-04", 4),
        ("gpu-node-05", 4),
    ]
    assert {s.gpus for s in specs} == {8}
    assert {s.memory_mib for s in specs} == {81920}


def test_zero_shared_nodes_means_none_share() -> None:
    assert [s.gpu_split for s in node_specs(2, 8, gpu_split=4, shared_nodes=0)] == [1, 1]


@pytest.mark.parametrize("shared", [-1, 3])
def test_shared_nodes_outside_the_cluster_are_refused(shared: int) -> None:
    with pytest.raises(ValueError, match="between 0 and 2"):
        node_specs(2, 8, gpu_split=4, shared_nodes=shared)
