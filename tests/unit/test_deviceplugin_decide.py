"""decide_allocate / decide_preferred with plain data: every refusal and the happy paths."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest

from deviceplugin.decide import (
    UNKNOWN_POD_WAIT_S,
    Allocation,
    Context,
    HandoffProgress,
    KubeletAdmission,
    MismatchPolicy,
    Refusal,
    RefusalKind,
    check_request,
    decide_allocate,
    decide_preferred,
    gpu_containers,
    handoff_abandoned,
    hint,
    holder_ended,
    kubelet_admitting,
    kubelet_records,
    unknown_listed,
)
from handoff.audit import KubeletPod, PluginAnswer
from handoff.wire import ContainerName, DeviceID, format_assignment
from lockd.model import (
    FencingToken,
    Holder,
    HolderKey,
    LastHandoff,
    LockRecord,
    NodeLockView,
    NodeName,
    Outcome,
)

NODE = NodeName("n1")
GPUS = [DeviceID(f"GPU-{i:02d}") for i in range(8)]
CTX = Context(node=NODE, devices=dict.fromkeys(GPUS, True))
UID = "uid-1"
TOKEN = FencingToken(7)
C = ContainerName


def assignment_of(**containers: Sequence[str]) -> dict[ContainerName, list[DeviceID]]:
    return {C(k): [DeviceID(d) for d in v] for k, v in containers.items()}


def lease(
    assignment: dict[ContainerName, list[DeviceID]] | str | None,
    *,
    holder: str | None = "ns/p",
    uid: str = UID,
    token: int = TOKEN,
) -> NodeLockView:
    data: dict[str, str] = {}
    if isinstance(assignment, str):
        data["assignment"] = assignment
    elif assignment is not None:
        data["assignment"] = format_assignment(assignment)
    h = Holder(HolderKey(holder), uid, data) if holder else None
    record = LockRecord(
        node=NODE,
        holder=h,
        token=FencingToken(token),
        duration_s=15,
        acquire_time=None,
        renew_time=None,
        resource_version="42",
    )
    return NodeLockView(record=record, unchanged_for_s=0.0, expired=False)


def container(name: str, gpus: int | str | None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "x"}
    if gpus is not None:
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return c


def pod(
    assignment: dict[ContainerName, list[DeviceID]] | str | None,
    *,
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
    uid: str = UID,
    token: str | None = str(TOKEN),
    node: str | None = NODE,
) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if isinstance(assignment, str):
        annotations["nodelock.io/assignment"] = assignment
    elif assignment is not None:
        annotations["nodelock.io/assignment"] = format_assignment(assignment)
    if token is not None:
        annotations["nodelock.io/token"] = token
    spec: dict[str, Any] = {"containers": containers}
    if init:
        spec["initContainers"] = init
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": uid, "annotations": annotations},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def ids(*indexes: int) -> list[DeviceID]:
    return [GPUS[i] for i in indexes]


ONE = assignment_of(main=ids(3))
ONE_POD = pod(ONE, containers=[container("main", 1)])


def refused(result: Allocation | Refusal, kind: RefusalKind) -> Refusal:
    assert isinstance(result, Refusal), result
    assert result.kind is kind, result
    return result


def served(result: Allocation | Refusal) -> Allocation:
    assert isinstance(result, Allocation), result
    return result


def releases_the_holder(r: Refusal, view: NodeLockView) -> None:
    """The refusal releases exactly the lock's holder at the lock's token."""
    assert view.record.holder is not None
    assert r.release == (view.record.holder, view.record.token), r.release


def serves(result: Allocation | Refusal, container: str, devices: Sequence[DeviceID]) -> None:
    """The holder of the default lease is served ``devices`` for ``container``."""
    a = served(result)
    assert (a.container, a.devices, a.token) == (container, tuple(devices), TOKEN), a
    assert a.holder.uid == UID


# -- happy paths ---------------------------------------------------------------------------------


def test_one_gpu_is_served_and_is_the_last() -> None:
    a = served(decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX))
    assert a.container == "main"
    assert a.devices == (GPUS[3],)
    assert a.last
    assert a.token == TOKEN
    assert a.holder.uid == UID
    assert a.progress == HandoffProgress(HolderKey("ns/p"), UID, TOKEN, (C("main"),), ((GPUS[3],),))


def test_four_gpus_served_in_assignment_order_whatever_kubelet_order() -> None:
    four = assignment_of(train=ids(5, 1, 7, 2))
    p = pod(four, containers=[container("train", 4)])
    a = served(decide_allocate(lease(four), p, ids(1, 2, 5, 7), None, CTX))
    assert a.devices == (GPUS[5], GPUS[1], GPUS[7], GPUS[2])
    assert a.last


def test_two_containers_served_in_spec_order_not_assignment_key_order() -> None:
    # The JSON lists "b" first; the pod spec lists "a" first: spec order wins.
    two = assignment_of(b=ids(2, 3), a=ids(0))
    p = pod(two, containers=[container("a", 1), container("sidecar", None), container("b", 2)])
    first = served(decide_allocate(lease(two), p, ids(0), None, CTX))
    assert (first.container, first.devices, first.last) == ("a", (GPUS[0],), False)
    second = served(decide_allocate(lease(two), p, ids(3, 2), first.progress, CTX))
    assert (second.container, second.devices, second.last) == ("b", (GPUS[2], GPUS[3]), True)
    assert second.progress.served == (C("a"), C("b"))


def test_init_container_first_and_its_device_reused() -> None:
    # kubelet reuses an init container's devices for later containers; the extender assigns so.
    a = assignment_of(train=ids(1, 4), setup=ids(1))
    p = pod(a, init=[container("setup", 1)], containers=[container("train", 2)])
    first = served(decide_allocate(lease(a), p, ids(1), None, CTX))
    assert first.container == "setup"
    second = served(decide_allocate(lease(a), p, ids(4, 1), first.progress, CTX))
    assert second.container == "train"
    assert second.last


def test_progress_from_a_checkpoint_continues_where_it_stopped() -> None:
    two = assignment_of(a=ids(0), b=ids(1))
    p = pod(two, containers=[container("a", 1), container("b", 1)])
    restored = HandoffProgress(HolderKey("ns/p"), UID, TOKEN, (C("a"),))
    a = served(decide_allocate(lease(two), p, ids(1), restored, CTX))
    assert a.container == "b"  # not "a" again (no repeat) ...
    # ... and a count that fits "a" but names "a"'s device is not served as "b" (no skip):
    refused(decide_allocate(lease(two), p, ids(0), restored, CTX), RefusalKind.DEVICES_MISMATCH)


def test_progress_of_an_older_finished_handoff_is_ignored() -> None:
    old = HandoffProgress(HolderKey("ns/old"), "uid-0", FencingToken(3), ())
    serves(decide_allocate(lease(ONE), ONE_POD, ids(3), old, CTX), "main", ids(3))


def test_mismatch_policy_assignment_serves_the_assignment() -> None:
    a = served(
        decide_allocate(lease(ONE), ONE_POD, ids(4), None, CTX, policy=MismatchPolicy.ASSIGNMENT)
    )
    assert a.devices == (GPUS[3],)
    assert a.kubelet_differs


def test_requests_only_quantity_counts() -> None:
    p = copy.deepcopy(ONE_POD)
    p["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    serves(decide_allocate(lease(ONE), p, ids(3), None, CTX), "main", ids(3))


# -- refusals ------------------------------------------------------------------------------------


def test_no_lease_at_all() -> None:
    r = refused(decide_allocate(None, None, ids(3), None, CTX), RefusalKind.NO_HOLDER)
    assert "n1" in r.message
    assert r.release is None


def test_lease_without_holder_names_the_last_handoff() -> None:
    free = lease(None, holder=None)
    last = LastHandoff(HolderKey("ns/q"), "u", FencingToken(6), "allocated")
    free = NodeLockView(
        record=LockRecord(**{**free.record.__dict__, "last": last}),
        unchanged_for_s=0.0,
        expired=False,
    )
    r = refused(decide_allocate(free, ONE_POD, ids(3), None, CTX), RefusalKind.NO_HOLDER)
    assert "ns/q" in r.message
    assert r.release is None


def test_token_mismatch_leaves_the_lock_alone() -> None:
    p = pod(ONE, containers=[container("main", 1)], token="6")
    r = refused(decide_allocate(lease(ONE), p, ids(3), None, CTX), RefusalKind.TOKEN_MISMATCH)
    assert "ns/p" in r.message
    assert "n1" in r.message
    assert "6" in r.message
    assert r.release is None


def test_lease_taken_over_by_another_holder_mid_handoff() -> None:
    interrupted = HandoffProgress(HolderKey("ns/p"), UID, TOKEN, (C("a"),))
    q_lease = lease(ONE, holder="ns/q", uid="uid-q", token=TOKEN + 1)
    q_pod = pod(ONE, containers=[container("main", 1)], uid="uid-q", token=str(TOKEN + 1))
    q_pod["metadata"]["name"] = "q"
    r = refused(decide_allocate(q_lease, q_pod, ids(3), interrupted, CTX), RefusalKind.TAKEN_OVER)
    assert "ns/p" in r.message
    assert "ns/q" in r.message
    assert r.release is None


def test_holder_pod_gone_releases() -> None:
    r = refused(decide_allocate(lease(ONE), None, ids(3), None, CTX), RefusalKind.POD_GONE)
    releases_the_holder(r, lease(ONE))


def test_holder_pod_replaced_under_its_name_releases() -> None:
    p = pod(ONE, containers=[container("main", 1)], uid="uid-2")
    r = refused(decide_allocate(lease(ONE), p, ids(3), None, CTX), RefusalKind.POD_GONE)
    releases_the_holder(r, lease(ONE))


def test_pod_bound_elsewhere() -> None:
    p = pod(ONE, containers=[container("main", 1)], node="n2")
    r = refused(decide_allocate(lease(ONE), p, ids(3), None, CTX), RefusalKind.WRONG_NODE)
    assert "n2" in r.message
    assert "n1" in r.message
    assert r.release is None


def test_pod_not_bound_yet_leaves_the_lock_alone() -> None:
    p = pod(ONE, containers=[container("main", 1)], node=None)
    r = refused(decide_allocate(lease(ONE), p, ids(3), None, CTX), RefusalKind.NOT_BOUND)
    assert r.release is None


@pytest.mark.parametrize(
    ("pod_assignment", "pod_token"),
    [
        (None, str(TOKEN)),  # missing assignment
        ("{not json", str(TOKEN)),
        ('{"main": []}', str(TOKEN)),
        ('{"main": ["bad id!"]}', str(TOKEN)),
        ('["GPU-03"]', str(TOKEN)),
        (ONE, None),  # missing token
        (ONE, "seven"),
        (ONE, "-1"),
    ],
)
def test_malformed_pod_annotations_release(
    pod_assignment: dict[ContainerName, list[DeviceID]] | str | None, pod_token: str | None
) -> None:
    p = pod(pod_assignment, containers=[container("main", 1)], token=pod_token)
    r = refused(decide_allocate(lease(ONE), p, ids(3), None, CTX), RefusalKind.MALFORMED)
    assert "ns/p" in r.message
    assert "n1" in r.message
    assert "nodelock.io/" in r.message
    assert r.release == (lease(ONE).record.holder, TOKEN)


def test_malformed_lease_copy_releases() -> None:
    r = refused(decide_allocate(lease("{"), ONE_POD, ids(3), None, CTX), RefusalKind.MALFORMED)
    assert "Lease" in r.message
    releases_the_holder(r, lease("{"))


def test_forged_assignment_on_the_pod_releases() -> None:
    # HAMi #3076: the pod owner edits its own annotation to get other devices.
    forged = pod(assignment_of(main=ids(6)), containers=[container("main", 1)])
    r = refused(decide_allocate(lease(ONE), forged, ids(6), None, CTX), RefusalKind.FORGED)
    assert "GPU-06" in r.message
    assert "GPU-03" in r.message
    releases_the_holder(r, lease(ONE))


def test_forged_even_when_kubelet_picked_the_forged_devices_under_assignment_policy() -> None:
    forged = pod(assignment_of(main=ids(6)), containers=[container("main", 1)])
    result = decide_allocate(
        lease(ONE), forged, ids(6), None, CTX, policy=MismatchPolicy.ASSIGNMENT
    )
    refused(result, RefusalKind.FORGED)


def test_spec_count_differs_from_assignment_releases() -> None:
    p = pod(ONE, containers=[container("main", 2)])
    r = refused(decide_allocate(lease(ONE), p, ids(3), None, CTX), RefusalKind.SPEC_MISMATCH)
    assert "requests 2" in r.message
    releases_the_holder(r, lease(ONE))


def test_assignment_names_a_container_without_gpus_releases() -> None:
    a = assignment_of(main=ids(3), other=ids(4))
    p = pod(a, containers=[container("main", 1), container("other", None)])
    r = refused(decide_allocate(lease(a), p, ids(3), None, CTX), RefusalKind.SPEC_MISMATCH)
    releases_the_holder(r, lease(a))


def test_assignment_of_devices_this_node_lacks_releases() -> None:
    a = assignment_of(main=["GPU-elsewhere"])
    p = pod(a, containers=[container("main", 1)])
    r = refused(decide_allocate(lease(a), p, ids(3), None, CTX), RefusalKind.UNKNOWN_DEVICE)
    releases_the_holder(r, lease(a))


def test_count_mismatch_with_kubelet_request_leaves_the_lock_alone() -> None:
    # The spec agrees with the assignment, so kubelet is admitting some other container.
    r = refused(
        decide_allocate(lease(ONE), ONE_POD, ids(3, 4), None, CTX), RefusalKind.COUNT_MISMATCH
    )
    assert "2" in r.message
    assert "main" in r.message
    assert r.release is None


def test_kubelet_ids_differ_refused_by_default() -> None:
    r = refused(
        decide_allocate(lease(ONE), ONE_POD, ids(4), None, CTX), RefusalKind.DEVICES_MISMATCH
    )
    assert "GPU-04" in r.message
    assert "GPU-03" in r.message
    # why kubelet may choose otherwise, and what to do: a person reads this on the failed pod
    assert "did not count the assigned ones free" in r.message
    assert "kubelet restart" in r.message
    assert "bare pod must be created again" in r.message
    assert r.release is None


def test_all_containers_already_served() -> None:
    done = HandoffProgress(HolderKey("ns/p"), UID, TOKEN, (C("main"),))
    r = refused(decide_allocate(lease(ONE), ONE_POD, ids(3), done, CTX), RefusalKind.ALL_SERVED)
    assert r.release is None


def test_unhealthy_assigned_device() -> None:
    ctx = Context(node=NODE, devices={**dict.fromkeys(GPUS, True), GPUS[3]: False})
    r = refused(decide_allocate(lease(ONE), ONE_POD, ids(3), None, ctx), RefusalKind.UNHEALTHY)
    assert r.release is None


def test_non_integer_gpu_quantity_is_a_spec_mismatch() -> None:
    p = pod(ONE, containers=[container("main", "500m")])
    refused(decide_allocate(lease(ONE), p, ids(3), None, CTX), RefusalKind.SPEC_MISMATCH)


# -- request shape -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "requests",
    [
        [],
        [[]],
        [["GPU-00"], ["GPU-01"]],
        [["GPU-00", "GPU-00"]],
        [["GPU-99"]],
        [["x" * 100]],
        [[f"GPU-{i:02d}" for i in range(9)]],
        [["GPU-00", ""]],
    ],
)
def test_bad_requests_are_refused_as_input_errors(requests: list[list[str]]) -> None:
    r = check_request(requests, CTX)
    assert isinstance(r, Refusal), r
    assert r.kind is RefusalKind.BAD_REQUEST
    assert r.release is None
    assert r.message.startswith(f"node {NODE}: ")
    assert r.kind is RefusalKind.BAD_REQUEST
    assert r.release is None


def test_good_request_passes() -> None:
    assert check_request([["GPU-01", "GPU-00"]], CTX) == (GPUS[1], GPUS[0])


# -- GetPreferredAllocation ----------------------------------------------------------------------


def test_preferred_hit_returns_the_assignment() -> None:
    four = assignment_of(train=ids(5, 1, 7, 2))
    p = pod(four, containers=[container("train", 4)])
    pref = decide_preferred(lease(four), p, GPUS, [], 4, None, CTX)
    assert pref.hit
    assert pref.devices == (GPUS[5], GPUS[1], GPUS[7], GPUS[2])


def test_preferred_follows_progress_and_must_include() -> None:
    a = assignment_of(setup=ids(1), train=ids(1, 4))
    p = pod(a, init=[container("setup", 1)], containers=[container("train", 2)])
    progress = HandoffProgress(HolderKey("ns/p"), UID, TOKEN, (C("setup"),))
    # kubelet reuses GPU-01 from the init container: it is "must include", not "available".
    available = [g for g in GPUS if g != GPUS[1]]
    pref = decide_preferred(lease(a), p, available, [GPUS[1]], 2, progress, CTX)
    assert pref.hit
    assert pref.devices == (GPUS[1], GPUS[4])


def test_preferred_miss_on_size_gives_a_hint() -> None:
    pref = decide_preferred(lease(ONE), ONE_POD, GPUS[::-1], [GPUS[6]], 2, None, CTX)
    assert not pref.hit
    assert pref.devices == (GPUS[6], GPUS[0])
    assert "main" in pref.reason


def test_preferred_miss_when_assigned_device_unavailable() -> None:
    pref = decide_preferred(lease(ONE), ONE_POD, ids(0, 1), [], 1, None, CTX)
    assert not pref.hit
    assert pref.devices == (GPUS[0],)


def test_preferred_miss_without_holder() -> None:
    pref = decide_preferred(None, None, ids(2, 0), [], 1, None, CTX)
    assert not pref.hit
    assert pref.devices == (GPUS[0],)


def test_hint_never_exceeds_size_or_repeats() -> None:
    assert hint(["b", "a", "a"], ["a"], 2) == ("a", "b")
    assert hint(["a"], [], 0) == ()
    assert hint(["a"], [], -3) == ()


# -- spec reading and interrupted handoffs -------------------------------------------------------


def test_gpu_containers_in_spec_order_init_first() -> None:
    p = pod(
        ONE,
        init=[container("i1", 1), container("i2", None)],
        containers=[container("c1", None), container("c2", 3), container("c3", 0)],
    )
    assert gpu_containers(p, "nvidia.com/gpu") == [(C("i1"), 1), (C("c2"), 3)]


def test_interrupted_handoff_is_abandoned_unless_still_pending_here() -> None:
    progress = HandoffProgress(HolderKey("ns/p"), UID, TOKEN, (C("main"),))
    assert not handoff_abandoned(ONE_POD, progress, NODE)
    assert handoff_abandoned(None, progress, NODE)
    for change in (
        {"status": {"phase": "Failed"}},
        {"status": {"phase": "Running"}},
        {"status": {"phase": "Pending", "containerStatuses": [{"name": "main"}]}},
        {"metadata": {"uid": "other", "namespace": "ns", "name": "p"}},
        {"spec": {"nodeName": "n2"}},
    ):
        assert handoff_abandoned({**ONE_POD, **change}, progress, NODE), change
    # kubelet admits a pod it has not seen before it stops it: one being deleted may still ask
    deleting = {**ONE_POD["metadata"], "deletionTimestamp": "2024-01-01T00:00:00Z"}
    assert not handoff_abandoned({**ONE_POD, "metadata": deleting}, progress, NODE)
    assert not handoff_abandoned({**ONE_POD, "status": {"phase": "Unknown"}}, progress, NODE)


# -- a holder that left the handoff (a stale Lease view after a takeover) ------------------------

STARTED = {"name": "main", "state": {"running": {}}, "containerID": "containerd://abc"}
LEFT_HANDOFF = [
    ("rejected by kubelet", {"phase": "Failed", "reason": "UnexpectedAdmissionError"}),
    ("evicted", {"phase": "Failed", "reason": "Evicted"}),
    ("completed", {"phase": "Succeeded"}),
    ("running", {"phase": "Running"}),
    ("a started container", {"phase": "Pending", "containerStatuses": [STARTED]}),
    ("a waiting container", {"phase": "Pending", "containerStatuses": [{"name": "main"}]}),
]


@pytest.mark.parametrize("status", [s for _, s in LEFT_HANDOFF], ids=[n for n, _ in LEFT_HANDOFF])
def test_a_holder_that_left_the_handoff_is_not_served_nor_released(status: dict[str, Any]) -> None:
    """S2: a view of the Lease that still names a holder kubelet rejected (or admitted) must not
    serve that holder's devices to whatever pod kubelet admits now (the lock may have been taken
    over while the watch was reconnecting); the lock is not the plugin's to release."""
    finished = {**ONE_POD, "status": status}
    r = refused(decide_allocate(lease(ONE), finished, ids(3), None, CTX), RefusalKind.LEFT_HANDOFF)
    assert r.release is None
    assert "ns/p" in r.message
    pref = decide_preferred(lease(ONE), finished, ids(3, 4), [], 1, None, CTX)
    assert not pref.hit
    assert "left the handoff" in pref.reason


