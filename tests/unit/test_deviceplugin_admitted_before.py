"""A pod kubelet admitted before the lock's holder, running without device records, does not
block the node (issue 30: kubelet restarted without its device checkpoint).

kubelet adds a pod to its pod manager and then admits it, one pod at a time in its sync loop
(``kubelet.go`` ``HandlePodAdditions``, v1.31.9 lines 2547-2594, v1.37.2 lines 2893-2923); ``List``
answers from that pod manager.  So a pod listed in a read that did not list the holder finished
its admission before the holder's began.  With ``PreStartRequired`` kubelet's pod worker never
calls Allocate for a container without a device record
(``cm/devicemanager/manager.go`` ``GetDeviceRunContainerOptions``, v1.31.9 lines 949-994,
v1.37.2 lines 990-1037), and a pod whose spec never changed (``metadata.generation`` 1, set
from 1.33) has no resize for kubelet to admit (``kubelet.go`` ``canResizePod``, v1.31.9 line
2795 with the alpha gate on, v1.33.13 line 2912).  Such a pod makes no Allocate call: the
holder's call is not its.  Plain data, no mocks.
"""

from __future__ import annotations

from typing import Any, cast

from deviceplugin.decide import (
    KubeletAdmission,
    KubeletSightings,
    RefusalKind,
    admitted_before,
    bystanders,
    decide_allocate,
    kubelet_admitting,
    sight,
)
from deviceplugin.servicer import DevicePluginServicer, options
from lockd.model import HolderKey
from proto import deviceplugin_v1beta1_pb2 as pb
from tests.unit.test_deviceplugin_decide import (
    CTX,
    ONE,
    ONE_POD,
    bypass,
    ids,
    lease,
    listed,
    refused,
    serves,
)

HOLDER = HolderKey("ns/p")
K1 = "8:1:100"  # one kubelet's PodResources socket file
K2 = "8:2:200"  # the socket of the kubelet started after it


def running(name: str = "before", *, uid: str = "uid-b", generation: int | None = 1) -> Any:
    """A pod admitted and running before kubelet restarted, its spec unchanged since creation."""
    pod = bypass(name, uid=uid, phase="Running")
    if generation is not None:
        pod["metadata"]["generation"] = generation
    return pod


def reads(*listings: tuple[str, list[str]], uids: dict[str, str] | None = None) -> Any:
    """The sightings after one List read per ``(instance, listed pods)``."""
    out = KubeletSightings()
    for instance, names in listings:
        out = sight(out, instance, names, uids or {"ns/before": "uid-b", "ns/p": "uid-1"})
    return out


# -- sightings: which pods were listed before the holder --------------------------------------


def test_a_pod_listed_before_the_holder_was_admitted_before_it() -> None:
    seen = reads((K1, ["ns/before"]), (K1, ["ns/before", "ns/p"]))
    assert admitted_before(seen, HOLDER) == {"ns/before": "uid-b"}


def test_pods_first_listed_with_the_holder_are_not() -> None:
    """Listed in the same read as the holder: either may be the one kubelet admits now."""
    seen = reads((K1, ["ns/before", "ns/p"]), (K1, ["ns/before", "ns/p"]))
    assert admitted_before(seen, HOLDER) == {}


def test_nothing_before_a_holder_kubelet_never_listed() -> None:
    assert admitted_before(reads((K1, ["ns/before"])), HOLDER) == {}


def test_another_kubelet_starts_from_nothing() -> None:
    """A restarted kubelet admits every pod again, in its own order: what the one before it
    listed says nothing about it."""
    seen = reads((K1, ["ns/before"]), (K2, ["ns/before", "ns/p"]))
    assert admitted_before(seen, HOLDER) == {}
    unsure = reads((K1, ["ns/before"]), ("", ["ns/before"]), (K1, ["ns/before", "ns/p"]))
    assert admitted_before(unsure, HOLDER) == {}


def test_a_pod_no_longer_listed_starts_anew() -> None:
    seen = reads((K1, ["ns/before"]), (K1, []), (K1, ["ns/before", "ns/p"]))
    assert admitted_before(seen, HOLDER) == {}


def test_a_holder_listed_again_counts_from_its_new_listing() -> None:
    """The holder's name left the list (an earlier pod of that name) and came back: pods
    listed in between were admitted before the holder now listed."""
    seen = reads((K1, ["ns/p"]), (K1, ["ns/before"]), (K1, ["ns/before", "ns/p"]))
    assert admitted_before(seen, HOLDER) == {"ns/before": "uid-b"}


