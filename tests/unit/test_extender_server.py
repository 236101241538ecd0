"""The extender's HTTP endpoints, served for real on loopback, fed with kube-scheduler's JSON.

No API server here: the cache is fed plain objects and the API client is an unconnected one, so
any call to the API server from filter or prioritize would fail these tests.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX
from kube.client import KubeClient
from kube.opsport import OpsServer
from lockd.lease import LeaseFormat
from lockd.locks import NodeLocks
from lockd.metrics import LockMetrics
from lockd.model import Holder, HolderKey, NodeName
from scheduler_ext.binder import Binder
from scheduler_ext.cache import ClusterCache
from scheduler_ext.choose import Policy
from scheduler_ext.metrics import ExtenderMetrics
from scheduler_ext.server import Endpoints, ServerOptions, make_app

WIRE = Path(__file__).parent / "extender_wire"
RES = "nvidia.com/gpu"
MAX_BODY = 256 * 1024


def fixture(name: str) -> Any:
    return json.loads((WIRE / name).read_text())


def node_objects() -> list[dict[str, Any]]:
    """The fixture's candidate nodes plus one more like gpu-a."""
    items: list[dict[str, Any]] = copy.deepcopy(fixture("args_node_list.json")["Nodes"]["items"])
    extra = copy.deepcopy(items[0])
    extra["metadata"]["name"] = "gpu-c"
    extra["metadata"]["annotations"]["nodelock.io/gpus"] = extra["metadata"]["annotations"][
        "nodelock.io/gpus"
    ].replace("GPU-a", "GPU-c")
    return [*items, extra]


def bound_pod(name: str, node: str, devices: list[str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "annotations": {"nodelock.io/assignment": json.dumps({"c": devices})},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {RES: str(len(devices))}}}],
        },
        "status": {"phase": "Running"},
    }


