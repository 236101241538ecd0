"""The fault campaign's history checker (``bench.soak_check``) on plain histories: a clean history
passes, and each kind of violation it claims to find is found, with its history around it."""

from __future__ import annotations

import json
from typing import Any

from bench.soak_check import (
    Checker,
    Event,
    LeaseView,
    Sample,
    blamed_fault,
    failure_cause,
    fault_windows,
    record_json,
)
from devcluster.invariants import ContainerRecord

NODE = "gpu-node-01"


def gpu_pod(
    name: str,
    ids: list[str] | None,
    *,
    assigned: list[str] | None = None,
    phase: str = "Running",
    token: int | None = None,
    uid: str | None = None,
    node: str = NODE,
    reason: str = "",
) -> dict[str, Any]:
    notes: dict[str, str] = {}
    if assigned is not None or ids is not None:
        notes["nodelock.io/assignment"] = json.dumps({"c": assigned if assigned else ids})
    if token is not None:
        notes["nodelock.io/token"] = str(token)
    if ids is not None:
        notes["sim.nodelock.io/allocated"] = json.dumps(
            {"c": {"deviceIDs": ids, "envs": {"NVIDIA_VISIBLE_DEVICES": ",".join(ids)}}}
        )
    status: dict[str, Any] = {"phase": phase}
    if reason:
        status["reason"] = reason
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid or f"uid-{name}",
            "annotations": notes,
        },
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "nodeName": node,
        },
        "status": status,
    }


def lease(holder: str = "", token: int = 1, renew: str = "r0", uid: str = "") -> LeaseView:
    return LeaseView(holder=holder, token=token, renew=renew, holder_uid=uid)


def run(samples: list[Sample], events: list[Event] = (), **finish: Any) -> Checker:  # type: ignore[assignment]
    checker = Checker(lease_s=5)
    for s in samples:
        checker.add(s)
    last = samples[-1]
    checker.finish(
        finish.get("final", list(last.pods)),
        finish.get("leases", [{"metadata": {"name": NODE}, "spec": {}}]),
        list(events),
        t=last.t,
        locked_nodes=[NODE],
    )
    return checker


def invariants(checker: Checker) -> list[str]:
    return [v.invariant for v in checker.violations]


def test_a_clean_history_passes() -> None:
    samples = [
        Sample(
            0.0,
            [gpu_pod("a", None, assigned=["G0"], phase="Pending", token=2)],
            {NODE: lease("ns/a", 2)},
        ),
        Sample(1.0, [gpu_pod("a", ["G0"], token=2)], {NODE: lease("ns/a", 2)}),
        Sample(
            2.0,
            [gpu_pod("a", ["G0"], token=2), gpu_pod("b", ["G1"], token=3)],
            {NODE: lease("", 3)},
        ),
    ]
    checker = run(samples)
    assert checker.violations == []


def test_two_running_pods_on_one_gpu_is_s1_with_its_history() -> None:
    events = [Event(1.5, "fault", "plugin-kill deviceplugin-gpu-node-01", "plugin-kill")]
    samples = [
        Sample(1.0, [gpu_pod("a", ["G0"], token=2)], {NODE: lease("", 2)}),
        Sample(
            2.0,
            [gpu_pod("a", ["G0"], token=2), gpu_pod("b", ["G0"], token=3)],
            {NODE: lease("", 3)},
        ),
        Sample(
            3.0,
            [gpu_pod("a", ["G0"], token=2), gpu_pod("b", ["G0"], token=3)],
            {NODE: lease("", 3)},
        ),
    ]
    checker = run(samples, events)
    assert invariants(checker) == ["S1"]
    v = checker.violations[0]
    assert v.t == 2.0
    assert v.times_seen == 2
    text = v.text()
    assert "plugin-kill" in text
    assert "ns/b: t=1.0s absent" in text


def test_kubelet_devices_other_than_the_assignment_is_s2() -> None:
    samples = [Sample(1.0, [gpu_pod("a", ["G1"], assigned=["G0"], token=2)], {NODE: lease("", 2)})]
    assert invariants(run(samples)) == ["S2"]


def test_a_record_that_changes_is_s2() -> None:
    samples = [
        Sample(1.0, [gpu_pod("a", ["G0"], token=2)], {}),
        Sample(2.0, [gpu_pod("a", ["G1"], assigned=["G1"], token=2)], {}),
    ]
    checker = run(samples)
    assert invariants(checker) == ["S2"]
    assert "changed" in checker.violations[0].message


