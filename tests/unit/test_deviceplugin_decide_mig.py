"""decide_allocate / decide_preferred for a plugin that serves whole GPUs and MIG instances.

One assignment names both (container -> whole-GPU UUIDs and MIG instance UUIDs); each call is
decided on the resource kubelet asked for, and the lock is released only after the last
container of every resource was served, in whatever order kubelet asks for the resources.
"""

from __future__ import annotations

from typing import Any

from deviceplugin.checkpoint import Checkpoint, from_json, to_json
from deviceplugin.decide import (
    Allocation,
    Context,
    HandoffProgress,
    MismatchPolicy,
    Refusal,
    RefusalKind,
    decide_allocate,
    decide_preferred,
)
from handoff.wire import DEFAULT_RESOURCE, ContainerName, DeviceID
from lockd.model import HolderKey
from tests.unit.test_deviceplugin_decide import NODE, TOKEN, UID, assignment_of, lease, pod

GPU = [DeviceID(f"GPU-{i:02d}") for i in range(2)]
MIG = [DeviceID(f"MIG-{i:02d}") for i in range(4)]
MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_3G = "nvidia.com/mig-3g.40gb"
RESOURCE_OF = {
    **dict.fromkeys(GPU, DEFAULT_RESOURCE),
    MIG[0]: MIG_1G,
    MIG[1]: MIG_1G,
    MIG[2]: MIG_1G,
    MIG[3]: MIG_3G,
}
C = ContainerName


def ctx(resource: str, *, sick: frozenset[DeviceID] = frozenset()) -> Context:
    """What the plugin's Admission builds for a call on ``resource``."""
    return Context(
        node=NODE,
        devices={d: d not in sick for d, r in RESOURCE_OF.items() if r == resource},
        resource=resource,
        others={d: r for d, r in RESOURCE_OF.items() if r != resource},
    )


def box(name: str, **limits: int) -> dict[str, Any]:
    names = {"gpu": DEFAULT_RESOURCE, "mig1g": MIG_1G, "mig3g": MIG_3G}
    return {
        "name": name,
        "image": "x",
        "resources": {"limits": {names[k]: str(v) for k, v in limits.items()}},
    }


def served(result: Allocation | Refusal) -> Allocation:
    assert isinstance(result, Allocation), result
    return result


def refused(result: Allocation | Refusal, kind: RefusalKind) -> Refusal:
    assert isinstance(result, Refusal), result
    assert result.kind is kind, result
    return result


def test_mig_only_pod_is_served_its_instance_and_released() -> None:
    a = assignment_of(main=[MIG[1]])
    p = pod(a, containers=[box("main", mig1g=1)])
    got = served(
        decide_allocate(lease(a), p, [MIG[2]], None, ctx(MIG_1G), policy=MismatchPolicy.ASSIGNMENT)
    )
    # kubelet's pick of another free instance: the assignment's, by policy as for whole GPUs
    assert got.devices == (MIG[1],)
    assert got.kubelet_differs
    got = served(decide_allocate(lease(a), p, [MIG[1]], None, ctx(MIG_1G)))
    assert got.devices == (MIG[1],)
    assert not got.kubelet_differs
    assert got.last
    assert got.progress.resources == (MIG_1G,)
    assert got.progress.of_resource(MIG_1G).served == (C("main"),)
    assert got.progress.of_resource(DEFAULT_RESOURCE).served == ()


def test_default_policy_refuses_another_instance_than_assigned() -> None:
    a = assignment_of(main=[MIG[1]])
    p = pod(a, containers=[box("main", mig1g=1)])
    refused(
        decide_allocate(lease(a), p, [MIG[2]], None, ctx(MIG_1G), policy=MismatchPolicy.REFUSE),
        RefusalKind.DEVICES_MISMATCH,
    )


def test_whole_gpu_and_mig_in_one_pod_release_after_both_in_either_order() -> None:
    a = assignment_of(train=[GPU[0], MIG[0]], side=[MIG[3]])
    p = pod(a, containers=[box("train", gpu=1, mig1g=1), box("side", mig3g=1)])
    for order in ([DEFAULT_RESOURCE, MIG_1G, MIG_3G], [MIG_1G, DEFAULT_RESOURCE, MIG_3G]):
        progress: HandoffProgress | None = None
        wanted = {DEFAULT_RESOURCE: [GPU[0]], MIG_1G: [MIG[0]], MIG_3G: [MIG[3]]}
        for i, resource in enumerate(order):
            got = served(decide_allocate(lease(a), p, wanted[resource], progress, ctx(resource)))
            assert got.devices == tuple(wanted[resource])
            assert got.last == (i == len(order) - 1), (order, resource)
            progress = got.progress
        assert progress is not None
        assert progress.served == (C("train"), C("train"), C("side"))
        assert progress.resources == tuple(order)
        # every resource served: one more call is refused, never served twice
        refused(
            decide_allocate(lease(a), p, [MIG[0]], progress, ctx(MIG_1G)), RefusalKind.ALL_SERVED
        )


