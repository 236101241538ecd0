"""Issue 51: Allocate and GetPreferredAllocation decide "may kubelet be admitting another pod
than the holder?" by one rule (``decide.another_pod_may_be_admitted``), fed by kubelet's
PodResources ``List`` or, only on a plugin without that socket, the API server's view; a
``List`` that fails on a socket kubelet made refuses.  Plain data, no cluster."""

from __future__ import annotations

from deviceplugin.decide import (
    UNKNOWN_POD_WAIT_S,
    KubeletAdmission,
    KubeletUnreadable,
    RefusalKind,
    another_pod_may_be_admitted,
    decide_allocate,
    decide_preferred,
    kubelet_admitting,
    unknown_listed,
)
from handoff.audit import KubeletPod
from lockd.model import HolderKey
from tests.unit.test_deviceplugin_decide import (
    CTX,
    GPUS,
    ONE,
    ONE_POD,
    UID,
    bypass,
    ids,
    lease,
    refused,
    served,
)

STATIC = KubeletPod("kube-system", "static-n1", {"c": frozenset()})  # no mirror pod: unknown
HOLDER = KubeletPod("ns", "p", {"main": frozenset()})


def _static_first(age: float = 0.0) -> KubeletAdmission:
    """kubelet lists the static pod it admits and the holder it has not admitted yet."""
    return kubelet_admitting(
        [STATIC, HOLDER],
        {"kube-system/static-n1": None},
        HolderKey("ns/p"),
        (),
        CTX,
        holder_pod=ONE_POD,
        unknown_for_s={"kube-system/static-n1": age},
    )


def test_kubelet_admitting_a_static_pod_is_steered_to_no_device_of_the_holder() -> None:
    """F1 step 2: while kubelet lists a static pod the API server does not know, its
    GetPreferredAllocation is a plain hint, not the holder's assignment, and its Allocate is
    refused: the same rule answers both."""
    seen = _static_first()
    pref = decide_preferred(lease(ONE), ONE_POD, GPUS, [], 1, None, CTX, kubelet=seen)
    assert not pref.hit
    assert "kube-system/static-n1 (unknown to the API server" in pref.reason
    assert pref.devices == (GPUS[0],)  # the hint: sorted available devices, not GPU-03
    r = refused(
        decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=seen),
        RefusalKind.AMBIGUOUS,
    )
    assert r.release is None
    assert r.message == pref.reason


def test_the_holder_alone_is_steered_and_served_by_the_same_rule() -> None:
    seen = kubelet_admitting(
        [HOLDER], {}, HolderKey("ns/p"), (), CTX, holder_pod=ONE_POD, unknown_for_s={}
    )
    pref = decide_preferred(lease(ONE), ONE_POD, GPUS, [], 1, None, CTX, kubelet=seen)
    assert (pref.hit, pref.devices) == (True, (GPUS[3],))
    assert served(decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=seen)).last


def test_a_list_that_fails_on_kubelets_socket_refuses_and_steers_nowhere() -> None:
    """F1 step 1: kubelet's socket is there and List fails (a channel in gRPC's back-off, a
    kubelet starting): no weaker rule decides instead; the holder keeps its lock."""
    down = KubeletUnreadable("PodResources List on /x failed: UNAVAILABLE: back-off")
    r = refused(
        decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=down, bound_here=[ONE_POD]),
        RefusalKind.UNAVAILABLE,
    )
    assert r.release is None
    assert "UNAVAILABLE: back-off" in r.message
    assert "static pod" in r.message
    pref = decide_preferred(lease(ONE), ONE_POD, GPUS, [], 1, None, CTX, kubelet=down)
    assert not pref.hit
    assert pref.reason == r.message


def test_without_a_socket_the_api_servers_view_steers_as_it_refuses() -> None:
    """A plugin without a PodResources socket decides by the pods bound here, for both calls."""
    others = [ONE_POD, bypass()]
    r = another_pod_may_be_admitted("ns/p", UID, CTX, kubelet=None, bound_here=others)
    assert r is not None
    assert r.kind is RefusalKind.AMBIGUOUS
    pref = decide_preferred(lease(ONE), ONE_POD, GPUS, [], 1, None, CTX, bound_here=others)
    assert not pref.hit
    assert "ns/sneaky (uid uid-x)" in pref.reason
    alone = decide_preferred(lease(ONE), ONE_POD, GPUS, [], 1, None, CTX, bound_here=[ONE_POD])
    assert alone.hit


def test_a_restarted_kubelet_times_its_static_pods_anew() -> None:
    """F1's variant: a static pod listed for minutes by the kubelet before a restart is
    admitted again by the new kubelet; it counts as waiting from the new kubelet's first List,
    not as "older than 60 s"."""
    seen, ages = unknown_listed({}, {"kube-system/static-n1"}, 0.0)
    seen, ages = unknown_listed(seen, {"kube-system/static-n1"}, 600.0)
    assert ages["kube-system/static-n1"] >= UNKNOWN_POD_WAIT_S  # the old kubelet's, left out
    seen, ages = unknown_listed(seen, {"kube-system/static-n1"}, 601.0, same_kubelet=False)
    assert ages == {"kube-system/static-n1": 0.0}
    assert _static_first(ages["kube-system/static-n1"]).others  # counts: refused


def test_a_terminating_pod_admitted_before_the_holder_still_calls_no_more() -> None:
    """M1: from 1.33 the API server raises ``metadata.generation`` once, on a pod's first
    graceful deletion (apiserver ``pkg/registry/rest/delete.go`` ``BeforeDelete``): a pod whose
    device record a kubelet restart lost, admitted before the holder and Terminating for its
    grace period, does not block the holder.  A spec change besides (one more) still counts."""
    from tests.unit.test_deviceplugin_admitted_before import admitting, running

    terminating = running(generation=2)
    terminating["metadata"]["deletionTimestamp"] = "2026-12-07T05:00:00Z"
    seen = admitting(terminating, {"ns/before": "uid-b"})
    assert seen == KubeletAdmission(holder_listed=True, others=(), admitted_before=("ns/before",))
    assert served(decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=seen)).last
    resized = running(generation=2)  # a resize, no deletion
    assert admitting(resized, {"ns/before": "uid-b"}).others == ("ns/before",)
    resized_then_deleted = running(generation=3)
    resized_then_deleted["metadata"]["deletionTimestamp"] = "2026-12-07T05:00:00Z"
    assert admitting(resized_then_deleted, {"ns/before": "uid-b"}).others == ("ns/before",)
