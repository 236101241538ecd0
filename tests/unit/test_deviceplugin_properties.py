"""Property tests of the Allocate decision for invariant S2.

S2: no container is started with devices other than its pod's assignment — whatever kubelet asks,
in whatever order, and whatever the pod owner writes on their own pod.
"""

from __future__ import annotations

from random import Random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.decide import (
    Allocation,
    Context,
    HandoffProgress,
    MismatchPolicy,
    decide_allocate,
    decide_preferred,
)
from handoff.wire import ContainerName, DeviceID, format_assignment
from lockd.model import FencingToken, Holder, HolderKey, LockRecord, NodeLockView, NodeName

NODE = NodeName("n1")
GPUS = [DeviceID(f"GPU-{i}") for i in range(8)]
CTX = Context(node=NODE, devices=dict.fromkeys(GPUS, True))
TOKEN = FencingToken(3)
Plan = list[tuple[str, list[DeviceID]]]


@st.composite
def handoffs(draw: st.DrawFn) -> tuple[dict[str, Any], NodeLockView, Plan]:
    """A holder pod with 1-4 GPU containers (some init), its Lease, and its spec-order plan."""
    n_init = draw(st.integers(0, 2))
    n_main = draw(st.integers(1, 3))
    names = [f"c{i}" for i in range(n_init + n_main)]
    plan: Plan = []
    kept = list(draw(st.permutations(GPUS)))  # app containers get disjoint devices
    for i, name in enumerate(names):
        count = draw(st.integers(1, 3))
        if i < n_init:  # an init container runs alone: any devices (kubelet reuses them later)
            plan.append((name, list(draw(st.permutations(GPUS))[:count])))
        else:
            plan.append((name, kept[:count]))
            kept = kept[count:]
    gpu_names = set(draw(st.sets(st.sampled_from(names), min_size=1)))
    plan = [(n, ids) for n, ids in plan if n in gpu_names]
    order = draw(st.permutations([n for n, _ in plan]))  # JSON key order need not be spec order
    assignment = {ContainerName(n): [DeviceID(d) for d in dict(plan)[n]] for n in order}
    value = format_assignment(assignment)

    def container(name: str) -> dict[str, Any]:
        c: dict[str, Any] = {"name": name}
        if name in gpu_names:
            c["resources"] = {"limits": {"nvidia.com/gpu": str(len(dict(plan)[name]))}}
        return c

    pod = {
        "metadata": {
            "namespace": "ns",
            "name": "p",
            "uid": "u",
            "annotations": {"nodelock.io/assignment": value, "nodelock.io/token": str(TOKEN)},
        },
        "spec": {
            "nodeName": NODE,
            "initContainers": [container(n) for n in names[:n_init]],
            "containers": [container(n) for n in names[n_init:]],
        },
    }
    holder = Holder(HolderKey("ns/p"), "u", {"assignment": value})
    view = NodeLockView(LockRecord(NODE, holder, TOKEN, 15, None, None, "1"), 0.0, expired=False)
    return pod, view, plan


requests = st.lists(
    st.lists(st.sampled_from(GPUS), min_size=1, max_size=4, unique=True), max_size=8
)


@settings(max_examples=300, deadline=None)
@given(handoffs(), requests, st.sampled_from(list(MismatchPolicy)), st.randoms())
def test_served_devices_are_always_the_pods_own_and_never_shared(
    h: tuple[dict[str, Any], NodeLockView, Plan],
    asks: list[list[DeviceID]],
    policy: MismatchPolicy,
    rnd: Random,
) -> None:
    """Whatever kubelet asks, a container gets only devices of its pod's assignment, kubelet's
    own pick when it is one (``refuse``), in spec order; app containers never share a device;
    and kubelet's own walk (reuse pool first, in any order, then the preference) is served."""
    pod, view, plan = h
    pods_devices = {d for _, ids in plan for d in ids}
    init_names = {c["name"] for c in pod["spec"]["initContainers"]}
    progress: HandoffProgress | None = None
    served: list[str] = []
    kept: dict[DeviceID, str] = {}  # device -> app container that keeps it

    def check(result: Allocation, ask: list[DeviceID]) -> None:
        nonlocal progress
        expected_name, expected_ids = plan[len(served)]
        assert result.container == expected_name
        assert len(result.devices) == len(ask) == len(expected_ids)
        assert set(result.devices) <= pods_devices
        if policy is MismatchPolicy.REFUSE:
            assert set(result.devices) == set(ask)
        if expected_name not in init_names:
            for dev in result.devices:
                assert dev not in kept, (dev, kept)
                kept[dev] = expected_name
        served.append(result.container)
        progress = result.progress
        assert result.last == (len(served) == len(plan))

    for ask in asks:  # random asks first
        result = decide_allocate(view, pod, ask, progress, CTX, policy=policy)
        if isinstance(result, Allocation):
            check(result, ask)
    # then kubelet's device manager: the reuse pool first (Go map order), then the preference
    reuse: set[DeviceID] = set()
    allocated: set[DeviceID] = set(kept)
    for name, ids in plan[len(served) :]:
        taken = rnd.sample(sorted(reuse), min(len(ids), len(reuse)))
        if len(taken) < len(ids):
            available = [d for d in GPUS if d not in allocated or d in taken]
            pref = decide_preferred(view, pod, available, taken, len(ids), progress, CTX)
            assert pref.hit, pref.reason
            assert set(taken) <= set(pref.devices)
            taken = list(pref.devices)
        result = decide_allocate(view, pod, taken, progress, CTX, policy=policy)
        assert isinstance(result, Allocation), result
        check(result, taken)
        allocated |= set(taken)
        if name in init_names:
            reuse |= set(taken)
        else:
            reuse -= set(taken)
    assert served == [n for n, _ in plan]


@settings(max_examples=300, deadline=None)
@given(handoffs(), st.lists(st.sampled_from(GPUS), min_size=1, max_size=3, unique=True))
def test_an_edited_pod_annotation_is_never_served(
    h: tuple[dict[str, Any], NodeLockView, Plan],
    forged_ids: list[DeviceID],
) -> None:
    pod, view, plan = h
    name = plan[0][0]
    forged = format_assignment({ContainerName(name): forged_ids})
    if forged == pod["metadata"]["annotations"]["nodelock.io/assignment"]:
        return
    pod["metadata"]["annotations"]["nodelock.io/assignment"] = forged
    for policy in MismatchPolicy:
        result = decide_allocate(view, pod, forged_ids, None, CTX, policy=policy)
        assert not isinstance(result, Allocation)
