"""A lock holder on a sharing node: its slice counts even on a GPU that already holds slices.

The Lease's copy of the holder's assignment names GPUs, not the size of its claim: until the
holder is seen bound (its own spec then counts), each of its GPUs counts as held whole."""

from __future__ import annotations

import json
from typing import Any

from handoff.wire import GPU, DeviceID, format_inventory
from lockd.model import FencingToken, Holder, HolderKey, LockRecord, NodeLockView, NodeName
from scheduler_ext.cache import ClusterCache
from scheduler_ext.choose import Fit, fit
from scheduler_ext.need import pod_need
from scheduler_ext.verbs import filter_nodes, with_lock_holder

NODE = NodeName("n1")


def node_obj(*, split: int = 4) -> dict[str, Any]:
    gpu = GPU(DeviceID("GPU-0"), 0, "H100", 81920, None, True, split=split)
    return {
        "metadata": {
            "name": NODE,
            "resourceVersion": "1",
            "annotations": {"nodelock.io/gpus": format_inventory([gpu])},
        },
        "status": {"allocatable": {"nvidia.com/gpu": str(split)}},
    }


def slice_pod(name: str, *, node: str | None = None) -> dict[str, Any]:
    annotations = {}
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}},
            }
        ]
    }
    if node is not None:
        annotations = {
            "nodelock.io/assignment": json.dumps({"main": ["GPU-0"]}),
            "nodelock.io/token": "1",
        }
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def held_by(uid: str) -> NodeLockView:
    holder = Holder(HolderKey(f"ns/{uid}"), uid, {"assignment": '{"main":["GPU-0"]}'})
    record = LockRecord(NODE, holder, FencingToken(2), 15, None, None, "7")
    return NodeLockView(record=record, unchanged_for_s=0.0, expired=False)


def test_a_lock_holders_slice_counts_on_a_gpu_that_already_holds_slices() -> None:
    cache = ClusterCache()
    cache.replace_nodes([node_obj(split=2)])
    cache.replace_pods([slice_pod("a", node=NODE)])  # one of GPU-0's two slices is in use
    base = cache.node_gpus(NODE)
    assert base is not None
    need = pod_need(slice_pod("new"), "nvidia.com/gpu")
    assert fit(base, need).fit is Fit.FITS  # without the holder: the second slice is free
    over = with_lock_holder(base, held_by("uid-h"))  # h holds GPU-0 too, its size unknown
    verdict = fit(over, need)
    assert verdict.fit is not Fit.FITS
    assert "held whole" in verdict.reason
    assert filter_nodes(need, [NODE], {NODE: over}.get).passed == ()


def test_the_holder_is_not_counted_against_itself_nor_once_it_is_accounted_for() -> None:
    cache = ClusterCache()
    cache.replace_nodes([node_obj(split=2)])
    cache.replace_pods([slice_pod("a", node=NODE)])
    base = cache.node_gpus(NODE)
    assert base is not None
    assert with_lock_holder(base, held_by("uid-h"), pod_uid="uid-h") is base
    assert with_lock_holder(base, held_by("uid-h"), finished=lambda uid: uid == "uid-h") is base
