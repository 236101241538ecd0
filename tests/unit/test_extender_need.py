"""A pod's GPU need: quantities, effective request, kubelet's device reuse across containers."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from handoff.request import BadPod, ContainerKind, ContainerNeed, parse_quantity
from handoff.wire import Keys
from scheduler_ext.need import NO_GPUS, NeedMemo, plan_slots, pod_need

GPU = "nvidia.com/gpu"


def container(name: str, gpus: int | str | None = None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "busybox", **extra}
    if gpus is not None:
        c["resources"] = {"limits": {GPU: str(gpus)}, "requests": {GPU: str(gpus)}}
    return c


def pod(*apps: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(apps)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": spec}


@pytest.mark.parametrize(
    ("raw", "value"),
    [("0", 0), ("1", 1), ("8", 8), (4, 4), ("1k", 1000), ("1e2", 100), ("2000m", 2), ("1Ki", 1024)],
)
def test_quantity_whole_numbers(raw: object, value: int) -> None:
    assert parse_quantity(raw, what="x") == value


@pytest.mark.parametrize("raw", ["1.5", "500m", "-1", "", "abc", "1 ", "1x", None, True, 1.0, "2E"])
def test_quantity_rejects_what_gpus_cannot_be(raw: object) -> None:
    with pytest.raises(BadPod):
        parse_quantity(raw, what="containers[0]")


def test_pod_without_gpus_needs_none() -> None:
    assert pod_need(pod(container("a"), container("b", 0)), GPU) is NO_GPUS
    assert not NO_GPUS.wants_gpus


def test_app_containers_add_up_and_get_disjoint_slots() -> None:
    need = pod_need(pod(container("a", 2), container("b"), container("c", 3)), GPU)
    assert need.total == 5
    assert need.plan == (("a", (0, 1)), ("c", (2, 3, 4)))


def test_limits_only_counts_as_request() -> None:
    c = {"name": "a", "resources": {"limits": {GPU: "2"}}}
    assert pod_need(pod(c), GPU).total == 2


def test_effective_request_is_max_of_init_and_sum_of_apps() -> None:
    # init 3 > apps 1+1: the pod occupies 3 GPUs; the apps reuse the init container's devices
    need = pod_need(pod(container("a", 1), container("b", 1), init=(container("i", 3),)), GPU)
    assert need.total == 3
    assert need.plan == (("i", (0, 1, 2)), ("a", (0,)), ("b", (1,)))
    # init 1 < apps 2+2: 4 GPUs, the init container's device goes to the first app container
    need = pod_need(pod(container("a", 2), container("b", 2), init=(container("i", 1),)), GPU)
    assert need.total == 4
    assert need.plan == (("i", (0,)), ("a", (0, 1)), ("b", (2, 3)))


def test_successive_init_containers_reuse_each_others_devices() -> None:
    need = pod_need(pod(container("app", 1), init=(container("i1", 2), container("i2", 3))), GPU)
    assert need.total == 3
    assert need.plan == (("i1", (0, 1)), ("i2", (0, 1, 2)), ("app", (0,)))


def test_sidecar_keeps_its_devices_for_the_pods_life() -> None:
    sidecar = container("side", 1, restartPolicy="Always")
    need = pod_need(pod(container("app", 2), init=(container("i", 2), sidecar)), GPU)
    # i gets {0,1}; the sidecar draws 0 from the pool and keeps it; app gets 1 plus a new one
    assert need.plan == (("i", (0, 1)), ("side", (0,)), ("app", (1, 2)))
    assert need.total == 3
    kinds = {c.name: c.kind for c in need.containers}
    assert kinds == {
        "i": ContainerKind.INIT,
        "side": ContainerKind.SIDECAR,
        "app": ContainerKind.APP,
    }


def test_sidecar_first_then_init_then_app() -> None:
    sidecar = container("side", 1, restartPolicy="Always")
    need = pod_need(pod(container("app", 2), init=(sidecar, container("i", 2))), GPU)
    assert need.plan == (("side", (0,)), ("i", (1, 2)), ("app", (1, 2)))
    assert need.total == 3  # the scheduler's formula: max(2 + 1, 2 + 1) = 3


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "at least one container"),
        ({"containers": "x"}, "must be a list"),
        ({"containers": [1]}, "must be an object"),
        ({"containers": [{"image": "x"}]}, "name"),
        ({"containers": [{"name": "a", "resources": []}]}, "resources"),
        ({"containers": [{"name": "a", "resources": {"limits": {GPU: "1.5"}}}]}, "whole"),
        ({"containers": [container("a", 1), container("a", 1)]}, "unique"),
        ({"containers": [container("a")], "initContainers": {"x": 1}}, "must be a list"),
    ],
)
def test_malformed_pods_are_refused_with_a_reason(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(BadPod, match=message):
        pod_need({"spec": spec}, GPU)


def test_missing_spec_is_refused() -> None:
    with pytest.raises(BadPod, match="spec"):
        pod_need({"metadata": {}}, GPU)


_kinds = st.sampled_from(list(ContainerKind))
_needs = st.lists(st.tuples(_kinds, st.integers(min_value=0, max_value=4)), min_size=1, max_size=6)


@given(_needs)
def test_plan_matches_kubelets_reuse_rules(raw: list[tuple[ContainerKind, int]]) -> None:
    inits: list[tuple[ContainerKind, int]] = [(k, n) for k, n in raw if k is not ContainerKind.APP]
    apps: list[tuple[ContainerKind, int]] = [(k, n) for k, n in raw if k is ContainerKind.APP]
    ordered = [ContainerNeed(f"c{i}", n, k) for i, (k, n) in enumerate(inits + apps)]  # type: ignore[arg-type]
    need = plan_slots(ordered)
    slots = dict(need.plan)
    counts = {c.name: c.count for c in ordered}
    # every container with a request gets exactly that many distinct slots
    for name, got in slots.items():
        assert len(got) == counts[name]
        assert len(set(got)) == len(got)
    assert all(c.name in slots for c in ordered if c.count)
    # the total is the number of distinct slots handed out, and it is never more than the sum
    used = {s for got in slots.values() for s in got}
    assert used == set(range(need.total))
    assert need.total <= sum(counts.values())
    # app containers (and sidecars) never share a slot with each other
    long_lived = [c.name for c in ordered if c.kind is not ContainerKind.INIT and c.count]
    for i, a in enumerate(long_lived):
        for b in long_lived[i + 1 :]:
            assert not set(slots[a]) & set(slots[b])
    # the total is at least the plain effective request (max of each init, sum of long-lived)
    biggest_init = max((n for k, n in inits if k is ContainerKind.INIT), default=0)
    assert need.total >= max(biggest_init, sum(counts[n] for n in long_lived))
    # deterministic
    assert plan_slots(ordered) == need


# ---- NeedMemo: the extender's pod_need, parsed once per containers and annotations ----------


def test_memo_answers_an_event_that_changed_status_or_node_from_the_first_parse() -> None:
    memo = NeedMemo(GPU, Keys())
    first = pod(container("a", 2))
    need = memo(first)
    later = {**first, "spec": {**first["spec"], "nodeName": "n1"}, "status": {"phase": "Running"}}
    assert memo(later) is need
    assert need == pod_need(later, GPU)
    assert (memo.hits, memo.misses) == (1, 1)


def test_memo_parses_again_when_containers_or_annotations_change() -> None:
    keys = Keys()
    memo = NeedMemo(GPU, keys)
    base = pod(container("a", 1))
    assert memo(base).total == 1
    more = pod(container("a", 3))
    assert memo(more).total == 3
    pinned = {**base, "metadata": {**base["metadata"], "annotations": {keys.gpu_model: "H100"}}}
    assert memo(pinned).wishes.models == ("H100",)
    assert memo(pinned) == pod_need(pinned, GPU, keys)
    sidecar = pod(container("a", 1), init=(container("s", 1, restartPolicy="Always"),))
    assert memo(sidecar) == pod_need(sidecar, GPU) != memo(base)
    assert memo.misses == 4


def test_memo_raises_the_same_refusal_every_time() -> None:
    keys = Keys()
    memo = NeedMemo(GPU, keys)
    bad = pod(container("a", "1.5"))
    for _ in range(2):
        with pytest.raises(BadPod, match="whole"):
            memo(bad)
    assert (memo.hits, memo.misses) == (1, 1)
    bad_wish = {**pod(container("a", 1)), "metadata": {"annotations": {keys.topology: "maybe"}}}
    with pytest.raises(BadPod, match="maybe"):
        memo(bad_wish)


def test_memo_keeps_at_most_its_size_least_recently_used_dropped() -> None:
    memo = NeedMemo(GPU, Keys(), size=2)
    one, two, three = (pod(container("a", n)) for n in (1, 2, 3))
    memo(one)
    memo(two)
    memo(one)  # two is now the least recently used
    memo(three)
    assert len(memo) == 2
    memo(one)
    assert memo.misses == 3  # one, two, three; one was kept
    memo(two)
    assert memo.misses == 4


def test_memo_parses_what_does_not_serialize_every_time() -> None:
    memo = NeedMemo(GPU, Keys())
    odd = pod(container("a", 1))
    odd["metadata"]["annotations"] = {1: "not a string key"}
    assert memo(odd) == pod_need(odd, GPU)
    assert memo(odd).total == 1
    assert (memo.hits, memo.misses, len(memo)) == (0, 0, 0)
    with pytest.raises(BadPod, match="spec"):
        memo({"metadata": {}})