def test_a_holder_being_deleted_but_not_admitted_is_still_served() -> None:
    """kubelet admits a pod it has not seen before it stops it; its devices are still its own."""
    meta = {**ONE_POD["metadata"], "deletionTimestamp": "2024-01-01T00:00:00Z"}
    serves(
        decide_allocate(lease(ONE), {**ONE_POD, "metadata": meta}, ids(3), None, CTX),
        "main",
        ids(3),
    )


# -- init container reuse: kubelet's own pick from the pod's reuse pool --------------------------


def walk(
    assignment: dict[ContainerName, list[DeviceID]],
    p: dict[str, Any],
    asks: list[list[DeviceID]],
) -> list[Allocation]:
    """Answer kubelet's asks one after another, carrying the progress along."""
    progress: HandoffProgress | None = None
    out = []
    for ask in asks:
        a = served(decide_allocate(lease(assignment), p, ask, progress, CTX))
        progress = a.progress
        out.append(a)
    return out


@pytest.mark.parametrize(
    ("init", "apps", "picks"),
    [
        (2, [1, 1], [[1], [0]]),  # kubelet's map order: the second device first
        (4, [2, 2], [[3, 0], [2, 1]]),
        (4, [1, 1, 1, 1], [[2], [0], [3], [1]]),
        (8, [4, 4], [[7, 1, 4, 2], [0, 3, 5, 6]]),
    ],
)
def test_app_containers_get_kubelets_pick_from_the_init_containers_devices(
    init: int, apps: list[int], picks: list[list[int]]
) -> None:
    """kubelet gives app containers devices of the init container's in its own order, without
    GetPreferredAllocation: any subset of the pod's unserved pool is served as kubelet chose."""
    start = 0
    a = {C("init"): ids(*range(init))}
    for i, n in enumerate(apps):
        a[C(f"c{i}")] = ids(*range(start, start + n))  # the extender: lowest slots, in order
        start += n
    p = pod(
        a,
        init=[container("init", init)],
        containers=[container(f"c{i}", n) for i, n in enumerate(apps)],
    )
    got = walk(a, p, [ids(*range(init)), *[ids(*pick) for pick in picks]])
    for alloc, pick in zip(got[1:], picks, strict=True):
        assert set(alloc.devices) == set(ids(*pick))
        assert not alloc.kubelet_differs
    assert got[-1].last
    assert got[-1].progress.given[1:] == tuple(alloc.devices for alloc in got[1:])


