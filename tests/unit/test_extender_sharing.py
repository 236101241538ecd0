"""The extender on nodes that share GPUs: pod and node objects through the cache into filter,
score, choice and the bind's conflict check (plain data, no API server)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from handoff.wire import GPU, ContainerName, DeviceID, format_inventory
from lockd.model import NodeName
from scheduler_ext.cache import ClusterCache
from scheduler_ext.choose import Fit, NodeGPUs, NoFit, Policy, choose, conflicts, fit, score
from scheduler_ext.need import PodNeed, pod_need

MIB_80G = 81920
NODE = NodeName("n1")


def node_obj(name: str = NODE, *, n: int = 2, split: int = 4) -> dict[str, Any]:
    gpus = [
        GPU(DeviceID(f"GPU-{name}-{i}"), i, "H100", MIB_80G, None, True, split=split)
        for i in range(n)
    ]
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "annotations": {"nodelock.io/gpus": format_inventory(gpus)},
        },
        "status": {"allocatable": {"nvidia.com/gpu": str(n * split)}},
    }


def pod_obj(
    name: str,
    *,
    gpus: int = 1,
    node: str | None = None,
    assigned: list[str] | None = None,
    **sharing: str,
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)}
    limits.update({f"nvidia.com/{k.replace('_', '-')}": v for k, v in sharing.items()})
    annotations = {}
    if assigned is not None:
        annotations["nodelock.io/assignment"] = json.dumps({"main": assigned})
        annotations["nodelock.io/token"] = "1"
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def picture(*pods: dict[str, Any], split: int = 4) -> NodeGPUs:
    cache = ClusterCache()
    cache.replace_nodes([node_obj(split=split)])
    cache.replace_pods(list(pods))
    got = cache.node_gpus(NODE)
    assert got is not None
    return got


def need(**kw: Any) -> PodNeed:
    return pod_need(pod_obj("new", **kw), "nvidia.com/gpu")


A, B = "GPU-n1-0", "GPU-n1-1"


def test_four_slices_per_gpu_then_the_node_is_full_with_a_reason() -> None:
    placed: list[dict[str, Any]] = []
    for i in range(8):
        pic = picture(*placed)
        got = choose(pic, need(gpumem="20000"))
        placed.append(
            pod_obj(f"p{i}", node=NODE, assigned=list(got[ContainerName("main")]), gpumem="20000")
        )
    per_gpu = [
        sum(1 for p in placed if A in p["metadata"]["annotations"]["nodelock.io/assignment"]),
        0,
    ]
    per_gpu[1] = 8 - per_gpu[0]
    assert per_gpu == [4, 4]
    verdict = fit(picture(*placed), need(gpumem="20000"))
    assert verdict.fit is Fit.NO_ROOM
    assert "all 4 slices in use" in verdict.reason
    assert score(picture(*placed), need(gpumem="20000"), Policy.BINPACK) == 0


def test_whole_gpu_pod_only_on_a_gpu_with_nothing_committed() -> None:
    one = pod_obj("s", node=NODE, assigned=[A], gpumem="1000")
    got = choose(picture(one), need())
    assert got == {"main": [DeviceID(B)]}
    whole = pod_obj("w", node=NODE, assigned=[B])
    verdict = fit(picture(one, whole), need())
    assert verdict.fit is Fit.NO_ROOM
    # a slice still fits beside the slice, never beside the whole GPU
    assert choose(picture(one, whole), need(gpumem="1000")) == {"main": [DeviceID(A)]}


def test_the_bind_confirm_sees_an_over_committed_gpu() -> None:
    held = [pod_obj(f"p{i}", node=NODE, assigned=[A], gpumem="30000") for i in range(2)]
    assignment = {ContainerName("main"): [DeviceID(A)]}
    problems = conflicts(assignment, picture(*held), need(gpumem="30000"))
    assert problems == [f"{A} has no room for 30000 MiB and 0% cores (21920 of 81920 MiB free)"]
    assert conflicts(assignment, picture(*held), need(gpumem="20000")) == []
    # a whole GPU conflicts with any slice on it
    assert conflicts(assignment, picture(held[0]), need()) != []


def test_unknown_devices_in_taken_count_as_whole() -> None:
    pic = replace(picture(), taken=frozenset({DeviceID(A)}))  # a lock holder's, size unknown
    assert choose(pic, need(gpumem="10")) == {"main": [DeviceID(B)]}


def test_binpack_scores_the_fuller_node_higher_and_spread_the_emptier() -> None:
    empty = picture()
    half = picture(pod_obj("p", node=NODE, assigned=[A], gpumem="40000"))
    n = need(gpumem="10000")
    assert score(half, n, Policy.BINPACK) > score(empty, n, Policy.BINPACK)
    assert score(half, n, Policy.SPREAD) < score(empty, n, Policy.SPREAD)


def test_a_whole_gpu_pod_goes_to_a_sharing_node_last() -> None:
    """kube-scheduler counts a whole GPU there as one virtual device: whole-GPU pods would race
    for the node's last GPUs unseen, so such a node scores lowest of the fitting ones."""
    whole = need()
    for policy in Policy:
        assert score(picture(), whole, policy) == 1  # fits, lowest
        assert score(picture(split=1), whole, policy) > 1  # the same GPUs, not shared
    full = picture(pod_obj("p", node=NODE, assigned=[A, B], gpumem="80000"))
    assert score(full, whole, Policy.BINPACK) == 0  # does not fit: still 0


def test_fit_keys_tell_different_commitments_apart() -> None:
    empty = picture()
    half = picture(pod_obj("p", node=NODE, assigned=[A], gpumem="40000"))
    assert empty.fit_key != half.fit_key


def test_slices_on_a_node_without_sharing_never_fit() -> None:
    verdict = fit(picture(split=1), need(gpumem="1000"))
    assert verdict.fit is Fit.NEVER
    assert "does not share GPUs" in verdict.reason
    with pytest.raises(NoFit, match="does not share"):
        choose(picture(split=1), need(gpucores="10"))
    # whole GPUs there keep the whole-GPU rules
    assert choose(picture(split=1), need()) == {"main": [DeviceID(A)]}


def test_bad_input_has_a_reason() -> None:
    too_big = fit(picture(), need(gpumem="100000"))
    assert too_big.fit is Fit.NEVER
    assert "the largest GPU here has 81920 MiB" in too_big.reason
    # a bad request is a reason on every node (kube-scheduler shows it), nothing is chosen
    for bad, words in [
        (need(gpucores="101"), "over 100"),
        (pod_need(pod_obj("x", gpus=0, gpumem="10"), "nvidia.com/gpu"), "no nvidia.com/gpu"),
    ]:
        assert bad.wants_gpus
        verdict = fit(picture(), bad)
        assert verdict.fit is Fit.NEVER
        assert words in verdict.reason
        assert score(picture(), bad, Policy.BINPACK) == 0
        with pytest.raises(NoFit, match=words.replace(".", r"\.")):
            choose(picture(), bad)


def test_two_gpus_are_distinct_physical_gpus() -> None:
    got = choose(picture(), need(gpus=2, gpumem="1000"))
    assert sorted(got[ContainerName("main")]) == [DeviceID(A), DeviceID(B)]
    verdict = fit(picture(), need(gpus=3, gpumem="1000"))
    assert verdict.fit is Fit.NEVER
