"""The extender's MIG choice: plain data in (inventory rows, pods), plain data out."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from deviceplugin.simulated import SimSpec, inventory
from handoff.request import BadPod
from handoff.wire import ContainerName, DeviceID, Keys, format_assignment, format_inventory
from lockd.model import NodeName
from scheduler_ext.cache import node_gpus
from scheduler_ext.choose import Fit, NodeGPUs, NoFit, Policy, choose, conflicts, fit, score
from scheduler_ext.mig import MigNeed, choice
from scheduler_ext.need import pod_need
from scheduler_ext.state import node_state, pod_state

NODE = NodeName("n1")
KEYS = Keys()
# GPU 0: 3g.40gb + 2g.20gb + 2 x 1g.10gb; GPU 1: 7 x 1g.10gb; GPU 2: whole
DEVICES = inventory(
    NODE, SimSpec(count=3, mig=((0, "3g.40gb+2g.20gb+2x1g.10gb"), (1, "7x1g.10gb")))
)
WHOLE = tuple(g for g in DEVICES if not g.profile)
INSTANCES = tuple(g for g in DEVICES if g.profile)


def of(profile: str, parent_index: int | None = None) -> list[DeviceID]:
    """The instances of ``profile`` in the extender's order (parent index, then ID)."""
    return [
        g.id
        for g in sorted(INSTANCES, key=lambda g: (g.index, g.id))
        if g.profile == profile and (parent_index is None or g.index == parent_index)
    ]


def pod(*containers: dict[str, int], init: dict[str, int] | None = None) -> dict[str, Any]:
    def box(i: int, limits: dict[str, int], prefix: str = "c") -> dict[str, Any]:
        return {
            "name": f"{prefix}{i}",
            "resources": {"limits": {k: str(v) for k, v in limits.items()}},
        }

    spec: dict[str, Any] = {"containers": [box(i, c) for i, c in enumerate(containers)]}
    if init is not None:
        spec["initContainers"] = [box(0, init, "init")]
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": spec}


def picture(taken: tuple[DeviceID, ...] = ()) -> NodeGPUs:
    return NodeGPUs(
        node=NODE,
        devices=WHOLE,
        taken=frozenset(taken),
        allocatable=len(WHOLE),
        mig=INSTANCES,
    )


C = ContainerName
MIG1 = "nvidia.com/mig-1g.10gb"
MIG3 = "nvidia.com/mig-3g.40gb"


def test_need_plans_each_profile_like_kubelet() -> None:
    need = pod_need(
        pod({MIG1: 2}, {MIG1: 1, "nvidia.com/gpu": 1}, init={MIG1: 3}), "nvidia.com/gpu"
    )
    assert need.total == 1
    assert need.wants_gpus
    (mig,) = need.mig
    # the init container's three instances are reused by the app containers (2 + 1)
    assert mig == MigNeed(
        "1g.10gb",
        MIG1,
        3,
        ((C("init0"), (0, 1, 2)), (C("c0"), (0, 1)), (C("c1"), (2,))),
    )
    only = pod_need(pod({MIG3: 1}), "nvidia.com/gpu")
    assert only.total == 0
    assert only.wants_gpus
    assert not pod_need(pod({"cpu": 1}), "nvidia.com/gpu").wants_gpus
    with pytest.raises(BadPod, match="names no MIG profile"):
        pod_need(pod({"nvidia.com/mig-big": 1}), "nvidia.com/gpu")


def test_whole_gpu_in_mig_mode_is_never_chosen_as_a_whole_gpu() -> None:
    need = pod_need(pod({"nvidia.com/gpu": 2}), "nvidia.com/gpu")
    verdict = fit(picture(), need)
    assert verdict.fit is Fit.NEVER
    assert "1 healthy GPUs" in verdict.reason
    one = choose(picture(), pod_need(pod({"nvidia.com/gpu": 1}), "nvidia.com/gpu"))
    assert one == {"c0": [WHOLE[0].id]}


def test_instances_of_the_asked_profile_free_first_in_order() -> None:
    need = pod_need(pod({MIG1: 2}, {MIG3: 1}), "nvidia.com/gpu")
    got = choose(picture(), need)
    assert got == {"c0": of("1g.10gb")[:2], "c1": of("3g.40gb")}
    taken = (of("1g.10gb")[0], of("3g.40gb")[0])
    verdict = fit(picture(taken), pod_need(pod({MIG3: 1}), "nvidia.com/gpu"))
    assert verdict.fit is Fit.NO_ROOM
    assert "0 free nvidia.com/mig-3g.40gb instances of 1" in verdict.reason
    got = choose(picture(taken), pod_need(pod({MIG1: 2}), "nvidia.com/gpu"))
    assert got == {"c0": of("1g.10gb")[1:3]}
    assert taken[0] not in got[C("c0")]