def real_pod(
    name: str,
    records: dict[str, list[str]],
    *,
    assigned: dict[str, list[str]],
    phase: str = "Running",
) -> Any:
    """A sampled pod of a real kubelet's node: kubelet's record in its ``kubelet`` field (read
    from the checkpoint and the runtime), no simulated kubelet's annotation."""
    pod = gpu_pod(name, None, assigned=[], token=2, phase=phase)
    pod["metadata"]["annotations"]["nodelock.io/assignment"] = json.dumps(assigned)
    pod["spec"]["containers"] = [
        {"name": c, "resources": {"limits": {"nvidia.com/gpu": "1"}}} for c in assigned
    ]
    pod["kubelet"] = record_json(
        {
            c: ContainerRecord({"nvidia.com/gpu": ids}, ",".join(d.split("::")[0] for d in ids))
            for c, ids in records.items()
        }
    )
    return pod


def test_a_real_kubelets_record_is_judged_like_the_simulated_ones() -> None:
    assigned = {"c0": ["G0"], "c1": ["G1"]}
    ok = real_pod("a", assigned, assigned=assigned)
    assert run([Sample(1.0, [ok], {})]).violations == []
    wrong = real_pod("a", {"c0": ["G0"], "c1": ["G2"]}, assigned=assigned)
    checker = run([Sample(1.0, [wrong], {})])
    assert invariants(checker) == ["S2"]
    assert "ns/a/c1" in checker.violations[0].message
    other = real_pod("b", {"c0": ["G0"]}, assigned={"c0": ["G0"]})
    assert "S1" in invariants(run([Sample(1.0, [ok, other], {})]))


def test_a_real_kubelets_record_may_grow_and_name_gpus_but_not_change() -> None:
    """kubelet writes its checkpoint container by container, and a record read from the runtime
    names a shared GPU's physical ID where the checkpoint named kubelet's virtual one."""
    assigned = {"c0": ["G0"], "c1": ["G1"]}
    virtual = {"c0": ["G0::1"], "c1": ["G1::0"]}
    samples = [
        Sample(1.0, [real_pod("a", {"c0": ["G0::1"]}, assigned=assigned, phase="Pending")], {}),
        Sample(2.0, [real_pod("a", virtual, assigned=assigned)], {}),
        Sample(3.0, [real_pod("a", {"c0": ["G0"], "c1": ["G1"]}, assigned=assigned)], {}),
    ]
    assert run(samples).violations == []
    moved = Sample(4.0, [real_pod("a", {"c0": ["G0"], "c1": ["G2"]}, assigned=assigned)], {})
    checker = run([*samples, moved])
    assert "changed" in " ".join(v.message for v in checker.violations)


def test_a_token_that_goes_down_is_a_fencing_violation() -> None:
    samples = [
        Sample(1.0, [], {NODE: lease("", 5)}),
        Sample(2.0, [], {NODE: lease("", 4)}),
    ]
    checker = run(samples, leases=[{"metadata": {"name": NODE}, "spec": {}}])
    assert "fencing" in invariants(checker)


def test_a_new_holder_with_the_old_token_is_a_fencing_violation() -> None:
    samples = [
        Sample(
            1.0,
            [gpu_pod("a", None, assigned=["G0"], phase="Pending")],
            {NODE: lease("ns/a", 5, uid="uid-a")},
        ),
        Sample(
            2.0,
            [gpu_pod("b", None, assigned=["G0"], phase="Pending")],
            {NODE: lease("ns/b", 5, uid="uid-b")},
        ),
        Sample(3.0, [], {}),
    ]
    checker = run(samples, final=[])
    assert invariants(checker) == ["fencing"]


def test_two_pods_bound_with_one_token_is_a_fencing_violation() -> None:
    samples = [
        Sample(1.0, [gpu_pod("a", ["G0"], token=7)], {}),
        Sample(2.0, [gpu_pod("b", ["G1"], token=7)], {}),
    ]
    assert invariants(run(samples)) == ["fencing"]


def test_a_lock_renewed_long_after_its_holder_ran_is_s3() -> None:
    a = gpu_pod("a", ["G0"], token=2)
    samples = [
        Sample(float(t), [a], {NODE: lease("ns/a", 2, renew=f"r{t}", uid="uid-a")})
        for t in range(12)
    ]
    checker = run(samples)
    assert invariants(checker)[0] == "S3"
    assert "still renewed" in checker.violations[0].message