def test_an_app_container_never_gets_a_device_an_earlier_one_holds() -> None:
    a = assignment_of(init=ids(0, 1), c0=ids(0), c1=ids(1))
    p = pod(a, init=[container("init", 2)], containers=[container("c0", 1), container("c1", 1)])
    first, c0 = walk(a, p, [ids(0, 1), ids(1)])
    r = refused(
        decide_allocate(lease(a), p, ids(1), c0.progress, CTX), RefusalKind.DEVICES_MISMATCH
    )
    assert "GPU-00" in r.message  # what is left to the pod
    refused(decide_allocate(lease(a), p, ids(5), c0.progress, CTX), RefusalKind.DEVICES_MISMATCH)
    assert first.container == "init"


def test_a_sidecar_keeps_its_devices() -> None:
    """A restartable init container runs beside the app containers: its devices are not reused."""
    a = assignment_of(side=ids(0), main=ids(1))
    side = {**container("side", 1), "restartPolicy": "Always"}
    p = pod(a, init=[side], containers=[container("main", 1)])
    (s,) = walk(a, p, [ids(0)])
    refused(decide_allocate(lease(a), p, ids(0), s.progress, CTX), RefusalKind.DEVICES_MISMATCH)
    served(decide_allocate(lease(a), p, ids(1), s.progress, CTX))