class Served:
    def __init__(self, url: str, endpoints: Endpoints, locks: NodeLocks, cache: ClusterCache):
        self.url = url
        self.endpoints = endpoints
        self.locks = locks
        self.cache = cache
        self.session = aiohttp.ClientSession()

    async def post(self, verb: str, body: Any, *, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.session.post(
            f"{self.url}/{verb}", data=data, headers={"Content-Type": "application/json"}
        ) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(f"{self.url}{path}") as resp:
            return resp.status, await resp.text()


async def serve(*, synced: bool = True, lock_aware: bool = True) -> tuple[Served, web.AppRunner]:
    cache = ClusterCache(resource=RES)
    if synced:
        cache.replace_nodes(node_objects())
        cache.replace_pods([bound_pod("busy", "gpu-b", ["GPU-b-0"])])
    offline = KubeClient(api_client=None)  # any request through it raises
    locks = NodeLocks(
        offline,
        metrics=LockMetrics(registry=CollectorRegistry()),
        namespace=DEFAULT_LOCK_NAMESPACE,
        prefix=DEFAULT_PREFIX,
    )
    metrics = ExtenderMetrics(cache, registry=CollectorRegistry())
    binder = Binder(offline, cache, locks, metrics, duration_s=15)
    endpoints = Endpoints(
        cache,
        locks,
        binder,
        metrics,
        ServerOptions(policy=Policy.BINPACK, lock_aware=lock_aware, max_body_bytes=MAX_BODY),
    )
    runner = web.AppRunner(make_app(endpoints))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return Served(f"http://127.0.0.1:{port}", endpoints, locks, cache), runner


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    s, runner = await serve()
    try:
        yield s
    finally:
        await s.session.close()
        await runner.cleanup()


async def test_filter_node_cache_capable(served: Served) -> None:
    status, body = await served.post("filter", fixture("args_node_cache.json"))
    assert status == 200
    assert body == {
        "Nodes": None,
        "NodeNames": ["gpu-a"],
        "FailedNodes": {"gpu-b": "node has 1 free GPUs of 2, pod needs 2"},
        "FailedAndUnresolvableNodes": {
            "cpu-only": "node has no GPU inventory (annotation nodelock.io/gpus)"
        },
        "Error": "",
    }


async def test_filter_with_node_list_answers_node_objects(served: Served) -> None:
    args = fixture("args_node_list.json")
    status, body = await served.post("filter", args)
    assert status == 200
    assert body["NodeNames"] is None
    assert body["Nodes"]["items"] == [args["Nodes"]["items"][0]]
    assert set(body["FailedNodes"]) == {"gpu-b"}
    assert set(body["FailedAndUnresolvableNodes"]) == {"cpu-only"}


async def test_prioritize_scores_every_candidate_in_order(served: Served) -> None:
    args = fixture("args_node_cache.json")
    args["NodeNames"] = ["gpu-a", "gpu-b", "cpu-only", "gpu-c"]
    status, body = await served.post("prioritize", args)
    assert status == 200
    assert [h["Host"] for h in body] == ["gpu-a", "gpu-b", "cpu-only", "gpu-c"]
    scores = {h["Host"]: h["Score"] for h in body}
    assert scores["gpu-b"] == scores["cpu-only"] == 0
    assert 0 < scores["gpu-a"] == scores["gpu-c"] <= 10
    assert all(isinstance(h["Score"], int) for h in body)


async def test_prioritize_node_list_mode(served: Served) -> None:
    status, body = await served.post("prioritize", fixture("args_node_list.json"))
    assert status == 200
    assert [h["Host"] for h in body] == ["gpu-a", "gpu-b", "cpu-only"]


def hold_lock(locks: NodeLocks, node: str, holder_uid: str) -> None:
    fmt = LeaseFormat(namespace=DEFAULT_LOCK_NAMESPACE, prefix=DEFAULT_PREFIX)
    lease = fmt.new_lease(
        NodeName(node),
        Holder(HolderKey("ml/other"), holder_uid, {"assignment": '{"c":["GPU-a-7"]}'}),
        duration_s=15,
        now="2026-07-01T12:00:00.000000Z",
    )
    lease["metadata"]["resourceVersion"] = "5"
    locks.observe(lease)


async def test_prioritize_steers_away_from_a_node_with_a_long_expected_wait(
    served: Served,
) -> None:
    args = fixture("args_node_cache.json")
    args["NodeNames"] = ["gpu-a", "gpu-c"]
    _, before = await served.post("prioritize", args)
    assert before[0]["Score"] == before[1]["Score"] > 0
    queues = served.endpoints.binder.queues
    queues.hold.add(0.1)  # handoffs take 0.1 s: a held lock is within the 0.5 s tolerance
    hold_lock(served.locks, "gpu-a", "uid-other")
    _, held = await served.post("prioritize", args)
    scores = {h["Host"]: h["Score"] for h in held}
    assert scores["gpu-a"] > scores["gpu-c"] > 0  # binpack: the holder's GPU counts, a is fuller
    queues.hold.add(10.0)  # now a handoff takes seconds: a's wait is far longer than c's
    _, after = await served.post("prioritize", args)
    assert {h["Host"]: h["Score"] for h in after} == {"gpu-a": 0, "gpu-c": before[1]["Score"]}
    # the pod that holds the lock itself is not steered away from it
    own = copy.deepcopy(args)
    own["Pod"]["metadata"]["uid"] = "uid-other"
    _, mine = await served.post("prioritize", own)
    assert mine[0]["Score"] > 0
    # the lock holder's assignment is taken even before its pod is seen
    status, body = await served.post("filter", args)
    assert status == 200
    assert body["NodeNames"] == ["gpu-a", "gpu-c"]


async def test_lock_aware_prioritize_can_be_switched_off() -> None:
    s, runner = await serve(lock_aware=False)
    try:
        hold_lock(s.locks, "gpu-a", "uid-other")
        args = fixture("args_node_cache.json")
        args["NodeNames"] = ["gpu-a", "gpu-c"]
        _, body = await s.post("prioritize", args)
        # gpu-a's lock holder has one device there: binpack now prefers the fuller gpu-a
        assert body[0]["Score"] >= body[1]["Score"] > 0
    finally:
        await s.session.close()
        await runner.cleanup()


async def test_pod_without_gpus_passes_every_node(served: Served) -> None:
    args = fixture("args_node_cache.json")
    for c in args["Pod"]["spec"]["containers"] + args["Pod"]["spec"]["initContainers"]:
        c["resources"] = {}
    status, body = await served.post("filter", args)
    assert status == 200
    assert body["NodeNames"] == ["gpu-a", "gpu-b", "cpu-only"]


async def test_unknown_nodes_fail_filter_and_score_zero(served: Served) -> None:
    args = fixture("args_node_cache.json")
    args["NodeNames"] = ["gpu-a", "ghost"]
    status, body = await served.post("filter", args)
    assert status == 200
    assert body["NodeNames"] == ["gpu-a"]
    assert body["FailedNodes"] == {"ghost": "node is not (yet) in the GPU extender's cache"}
    _, scores = await served.post("prioritize", args)
    assert scores[1] == {"Host": "ghost", "Score": 0}


BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("filter", b"{not json", "body is not JSON"),
    ("filter", b"", "body is not JSON"),
    ("filter", b"\xff\xfe", "body is not JSON"),
    ("filter", b"[]", "must be a JSON object"),
    ("filter", b'{"Pod": null, "NodeNames": ["a"]}', "'Pod' is missing"),
    (
        "filter",
        b'{"Pod": {"metadata": {"name": "p", "namespace": "n"}, "spec": {}}, "NodeNames": ["a"]}',
        "at least one container",
    ),
    ("prioritize", b'{"Pod": 5, "NodeNames": []}', "Pod must be a JSON object"),
    (
        "prioritize",
        b'{"Pod": {"metadata": {"name": "p", "namespace": "n"}, "spec": '
        b'{"containers": [{"name": "c", "resources": {"limits": '
        b'{"nvidia.com/gpu": "0.5"}}}]}}, "NodeNames": ["a"]}',
        "whole number",
    ),
    ("bind", b'{"PodName": "p", "PodNamespace": "n", "Node": "x"}', "'PodUID' is missing"),
    (
        "bind",
        b'{"PodName": 1, "PodNamespace": "n", "PodUID": "u", "Node": "x"}',
        "'PodName' must be a string",
    ),
    ("bind", b"null", "must be a JSON object"),
    ("filter", b"[" * 100_000, "body is not JSON"),  # deeper than any decoder recurses
    (
        "prioritize",
        b'{"Pod": {"metadata": {"name": "p", "namespace": "n"}, "spec": {}}, '
        b'"NodeNames": ["a", 7]}',
        "7 is not a node name",
    ),
    (
        "filter",
        b'{"Pod": {"metadata": {"name": "p", "namespace": "n"}, "spec": {}}, '
        b'"NodeNames": ["a", ""]}',
        "'' is not a node name",
    ),
]


