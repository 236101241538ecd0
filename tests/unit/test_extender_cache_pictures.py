"""The cache's per-node GPU pictures, kept current write by write, equal a rebuild from scratch.

``ClusterCache.pictures()`` is what filter and prioritize read for every node; each write
rebuilds only the pictures of the nodes it touched.  These tests replay arbitrary sequences of
node and pod events (watch events and relists, in any order, including pods bound to nodes that
do not exist, deletions of unknown objects, pods moving between nodes and finishing) and check,
after every step, that each picture equals the one a fresh cache builds from the same objects.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from handoff.wire import GPU, DeviceID, format_inventory
from lockd.model import NodeName
from scheduler_ext.cache import ClusterCache, node_gpus
from scheduler_ext.choose import NodeGPUs

RES = "nvidia.com/gpu"
NODES = ["n0", "n1", "n2"]
DEVICES = [f"GPU-{i}" for i in range(4)]

JSON = dict[str, Any]


@st.composite
def node_objects(draw: st.DrawFn) -> JSON:
    name = draw(st.sampled_from(NODES))
    annotations: dict[str, str] = {}
    kind = draw(st.sampled_from(["inventory", "inventory", "inventory", "none", "garbage"]))
    if kind == "inventory":
        count = draw(st.integers(0, len(DEVICES)))
        unhealthy = draw(st.sets(st.integers(0, len(DEVICES) - 1)))
        gpus = [
            GPU(DeviceID(DEVICES[i]), i, "H100", 81559, 0, i not in unhealthy) for i in range(count)
        ]
        annotations["nodelock.io/gpus"] = format_inventory(gpus)
    elif kind == "garbage":
        annotations["nodelock.io/gpus"] = "{not json"
    status: JSON = {}
    allocatable = draw(st.one_of(st.none(), st.integers(0, len(DEVICES) + 1)))
    if allocatable is not None:
        status["allocatable"] = {RES: str(allocatable)}
    rv = draw(st.integers(1, 9))
    return {
        "metadata": {"name": name, "annotations": annotations, "resourceVersion": str(rv)},
        "status": status,
    }


@st.composite
def pod_objects(draw: st.DrawFn) -> JSON:
    uid = draw(st.sampled_from(["u0", "u1", "u2", "u3", "u4"]))
    name = draw(st.sampled_from(["p0", "p1", "p2"]))  # names reused across UIDs
    meta: JSON = {"name": name, "namespace": "ns", "uid": uid}
    assignment = draw(
        st.one_of(
            st.none(),
            st.lists(st.sampled_from([*DEVICES, "GPU-elsewhere"]), max_size=3, unique=True),
            st.just("garbage"),
        )
    )
    if assignment == "garbage":
        meta["annotations"] = {"nodelock.io/assignment": "{not json"}
    elif assignment is not None:
        meta["annotations"] = {"nodelock.io/assignment": json.dumps({"c": assignment})}
    spec: JSON = {
        "containers": [
            {"name": "c", "resources": {"requests": {RES: str(draw(st.integers(0, 3)))}}}
        ]
    }
    node = draw(st.one_of(st.none(), st.sampled_from([*NODES, "not-a-node"])))
    if node is not None:
        spec["nodeName"] = node
    phase = draw(st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]))
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


EVENTS = st.one_of(
    st.tuples(st.just("node"), st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), node_objects()),
    st.tuples(st.just("pod"), st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), pod_objects()),
    st.tuples(st.just("nodes"), st.just("LIST"), st.lists(node_objects(), max_size=3)),
    st.tuples(st.just("pods"), st.just("LIST"), st.lists(pod_objects(), max_size=5)),
)


class Model:
    """The objects a cache has been told about, by the API server's rules, with no indexes."""

    def __init__(self) -> None:
        self.nodes: dict[str, JSON] = {}
        self.pods: dict[str, JSON] = {}

    def apply(self, what: str, kind: str, obj: Any) -> None:
        if what == "nodes":
            self.nodes = {o["metadata"]["name"]: o for o in obj}
        elif what == "pods":
            self.pods = {o["metadata"]["uid"]: o for o in obj}
        else:
            table = self.nodes if what == "node" else self.pods
            key = obj["metadata"]["name" if what == "node" else "uid"]
            if kind == "DELETED":
                table.pop(key, None)
            else:
                table[key] = obj

    def fresh(self) -> ClusterCache:
        cache = ClusterCache(resource=RES)
        cache.replace_nodes(list(self.nodes.values()))
        cache.replace_pods(list(self.pods.values()))
        return cache