def test_a_lock_held_but_not_renewed_is_no_s3_until_the_end() -> None:
    a = gpu_pod("a", ["G0"], token=2)
    samples = [Sample(float(t), [a], {NODE: lease("ns/a", 2, uid="uid-a")}) for t in range(12)]
    # the lock is free at the end: nothing to report
    assert run(samples).violations == []
    # still held at the end: S3
    held = [{"metadata": {"name": NODE}, "spec": {"holderIdentity": "ns/a"}}]
    assert invariants(run(samples, leases=held)) == ["S3"]


def test_a_pod_left_pending_at_the_end_is_l1() -> None:
    samples = [Sample(1.0, [gpu_pod("a", None, phase="Pending", node="")], {})]
    assert invariants(run(samples)) == ["L1"]


def test_a_pod_that_failed_is_l1_unless_a_fault_on_its_node_explains_it() -> None:
    failed = gpu_pod("a", None, assigned=["G0"], phase="Failed", reason="UnexpectedAdmissionError")
    samples = [Sample(100.0, [failed], {})]
    checker = run(samples)
    assert invariants(checker) == ["L1"]
    assert "UnexpectedAdmissionError" in checker.violations[0].message

    def fault(kind: str, target: str, start: float, end: float) -> list[Event]:
        what = f"{kind} {target} for {end - start:.1f}s"
        return [Event(start, "fault", what, kind), Event(end, "heal", what, kind)]

    assert run(samples, fault("plugin-kill", "deviceplugin-gpu-node-01", 80, 85)).violations == []
    assert run(samples, fault("etcd-kill", "etcd", 80, 85)).violations == []
    # another node's plugin, an extender, or a fault that healed long before explain nothing
    for events in (
        fault("plugin-kill", "deviceplugin-gpu-node-02", 80, 85),
        fault("extender-kill", "extender-0", 90, 99),
        fault("plugin-kill", "deviceplugin-gpu-node-01", 10, 15),
        # a slowed Allocate fails pods only as the plugin restarts, not halfway through
        fault("slow-allocate", "deviceplugin-gpu-node-01 (allocate.start=sleep:7.0)", 80, 120),
    ):
        assert invariants(run(samples, events)) == ["L1"], events


def test_fault_windows_pair_each_fault_with_its_heal() -> None:
    events = [
        Event(1.0, "fault", "a gpu-node-01", "k"),
        Event(2.0, "fault", "b gpu-node-01", "k"),
        Event(3.0, "heal", "a gpu-node-01", "k"),
        Event(5.0, "restart", "deviceplugin-gpu-node-02 had ended; started again"),
        Event(9.0, "workload", "pod x created"),
    ]
    assert fault_windows(events) == [
        (1.0, 3.0, "a gpu-node-01", "k"),
        (2.0, float("inf"), "b gpu-node-01", "k"),
        (5.0, 5.0, "deviceplugin-gpu-node-02 had ended; started again", "restart"),
    ]
    one = events[:1] + events[2:3]
    assert blamed_fault(one, 3.0 + 31, NODE) is None
    assert blamed_fault(one, 3.0 + 29, NODE) == "a gpu-node-01"
    assert blamed_fault(one, 3.0 + 29, "gpu-node-02") is None
    assert blamed_fault(events, 5.0 + 9, "gpu-node-02") is not None
    assert blamed_fault(events, 5.0 + 11, "gpu-node-02") is None


def taken_over(holder: str, token: int, *, by: str = "ns/b") -> LeaseView:
    return LeaseView(
        holder=by,
        token=token + 1,
        renew="r1",
        holder_uid=f"uid-{by.split('/')[1]}",
        last_holder=holder,
        last_holder_uid=f"uid-{holder.split('/')[1]}",
        last_token=token,
        last_outcome="taken-over",
    )


def test_a_lock_taken_over_from_a_holder_kubelet_may_still_admit_is_s3() -> None:
    waiting = gpu_pod("a", None, assigned=["G0"], phase="Pending", token=4)
    b = gpu_pod("b", None, assigned=["G1"], phase="Pending", token=5)
    samples = [
        Sample(1.0, [waiting], {NODE: lease("ns/a", 4, uid="uid-a")}),
        Sample(2.0, [waiting, b], {NODE: taken_over("ns/a", 4)}),
        Sample(3.0, [gpu_pod("a", ["G0"], token=4), gpu_pod("b", ["G1"], token=5)], {}),
    ]
    checker = run(samples)
    assert invariants(checker) == ["S3"]
    assert "taken over from ns/a" in checker.violations[0].message