@pytest.mark.parametrize(("verb", "raw", "reason"), BAD_BODIES)
async def test_bad_input_gets_400_with_a_reason_and_the_server_keeps_serving(
    served: Served, verb: str, raw: bytes, reason: str
) -> None:
    status, body = await served.post(verb, None, raw=raw)
    assert status == 400
    assert reason in body["Error"]
    status, good = await served.post("filter", fixture("args_node_cache.json"))
    assert status == 200
    assert good["NodeNames"] == ["gpu-a"]


async def test_oversized_body_gets_413_and_the_server_keeps_serving(served: Served) -> None:
    args = fixture("args_node_cache.json")
    args["NodeNames"] = [f"node-{i:06d}" for i in range(MAX_BODY // 10)]
    status, body = await served.post("filter", args)
    assert status == 413
    assert "too large" in body["Error"]
    status, _ = await served.post("filter", fixture("args_node_cache.json"))
    assert status == 200


async def test_wrong_method_and_unknown_path(served: Served) -> None:
    assert (await served.get("/filter"))[0] == 405
    assert (await served.post("preempt", {}))[0] == 404


async def test_probes_and_metrics(served: Served) -> None:
    assert await served.get("/healthz") == (200, "ok\n")
    assert await served.get("/readyz") == (200, "ok\n")
    await served.post("filter", fixture("args_node_cache.json"))
    await served.post("filter", None, raw=b"{")
    # the API port (the one kube-scheduler's client certificate opens) serves no /metrics
    assert (await served.get("/metrics"))[0] == 404
    ops = OpsServer(served.endpoints.metrics.registry, served.endpoints.waiting_for)
    await ops.start("127.0.0.1", 0)
    try:
        async with served.session.get(f"{ops.url}/metrics") as resp:
            status, text = resp.status, await resp.text()
        async with served.session.get(f"{ops.url}/readyz") as resp:
            assert (resp.status, await resp.text()) == (200, "ok\n")
        # and the operations port serves no verb: nothing there changes state
        for verb in ("bind", "filter", "prioritize"):
            async with served.session.post(f"{ops.url}/{verb}", json={}) as resp:
                assert resp.status == 404, verb
        async with served.session.post(f"{ops.url}/metrics", json={}) as resp:
            assert resp.status == 405
    finally:
        await ops.stop()
    assert status == 200
    assert 'nodelock_extender_requests_total{result="ok",verb="filter"} 1.0' in text
    assert 'nodelock_extender_requests_total{result="bad_request",verb="filter"} 1.0' in text
    assert 'nodelock_extender_gpus{node="gpu-a"} 8.0' in text
    assert 'nodelock_extender_gpus_assigned{node="gpu-b"} 1.0' in text
    assert 'nodelock_extender_filter_nodes_total{result="unresolvable"} 1.0' in text
    assert "nodelock_extender_request_duration_seconds_bucket" in text
    assert 'nodelock_extender_cache_staleness_seconds{resource="pods"}' in text


async def test_not_ready_until_the_caches_are_listed() -> None:
    s, runner = await serve(synced=False)
    try:
        assert await s.get("/readyz") == (503, "waiting for: nodes, pods\n")
        assert (await s.get("/healthz"))[0] == 200
        s.cache.replace_nodes([])
        s.cache.replace_pods([])
        assert (await s.get("/readyz"))[0] == 200
    finally:
        await s.session.close()
        await runner.cleanup()


async def test_an_unexpected_bind_error_is_answered_in_error_and_serving_goes_on(
    served: Served,
) -> None:
    # the pod is unknown to the cache, so bind reads it through the API client, which here is
    # unconnected and fails in a way no API server would: the bind must still answer 200 + Error
    args = {"PodName": "p", "PodNamespace": "ml", "PodUID": "u", "Node": "gpu-a"}
    status, body = await served.post("bind", args)
    assert status == 200
    assert body["Error"].startswith("GPU extender bind failed")
    status, _ = await served.post("filter", fixture("args_node_cache.json"))
    assert status == 200