def test_preference_fills_up_from_the_pool_after_kubelets_reuse() -> None:
    """init 4 -> app 1 then app 4: kubelet took GPU-02 for the first app container, so the
    second one's preference is the three left of the pool plus the pod's fresh device."""
    a = assignment_of(init=ids(0, 1, 2, 3), c0=ids(0), c1=ids(1, 2, 3, 4))
    p = pod(a, init=[container("init", 4)], containers=[container("c0", 1), container("c1", 4)])
    _, c0 = walk(a, p, [ids(0, 1, 2, 3), ids(2)])
    free = [g for g in GPUS if g not in ids(0, 1, 2, 3)]
    pref = decide_preferred(lease(a), p, free, ids(0, 1, 3), 4, c0.progress, CTX)
    assert pref.hit, pref.reason
    assert set(pref.devices) == set(ids(0, 1, 3, 4))
    c1 = served(decide_allocate(lease(a), p, list(pref.devices), c0.progress, CTX))
    assert c1.last


def test_an_assignment_sharing_a_device_between_app_containers_is_rejected() -> None:
    a = assignment_of(c0=ids(0), c1=ids(0))
    p = pod(a, containers=[container("c0", 1), container("c1", 1)])
    r = refused(decide_allocate(lease(a), p, ids(0), None, CTX), RefusalKind.SPEC_MISMATCH)
    releases_the_holder(r, lease(a))