def test_the_lock_is_not_released_before_a_lost_resource_is_asked_again() -> None:
    """Container "train" asks for a GPU and a 1g instance.  kubelet died after the plugin
    answered its 1g call, before writing its checkpoint (once per container), restarted and
    asks for its GPU first.  The lost 1g entry no longer counts (kubelet holds no devices of
    it), so the GPU answer is not the last: the lock stays held for the 1g call to come, which
    gets its instance and releases it."""
    a = assignment_of(train=[GPU[0], MIG[0]])
    p = pod(a, containers=[box("train", gpu=1, mig1g=1)])
    first = served(decide_allocate(lease(a), p, [MIG[0]], None, ctx(MIG_1G)))
    assert not first.last

    def gpu_call(held_1g: set[ContainerName]) -> Allocation | Refusal:
        """kubelet asks for the GPU with no checkpoint record, holding ``held_1g``'s instance."""
        return decide_allocate(
            lease(a),
            p,
            [GPU[0]],
            first.progress,
            ctx(DEFAULT_RESOURCE),
            recorded={},
            held_other={MIG_1G: held_1g},
        )

    gpu = served(gpu_call(set()))
    assert not gpu.last
    again = served(decide_allocate(lease(a), p, [MIG[0]], gpu.progress, ctx(MIG_1G), recorded={}))
    assert again.devices == (MIG[0],)
    assert again.last
    # the same GPU call asked of the kubelet that holds the 1g answer (no restart): the last
    assert served(gpu_call({C("train")})).last


def test_whole_gpu_call_ignores_instances_and_checks_its_own_count() -> None:
    a = assignment_of(main=[GPU[0], MIG[0]])
    p = pod(a, containers=[box("main", gpu=1, mig1g=1)])
    got = served(decide_allocate(lease(a), p, [GPU[0]], None, ctx(DEFAULT_RESOURCE)))
    assert got.devices == (GPU[0],)
    assert not got.last
    assert got.progress.resources == ()  # whole GPUs only so far: nothing new recorded
    # kubelet asking a MIG instance for a container that has none of that profile
    bad = assignment_of(main=[GPU[0], MIG[3]])
    p = pod(bad, containers=[box("main", gpu=1, mig1g=1)])
    refused(decide_allocate(lease(bad), p, [MIG[0]], None, ctx(MIG_1G)), RefusalKind.SPEC_MISMATCH)


def test_instance_of_another_profile_or_unknown_is_refused() -> None:
    # the assignment gives a 3g instance to a container asking for a 1g one
    a = assignment_of(main=[MIG[3]])
    p = pod(a, containers=[box("main", mig1g=1)])
    r = refused(
        decide_allocate(lease(a), p, [MIG[0]], None, ctx(MIG_1G)), RefusalKind.SPEC_MISMATCH
    )
    assert r.release is not None
    a = assignment_of(main=[DeviceID("MIG-gone")])
    p = pod(a, containers=[box("main", mig1g=1)])
    refused(decide_allocate(lease(a), p, [MIG[0]], None, ctx(MIG_1G)), RefusalKind.UNKNOWN_DEVICE)


def test_unhealthy_instance_is_refused() -> None:
    a = assignment_of(main=[MIG[0]])
    p = pod(a, containers=[box("main", mig1g=1)])
    refused(
        decide_allocate(lease(a), p, [MIG[0]], None, ctx(MIG_1G, sick=frozenset({MIG[0]}))),
        RefusalKind.UNHEALTHY,
    )


def test_preferred_steers_kubelet_to_the_assigned_instance() -> None:
    a = assignment_of(main=[GPU[1], MIG[2]])
    p = pod(a, containers=[box("main", gpu=1, mig1g=1)])
    pref = decide_preferred(lease(a), p, [MIG[0], MIG[1], MIG[2]], [], 1, None, ctx(MIG_1G))
    assert pref.hit
    assert pref.devices == (MIG[2],)
    pref = decide_preferred(lease(a), p, GPU, [], 1, None, ctx(DEFAULT_RESOURCE))
    assert pref.hit
    assert pref.devices == (GPU[1],)


def test_progress_of_several_resources_survives_the_checkpoint() -> None:
    a = assignment_of(main=[GPU[0], MIG[0]])
    p = pod(a, containers=[box("main", gpu=1, mig1g=1)])
    first = served(decide_allocate(lease(a), p, [MIG[0]], None, ctx(MIG_1G)))
    cp = Checkpoint(NODE, first.progress)
    again = from_json(to_json(cp), NODE)
    assert again.progress == first.progress
    assert again.progress == HandoffProgress(
        HolderKey("ns/p"), UID, TOKEN, (C("main"),), ((MIG[0],),), (MIG_1G,)
    )
    last = served(decide_allocate(lease(a), p, [GPU[0]], again.progress, ctx(DEFAULT_RESOURCE)))
    assert last.last
    assert "resources" not in (
        to_json(
            Checkpoint(
                NODE, HandoffProgress(HolderKey("ns/p"), UID, TOKEN, (C("main"),), ((GPU[0],),))
            )
        )["progress"]
        or {}
    )


def test_call_for_a_resource_the_holder_does_not_ask_for_keeps_its_lock() -> None:
    """kubelet asks the whole-GPU endpoint while the holder asks for MIG instances only: the
    caller is another pod (bound around the extender), so the holder's lock stays."""
    a = assignment_of(main=[MIG[0]])
    p = pod(a, containers=[box("main", mig1g=1)])
    r = refused(
        decide_allocate(lease(a), p, [GPU[0]], None, ctx(DEFAULT_RESOURCE)),
        RefusalKind.COUNT_MISMATCH,
    )
    assert r.release is None
    assert "asks for no nvidia.com/gpu" in r.message
    # a holder that asks for nothing this plugin serves is broken: released as before
    none = pod(a, containers=[{"name": "main", "image": "x"}])
    r = refused(
        decide_allocate(lease(a), none, [GPU[0]], None, ctx(DEFAULT_RESOURCE)),
        RefusalKind.SPEC_MISMATCH,
    )
    assert r.release is not None
