"""The kube-scheduler extender protocol on the wire (``k8s.io/kube-scheduler/extender/v1``).

The Go types carry no JSON tags, so field names are the Go names (PascalCase) and nil pointers
are ``null``.  kube-scheduler (``pkg/scheduler/extender.go``) sends ``ExtenderArgs`` with exactly
one of ``Nodes`` (a v1.NodeList, when ``nodeCacheCapable`` is false) or ``NodeNames`` (when true),
and decodes our answer with ``encoding/json``.  We answer in the mode we were asked in.

Parsing checks types and presence and raises ``BadRequest`` with a reason a person can act on;
formatting returns plain JSON values.  No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lockd.model import NodeName

JSON = dict[str, Any]


class BadRequest(ValueError):
    """The request body is not what the extender protocol sends (HTTP 400)."""


@dataclass(frozen=True)
class ExtenderArgs:
    """``ExtenderArgs{Pod, Nodes, NodeNames}``: a pod and its candidate nodes.

    ``nodes`` holds the full Node objects when the scheduler sent a NodeList (not node-cache
    capable), else None; ``node_names`` is always filled, in the order received.
    """

    pod: JSON
    node_names: tuple[NodeName, ...]
    nodes: tuple[JSON, ...] | None


@dataclass(frozen=True)
class BindingArgs:
    """``ExtenderBindingArgs{PodName, PodNamespace, PodUID, Node}``."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: NodeName

    @property
    def key(self) -> str:
        return f"{self.pod_namespace}/{self.pod_name}"


def _object(body: object, what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise BadRequest(f"{what} must be a JSON object, got {type(body).__name__}")
    return body


def _string(body: Mapping[str, Any], field: str, *, what: str) -> str:
    if field not in body:
        raise BadRequest(f"{what}: field {field!r} is missing")
    value = body[field]
    if not isinstance(value, str):
        raise BadRequest(f"{what}: field {field!r} must be a string, got {type(value).__name__}")
    if not value:
        raise BadRequest(f"{what}: field {field!r} must not be empty")
    return value


def _all_nonempty_strings(items: list[Any]) -> bool:
    """Whether every item is a non-empty string, checked in C (thousands of node names)."""
    try:
        "".join(items)  # a TypeError at the first item that is not a string
    except TypeError:
        return False
    return "" not in items


def parse_extender_args(body: object) -> ExtenderArgs:
    """Parse the body of a filter or prioritize call."""
    args = _object(body, "ExtenderArgs")
    if "Pod" not in args or args["Pod"] is None:
        raise BadRequest("ExtenderArgs: field 'Pod' is missing")
    pod = _object(args["Pod"], "ExtenderArgs.Pod")
    meta = _object(pod.get("metadata"), "ExtenderArgs.Pod.metadata")
    for field in ("name", "namespace"):
        if not isinstance(meta.get(field), str) or not meta.get(field):
            raise BadRequest(f"ExtenderArgs.Pod.metadata.{field} must be a non-empty string")
    _object(pod.get("spec"), "ExtenderArgs.Pod.spec")
    raw_names = args.get("NodeNames")
    raw_nodes = args.get("Nodes")
    if raw_names is not None and raw_nodes is not None:
        raise BadRequest("ExtenderArgs: only one of 'Nodes' and 'NodeNames' may be set")
    if raw_names is not None:
        if not isinstance(raw_names, list):
            raise BadRequest("ExtenderArgs.NodeNames must be a list of strings")
        if not _all_nonempty_strings(raw_names):
            for name in raw_names:
                if not isinstance(name, str) or not name:
                    raise BadRequest(f"ExtenderArgs.NodeNames: {name!r} is not a node name")
        node_names: tuple[NodeName, ...] = tuple(raw_names)  # NodeName is str at run time
        return ExtenderArgs(pod=dict(pod), node_names=node_names, nodes=None)
    if raw_nodes is not None:
        node_list = _object(raw_nodes, "ExtenderArgs.Nodes")
        items = node_list.get("items")
        if items is None:
            items = []  # Go marshals a nil slice of a NodeList as "items": null
        if not isinstance(items, list):
            raise BadRequest("ExtenderArgs.Nodes.items must be a list of Node objects")
        names: list[NodeName] = []
        for i, item in enumerate(items):
            node = _object(item, f"ExtenderArgs.Nodes.items[{i}]")
            node_meta = _object(node.get("metadata"), f"ExtenderArgs.Nodes.items[{i}].metadata")
            name = node_meta.get("name")
            if not isinstance(name, str) or not name:
                raise BadRequest(f"ExtenderArgs.Nodes.items[{i}].metadata.name is missing")
            names.append(NodeName(name))
        return ExtenderArgs(pod=dict(pod), node_names=tuple(names), nodes=tuple(items))
    raise BadRequest("ExtenderArgs: one of 'Nodes' and 'NodeNames' must be set")


def parse_binding_args(body: object) -> BindingArgs:
    """Parse the body of a bind call."""
    args = _object(body, "ExtenderBindingArgs")
    what = "ExtenderBindingArgs"
    return BindingArgs(
        pod_name=_string(args, "PodName", what=what),
        pod_namespace=_string(args, "PodNamespace", what=what),
        pod_uid=_string(args, "PodUID", what=what),
        node=NodeName(_string(args, "Node", what=what)),
    )


def filter_result(
    args: ExtenderArgs,
    passed: Sequence[NodeName],
    failed: Mapping[NodeName, str],
    unresolvable: Mapping[NodeName, str],
    *,
    error: str = "",
) -> JSON:
    """``ExtenderFilterResult`` in the mode of ``args``: NodeNames, or Nodes with the objects."""
    nodes: JSON | None = None
    names: list[str] | None = None
    if args.nodes is None:
        names = list(passed)
    else:
        keep = set(passed)
        items = [n for n, name in zip(args.nodes, args.node_names, strict=True) if name in keep]
        nodes = {"metadata": {}, "items": items}
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }


def filter_error(message: str) -> JSON:
    """An ``ExtenderFilterResult`` that fails the whole filter call with ``message``."""
    return {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": message,
    }


def host_priority_list(scores: Iterable[tuple[NodeName, int]]) -> list[JSON]:
    """``HostPriorityList``: ``[{"Host": name, "Score": 0..10}]`` in the order given."""
    return [{"Host": name, "Score": score} for name, score in scores]


def binding_result(error: str = "") -> JSON:
    """``ExtenderBindingResult{Error}``; an empty error means bound."""
    return {"Error": error}