def test_a_pod_whose_uid_the_plugin_did_not_know_is_not_known_before() -> None:
    seen = KubeletSightings()
    seen = sight(seen, K1, ["ns/before"], {})
    seen = sight(seen, K1, ["ns/before", "ns/p"], {"ns/before": "uid-b"})
    assert admitted_before(seen, HOLDER) == {}
    changed = KubeletSightings()
    changed = sight(changed, K1, ["ns/before"], {"ns/before": "uid-old"})
    changed = sight(changed, K1, ["ns/before", "ns/p"], {"ns/before": "uid-b"})
    assert admitted_before(changed, HOLDER) == {}


# -- the decision ---------------------------------------------------------------------------


def admitting(other: Any, earlier: dict[str, str] | None) -> KubeletAdmission:
    return kubelet_admitting(
        [listed("p", main=[]), listed("before", c=[])],
        {"ns/before": other},
        HOLDER,
        set(),
        CTX,
        holder_pod=ONE_POD,
        recorded={},
        earlier=earlier,
    )


def test_a_pod_running_without_device_records_admitted_before_the_holder_lets_it_be_served() -> (
    None
):
    """The test's scenario on real kubelets: kubelet restarted without its checkpoint lists the
    pod that ran before without devices; kubelet admitted it before the holder, so the holder's
    call is served with the holder's own devices."""
    seen = admitting(running(), {"ns/before": "uid-b"})
    assert seen == KubeletAdmission(holder_listed=True, others=(), admitted_before=("ns/before",))
    serves(decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=seen), "main", ids(3))


def test_without_knowing_it_was_admitted_before_the_pod_still_counts() -> None:
    """Hole 1 of issue 31 stays closed: a served pod kubelet lost the record of counts unless
    kubelet admitted it before the holder."""
    seen = admitting(running(), None)
    assert seen.others == ("ns/before",)
    r = refused(
        decide_allocate(lease(ONE), ONE_POD, ids(3), None, CTX, kubelet=seen),
        RefusalKind.AMBIGUOUS,
    )
    assert r.release is None


def test_a_pod_whose_spec_changed_counts() -> None:
    """generation 2: a resize kubelet may admit through Allocate again (before 1.37)."""
    assert admitting(running(generation=2), {"ns/before": "uid-b"}).others == ("ns/before",)


def with_statuses(pod: Any, *statuses: dict[str, Any]) -> Any:
    pod["status"]["containerStatuses"] = list(statuses)
    return pod


def test_without_a_generation_a_pod_counts_unchanged_while_kubelet_resizes_nothing() -> None:
    """An API server before 1.33 sets no generation: the pod is left out while its kubelet
    reports no container's resources (its InPlacePodVerticalScaling gate off: no resize)."""
    pod = with_statuses(running(generation=None), {"name": "c0", "ready": True})
    answer = admitting(pod, {"ns/before": "uid-b"})
    assert answer.others == ()
    assert answer.admitted_before == ("ns/before",)


def test_without_a_generation_a_kubelet_that_may_resize_keeps_the_pod_counted() -> None:
    """The same pod whose kubelet reports its containers' resources (the gate on: a resize may
    be admitted through Allocate), or that has no container status yet, still counts."""
    resized = with_statuses(
        running(generation=None), {"name": "c0", "resources": {"limits": {"cpu": "1"}}}
    )
    assert admitting(resized, {"ns/before": "uid-b"}).others == ("ns/before",)
    assert admitting(running(generation=None), {"ns/before": "uid-b"}).others == ("ns/before",)


def test_a_pod_of_another_uid_under_that_name_counts() -> None:
    """The name kubelet listed earlier was another pod's: this one may be in admission now."""
    assert admitting(running(uid="uid-new"), {"ns/before": "uid-b"}).others == ("ns/before",)


def test_the_fallback_is_never_weaker() -> None:
    """Without kubelet's List, the pod counts: the API server's view cannot tell when kubelet
    admitted it."""
    assert bystanders([running()], "uid-1", set(), CTX, recorded={}) == ["ns/before (uid uid-b)"]


async def test_the_plugin_requires_pre_start_so_kubelet_calls_allocate_only_at_admission() -> None:
    """kubelet fails the start of a container it has no device record of before it would call
    Allocate from the pod worker, only when the plugin registered with PreStartRequired."""
    servicer = DevicePluginServicer.__new__(DevicePluginServicer)  # options need no state
    told = await servicer.GetDevicePluginOptions(pb.Empty(), cast(Any, None))
    assert told.pre_start_required
    assert told.get_preferred_allocation_available
    assert not options().pre_start_required  # the stock plugin of devcluster keeps its own
