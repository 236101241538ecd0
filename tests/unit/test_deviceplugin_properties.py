"""Property tests of the Allocate decision for invariant S2.

S2: no container is started with devices other than its pod's assignment — whatever kubelet asks,
in whatever order, and whatever the pod owner writes on their own pod.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.decide import (
    Allocation,
    Context,
    HandoffProgress,
    MismatchPolicy,
    decide_allocate,
    known_devices,
)
from handoff.wire import ContainerName, DeviceID, format_assignment
from lockd.model import FencingToken, Holder, HolderKey, LockRecord, NodeLockView, NodeName

NODE = NodeName("n1")
GPUS = [DeviceID(f"GPU-{i}") for i in range(8)]
CTX = Context(node=NODE, devices=known_devices(GPUS))
TOKEN = FencingToken(3)
Plan = list[tuple[str, list[DeviceID]]]


@st.composite
def handoffs(draw: st.DrawFn) -> tuple[dict[str, Any], NodeLockView, Plan]:
    """A holder pod with 1-4 GPU containers (some init), its Lease, and its spec-order plan."""
    n_init = draw(st.integers(0, 2))
    n_main = draw(st.integers(1, 3))
    names = [f"c{i}" for i in range(n_init + n_main)]
    plan: Plan = []
    for name in names:
        count = draw(st.integers(1, 3))
        plan.append((name, list(draw(st.permutations(GPUS))[:count])))
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
@given(handoffs(), requests, st.sampled_from(list(MismatchPolicy)))
def test_served_devices_are_always_the_leased_assignment_in_spec_order(
    h: tuple[dict[str, Any], NodeLockView, Plan],
    asks: list[list[DeviceID]],
    policy: MismatchPolicy,
) -> None:
    pod, view, plan = h
    progress: HandoffProgress | None = None
    served: list[str] = []
    for ask in [*asks, *[ids for _, ids in plan]]:  # random asks, then what kubelet would ask
        result = decide_allocate(view, pod, ask, progress, CTX, policy=policy)
        if not isinstance(result, Allocation):
            continue
        expected_name, expected_ids = plan[len(served)]
        assert result.container == expected_name
        assert list(result.devices) == expected_ids
        assert len(ask) == len(expected_ids)
        if policy is MismatchPolicy.REFUSE:
            assert set(ask) == set(expected_ids)
        served.append(result.container)
        progress = result.progress
        assert result.last == (len(served) == len(plan))
    assert served == [n for n, _ in plan]  # kubelet's own asks were all served, in order


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