def apply(cache: ClusterCache, what: str, kind: str, obj: Any) -> None:
    if what == "nodes":
        cache.replace_nodes(obj)
    elif what == "pods":
        cache.replace_pods(obj)
    elif what == "node":
        cache.apply_node(kind, obj)
    else:
        cache.apply_pod(kind, obj)


def same(a: NodeGPUs | None, b: NodeGPUs | None) -> bool:
    """Equal pictures, derived figures included (filter and prioritize read those)."""
    if a is None or b is None:
        return a is b
    return (a, a.free, a.capacity, a.assigned, a.available, a.fit_key) == (
        b,
        b.free,
        b.capacity,
        b.assigned,
        b.available,
        b.fit_key,
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, max_size=25))
def test_pictures_equal_a_rebuild_from_scratch_after_any_events(
    events: list[tuple[str, str, Any]],
) -> None:
    cache = ClusterCache(resource=RES)
    model = Model()
    for what, kind, obj in events:
        apply(cache, what, kind, obj)
        model.apply(what, kind, obj)
        fresh = model.fresh()
        assert set(cache.pictures()) == set(fresh.pictures()) == set(model.nodes)
        for name in NODES:
            node = NodeName(name)
            ours = cache.node_gpus(node)
            assert same(ours, fresh.node_gpus(node)), (name, events)
            state = cache.node(node)
            direct = None if state is None else node_gpus(state, cache.pods_on(node))
            assert same(ours, direct)
            assert same(cache.pictures().get(node), ours)


def test_a_write_rebuilds_only_the_pictures_it_touched() -> None:
    cache = ClusterCache(resource=RES)
    inventory = format_inventory(
        [GPU(DeviceID(d), i, "H100", 81559, 0, True) for i, d in enumerate(DEVICES)]
    )
    cache.replace_nodes(
        [
            {
                "metadata": {"name": n, "annotations": {"nodelock.io/gpus": inventory}},
                "status": {"allocatable": {RES: str(len(DEVICES))}},
            }
            for n in NODES
        ]
    )
    before = dict(cache.pictures())
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"requests": {RES: "1"}}}],
        },
        "status": {"phase": "Running"},
    }
    cache.apply_pod("ADDED", pod)
    after = cache.pictures()
    assert after[NodeName("n0")] is before[NodeName("n0")]
    assert after[NodeName("n2")] is before[NodeName("n2")]
    assert after[NodeName("n1")] is not before[NodeName("n1")]
    assert after[NodeName("n1")].available == len(DEVICES) - 1
    # the rebuilt picture keeps the node's inventory tuple, so its layout is computed once
    assert after[NodeName("n1")].devices is before[NodeName("n1")].devices


def test_a_mig_nodes_pictures_share_its_whole_gpus_and_its_instances() -> None:
    cache = ClusterCache(resource=RES)
    gpus = [
        GPU(DeviceID("GPU-0"), 0, "H100", 81559, 0, True),
        GPU(
            DeviceID("MIG-1a"),
            1,
            "H100",
            9984,
            0,
            True,
            profile="1g.10gb",
            parent=DeviceID("GPU-1"),
        ),
    ]
    inventory = format_inventory(gpus)
    cache.replace_nodes(
        [{"metadata": {"name": "n0", "annotations": {"nodelock.io/gpus": inventory}}}]
    )
    first = cache.pictures()[NodeName("n0")]
    assert [g.id for g in first.devices] == ["GPU-0"]
    assert [g.id for g in first.mig] == ["MIG-1a"]
    asks = {"name": "c", "resources": {"requests": {RES: "1"}}}
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"nodeName": "n0", "containers": [asks]},
        "status": {"phase": "Running"},
    }
    cache.apply_pod("ADDED", pod)
    second = cache.pictures()[NodeName("n0")]
    assert second is not first
    assert second.available == 0
    assert second.devices is first.devices
    assert second.mig is first.mig
