"""The extender protocol on the wire, against the exact JSON of kube-scheduler's Go types.

The fixtures in ``extender_wire/`` are written by ``extender_wire/gen/main.go`` with
``encoding/json`` from ``k8s.io/kube-scheduler/extender/v1`` and ``k8s.io/api/core/v1`` — what
kube-scheduler's ``HTTPExtender.send`` puts on the wire, and what it decodes our answers into.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lockd.model import NodeName
from scheduler_ext.protocol import (
    BadRequest,
    binding_result,
    filter_error,
    filter_result,
    host_priority_list,
    parse_binding_args,
    parse_extender_args,
)

WIRE = Path(__file__).parent / "extender_wire"


def fixture(name: str) -> Any:
    return json.loads((WIRE / name).read_text())


def shape(value: Any) -> Any:
    """The JSON shape: field names and JSON types, recursively for the protocol's own objects."""
    if isinstance(value, dict):
        return {k: shape(v) if k[:1].isupper() else type(v).__name__ for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    return type(value).__name__


def test_node_cache_capable_args() -> None:
    args = parse_extender_args(fixture("args_node_cache.json"))
    assert args.node_names == ("gpu-a", "gpu-b", "cpu-only")
    assert args.nodes is None
    assert args.pod["metadata"]["uid"] == "5f0c1c5e-8a4e-4f57-9d0a-6c1d2b3a4e5f"


def test_node_list_args() -> None:
    args = parse_extender_args(fixture("args_node_list.json"))
    assert args.node_names == ("gpu-a", "gpu-b", "cpu-only")
    assert args.nodes is not None
    assert [n["metadata"]["name"] for n in args.nodes] == list(args.node_names)


def test_binding_args() -> None:
    args = parse_binding_args(fixture("bind_args.json"))
    assert (args.pod_namespace, args.pod_name, args.node) == ("ml", "train-0", "gpu-a")
    assert args.pod_uid == "5f0c1c5e-8a4e-4f57-9d0a-6c1d2b3a4e5f"
    assert args.key == "ml/train-0"


def test_filter_result_has_go_shape_in_node_cache_mode() -> None:
    args = parse_extender_args(fixture("args_node_cache.json"))
    ours = filter_result(
        args, [NodeName("gpu-a")], {NodeName("gpu-b"): "x"}, {NodeName("cpu-only"): "y"}
    )
    go = fixture("filter_result_node_cache.json")
    assert ours == go  # byte-for-byte the same value, field for field
    assert list(ours) == list(go)


def test_filter_result_has_go_shape_in_node_list_mode() -> None:
    args = parse_extender_args(fixture("args_node_list.json"))
    ours = filter_result(
        args, [NodeName("gpu-a")], {NodeName("gpu-b"): "x"}, {NodeName("cpu-only"): "y"}
    )
    go = fixture("filter_result_node_list.json")
    assert shape(ours) == shape(go)
    # the Node objects go back exactly as the scheduler sent them
    assert ours["Nodes"]["items"] == go["Nodes"]["items"]


def test_priority_and_binding_results_have_go_shape() -> None:
    ours = host_priority_list([(NodeName("gpu-a"), 10), (NodeName("gpu-b"), 0)])
    assert ours == fixture("host_priority_list.json")
    assert binding_result("x") == fixture("bind_result.json")
    assert binding_result() == {"Error": ""}
    failed_whole = filter_error("boom")
    assert list(failed_whole) == list(fixture("filter_result_node_cache.json"))
    assert failed_whole["Error"] == "boom"


def test_go_nil_node_list_items_are_an_empty_candidate_list() -> None:
    body = fixture("args_node_list.json")
    body["Nodes"] = {"metadata": {}, "items": None}
    assert parse_extender_args(body).node_names == ()


def _mutate(name: str, path: list[str | int], value: Any) -> Any:
    body = fixture(name)
    target = body
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return body


_DELETE = object()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([], "must be a JSON object"),
        ("x", "must be a JSON object"),
        (_mutate("args_node_cache.json", ["Pod"], _DELETE), "'Pod' is missing"),
        (_mutate("args_node_cache.json", ["Pod"], None), "'Pod' is missing"),
        (_mutate("args_node_cache.json", ["Pod"], "train-0"), "Pod must be a JSON object"),
        (_mutate("args_node_cache.json", ["Pod", "metadata"], _DELETE), "metadata must be"),
        (_mutate("args_node_cache.json", ["Pod", "metadata", "name"], 7), "metadata.name"),
        (_mutate("args_node_cache.json", ["Pod", "spec"], _DELETE), "Pod.spec must be"),
        (_mutate("args_node_cache.json", ["NodeNames"], None), "one of 'Nodes' and 'NodeNames'"),
        (_mutate("args_node_cache.json", ["NodeNames"], "gpu-a"), "list of strings"),
        (_mutate("args_node_cache.json", ["NodeNames"], ["gpu-a", 3]), "not a node name"),
        (_mutate("args_node_cache.json", ["NodeNames"], ["gpu-a", ""]), "not a node name"),
        (_mutate("args_node_cache.json", ["Nodes"], {"items": []}), "only one of"),
        (_mutate("args_node_list.json", ["Nodes"], []), "Nodes must be a JSON object"),
        (_mutate("args_node_list.json", ["Nodes", "items"], {}), "items must be a list"),
        (_mutate("args_node_list.json", ["Nodes", "items", 0], 1), "items[0] must be"),
        (
            _mutate("args_node_list.json", ["Nodes", "items", 1, "metadata", "name"], _DELETE),
            "items[1].metadata.name",
        ),
    ],
)
def test_malformed_extender_args_say_what_is_wrong(body: Any, reason: str) -> None:
    with pytest.raises(BadRequest) as err:
        parse_extender_args(body)
    assert reason in str(err.value)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("PodName", _DELETE, "'PodName' is missing"),
        ("PodNamespace", 3, "'PodNamespace' must be a string"),
        ("PodUID", None, "'PodUID' must be a string"),
        ("Node", "", "'Node' must not be empty"),
    ],
)
def test_malformed_binding_args_say_what_is_wrong(field: str, value: Any, reason: str) -> None:
    with pytest.raises(BadRequest, match=reason):
        parse_binding_args(_mutate("bind_args.json", [field], value))