# -- a GPU pod bound around the extender beside the holder (hole 1b) -----------------------------


def bypass(
    name: str = "sneaky", *, gpus: int | str | None = 1, uid: str = "uid-x", **status: Any
) -> dict[str, Any]:
    """A pod bound to this node by hand: no lock, no assignment."""
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "spec": {"nodeName": NODE, "containers": [container("c", gpus)]},
        "status": {"phase": "Pending", **status},
    }


def test_another_pending_gpu_pod_bound_here_makes_allocate_ambiguous() -> None:
    """kubelet may be admitting the other pod with the holder's count: refuse, keep the lock."""
    r = refused(
        decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, bound_here=[ONE_POD, bypass()]),
        RefusalKind.AMBIGUOUS,
    )
    assert r.release is None
    assert "ns/sneaky (uid uid-x)" in r.message


@pytest.mark.parametrize(
    "other",
    [
        bypass(gpus=None),  # asks for no GPU
        bypass(gpus=0),
        bypass(phase="Failed", reason="UnexpectedAdmissionError"),  # kubelet rejected it
        bypass(phase="Succeeded"),  # a finished Job pod
        {**bypass(), "spec": {"nodeName": "n2", "containers": [container("c", 1)]}},
    ],
    ids=["no-gpu", "zero-gpus", "rejected", "succeeded", "elsewhere"],
)
def test_pods_that_cannot_be_admitted_for_gpus_now_are_no_bystanders(other: dict[str, Any]) -> None:
    a = served(decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, bound_here=[ONE_POD, other]))
    assert (a.container, a.devices, a.token, a.last) == ("main", tuple(ids(3)), TOKEN, True)


@pytest.mark.parametrize(
    "other",
    [
        bypass(phase="Running"),
        bypass(containerStatuses=[{"name": "c", "state": {"waiting": {}}}]),
    ],
    ids=["running", "waiting"],
)
def test_an_admitted_gpu_pod_is_a_bystander_unless_kubelet_records_its_devices(
    other: dict[str, Any],
) -> None:
    """Without List, an admitted pod may be one kubelet calls Allocate for again (it restarted
    and lost its checkpoint): it counts unless kubelet's checkpoint records its devices."""
    bound = [ONE_POD, other]
    unrecorded: list[dict[str, list[str]] | None] = [None, {}, {"uid-x": []}]
    for recorded in unrecorded:
        r = refused(
            decide_allocate(
                lease(ONE), ONE_POD, ids(3), None, CTX, bound_here=bound, recorded=recorded
            ),
            RefusalKind.AMBIGUOUS,
        )
        assert r.release is None
        assert "ns/sneaky (uid uid-x)" in r.message
    a = served(
        decide_allocate(
            lease(ONE), ONE_POD, ids(3), None, CTX, bound_here=bound, recorded={"uid-x": ["c"]}
        )
    )
    assert (a.devices, a.token) == (tuple(ids(3)), TOKEN)


