"""A pod's GPU request: one parser for the extender and the device plugin (pure).

Which count a container asks for is a fact both sides of the handoff must read the same way, so it
lives here.  Kubernetes requires an extended resource's request to equal its limit, and the API
server defaults a missing request to the limit; kubelet's device manager reads the **limit**.  So
the count is the container's limit of the resource, falling back to its request for an object that
was never defaulted (a limit-less spec written by hand or by a test).  If both are set and differ
(the API server rejects such a pod, so only a hand-made object can), the limit wins, as in kubelet.

Quantities are parsed as Kubernetes quantities (``2``, ``"2"``, ``"2000m"``, ``"2e0"``), and must
be non-negative whole numbers no larger than ``MAX_GPUS_PER_CONTAINER``.

Guarantee: deterministic for equal inputs; every malformed pod or resource value raises
``BadPod`` (a ``ValueError``) with a message naming the container and the value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

from handoff.wire import ContainerName

_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
MAX_GPUS_PER_CONTAINER = 1024


class BadPod(ValueError):
    """The pod object is not shaped like a v1.Pod, or a GPU request is not a whole number."""


class ContainerKind(StrEnum):
    """Where a container runs in the pod's life, which decides how kubelet reuses its devices."""

    INIT = "init"  # runs to completion before the next; its devices go to the reuse pool
    SIDECAR = "sidecar"  # restartable init container: keeps its devices while the pod runs
    APP = "app"


@dataclass(frozen=True)
class ContainerNeed:
    """One container's GPU request."""

    name: ContainerName
    count: int
    kind: ContainerKind


def whole_quantity(
    raw: object, *, what: str, maximum: int, error: type[ValueError] = ValueError
) -> int:
    """A Kubernetes quantity that must be a whole number from 0 to ``maximum`` (the API server
    may store ``20000`` as ``"20k"``); anything else raises ``error`` saying why.  The one
    quantity reader of the handoff: GPU counts and shared-GPU slices both use it."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise error(f"{what}: quantity must be a string, got {raw!r}")
    text = str(raw)
    match = _QUANTITY.match(text)
    if match is None:
        raise error(f"{what}: {text!r} is not a Kubernetes quantity")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            value = Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        else:
            value = Decimal(number) * _SUFFIX[suffix]
    except (InvalidOperation, ValueError, OverflowError) as exc:
        raise error(f"{what}: {text!r} is not a Kubernetes quantity") from exc
    if value < 0 or value != value.to_integral_value():
        raise error(f"{what}: {text!r} is not a whole number (negative or fractional)")
    if value > maximum:
        raise error(f"{what}: {text!r} is more than {maximum}")
    return int(value)


def parse_quantity(raw: object, *, what: str) -> int:
    """Parse a Kubernetes quantity that must be a non-negative whole number of devices."""
    return whole_quantity(raw, what=what, maximum=MAX_GPUS_PER_CONTAINER, error=BadPod)


def _container_count(container: Mapping[str, Any], resource: str, *, where: str) -> int:
    resources = container.get("resources")
    resources = {} if resources is None else resources
    if not isinstance(resources, Mapping):
        raise BadPod(f"{where}: resources must be an object")
    requests = resources.get("requests")
    limits = resources.get("limits")
    requests = {} if requests is None else requests
    limits = {} if limits is None else limits
    if not isinstance(requests, Mapping) or not isinstance(limits, Mapping):
        raise BadPod(f"{where}: resources.requests and resources.limits must be objects")
    # kubelet reads the limit; the request is read only when no limit is set (module docstring).
    if resource in limits:
        return parse_quantity(limits[resource], what=f"{where} limits[{resource}]")
    if resource in requests:
        return parse_quantity(requests[resource], what=f"{where} requests[{resource}]")
    return 0


def _containers(spec: Mapping[str, Any], field: str) -> Sequence[Mapping[str, Any]]:
    items = spec.get(field)
    items = [] if items is None else items
    if not isinstance(items, list):
        raise BadPod(f"spec.{field} must be a list")
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise BadPod(f"spec.{field}[{i}] must be an object")
        if not isinstance(item.get("name"), str) or not item.get("name"):
            raise BadPod(f"spec.{field}[{i}].name must be a non-empty string")
    return items


def container_needs(pod: Mapping[str, Any], resource: str) -> tuple[ContainerNeed, ...]:
    """Every container's count of ``resource`` in kubelet's order: init containers, then apps,
    each group in spec order; containers that do not ask for it have count 0."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise BadPod("pod has no spec object")
    out: list[ContainerNeed] = []
    for c in _containers(spec, "initContainers"):
        kind = ContainerKind.SIDECAR if c.get("restartPolicy") == "Always" else ContainerKind.INIT
        name = str(c["name"])
        count = _container_count(c, resource, where=f"init container {name!r}")
        out.append(ContainerNeed(ContainerName(name), count, kind))
    apps = _containers(spec, "containers")
    if not apps:
        raise BadPod("spec.containers must list at least one container")
    for c in apps:
        name = str(c["name"])
        count = _container_count(c, resource, where=f"container {name!r}")
        out.append(ContainerNeed(ContainerName(name), count, ContainerKind.APP))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise BadPod("container names must be unique across initContainers and containers")
    return tuple(out)
