"""The watch-fed cache: what counts as taken, when GPUs are freed, relists, the lock overlay."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from handoff.wire import GPU, DeviceID, Keys, format_inventory
from lockd.model import FencingToken, Holder, HolderKey, LockRecord, NodeLockView, NodeName
from scheduler_ext.cache import ClusterCache
from scheduler_ext.choose import NodeGPUs
from scheduler_ext.state import node_state
from scheduler_ext.verbs import with_lock_holder

RES = "nvidia.com/gpu"


def inventory(n: int, *, unhealthy: tuple[int, ...] = ()) -> str:
    return format_inventory(
        [GPU(DeviceID(f"GPU-{i}"), i, "H100", 81559, 0, i not in unhealthy) for i in range(n)]
    )


def node_obj(name: str, n: int = 4, *, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    ann = {"nodelock.io/gpus": inventory(n)} if annotations is None else annotations
    return {
        "metadata": {"name": name, "annotations": ann, "resourceVersion": "1"},
        "status": {"allocatable": {RES: str(n), "cpu": "8"}},
    }


def pod_obj(
    name: str,
    *,
    uid: str | None = None,
    node: str | None = None,
    gpus: int = 1,
    assignment: dict[str, list[str]] | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}"}
    if assignment is not None:
        meta["annotations"] = {"nodelock.io/assignment": json.dumps(assignment)}
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": {RES: str(gpus)}}}]
    }
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def cache_with(*pods: dict[str, Any], nodes: int = 4) -> ClusterCache:
    cache = ClusterCache()
    cache.replace_nodes([node_obj("n1", nodes), node_obj("n2", nodes)])
    cache.replace_pods(list(pods))
    return cache


def taken(cache: ClusterCache, node: str = "n1") -> set[str]:
    gpus = cache.node_gpus(NodeName(node))
    assert gpus is not None
    return set(gpus.taken)


def test_bound_pods_with_assignments_take_their_devices() -> None:
    cache = cache_with(
        pod_obj("a", node="n1", assignment={"c": ["GPU-0", "GPU-2"]}),
        pod_obj("b", node="n2", assignment={"c": ["GPU-1"]}),
        pod_obj("pending", assignment=None),
    )
    assert taken(cache) == {"GPU-0", "GPU-2"}
    assert taken(cache, "n2") == {"GPU-1"}


def test_terminal_and_deleted_pods_free_their_devices() -> None:
    cache = cache_with(pod_obj("a", node="n1", assignment={"c": ["GPU-0"]}))
    assert taken(cache) == {"GPU-0"}
    cache.apply_pod(
        "MODIFIED", pod_obj("a", node="n1", assignment={"c": ["GPU-0"]}, phase="Failed")
    )
    assert taken(cache) == set()
    cache.apply_pod("MODIFIED", pod_obj("a", node="n1", assignment={"c": ["GPU-0"]}))
    assert taken(cache) == {"GPU-0"}
    cache.apply_pod("DELETED", pod_obj("a", node="n1", assignment={"c": ["GPU-0"]}))
    assert taken(cache) == set()
    assert cache.is_gone("uid-a")
    assert cache.seen_bound_or_gone("uid-a")


def test_relist_drops_pods_deleted_while_the_watch_was_down() -> None:
    cache = cache_with(pod_obj("a", node="n1", assignment={"c": ["GPU-0"]}), pod_obj("b"))
    cache.replace_pods([pod_obj("b")])
    assert taken(cache) == set()
    assert cache.is_gone("uid-a")
    assert cache.pod("uid-b") is not None


def test_bound_pod_without_assignment_holds_unknown_devices() -> None:
    cache = cache_with(pod_obj("x", node="n1", gpus=2))
    gpus = cache.node_gpus(NodeName("n1"))
    assert gpus is not None
    assert gpus.unattributed == 2
    assert gpus.available == 2


def test_malformed_assignment_counts_as_unknown_devices_not_free() -> None:
    bad = pod_obj("x", node="n1", gpus=1)
    bad["metadata"]["annotations"] = {"nodelock.io/assignment": "{not json"}
    cache = cache_with(bad)
    state = cache.pod("uid-x")
    assert state is not None
    assert state.assignment_error is not None
    gpus = cache.node_gpus(NodeName("n1"))
    assert gpus is not None
    assert gpus.available == 3


def test_binding_seen_by_watch_changes_the_picture_of_both_nodes() -> None:
    cache = cache_with(pod_obj("a"))
    assert not cache.seen_bound_or_gone("uid-a")
    before = cache.node_gpus(NodeName("n1"))
    cache.apply_pod("MODIFIED", pod_obj("a", node="n1", assignment={"c": ["GPU-3"]}))
    assert cache.seen_bound_or_gone("uid-a")
    after = cache.node_gpus(NodeName("n1"))
    assert before is not after
    assert taken(cache) == {"GPU-3"}
    assert [p.key for p in cache.pods_on(NodeName("n1"))] == ["ns/a"]


def test_node_inventory_problems_are_kept_as_reasons() -> None:
    keys = Keys()
    missing = node_state(node_obj("n", annotations={}), keys=keys, resource=RES)
    assert missing.problem is not None
    assert "no GPU inventory" in missing.problem
    broken = node_state(node_obj("n", annotations={keys.gpus: "[{]"}), keys=keys, resource=RES)
    assert broken.problem is not None
    assert "does not parse" in broken.problem
    no_alloc = node_obj("n")
    del no_alloc["status"]["allocatable"][RES]
    assert node_state(no_alloc, keys=keys, resource=RES).allocatable == 0


def test_node_deleted_is_unknown() -> None:
    cache = cache_with()
    cache.apply_node("DELETED", node_obj("n1"))
    assert cache.node_gpus(NodeName("n1")) is None
    assert cache.node_names() == ["n2"]


def test_gpu_counts_for_metrics() -> None:
    cache = cache_with(pod_obj("a", node="n1", assignment={"c": ["GPU-0", "GPU-1"]}))
    assert cache.gpu_counts() == {"n1": (4, 2), "n2": (4, 0)}


def _view(holder: Holder | None) -> NodeLockView:
    record = LockRecord(
        node=NodeName("n1"),
        holder=holder,
        token=FencingToken(3),
        duration_s=15,
        acquire_time=None,
        renew_time=None,
        resource_version="9",
    )
    return NodeLockView(record=record, unchanged_for_s=0.0, expired=False)


def test_lock_holders_assignment_is_taken_before_its_pod_annotation_is_seen() -> None:
    cache = cache_with()
    base = cache.node_gpus(NodeName("n1"))
    assert isinstance(base, NodeGPUs)
    holder = Holder(HolderKey("ns/h"), "uid-h", {"assignment": '{"c":["GPU-1","GPU-2"]}'})
    over = with_lock_holder(base, _view(holder))
    assert set(over.taken) == {"GPU-1", "GPU-2"}
    assert over.available == 2
    # the pod being scheduled is not kept off its own devices; a free lock changes nothing
    assert with_lock_holder(base, _view(holder), pod_uid="uid-h") is base
    assert with_lock_holder(base, _view(None)) is base
    assert with_lock_holder(base, None) is base
    broken = Holder(HolderKey("ns/h"), "uid-h", {"assignment": "nope"})
    assert with_lock_holder(base, _view(broken)) is base


async def test_wait_until_wakes_on_a_change() -> None:
    cache = cache_with()

    async def bind_later() -> None:
        await asyncio.sleep(0)
        cache.apply_pod("ADDED", pod_obj("a", node="n1"))

    task = asyncio.create_task(bind_later())
    assert await cache.wait_until(lambda: cache.seen_bound_or_gone("uid-a"), timeout_s=5.0)
    await task
    assert not await cache.wait_until(lambda: cache.is_gone("uid-zzz"), timeout_s=0.01)


def test_finished_lock_holder_does_not_keep_its_devices() -> None:
    cache = cache_with(pod_obj("h", node="n1", assignment={"c": ["GPU-1"]}, phase="Failed"))
    base = cache.node_gpus(NodeName("n1"))
    assert base is not None
    holder = Holder(HolderKey("ns/h"), "uid-h", {"assignment": '{"c":["GPU-1"]}'})
    assert cache.finished("uid-h")
    assert with_lock_holder(base, _view(holder), finished=cache.finished) is base
    assert "GPU-1" in with_lock_holder(base, _view(holder)).taken
    cache.apply_pod("DELETED", pod_obj("h", node="n1"))
    assert cache.finished("uid-h")
    assert not cache.finished("uid-unknown")


def test_a_lock_holder_bound_elsewhere_keeps_nothing_on_this_node() -> None:
    """The orphaned lock the handoff model found: an acquire whose answer was lost leaves n1's
    Lease naming a pod that was then bound to n2.  Filter must not count that pod's assignment
    copy on n1 forever (nothing would ever take the lock over: no bind is sent to a full n1)."""
    cache = cache_with(pod_obj("h", node="n2", assignment={"c": ["GPU-3"]}))
    base = cache.node_gpus(NodeName("n1"))
    assert base is not None
    holder = Holder(HolderKey("ns/h"), "uid-h", {"assignment": '{"c":["GPU-1","GPU-2"]}'})
    assert cache.accounts_for("uid-h")
    assert not cache.finished("uid-h")  # the old predicate: counted the copy on n1 forever
    assert with_lock_holder(base, _view(holder), finished=cache.accounts_for) is base
    assert {"GPU-1", "GPU-2"} <= with_lock_holder(
        base, _view(holder), finished=cache.finished
    ).taken
    # bound here, its own annotation counts its devices; not yet seen bound, the copy counts
    here = cache_with(pod_obj("h", node="n1", assignment={"c": ["GPU-1"]}))
    assert "GPU-1" in here.node_gpus(NodeName("n1")).taken  # type: ignore[union-attr]
    assert here.accounts_for("uid-h")
    pending = cache_with(pod_obj("h"))
    assert not pending.accounts_for("uid-h")
    assert not pending.accounts_for("uid-never-seen")
    pending.apply_pod("DELETED", pod_obj("h"))
    assert pending.accounts_for("uid-h")


def test_pending_demand_follows_binds_terminal_pods_deletes_and_relists() -> None:
    cache = cache_with(pod_obj("a", gpus=1), pod_obj("b", gpus=4), pod_obj("c", gpus=2, node="n1"))
    assert cache.pending_demand() == (5, 4)  # c is bound: not pending
    cache.apply_pod("MODIFIED", pod_obj("b", gpus=4, node="n2"))  # bound
    assert cache.pending_demand() == (1, 1)
    cache.apply_pod("ADDED", pod_obj("d", gpus=8))
    assert cache.pending_demand() == (9, 8)
    cache.apply_pod("MODIFIED", pod_obj("d", gpus=8, phase="Failed"))  # terminal, unbound
    assert cache.pending_demand() == (1, 1)
    cache.apply_pod("DELETED", pod_obj("a"))
    assert cache.pending_demand() == (0, 0)
    cache.replace_pods([pod_obj("e", gpus=3), pod_obj("f", gpus=0)])
    assert cache.pending_demand() == (3, 3)


def test_slices_of_shared_gpus_are_no_whole_gpu_demand() -> None:
    shared = pod_obj("s", gpus=1)
    shared["spec"]["containers"][0]["resources"]["limits"] = {
        RES: "1",
        "nvidia.com/gpumem": "20000",
    }
    cache = cache_with(shared, pod_obj("w", gpus=2))
    assert cache.pending_demand() == (2, 2)


def test_fit_keys_and_a_picture_per_key_follow_every_write() -> None:
    cache = cache_with(pod_obj("a", node="n1", assignment={"c": ["GPU-0"]}))

    def agrees() -> None:
        pictures = cache.pictures()
        assert dict(cache.fit_keys()) == {n: g.fit_key for n, g in pictures.items()}
        for key in cache.fit_keys().values():
            found = cache.with_key(key)
            assert found is not None
            assert found.fit_key == key

    agrees()
    cache.apply_pod("ADDED", pod_obj("b", node="n2", assignment={"c": ["GPU-1"]}))
    agrees()
    cache.apply_pod("MODIFIED", pod_obj("a", node="n1", phase="Succeeded"))
    agrees()
    cache.apply_node("ADDED", node_obj("n3", 8))
    agrees()
    cache.apply_node("DELETED", node_obj("n2"))
    agrees()
    assert NodeName("n2") not in cache.fit_keys()


def test_a_pod_event_that_changes_nothing_the_extender_keeps_rebuilds_no_picture() -> None:
    bound = pod_obj("a", node="n1", assignment={"c": ["GPU-0"]}, phase="Running")
    cache = cache_with(bound)
    before = cache.pictures()[NodeName("n1")]
    again = json.loads(json.dumps(bound))
    again["metadata"]["resourceVersion"] = "7"  # a status write: new version, same facts
    again["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    cache.apply_pod("MODIFIED", again)
    assert cache.pictures()[NodeName("n1")] is before  # not rebuilt
    assert taken(cache) == {"GPU-0"}
    freed = json.loads(json.dumps(again))
    freed["status"]["phase"] = "Succeeded"  # a change the extender keeps: rebuilt, GPU freed
    cache.apply_pod("MODIFIED", freed)
    assert cache.pictures()[NodeName("n1")] is not before
    assert taken(cache) == set()


def test_bound_cpu_pods_are_not_kept_and_leave_no_tombstone() -> None:
    """A bound CPU pod is read and dropped (``PodState.quiet``): at 100,000 pods its record
    would be most of the extender's memory, and no decision reads it."""
    cpu_bound = pod_obj("web", node="n1", gpus=0)
    cpu_pending = pod_obj("queued", gpus=0)
    cache = cache_with(
        cpu_bound, cpu_pending, pod_obj("gpu", node="n1", assignment={"c": ["GPU-0"]})
    )
    assert cache.pod("uid-web") is None
    assert cache.pod("uid-queued") is not None  # not bound yet: kube-scheduler may ask for it
    assert [p.uid for p in cache.pods_on(NodeName("n1"))] == ["uid-gpu"]
    assert taken(cache) == {"GPU-0"}
    cache.apply_pod("DELETED", cpu_bound)
    assert not cache.is_gone("uid-web")
    cache.apply_pod("MODIFIED", pod_obj("queued", node="n2", gpus=0))  # bound: dropped
    assert cache.pod("uid-queued") is None


def test_a_cpu_pod_that_gets_an_assignment_is_kept_and_one_that_loses_it_is_forgotten() -> None:
    cache = cache_with(pod_obj("odd", node="n1", gpus=0))
    assert cache.pod("uid-odd") is None
    cache.apply_pod("MODIFIED", pod_obj("odd", node="n1", gpus=0, assignment={"c": ["GPU-1"]}))
    assert cache.pod("uid-odd") is not None
    assert taken(cache) == {"GPU-1"}
    cache.apply_pod("MODIFIED", pod_obj("odd", node="n1", gpus=0))
    assert cache.pod("uid-odd") is None
    assert taken(cache) == set()