def test_a_pod_this_plugin_served_is_no_bystander_only_while_kubelet_records_it() -> None:
    """The previous holder, served a moment ago, is Pending until kubelet writes its statuses.
    It is no bystander once kubelet's checkpoint records its devices; being in the plugin's
    own ``served_pods`` is not enough (issue 31 hole 1: kubelet may have restarted before
    writing its checkpoint, and calls Allocate for that pod again)."""
    done = bypass("previous", uid="uid-prev")
    bound = [ONE_POD, done]
    for served_pods in (set(), {"uid-prev"}):
        r = refused(
            decide_allocate(
                lease(ONE), ONE_POD, ids(3), None, CTX, bound_here=bound, served_pods=served_pods
            ),
            RefusalKind.AMBIGUOUS,
        )
        assert "ns/previous (uid uid-prev)" in r.message
        assert r.release is None
    a = served(
        decide_allocate(
            lease(ONE),
            ONE_POD,
            ids(3),
            None,
            CTX,
            bound_here=bound,
            served_pods={"uid-prev"},
            recorded={"uid-prev": ["c"]},
        )
    )
    assert (a.container, a.devices) == ("main", tuple(ids(3)))


def test_after_a_kubelet_restart_the_fallback_never_serves_a_served_pod_the_holders_devices() -> (
    None
):
    """Issue 31 hole 1 on the fallback path: P was served (Running now), kubelet restarted
    without writing its checkpoint, Q holds the lock, List fails; kubelet's Allocate for P
    must not get Q's devices."""
    p_running = bypass(
        "p-old", uid="uid-p", phase="Running", containerStatuses=[{"name": "c", "state": {}}]
    )
    q = pod(ONE, containers=[container("main", 1)], uid="uid-q")
    q["metadata"]["name"] = "q"
    view = lease(ONE, uid="uid-q", holder="ns/q")
    r = refused(
        decide_allocate(
            view,
            q,
            ids(3),
            None,
            CTX,
            bound_here=[q, p_running],
            served_pods={"uid-p"},
            recorded={},  # the checkpoint kubelet wrote after its restart lacks P
        ),
        RefusalKind.AMBIGUOUS,
    )
    assert "ns/p-old (uid uid-p)" in r.message
    assert r.release is None


def test_a_pod_being_deleted_before_admission_is_a_bystander() -> None:
    meta = {**bypass()["metadata"], "deletionTimestamp": "2024-01-01T00:00:00Z"}
    other = {**bypass(), "metadata": meta}
    refused(
        decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, bound_here=[other]),
        RefusalKind.AMBIGUOUS,
    )


# -- who kubelet admits, by its own PodResources view (hole 1b without ambiguity) ---------------


def listed(name: str, **containers: Sequence[str]) -> KubeletPod:
    """One pod of kubelet's PodResources List: container -> the devices kubelet gave it."""
    return KubeletPod("ns", name, {c: frozenset(d) for c, d in containers.items()})


def admitting(
    entries: list[KubeletPod], specs: dict[str, Any], served_uids: set[str] | None = None
) -> KubeletAdmission:
    return kubelet_admitting(entries, specs, HolderKey("ns/p"), served_uids or set(), CTX)


def test_the_holder_alone_awaiting_devices_is_served() -> None:
    """Other pods kubelet lists have their devices, ask for none, or were served by this plugin."""
    running = bypass("running", uid="uid-r")
    cpu_only = bypass("cpu", gpus=None, uid="uid-c")
    previous = bypass("previous", uid="uid-prev")  # served, its status not written yet
    entries = [
        listed("p", main=[]),
        listed("running", c=ids(5)),
        listed("cpu", c=[]),
        listed("previous", c=ids(6)),
    ]
    specs = {"ns/running": running, "ns/cpu": cpu_only, "ns/previous": previous}
    seen = admitting(entries, specs, {"uid-prev"})
    assert seen == KubeletAdmission(holder_listed=True, others=())
    a = served(decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=seen))
    assert (a.container, a.devices, a.token, a.last) == ("main", tuple(ids(3)), TOKEN, True)


def test_a_served_pod_kubelet_lists_without_devices_may_be_asked_for_again() -> None:
    """Issue 31 hole 1 with List: kubelet restarted before writing its checkpoint and lists the
    pod this plugin served with no devices; it calls Allocate for it again (at re-admission, or
    from the pod worker via GetDeviceRunContainerOptions), so it counts until kubelet records
    its devices again (List or checkpoint)."""
    previous = bypass("previous", uid="uid-prev", phase="Running")
    entries = [listed("p", main=[]), listed("previous", c=[])]
    seen = admitting(entries, {"ns/previous": previous}, {"uid-prev"})
    assert seen == KubeletAdmission(holder_listed=True, others=("ns/previous",))
    r = refused(
        decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=seen),
        RefusalKind.AMBIGUOUS,
    )
    assert "ns/previous" in r.message
    assert r.release is None
    recorded = kubelet_admitting(
        entries,
        {"ns/previous": previous},
        HolderKey("ns/p"),
        {"uid-prev"},
        CTX,
        recorded={"uid-prev": ["c"]},
    )
    assert recorded == KubeletAdmission(holder_listed=True, others=())


def test_kubelet_admitting_a_bypass_pod_is_refused_and_the_lock_kept() -> None:
    """The bypass pod is listed and the holder not yet: kubelet admits the bypass pod."""
    seen = admitting([listed("sneaky", c=[])], {"ns/sneaky": bypass()})
    assert seen == KubeletAdmission(holder_listed=False, others=("ns/sneaky",))
    r = refused(
        decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=seen),
        RefusalKind.AMBIGUOUS,
    )
    assert r.release is None
    assert "kubelet is admitting another pod" in r.message
    assert "awaiting devices: ns/sneaky" in r.message


def test_a_holder_kubelet_rejected_is_not_listed_and_not_served() -> None:
    """A rejected pod leaves kubelet's active list at once, before its Failed status is written."""
    seen = admitting([listed("next", main=[])], {"ns/next": bypass("next", uid="uid-n")})
    assert not seen.holder_listed
    r = refused(
        decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=seen),
        RefusalKind.AMBIGUOUS,
    )
    assert r.release is None


