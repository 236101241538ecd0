"""The plugin's progress of a handoff, trusted only as far as kubelet's records confirm it.

kubelet records a container's devices and writes its checkpoint after the plugin answered
(cm/devicemanager/manager.go ``allocateContainerResources``: ``podDevices.insert``, then
``writeCheckpoint``, v1.31.9 lines 915, 919; v1.37.2 lines 955, 959), and calls Allocate only for a
container it has no record of (``devicesToAllocate``, v1.31.9 lines 577, 629; v1.37.2 lines 611,
663), init containers first, then containers, in spec order.  A kubelet that died between the
plugin's answer and that write asks for the same container again; the plugin's own progress already
counts it as served.  Plain data, no mocks.
"""

from __future__ import annotations

from deviceplugin.decide import (
    Allocation,
    HandoffProgress,
    MismatchPolicy,
    Refusal,
    RefusalKind,
    decide_allocate,
    decide_preferred,
    kubelet_admitting,
    kubelet_confirmed,
)
from handoff.wire import DEFAULT_RESOURCE
from lockd.model import HolderKey
from tests.unit.test_deviceplugin_decide import (
    CTX,
    UID,
    C,
    assignment_of,
    container,
    ids,
    lease,
    listed,
    pod,
    serves,
)

TWO = assignment_of(a=ids(0), b=ids(1))
TWO_POD = pod(TWO, containers=[container("a", 1), container("b", 1)])
HOLDER = HolderKey("ns/p")
A_SERVED = HandoffProgress(HOLDER, UID, lease(TWO).record.token, (C("a"),), (tuple(ids(0)),))


def test_a_container_kubelet_lost_the_record_of_gets_its_own_devices_again() -> None:
    """kubelet died after the plugin answered "a" and before writing its checkpoint: at
    re-admission it asks for "a" again (its checkpoint, read afresh, has no record of the
    pod).  "a" is served its own assignment, and the lock is not released: "b" is still to
    come."""
    again = decide_allocate(lease(TWO), TWO_POD, ids(0), A_SERVED, CTX, recorded={})
    serves(again, "a", ids(0))
    assert isinstance(again, Allocation)
    assert not again.last
    assert again.progress.served == (C("a"),)
    # then kubelet records "a" (writes its checkpoint) and asks for "b": the last one
    then = decide_allocate(lease(TWO), TWO_POD, ids(1), again.progress, CTX, recorded={UID: {"a"}})
    serves(then, "b", ids(1))
    assert isinstance(then, Allocation)
    assert then.last
    assert then.progress.served == (C("a"), C("b"))


def test_kubelet_asking_again_for_a_lost_container_is_not_given_the_next_ones_devices() -> None:
    """The devices kubelet asks for at re-admission by its preference: "a"'s own, which a
    plugin trusting its progress alone refused as a mismatch for "b" or, with the assignment
    policy, answered with "b"'s devices and released the lock."""
    pref = decide_preferred(lease(TWO), TWO_POD, ids(0, 1, 2), [], 1, A_SERVED, CTX, recorded={})
    assert pref.hit
    assert pref.devices == tuple(ids(0))
    lenient = decide_allocate(
        lease(TWO),
        TWO_POD,
        ids(0),
        A_SERVED,
        CTX,
        policy=MismatchPolicy.ASSIGNMENT,
        recorded={},
    )
    serves(lenient, "a", ids(0))
    assert isinstance(lenient, Allocation)
    assert not lenient.last
    assert not lenient.kubelet_differs


def test_kubelet_records_of_other_pods_do_not_confirm_the_holders_progress() -> None:
    other = {"uid-other": {"a", "b"}}
    serves(decide_allocate(lease(TWO), TWO_POD, ids(0), A_SERVED, CTX, recorded=other), "a", ids(0))


def test_a_recorded_container_stays_served() -> None:
    """kubelet recorded "a": it asks for "b", and "a"'s devices are not offered again."""
    r = decide_allocate(lease(TWO), TWO_POD, ids(0), A_SERVED, CTX, recorded={UID: {"a"}})
    assert isinstance(r, Refusal)
    assert r.kind is RefusalKind.DEVICES_MISMATCH
    assert r.release is None
    pref = decide_preferred(
        lease(TWO), TWO_POD, ids(0, 1, 2), [], 1, A_SERVED, CTX, recorded={UID: {"a"}}
    )
    assert pref.devices == tuple(ids(1))