def test_a_lock_released_expired_from_a_holder_kubelet_may_still_admit_is_s3() -> None:
    waiting = gpu_pod("a", None, assigned=["G0"], phase="Pending", token=4)
    released = LeaseView(
        holder="",
        token=4,
        renew="r1",
        last_holder="ns/a",
        last_holder_uid="uid-a",
        last_token=4,
        last_outcome="expired",
    )
    samples = [
        Sample(1.0, [waiting], {NODE: lease("ns/a", 4, uid="uid-a")}),
        Sample(2.0, [waiting], {NODE: released}),
        Sample(3.0, [gpu_pod("a", ["G0"], token=4)], {}),
    ]
    checker = run(samples)
    assert invariants(checker) == ["S3"]
    assert "released expired from ns/a" in checker.violations[0].message


def test_a_takeover_from_a_holder_that_left_the_handoff_is_no_violation() -> None:
    b = gpu_pod("b", ["G1"], token=5)
    for holder in (
        gpu_pod("a", ["G0"], token=4),  # admitted: kubelet's record is there
        gpu_pod("a", None, assigned=["G0"], phase="Pending", token=4, node="gpu-node-02"),
        gpu_pod("a", None, assigned=["G0"], phase="Pending", token=3),  # bound with another lock
        gpu_pod("a", None, assigned=["G0"], phase="Failed", token=4, reason="Rejected"),
    ):
        samples = [Sample(2.0, [holder, b], {NODE: taken_over("ns/a", 4)})]
        checker = Checker(lease_s=5)
        for s in samples:
            checker.add(s)
        assert checker.violations == [], holder


def test_kubelets_podresources_listing_other_devices_than_its_record_is_s2() -> None:
    a = gpu_pod("a", ["G0"], token=2)
    listed = {NODE: {"ns/a": {"c": ["G1"]}}}
    checker = run([Sample(1.0, [a], {}, listed)])
    assert invariants(checker) == ["S2"]
    assert "PodResources" in checker.violations[0].message
    # the same devices, or none at all (kubelet restarted without its checkpoint), pass
    for ids in (["G0"], []):
        same = {NODE: {"ns/a": {"c": ids}}}
        assert run([Sample(1.0, [a], {}, same)]).violations == []


def test_a_pending_pods_container_listed_before_its_record_is_no_s2_until_it_runs() -> None:
    # kubelet lists container d's devices from the plugin's answer on, before its checkpoint
    # names d: while the pod is Pending the record may lag; once it runs, it may not
    listed = {NODE: {"ns/a": {"c": ["G0"], "d": ["G1"]}}}
    pending = gpu_pod("a", ["G0"], token=2, phase="Pending")
    assert "S2" not in invariants(run([Sample(1.0, [pending], {}, listed)]))
    running = gpu_pod("a", ["G0"], token=2)
    checker = run([Sample(1.0, [running], {}, listed)])
    assert invariants(checker) == ["S2"]
    assert "ns/a/d" in checker.violations[0].message
    # a container the Pending pod's record names is held to it
    other = {NODE: {"ns/a": {"c": ["G1"]}}}
    assert "S2" in invariants(run([Sample(1.0, [pending], {}, other)]))


def test_a_failure_is_summed_up_without_names() -> None:
    refused = (
        "Pod was rejected: Allocate failed due to rpc error: code = FailedPrecondition desc = node "
        "gpu-node-03: kubelet is admitting another pod than the node lock's holder soak-1/p (uid "
        "930f), which is unexpected"
    )
    assert failure_cause(refused) == (
        "rpc error FailedPrecondition: kubelet is admitting another pod than the node lock's holder"
    )
    gone = (
        "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate "
        "unhealthy devices nvidia.com/gpu, which is unexpected"
    )
    assert failure_cause(gone) == "no healthy devices present"


def test_a_pod_deleted_before_it_had_a_node_is_no_l1() -> None:
    """kube-controller-manager's pod GC marks an unscheduled pod that is being deleted Failed
    (no reason); only without the deletion is such a failure L1."""
    deleted = gpu_pod("a", None, phase="Failed", node="")
    deleted["metadata"]["deletionTimestamp"] = "2026-12-02T17:00:00Z"
    assert run([Sample(100.0, [deleted], {})]).violations == []
    failed = gpu_pod("a", None, phase="Failed", node="")
    assert invariants(run([Sample(100.0, [failed], {})])) == ["L1"]