def test_more_instances_than_exist_never_fit_and_other_profiles_do_not_count() -> None:
    need = pod_need(pod({MIG1: 10}), "nvidia.com/gpu")
    verdict = fit(picture(), need)
    assert verdict.fit is Fit.NEVER
    assert "9 healthy nvidia.com/mig-1g.10gb instances, pod needs 10" in verdict.reason
    with pytest.raises(NoFit):
        choose(picture(), need)
    absent = fit(picture(), pod_need(pod({"nvidia.com/mig-7g.80gb": 1}), "nvidia.com/gpu"))
    assert absent.fit is Fit.NEVER
    assert score(picture(), need, Policy.BINPACK) == 0


def test_whole_gpu_and_instances_in_one_assignment() -> None:
    need = pod_need(pod({"nvidia.com/gpu": 1, MIG1: 1}), "nvidia.com/gpu")
    assert choose(picture(), need) == {"c0": [WHOLE[0].id, of("1g.10gb")[0]]}
    # the whole GPU taken: the pod does not fit, whatever instances are free
    assert fit(picture((WHOLE[0].id,)), need).fit is Fit.NO_ROOM


def test_unhealthy_instances_are_not_chosen() -> None:
    instances = [
        replace(g, healthy=False) if g.profile == "1g.10gb" and g.index == 0 else g
        for g in INSTANCES
    ]
    needs = pod_need(pod({MIG1: 1}), "nvidia.com/gpu").mig
    assert choice(instances, frozenset(), needs) == {"c0": [of("1g.10gb", 1)[0]]}


def test_conflicts_name_taken_and_unknown_devices() -> None:
    a = {ContainerName("c0"): [of("1g.10gb")[0], WHOLE[0].id, DeviceID("MIG-unknown")]}
    problems = conflicts(a, picture((of("1g.10gb")[0],)))
    assert problems == [
        f"{of('1g.10gb')[0]} (nvidia.com/mig-1g.10gb) is assigned to another pod",
        "MIG-unknown is not in the node's inventory",
    ]
    assert conflicts({ContainerName("c0"): [of("1g.10gb")[1]]}, picture()) == []


def test_score_mig_only_pods_by_instances_of_their_profile() -> None:
    need = pod_need(pod({MIG1: 1}), "nvidia.com/gpu")
    empty = score(picture(), need, Policy.BINPACK)
    fuller = score(picture(tuple(of("1g.10gb")[:6])), need, Policy.BINPACK)
    assert 1 <= empty < fuller <= 10
    assert score(picture(), need, Policy.SPREAD) > score(
        picture(tuple(of("1g.10gb")[:6])), need, Policy.SPREAD
    )


def test_fit_key_tells_nodes_with_other_free_instances_apart() -> None:
    assert picture().fit_key != picture((of("3g.40gb")[0],)).fit_key
    assert picture().fit_key == picture().fit_key


def test_node_picture_from_the_published_inventory_and_assignments() -> None:
    node_obj = {
        "metadata": {"name": NODE, "annotations": {KEYS.gpus: format_inventory(DEVICES)}},
        "status": {"allocatable": {"nvidia.com/gpu": "1", MIG1: "9"}},
    }
    node = node_state(node_obj, keys=KEYS, resource="nvidia.com/gpu")
    assert node.problem is None
    holder = pod({MIG1: 1})
    holder["spec"]["nodeName"] = NODE
    holder["metadata"]["annotations"] = {
        KEYS.assignment: format_assignment({ContainerName("c0"): [of("1g.10gb")[0]]})
    }
    gpus = node_gpus(node, [pod_state(holder, keys=KEYS, resource="nvidia.com/gpu")])
    assert gpus.devices == WHOLE
    assert set(gpus.mig) == set(INSTANCES)
    assert gpus.taken == {of("1g.10gb")[0]}
    assert gpus.capacity == 1
    assert choose(gpus, pod_need(pod({MIG1: 1}), "nvidia.com/gpu")) == {"c0": [of("1g.10gb")[1]]}