@pytest.mark.parametrize(
    ("entry", "spec"),
    [
        (listed("other", c=[]), bypass("other")),  # a GPU container without devices
        (listed("other", c=[]), None),  # unknown to the API server and the watch
        (listed("other", c=[]), bypass("other", gpus="one")),  # unreadable request
        (
            listed("other", app=[]),  # GPUs in an init container only, not admitted by status
            {
                **bypass("other"),
                "spec": {
                    "nodeName": NODE,
                    "initContainers": [container("c", 1)],
                    "containers": [container("app", None)],
                },
            },
        ),
    ],
    ids=["unserved", "unknown", "unreadable", "init-only-pending"],
)
def test_a_second_pod_awaiting_devices_makes_the_call_ambiguous(
    entry: KubeletPod, spec: dict[str, Any] | None
) -> None:
    seen = admitting([listed("p", main=[]), entry], {"ns/other": spec})
    assert seen.holder_listed
    assert len(seen.others) == 1
    assert seen.others[0].startswith("ns/other")
    r = refused(
        decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=seen),
        RefusalKind.AMBIGUOUS,
    )
    assert r.release is None


def test_an_admitted_init_only_gpu_pod_is_no_bystander() -> None:
    """kubelet lists no init containers: such a pod counts as admitted once its status says so."""
    spec = {
        **bypass("other", phase="Running"),
        "spec": {
            "nodeName": NODE,
            "initContainers": [container("c", 1)],
            "containers": [container("app", None)],
        },
    }
    seen = admitting([listed("p", main=[]), listed("other", app=[])], {"ns/other": spec})
    assert seen == KubeletAdmission(holder_listed=True, others=())


def test_a_holder_kubelet_already_gave_its_gpus_is_not_the_pod_it_asks_about() -> None:
    """kubelet lists the holder with its device: the Allocate in flight is another pod's."""
    given = admitting([listed("p", main=ids(3))], {}, set())
    assert given.holder_listed  # without the holder's spec, listed is all that is known
    seen = kubelet_admitting(
        [listed("p", main=ids(3))], {}, HolderKey("ns/p"), set(), CTX, holder_pod=ONE_POD
    )
    assert not seen.holder_listed
    refused(
        decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=seen),
        RefusalKind.AMBIGUOUS,
    )
    waiting = kubelet_admitting(
        [listed("p", main=[])], {}, HolderKey("ns/p"), set(), CTX, holder_pod=ONE_POD
    )
    serves(decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=waiting), "main", ids(3))


# -- kubelets that list every pod in their pod manager (before 1.34, or the gate off) -----------


def terminated(name: str, exit_code: int) -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": exit_code}}}


def with_spec(other: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {**other, "spec": {**other["spec"], **spec}}


@pytest.mark.parametrize(
    "spec",
    [
        bypass("other", phase="Succeeded"),  # a finished Job pod
        bypass("other", phase="Failed"),  # failed
        bypass("other", phase="Failed", reason="OutOfnvidia.com/gpu"),  # kubelet rejected it
        with_spec(  # every container ended and none starts again
            bypass("other", phase="Running", containerStatuses=[terminated("c", 1)]),
            restartPolicy="Never",
        ),
        with_spec(
            bypass("other", phase="Running", containerStatuses=[terminated("c", 0)]),
            restartPolicy="OnFailure",
        ),
    ],
    ids=["succeeded", "failed", "rejected", "ended-never", "ended-onfailure-ok"],
)
def test_a_finished_or_rejected_pod_listed_without_devices_never_blocks(
    spec: dict[str, Any],
) -> None:
    """kubelet before 1.34 lists such a pod, its GPU container without devices (kubelet freed
    them), until the pod is deleted from the API."""
    seen = admitting([listed("p", main=[]), listed("other", c=[])], {"ns/other": spec})
    assert seen == KubeletAdmission(holder_listed=True, others=())
    a = served(decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=seen))
    assert (a.container, a.devices, a.token) == ("main", tuple(ids(3)), TOKEN)


@pytest.mark.parametrize(
    "spec",
    [
        with_spec(  # Always starts it again
            bypass("other", phase="Running", containerStatuses=[terminated("c", 0)]),
            restartPolicy="Always",
        ),
        with_spec(  # OnFailure starts a failed one again
            bypass("other", phase="Running", containerStatuses=[terminated("c", 1)]),
            restartPolicy="OnFailure",
        ),
        with_spec(  # one container still runs
            bypass(
                "other",
                phase="Running",
                containerStatuses=[terminated("c", 0), {"name": "d", "state": {"running": {}}}],
            ),
            restartPolicy="Never",
        ),
    ],
    ids=["always", "onfailure-failed", "one-running"],
)
def test_a_pod_whose_containers_may_start_again_still_counts(spec: dict[str, Any]) -> None:
    seen = admitting([listed("p", main=[]), listed("other", c=[])], {"ns/other": spec})
    assert seen == KubeletAdmission(holder_listed=True, others=("ns/other",))


def test_a_pod_whose_gpus_come_from_dra_is_not_counted() -> None:
    """kubelet 1.37 leaves a request mapped in ``extendedResourceClaimStatus`` to the DRA
    driver and lists the container with no device plugin devices, for good."""
    dra = bypass(
        "other",
        extendedResourceClaimStatus={
            "resourceClaimName": "other-extended-resources-xyz",
            "requestMappings": [
                {"containerName": "c", "resourceName": "nvidia.com/gpu", "requestName": "r0"}
            ],
        },
    )
    seen = admitting([listed("p", main=[]), listed("other", c=[])], {"ns/other": dra})
    assert seen == KubeletAdmission(holder_listed=True, others=())
    other_resource = copy.deepcopy(dra)
    other_resource["status"]["extendedResourceClaimStatus"]["requestMappings"][0][
        "resourceName"
    ] = "example.com/fpga"
    counted = admitting([listed("p", main=[]), listed("other", c=[])], {"ns/other": other_resource})
    assert counted.others == ("ns/other",)