def test_without_kubelets_checkpoint_the_progress_is_trusted_as_it_stands() -> None:
    """``recorded`` None (kubelet's checkpoint not read): the progress alone decides, so
    a kubelet asking for "b" is never given "a"'s devices."""
    serves(decide_allocate(lease(TWO), TWO_POD, ids(1), A_SERVED, CTX, recorded=None), "b", ids(1))


def test_three_containers_kubelet_lost_only_the_last_record() -> None:
    three = assignment_of(a=ids(0), b=ids(1), c=ids(2))
    p = pod(three, containers=[container("a", 1), container("b", 1), container("c", 1)])
    token = lease(three).record.token
    progress = HandoffProgress(HOLDER, UID, token, (C("a"), C("b")), (tuple(ids(0)), tuple(ids(1))))
    again = decide_allocate(lease(three), p, ids(1), progress, CTX, recorded={UID: {"a"}})
    serves(again, "b", ids(1))
    assert isinstance(again, Allocation)
    assert again.progress.served == (C("a"), C("b"))
    assert not again.last


MIG_1G = "nvidia.com/mig-1g.10gb"


def _mixed(*entries: tuple[str, str, int]) -> HandoffProgress:
    """The holder's progress with ``(container, resource, device index)`` entries served."""
    return HandoffProgress(
        HOLDER,
        UID,
        lease(TWO).record.token,
        tuple(C(name) for name, _, _ in entries),
        tuple(tuple(ids(index)) for _, _, index in entries),
        tuple(resource for _, resource, _ in entries),
    )


def test_kubelet_confirmed_keeps_other_resources_and_parallel_entries() -> None:
    token = lease(TWO).record.token
    whole = _mixed(("a", DEFAULT_RESOURCE, 0), ("m", MIG_1G, 5), ("b", DEFAULT_RESOURCE, 1))
    kept = kubelet_confirmed(whole, {UID: {"b"}}, DEFAULT_RESOURCE)
    assert kept.served == (C("m"), C("b"))
    assert kept.given == (tuple(ids(5)), tuple(ids(1)))
    assert kept.resources == (MIG_1G, DEFAULT_RESOURCE)
    assert kubelet_confirmed(whole, None, DEFAULT_RESOURCE) is whole
    assert kubelet_confirmed(whole, {UID: {"a", "b"}}, DEFAULT_RESOURCE) is whole
    # a checkpoint written before ``given`` was kept: the recorded devices stay parallel
    old = HandoffProgress(HOLDER, UID, token, (C("a"), C("b")), (tuple(ids(0)),))
    assert kubelet_confirmed(old, {UID: {"b"}}, DEFAULT_RESOURCE).given == ()
    assert kubelet_confirmed(old, {UID: {"a"}}, DEFAULT_RESOURCE).given == (tuple(ids(0)),)


def test_an_entry_of_another_resource_counts_while_kubelet_holds_its_devices() -> None:
    """kubelet writes its checkpoint once per container, after each of its resources, but
    holds (and ``List`` shows) each resource's devices from its answer on.  ``m``'s MIG entry
    stands while kubelet holds it (the same container's next resource asked of this kubelet),
    and is dropped when it does not (a kubelet that died before writing asks for it again);
    ``held_other`` None (``List`` unread) leaves it standing."""
    whole = _mixed(("a", DEFAULT_RESOURCE, 0), ("m", MIG_1G, 5))
    recorded = {UID: {"a"}}
    assert kubelet_confirmed(whole, recorded, DEFAULT_RESOURCE, held_other={MIG_1G: {"m"}}) is whole
    assert kubelet_confirmed(whole, recorded, DEFAULT_RESOURCE, held_other=None) is whole
    lost = kubelet_confirmed(whole, recorded, DEFAULT_RESOURCE, held_other={MIG_1G: set()})
    assert lost.served == (C("a"),)
    assert lost.resources == (DEFAULT_RESOURCE,)
    assert kubelet_confirmed(whole, recorded, DEFAULT_RESOURCE, held_other={}).served == (C("a"),)


def test_the_holder_listed_without_the_lost_containers_devices_is_the_pod_kubelet_admits() -> None:
    """With kubelet's List: the holder is listed with "a" without devices (kubelet lost them),
    so it is the pod kubelet admits, and "a" gets its own devices again."""
    seen = kubelet_admitting(
        [listed("p", a=[], b=[])], {}, HOLDER, {UID}, CTX, holder_pod=TWO_POD, recorded={}
    )
    assert seen.holder_listed
    again = decide_allocate(lease(TWO), TWO_POD, ids(0), A_SERVED, CTX, kubelet=seen, recorded={})
    serves(again, "a", ids(0))
