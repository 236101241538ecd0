"""The audit's comparison of assignments, kubelet's PodResources and the plugin's answers."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from handoff.audit import (
    Disagreement,
    Kind,
    KubeletPod,
    NodeViews,
    PluginAnswer,
    PodRecord,
    answered_gpus,
    audit_node,
    confirmed,
    for_resource,
    pod_record,
    report_json,
    table,
)
from handoff.wire import Keys

NODE = "gpu-node-01"
INVENTORY = frozenset(f"GPU-{i}" for i in range(4))


def pod(
    name: str,
    assignment: Mapping[str, Sequence[str]] | None,
    *,
    phase: str = "Running",
    deleting: bool = False,
    init: Sequence[str] = (),
    raw: str | None = None,
    sliced: Sequence[str] = (),
) -> PodRecord:
    return PodRecord(
        namespace="ns",
        name=name,
        uid=f"uid-{name}",
        phase=phase,
        deleting=deleting,
        assignment_raw=raw
        if raw is not None
        else (
            None if assignment is None else json.dumps({c: list(v) for c, v in assignment.items()})
        ),
        init_containers=frozenset(init),
        sliced=frozenset(sliced),
    )


def listed(name: str, containers: Mapping[str, Sequence[str]]) -> KubeletPod:
    return KubeletPod("ns", name, {c: frozenset(v) for c, v in containers.items()})


def answer(name: str, container: str, kubelet: Sequence[str], said: Sequence[str]) -> PluginAnswer:
    return PluginAnswer(f"uid-{name}", container, frozenset(kubelet), frozenset(said))


def audit(
    pods: Sequence[PodRecord],
    kubelet: Sequence[KubeletPod] | None,
    answers: Sequence[PluginAnswer] | None = None,
) -> list[Disagreement]:
    return audit_node(NodeViews(NODE, pods, kubelet, "socket gone", answers, INVENTORY))


def kinds(found: Sequence[Disagreement]) -> list[tuple[Kind, str, str]]:
    return [(d.kind, d.pod, d.container) for d in found]


def test_all_agree() -> None:
    pods = [pod("a", {"c0": ["GPU-0", "GPU-1"]}), pod("b", {"c0": ["GPU-2"], "c1": ["GPU-3"]})]
    kubelet = [
        listed("a", {"c0": ["GPU-1", "GPU-0"]}),
        listed("b", {"c0": ["GPU-2"], "c1": ["GPU-3"], "sidecar-free": []}),
    ]
    answers = [answer("a", "c0", ["GPU-0", "GPU-1"], ["GPU-1", "GPU-0"])]
    assert audit(pods, kubelet, answers) == []


def test_kubelet_gave_other_devices_than_assigned() -> None:
    found = audit([pod("a", {"c0": ["GPU-0"]})], [listed("a", {"c0": ["GPU-1"]})])
    assert kinds(found) == [(Kind.KUBELET_DIFFERS, "ns/a", "c0")]
    assert found[0].devices == ("GPU-0", "GPU-1")
    assert "kubelet gave it [GPU-1], the assignment [GPU-0]" in found[0].detail


def test_one_device_in_two_live_pods() -> None:
    pods = [pod("a", {"c0": ["GPU-0"]}), pod("b", {"c0": ["GPU-1"]})]
    found = audit(pods, [listed("a", {"c0": ["GPU-0"]}), listed("b", {"c0": ["GPU-0"]})])
    assert (Kind.DEVICE_IN_TWO_PODS, "ns/a", "") in kinds(found)
    two = next(d for d in found if d.kind is Kind.DEVICE_IN_TWO_PODS)
    assert two.devices == ("GPU-0",)
    assert "ns/a and ns/b" in two.detail
    assert (Kind.KUBELET_DIFFERS, "ns/b", "c0") in kinds(found)


def test_a_finished_pod_holding_a_device_is_not_a_second_holder() -> None:
    pods = [pod("done", {"c0": ["GPU-0"]}, phase="Succeeded"), pod("b", {"c0": ["GPU-0"]})]
    kubelet = [listed("done", {"c0": ["GPU-0"]}), listed("b", {"c0": ["GPU-0"]})]
    assert audit(pods, kubelet) == []


def test_assigned_twice_among_live_pods() -> None:
    pods = [pod("a", {"c0": ["GPU-0"]}, phase="Pending"), pod("b", {"c0": ["GPU-0"]})]
    found = audit(pods, [listed("b", {"c0": ["GPU-0"]})])
    assert kinds(found) == [(Kind.ASSIGNED_TWICE, "ns/a", "")]


def test_running_pod_without_kubelet_record() -> None:
    found = audit([pod("a", {"c0": ["GPU-0"]})], [])
    assert kinds(found) == [(Kind.NO_KUBELET_RECORD, "ns/a", "")]
    # still Pending: admission may be under way, nothing to say yet
    assert audit([pod("a", {"c0": ["GPU-0"]}, phase="Pending")], [listed("a", {"c0": []})]) == []


def test_a_listed_pod_the_api_server_does_not_know_holding_devices_is_reported() -> None:
    """Issue 51: a static pod without a mirror pod that kubelet gave devices (F1 gave it the
    lock holder's) is named, and its devices count as held by it."""
    pods = [pod("a", {"c0": ["GPU-0"]})]
    kubelet = [listed("a", {"c0": ["GPU-0"]}), listed("static-n1", {"c": ["GPU-0"]})]
    found = audit(pods, kubelet)
    assert kinds(found) == [
        (Kind.DEVICE_IN_TWO_PODS, "ns/a", ""),
        (Kind.UNKNOWN_POD, "ns/static-n1", ""),
    ]
    unknown = found[1]
    assert unknown.devices == ("GPU-0",)
    assert "the API server has no such pod" in unknown.detail
    # listed without devices (admission under way, or refused): nothing to say
    assert audit(pods[:1], [listed("a", {"c0": ["GPU-0"]}), listed("s", {"c": []})]) == []


def test_kubelet_devices_without_assignment() -> None:
    found = audit([pod("a", None)], [listed("a", {"c0": ["GPU-0"]})])
    assert kinds(found) == [(Kind.NO_ASSIGNMENT, "ns/a", "")]


def test_malformed_assignment_is_reported() -> None:
    found = audit([pod("a", None, raw="{not json")], [listed("a", {"c0": ["GPU-0"]})])
    assert [d.kind for d in found] == [Kind.BAD_ASSIGNMENT, Kind.NO_ASSIGNMENT]


def test_device_outside_the_inventory() -> None:
    found = audit([pod("a", {"c0": ["GPU-9"]})], [listed("a", {"c0": ["GPU-9"]})])
    assert kinds(found) == [(Kind.UNKNOWN_DEVICE, "ns/a", "")]


def test_plugin_answer_differs_from_kubelet() -> None:
    pods = [pod("a", {"c0": ["GPU-0"]}), pod("b", {"c0": ["GPU-1"]})]
    kubelet = [listed("a", {"c0": ["GPU-0"]}), listed("b", {"c0": ["GPU-1"]})]
    found = audit(pods, kubelet, [answer("a", "c0", ["GPU-0"], ["GPU-2"])])
    assert kinds(found) == [(Kind.ANSWER_DIFFERS, "ns/a", "c0")]
    assert found[0].devices == ("GPU-0", "GPU-2")
    # an entry of a pod that is gone is kubelet's leftover, not a disagreement
    stale = [answer("gone", "c0", ["GPU-3"], ["GPU-1"])]
    assert audit(pods, kubelet, stale) == []


def test_init_container_reuse_is_judged_against_the_pods_devices() -> None:
    # init0 ran on GPU-0; kubelet reuses it for c0, whose own assignment said GPU-1
    p = pod("a", {"init0": ["GPU-0"], "c0": ["GPU-1"]}, init=["init0"])
    assert audit([p], [listed("a", {"c0": ["GPU-0"]})]) == []
    found = audit([p], [listed("a", {"c0": ["GPU-3"]})])
    assert kinds(found) == [(Kind.KUBELET_DIFFERS, "ns/a", "c0")]
    found = audit([p], [listed("a", {"c0": ["GPU-0", "GPU-1"]})])
    assert kinds(found) == [(Kind.KUBELET_DIFFERS, "ns/a", "c0")]


def test_container_assigned_but_not_given_while_running() -> None:
    p = pod("a", {"c0": ["GPU-0"], "c1": ["GPU-1"]})
    found = audit([p], [listed("a", {"c0": ["GPU-0"], "c1": []})])
    assert kinds(found) == [(Kind.KUBELET_DIFFERS, "ns/a", "c1")]


def test_pods_being_deleted_are_not_judged() -> None:
    p = pod("a", {"c0": ["GPU-0"]}, deleting=True)
    assert audit([p], []) == []


def test_unreachable_kubelet_is_a_finding() -> None:
    found = audit([pod("a", {"c0": ["GPU-0"]})], None)
    assert kinds(found) == [(Kind.KUBELET_UNREACHABLE, "", "")]
    assert found[0].detail == "socket gone"


def test_answered_gpus_reads_env_and_cdi_names() -> None:
    envs = {"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-0"}
    assert answered_gpus(envs, [], resource="nvidia.com/gpu") == frozenset({"GPU-0", "GPU-1"})
    cdi = ["nvidia.com/gpu=GPU-2", "other.com/x=y"]
    assert answered_gpus({}, cdi, resource="nvidia.com/gpu") == frozenset({"GPU-2"})
    assert answered_gpus({"OTHER": "1"}, [], resource="nvidia.com/gpu") is None


def test_confirmed_keeps_what_both_looks_saw() -> None:
    a = Disagreement(NODE, Kind.KUBELET_DIFFERS, "ns/a", "c0", ("GPU-0",), "first")
    b = Disagreement(NODE, Kind.NO_KUBELET_RECORD, "ns/b", "", ("GPU-1",), "")
    a2 = Disagreement(NODE, Kind.KUBELET_DIFFERS, "ns/a", "c0", ("GPU-0",), "second")
    assert confirmed([a, b], [a2]) == [a2]


# ---- a node that shares its GPUs: kubelet's virtual IDs <uuid>::<k> ---------------------------


def test_slices_of_one_gpu_agree_when_every_view_is_folded_to_its_gpu() -> None:
    pods = [
        pod("a", {"c0": ["GPU-0"]}, sliced=["c0"]),
        pod("b", {"c0": ["GPU-0"]}, sliced=["c0"]),
        pod("w", {"c0": ["GPU-1"]}),
    ]
    kubelet = [
        listed("a", {"c0": ["GPU-0::0"]}),
        listed("b", {"c0": ["GPU-0::3"]}),
        listed("w", {"c0": ["GPU-1::0"]}),
    ]
    answers = [
        answer("a", "c0", ["GPU-0::0"], ["GPU-0"]),
        answer("b", "c0", ["GPU-0::3"], ["GPU-0"]),
        answer("w", "c0", ["GPU-1::0"], ["GPU-1"]),
    ]
    assert audit(pods, kubelet, answers) == []


def test_a_gpu_held_whole_and_also_assigned_as_a_slice_is_assigned_twice() -> None:
    pods = [pod("w", {"c0": ["GPU-0"]}), pod("s", {"c0": ["GPU-0"]}, sliced=["c0"])]
    kubelet = [listed("w", {"c0": ["GPU-0::0"]}), listed("s", {"c0": ["GPU-0::1"]})]
    found = audit(pods, kubelet)
    assert kinds(found) == [(Kind.ASSIGNED_TWICE, "ns/s", "")]
    assert found[0].devices == ("GPU-0",)


def test_one_virtual_device_in_two_pods_is_found_on_kubelets_own_ids() -> None:
    pods = [pod("a", {"c0": ["GPU-0"]}, sliced=["c0"]), pod("b", {"c0": ["GPU-0"]}, sliced=["c0"])]
    kubelet = [listed("a", {"c0": ["GPU-0::2"]}), listed("b", {"c0": ["GPU-0::2"]})]
    found = audit(pods, kubelet)
    assert kinds(found) == [(Kind.DEVICE_IN_TWO_PODS, "ns/a", "")]
    assert found[0].devices == ("GPU-0::2",)


def test_virtual_devices_of_other_gpus_still_differ() -> None:
    pods = [pod("a", {"c0": ["GPU-0", "GPU-1"]}, sliced=["c0"])]
    # two slices of one GPU for one container: not the two distinct GPUs it was assigned
    found = audit(pods, [listed("a", {"c0": ["GPU-0::0", "GPU-0::1"]})])
    assert kinds(found) == [(Kind.KUBELET_DIFFERS, "ns/a", "c0")]
    found = audit([pod("a", {"c0": ["GPU-0"]})], [listed("a", {"c0": ["GPU-1::0"]})])
    assert kinds(found) == [(Kind.KUBELET_DIFFERS, "ns/a", "c0")]
    # a slice of a GPU the node does not have
    found = audit([pod("a", {"c0": ["GPU-9"]})], [listed("a", {"c0": ["GPU-9::0"]})])
    assert kinds(found) == [(Kind.UNKNOWN_DEVICE, "ns/a", "")]
    # the plugin answered another GPU than the one kubelet's virtual device belongs to
    answers = [answer("a", "c0", ["GPU-0::0"], ["GPU-1"])]
    found = audit([pod("a", {"c0": ["GPU-0"]})], [listed("a", {"c0": ["GPU-0::0"]})], answers)
    assert kinds(found) == [(Kind.ANSWER_DIFFERS, "ns/a", "c0")]


def test_pod_record_knows_which_containers_take_slices() -> None:
    def limits(**extra: str) -> dict[str, object]:
        return {"resources": {"limits": {"nvidia.com/gpu": "1", **extra}}}

    containers: list[dict[str, object]] = [
        {"name": "whole", **limits()},
        {"name": "mem", **limits(**{"nvidia.com/gpumem": "1000"})},
        {"name": "cores", **limits(**{"nvidia.com/gpucores": "30"})},
        {"name": "none"},
    ]
    obj = {
        "metadata": {"namespace": "ns", "name": "a", "uid": "u1"},
        "spec": {"initContainers": [{"name": "i0", **limits()}], "containers": containers},
        "status": {"phase": "Running"},
    }
    assert pod_record(obj, Keys()).sliced == {"mem", "cores"}
    # a request the extender refuses (it never binds such a pod): counted as whole GPUs
    containers.append({"name": "bad", **limits(**{"nvidia.com/gpucores": "300"})})
    assert pod_record(obj, Keys()).sliced == frozenset()


def test_pod_record_from_api_object() -> None:
    obj = {
        "metadata": {
            "namespace": "ns",
            "name": "a",
            "uid": "u1",
            "annotations": {"nodelock.io/assignment": '{"c0":["GPU-0"]}'},
            "deletionTimestamp": "2026-11-30T00:00:00Z",
        },
        "spec": {
            "initContainers": [{"name": "i0"}, {"name": "side", "restartPolicy": "Always"}],
            "containers": [{"name": "c0"}],
        },
        "status": {"phase": "Running"},
    }
    rec = pod_record(obj, Keys())
    assert rec.key == "ns/a"
    assert rec.uid == "u1"
    assert rec.deleting
    assert not rec.live
    assert rec.init_containers == {"i0"}
    assert rec.assignment_raw == '{"c0":["GPU-0"]}'


def test_reports() -> None:
    d = Disagreement(NODE, Kind.KUBELET_DIFFERS, "ns/a", "c0", ("GPU-0",), "why")
    text = table([d], [NODE])
    assert "kubelet-differs" in text
    assert "ns/a" in text
    assert text.endswith("1 node(s)")
    assert "no disagreements" in table([], [NODE])
    doc = json.loads(report_json([d], [NODE]))
    assert doc["agree"] is False
    assert doc["disagreements"][0]["kind"] == "kubelet-differs"


def test_each_resource_is_judged_on_its_own_devices() -> None:
    """A node with MIG instances: the whole-GPU view and each profile's view see only their
    devices of every assignment (``for_resource``)."""
    mig = frozenset({"MIG-0", "MIG-1"})
    pods = [
        pod("whole", {"c": ["GPU-0"]}),
        pod("small", {"c": ["MIG-0"]}),
        pod("mixed", {"a": ["GPU-1"], "b": ["MIG-1"]}),
        pod("bad", None, raw="{"),
    ]
    by_gpu = for_resource(pods, INVENTORY, Keys())
    by_mig = for_resource(pods, mig, Keys())
    assert [p.assignment_raw for p in by_gpu] == ['{"c":["GPU-0"]}', None, '{"a":["GPU-1"]}', "{"]
    assert [p.assignment_raw for p in by_mig] == [None, '{"c":["MIG-0"]}', '{"b":["MIG-1"]}', "{"]
    gpu_view = [listed("whole", {"c": ["GPU-0"]}), listed("mixed", {"a": ["GPU-1"]})]
    mig_view = [listed("small", {"c": ["MIG-0"]}), listed("mixed", {"b": ["MIG-1"]})]
    assert kinds(audit_node(NodeViews(NODE, by_gpu, gpu_view, inventory=INVENTORY))) == [
        (Kind.BAD_ASSIGNMENT, "ns/bad", "")
    ]
    assert kinds(audit_node(NodeViews(NODE, by_mig, mig_view, inventory=mig))) == [
        (Kind.BAD_ASSIGNMENT, "ns/bad", "")
    ]
    # kubelet gives the small pod the mixed pod's instance: both views of MIG see it
    swapped = [listed("small", {"c": ["MIG-1"]}), listed("mixed", {"b": ["MIG-1"]})]
    found = kinds(audit_node(NodeViews(NODE, by_mig, swapped, inventory=mig)))
    assert (Kind.DEVICE_IN_TWO_PODS, "ns/mixed", "") in found
    assert (Kind.KUBELET_DIFFERS, "ns/small", "c") in found
    # judged with the unrestricted assignments, the whole-GPU view would report the instances
    unrestricted = kinds(audit_node(NodeViews(NODE, pods, gpu_view, inventory=INVENTORY)))
    assert (Kind.NO_KUBELET_RECORD, "ns/small", "") in unrestricted