def test_an_unknown_listed_pod_counts_only_as_long_as_an_admission_can_take() -> None:
    """A static pod without a mirror pod is listed by kubelet and unknown to the API server."""
    entries = [listed("p", main=[]), listed("static-n1", c=[])]
    specs: dict[str, Any] = {"ns/static-n1": None}

    def seen_after(age: float | None) -> KubeletAdmission:
        ages = None if age is None else {"ns/static-n1": age}
        return kubelet_admitting(
            entries, specs, HolderKey("ns/p"), set(), CTX, holder_pod=ONE_POD, unknown_for_s=ages
        )

    for age in (None, 0.0, UNKNOWN_POD_WAIT_S - 1):
        early = seen_after(age)
        assert early.holder_listed
        assert early.ignored_unknown == ()
        assert len(early.others) == 1
        assert early.others[0].startswith("ns/static-n1 (unknown to the API server")
        assert f"at most {UNKNOWN_POD_WAIT_S:.0f} s" in early.others[0]
        r = refused(
            decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=early),
            RefusalKind.AMBIGUOUS,
        )
        assert "ns/static-n1 (unknown to the API server" in r.message
    late = seen_after(UNKNOWN_POD_WAIT_S)
    assert late == KubeletAdmission(
        holder_listed=True, others=(), ignored_unknown=("ns/static-n1",)
    )
    a = served(decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=late))
    assert (a.devices, a.token) == (tuple(ids(3)), TOKEN)


def test_a_static_pod_with_its_mirror_pod_is_judged_by_the_mirror_pods_status() -> None:
    mirror = bypass("static-n1", phase="Running")
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    entries = [listed("p", main=[]), listed("static-n1", c=ids(5))]
    seen = admitting(entries, {"ns/static-n1": mirror})
    assert seen == KubeletAdmission(holder_listed=True, others=())
    finished = bypass("static-n1", phase="Failed")
    gone = admitting([listed("p", main=[]), listed("static-n1", c=[])], {"ns/static-n1": finished})
    assert gone == KubeletAdmission(holder_listed=True, others=())


def test_a_holder_kubelet_rejected_after_allocate_is_not_the_pod_it_asks_about() -> None:
    """kubelet's later admit handlers (resources, affinity, taints, AppArmor, shutdown) may
    reject a pod after its Allocate was answered; a holder listed as Failed is not served."""
    rejected = {**ONE_POD, "status": {"phase": "Failed", "reason": "NodeAffinity"}}
    seen = kubelet_admitting(
        [listed("p", main=[])], {}, HolderKey("ns/p"), set(), CTX, holder_pod=rejected
    )
    assert seen == KubeletAdmission(holder_listed=False, others=())


def test_an_unknown_pod_is_timed_from_the_first_list_that_showed_it() -> None:
    seen, ages = unknown_listed({}, {"ns/static-n1"}, 100.0)
    assert (seen, ages) == ({"ns/static-n1": 100.0}, {"ns/static-n1": 0.0})
    seen, ages = unknown_listed(seen, {"ns/static-n1", "ns/other"}, 130.5)
    assert seen == {"ns/static-n1": 100.0, "ns/other": 130.5}
    assert ages == {"ns/static-n1": 30.5, "ns/other": 0.0}
    # known to the API server now, or no longer listed: forgotten; unknown again starts anew
    seen, ages = unknown_listed(seen, {"ns/other"}, 140.0)
    assert (seen, ages) == ({"ns/other": 130.5}, {"ns/other": 9.5})
    seen, ages = unknown_listed(seen, {"ns/static-n1"}, 150.0)
    assert ages == {"ns/static-n1": 0.0}


def test_kubelets_checkpoint_records_only_containers_with_devices() -> None:
    answers = [
        PluginAnswer("uid-a", "c", frozenset({"GPU-00"}), frozenset({"GPU-00"})),
        PluginAnswer("uid-a", "d", frozenset({"GPU-01"}), None),
        PluginAnswer("uid-b", "c", frozenset(), None),
    ]
    assert kubelet_records(answers) == {"uid-a": {"c", "d"}}
    assert kubelet_records([]) == {}


# -- a holder that ended: its lock is released at once (issue 52) -------------------------------


def _status(phase: str, reason: str = "") -> dict[str, Any]:
    p = pod(assignment_of(c0=["GPU-00"]), containers=[container("c0", 1)])
    p["status"] = {"phase": phase, "reason": reason}
    return p


def test_a_holder_kubelet_rejected_before_any_allocate_has_its_lock_released_rejected() -> None:
    view = lease(assignment_of(c0=["GPU-00"]))
    got = holder_ended(
        view, _status("Failed", "UnexpectedAdmissionError"), seen_gone=False, pending_tokens=()
    )
    assert got is not None
    assert (got.holder.key, got.token, got.end.outcome) == ("ns/p", TOKEN, Outcome.REJECTED)


def test_a_holder_that_succeeded_or_was_deleted_has_its_lock_released() -> None:
    view = lease(assignment_of(c0=["GPU-00"]))
    done = holder_ended(view, _status("Succeeded"), seen_gone=False, pending_tokens=())
    assert done is not None
    assert done.end.outcome is Outcome.FINISHED
    gone = holder_ended(view, None, seen_gone=True, pending_tokens=())
    assert gone is not None
    assert gone.end.outcome is Outcome.DELETED


def test_no_release_for_a_holder_that_may_still_be_admitted_or_one_already_decided() -> None:
    view = lease(assignment_of(c0=["GPU-00"]))
    waiting = pod(assignment_of(c0=["GPU-00"]), containers=[container("c0", 1)])
    assert holder_ended(view, waiting, seen_gone=False, pending_tokens=()) is None
    assert holder_ended(view, None, seen_gone=False, pending_tokens=()) is None  # not seen yet
    failed = _status("Failed", "UnexpectedAdmissionError")
    assert holder_ended(view, failed, seen_gone=False, pending_tokens=(TOKEN,)) is None
    free = lease(None, holder=None)
    assert holder_ended(free, failed, seen_gone=False, pending_tokens=()) is None
    assert holder_ended(None, failed, seen_gone=False, pending_tokens=()) is None


def test_a_holder_failed_then_deleted_has_its_lock_released_rejected() -> None:
    view = lease(assignment_of(c0=["GPU-00"]))
    got = holder_ended(view, None, seen_gone=True, failed_before_gone=True, pending_tokens=())
    assert got is not None
    assert got.end.outcome is Outcome.REJECTED
