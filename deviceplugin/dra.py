"""Is a node's extended resource also published by a DRA driver?  Then nodelock must not serve it.

With Dynamic Resource Allocation's extended-resource mapping (KEP-5004, feature gate
``DRAExtendedResource``: alpha in 1.34, beta and on by default in 1.36, GA and locked on in 1.37;
``pkg/features/kube_features.go`` at v1.37.2), a ``resource.k8s.io/v1`` DeviceClass with
``spec.extendedResourceName: nvidia.com/gpu`` (``DeviceClassSpec.ExtendedResourceName``,
``k8s.io/api`` v0.37.2 ``resource/v1/types.go``) lets a pod's ``nvidia.com/gpu`` request be
allocated from the devices that a DRA driver (``ResourceSliceSpec.Driver``) publishes for a node in
ResourceSlices.  If the node's device plugin serves the same name, two owners hand out the same
GPUs: kube-scheduler delegates the request to DRA whenever the node's allocatable of the resource
is 0 (``shouldDelegateResourceToDRA`` in ``pkg/scheduler/framework/plugins/noderesources/fit.go``,
``filterExtendedResources`` in ``.../dynamicresources/extendeddynamicresources.go``, v1.37.2), as
it is while the plugin restarts or its GPUs are unhealthy, and kubelet then skips the device
plugin for that container (``allocateContainerResources`` / ``isDRAExtendedResource`` in
``pkg/kubelet/cm/devicemanager/manager.go``, v1.37.2).  Neither the node lock nor the device
plugin sees those pods, so a GPU can be given twice.

``overlap`` decides, from plain API objects, whether the resource is published for the node by
DRA and names each DeviceClass, driver and ResourceSlice that does; ``check_node`` reads those
objects from the API server.  ``DevicePlugin.start`` refuses to start on a node with an overlap.

Guarantees and limits:
- A DeviceClass maps the resource when its ``spec.extendedResourceName`` equals it, or, without
  that field, when the resource is the implicit name ``deviceclass.resource.kubernetes.io/<class>``.
- A class's CEL selectors are not evaluated.  A selector whose expression is a conjunction (no
  ``||``) with a conjunct exactly ``device.driver == "<name>"`` limits the class to that driver;
  any other class may select any driver's devices and so counts every driver.  The rule errs
  towards refusing: it may name a driver whose devices the class would not select, never the
  reverse.
- A ResourceSlice publishes for the node when its ``spec.nodeName`` is the node, ``spec.allNodes``
  is set, its ``spec.nodeSelector`` matches the node, or (``spec.perDeviceNodeSelection``) one of
  its devices does so itself; a slice without devices publishes nothing.  Node selector operators
  other than In, NotIn, Exists, DoesNotExist, Gt and Lt count as matching.
- Where ``resource.k8s.io/v1`` is not served (Kubernetes before 1.34, or the API turned off), no
  DRA driver can serve the resource through it and the check says so: ``DraCheck.served`` False.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kube.client import KubeClient, node_path
from kube.errors import Forbidden, NotFound

DRA_API = "resource.k8s.io/v1"
DEVICE_CLASSES_PATH = f"/apis/{DRA_API}/deviceclasses"
RESOURCE_SLICES_PATH = f"/apis/{DRA_API}/resourceslices"
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"  # resourceapi.ResourceDeviceClassPrefix
MIGRATION_DOC = "docs/install.md, 'Moving a node between nodelock and DRA'"
LIST_PAGE = 500

Obj = Mapping[str, Any]

# device.driver == "name", either way round
_DRIVER_IS = (
    re.compile(r"""device\.driver\s*==\s*(["'])(?P<name>[^"']+)\1"""),
    re.compile(r"""(["'])(?P<name>[^"']+)\1\s*==\s*device\.driver"""),
)


class DraConflict(Exception):
    """The node's resource is also published by a DRA driver; the plugin must not serve it."""

    user_facing = True


class DraUnreadable(Exception):
    """The API server refused to show the DeviceClasses or ResourceSlices (403)."""

    user_facing = True


@dataclass(frozen=True)
class DraPublisher:
    """One DeviceClass mapping the resource, and one ResourceSlice publishing devices it may
    select for the node."""

    device_class: str
    driver: str
    resource_slice: str
    devices: int  # of the slice's devices, those published for the node
    any_driver: bool  # the class's selectors name no driver: every driver's devices count

    def describe(self) -> str:
        how = (
            "whose selectors name no driver, so it may select any driver's devices"
            if self.any_driver
            else f"which selects devices of driver {self.driver!r}"
        )
        return (
            f"DeviceClass {self.device_class!r}, {how}: ResourceSlice {self.resource_slice!r} "
            f"of driver {self.driver!r} publishes {self.devices} device(s) for this node"
        )


@dataclass(frozen=True)
class DraCheck:
    """Whether ``resource`` on ``node`` is also published through DRA, and by whom."""

    node: str
    resource: str
    served: bool  # resource.k8s.io/v1 is served by the API server
    classes: tuple[str, ...]  # DeviceClasses mapping the resource (whatever the node)
    publishers: tuple[DraPublisher, ...]

    @property
    def conflict(self) -> bool:
        return bool(self.publishers)

    def message(self) -> str:
        """One paragraph a person can act on."""
        if not self.served:
            return (
                f"node {self.node}: {DRA_API} is not served by the API server (Kubernetes before "
                f"1.34, or the API is off), so no DRA driver can publish {self.resource}; "
                "nothing to check"
            )
        if not self.conflict:
            if not self.classes:
                return f"node {self.node}: no DeviceClass maps {self.resource} to DRA devices"
            return (
                f"node {self.node}: DeviceClass(es) {', '.join(self.classes)} map "
                f"{self.resource} to DRA devices, but no ResourceSlice publishes such devices "
                "for this node"
            )
        drivers = sorted({p.driver for p in self.publishers})
        return (
            f"node {self.node}: {self.resource} is also published by DRA: "
            + "; ".join(p.describe() for p in self.publishers)
            + ". kube-scheduler may allocate these devices to a pod's "
            f"{self.resource} request and kubelet then bypasses the device plugin, so nodelock "
            "would hand out GPUs that DRA also hands out; the device plugin refuses to serve "
            f"this node. Serve the node with one of them: remove the DRA driver "
            f"({', '.join(drivers)}) from this node, or take the node out of nodelock's device "
            f"plugin DaemonSet ({MIGRATION_DOC})"
        )


# ---- the decision: plain objects in, a DraCheck out -----------------------------------------


def class_resource(device_class: Obj) -> str:
    """The extended resource name a DeviceClass maps: explicit, else the implicit one."""
    spec = device_class.get("spec") or {}
    explicit = spec.get("extendedResourceName")
    if explicit:
        return str(explicit)
    return IMPLICIT_PREFIX + str((device_class.get("metadata") or {}).get("name", ""))


def class_drivers(device_class: Obj) -> frozenset[str] | None:
    """The drivers whose devices the class may select; None: any driver (see the module doc)."""
    allowed: frozenset[str] | None = None
    for selector in (device_class.get("spec") or {}).get("selectors") or []:
        expression = str(((selector or {}).get("cel") or {}).get("expression", ""))
        if "||" in expression:
            continue
        named = set()
        for part in expression.split("&&"):
            for pattern in _DRIVER_IS:
                if m := pattern.fullmatch(part.strip()):
                    named.add(m.group("name"))
        if named:
            # two different drivers in one conjunction: nothing matches; else that driver
            this = frozenset(named) if len(named) == 1 else frozenset()
            allowed = this if allowed is None else allowed & this
    return allowed


def _requirement_matches(req: Obj, value: str | None) -> bool:
    op = req.get("operator")
    values = [str(v) for v in req.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        try:
            have, bound = int(value or ""), int(values[0])
        except (ValueError, IndexError):
            return False
        return have > bound if op == "Gt" else have < bound
    return True  # an operator this code does not know: counts as matching (errs to refuse)


def node_selector_matches(selector: Obj, *, node: str, labels: Mapping[str, str]) -> bool:
    """A core/v1 NodeSelector against a node: its terms ORed, each term's requirements ANDed; an
    empty term matches nothing (as the NodeSelector type documents)."""
    for term in selector.get("nodeSelectorTerms") or []:
        exprs = (term or {}).get("matchExpressions") or []
        fields = (term or {}).get("matchFields") or []
        if not exprs and not fields:
            continue
        ok = all(_requirement_matches(r, labels.get(str(r.get("key")))) for r in exprs)
        ok = ok and all(
            _requirement_matches(r, node if r.get("key") == "metadata.name" else None)
            for r in fields
        )
        if ok:
            return True
    return False


def _placed_on(obj: Obj, *, node: str, labels: Mapping[str, str]) -> bool:
    """A slice's spec, or a device, that names nodes: is ``node`` one of them?"""
    if obj.get("nodeName") is not None:
        return bool(obj.get("nodeName") == node)
    if obj.get("allNodes"):
        return True
    selector = obj.get("nodeSelector")
    if selector is not None:
        return node_selector_matches(selector, node=node, labels=labels)
    return False


def devices_for_node(resource_slice: Obj, *, node: str, labels: Mapping[str, str]) -> int:
    """How many of a ResourceSlice's devices are published for ``node``."""
    spec = resource_slice.get("spec") or {}
    devices = spec.get("devices") or []
    if spec.get("perDeviceNodeSelection"):
        return sum(1 for d in devices if _placed_on(d or {}, node=node, labels=labels))
    return len(devices) if _placed_on(spec, node=node, labels=labels) else 0


def overlap(
    *,
    node: str,
    resource: str,
    node_labels: Mapping[str, str],
    device_classes: Sequence[Obj],
    resource_slices: Sequence[Obj],
) -> DraCheck:
    """Which DeviceClasses map ``resource`` and which ResourceSlices publish devices for ``node``
    that those classes may select (``resource.k8s.io/v1`` served)."""
    mapping = sorted(
        (c for c in device_classes if class_resource(c) == resource),
        key=lambda c: str((c.get("metadata") or {}).get("name", "")),
    )
    publishers = []
    for device_class in mapping:
        name = str((device_class.get("metadata") or {}).get("name", ""))
        drivers = class_drivers(device_class)
        for s in sorted(
            resource_slices, key=lambda s: str((s.get("metadata") or {}).get("name", ""))
        ):
            driver = str((s.get("spec") or {}).get("driver", ""))
            if drivers is not None and driver not in drivers:
                continue
            count = devices_for_node(s, node=node, labels=node_labels)
            if count:
                publishers.append(
                    DraPublisher(
                        device_class=name,
                        driver=driver,
                        resource_slice=str((s.get("metadata") or {}).get("name", "")),
                        devices=count,
                        any_driver=drivers is None,
                    )
                )
    return DraCheck(
        node=node,
        resource=resource,
        served=True,
        classes=tuple(str((c.get("metadata") or {}).get("name", "")) for c in mapping),
        publishers=tuple(publishers),
    )


def not_served(*, node: str, resource: str) -> DraCheck:
    """The answer where the API server does not serve ``resource.k8s.io/v1``."""
    return DraCheck(node=node, resource=resource, served=False, classes=(), publishers=())


# ---- the reads ------------------------------------------------------------------------------


async def _list_all(kube: KubeClient, path: str) -> list[Obj]:
    items: list[Obj] = []
    token: str | None = None
    while True:
        page = await kube.list(path, limit=LIST_PAGE, continue_token=token)
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue") or None
        if not token:
            return items


async def check_node(kube: KubeClient, *, node: str, resources: Sequence[str]) -> list[DraCheck]:
    """Read the DeviceClasses (and, only if one maps one of ``resources``, the node's labels and
    the ResourceSlices) and decide for each resource.

    A 404 on the DeviceClass list means ``resource.k8s.io/v1`` is not served: ``served`` False.
    A 403 raises ``DraUnreadable``: the device plugin needs get and list on deviceclasses and
    resourceslices, which the chart grants.  ``ApiUnavailable`` propagates.
    """
    try:
        classes = await _list_all(kube, DEVICE_CLASSES_PATH)
    except NotFound:
        return [not_served(node=node, resource=r) for r in resources]
    except Forbidden as exc:
        raise DraUnreadable(
            f"node {node}: cannot tell whether a DRA driver also publishes "
            f"{', '.join(resources)}: {exc}. The device plugin's service account needs get and "
            "list on deviceclasses and resourceslices (resource.k8s.io), as the chart's "
            "ClusterRole grants"
        ) from exc
    slices: list[Obj] = []
    labels: Mapping[str, str] = {}
    if any(class_resource(c) in resources for c in classes):
        try:
            slices = await _list_all(kube, RESOURCE_SLICES_PATH)
        except Forbidden as exc:
            raise DraUnreadable(
                f"node {node}: a DeviceClass maps {', '.join(resources)} to DRA devices, but the "
                f"device plugin may not list ResourceSlices: {exc}. Grant get and list on "
                "resourceslices (resource.k8s.io), as the chart's ClusterRole does"
            ) from exc
        try:
            labels = ((await kube.get(node_path(node))).get("metadata") or {}).get("labels") or {}
        except NotFound:
            labels = {}
    return [
        overlap(
            node=node,
            resource=r,
            node_labels=labels,
            device_classes=classes,
            resource_slices=slices,
        )
        for r in resources
    ]
