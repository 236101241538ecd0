"""The DRA overlap rule, from plain DeviceClass and ResourceSlice objects (resource.k8s.io/v1)."""

from __future__ import annotations

from typing import Any

from deviceplugin.dra import (
    DraCheck,
    class_drivers,
    class_resource,
    devices_for_node,
    node_selector_matches,
    not_served,
    overlap,
)

NODE = "gpu-1"
GPU = "nvidia.com/gpu"
DRIVER = "gpu.nvidia.com"


def device_class(
    name: str, *, resource: str | None = GPU, expressions: tuple[str, ...] = ()
) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in expressions]}
    if resource is not None:
        spec["extendedResourceName"] = resource
    return {"metadata": {"name": name}, "spec": spec}


def resource_slice(
    name: str, *, driver: str = DRIVER, devices: int = 2, **placement: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": "pool", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": f"gpu-{i}"} for i in range(devices)],
        **placement,
    }
    return {"metadata": {"name": name}, "spec": spec}


def check(
    classes: list[dict[str, Any]],
    slices: list[dict[str, Any]],
    *,
    labels: dict[str, str] | None = None,
    resource: str = GPU,
) -> DraCheck:
    return overlap(
        node=NODE,
        resource=resource,
        node_labels=labels or {},
        device_classes=classes,
        resource_slices=slices,
    )


def test_a_class_mapping_the_resource_and_a_slice_for_the_node_conflict_and_are_named() -> None:
    result = check(
        [device_class("gpus", expressions=(f'device.driver == "{DRIVER}"',))],
        [resource_slice("gpu-1-gpus", nodeName=NODE, devices=4)],
    )
    assert result.conflict
    assert [(p.device_class, p.driver, p.resource_slice, p.devices) for p in result.publishers] == [
        ("gpus", DRIVER, "gpu-1-gpus", 4)
    ]
    message = result.message()
    for part in ("'gpus'", f"'{DRIVER}'", "'gpu-1-gpus'", "Moving a node between nodelock and DRA"):
        assert part in message


def test_no_class_maps_the_resource_no_conflict_even_with_slices_on_the_node() -> None:
    result = check(
        [device_class("nics", resource="example.com/nic"), device_class("plain", resource=None)],
        [resource_slice("gpu-1-gpus", nodeName=NODE)],
    )
    assert not result.conflict
    assert result.classes == ()
    assert "no DeviceClass maps nvidia.com/gpu" in result.message()


def test_a_class_without_extended_resource_name_maps_its_implicit_name() -> None:
    cls = device_class("gpus", resource=None)
    assert class_resource(cls) == "deviceclass.resource.kubernetes.io/gpus"
    implicit = check([cls], [resource_slice("s", nodeName=NODE)], resource=class_resource(cls))
    assert implicit.conflict
    assert not check([cls], [resource_slice("s", nodeName=NODE)]).conflict


def test_slices_of_other_nodes_or_without_devices_do_not_conflict() -> None:
    result = check(
        [device_class("gpus")],
        [
            resource_slice("other", nodeName="gpu-2"),
            resource_slice("empty", nodeName=NODE, devices=0),
        ],
    )
    assert not result.conflict
    assert result.classes == ("gpus",)
    assert "no ResourceSlice publishes" in result.message()


def test_a_class_naming_its_driver_ignores_other_drivers_slices_on_the_node() -> None:
    classes = [
        device_class(
            "gpus", expressions=(f"device.driver == '{DRIVER}' && device.attributes['x'].y",)
        )
    ]
    assert not check(
        classes, [resource_slice("nic", driver="nic.example.com", nodeName=NODE)]
    ).conflict
    assert check(classes, [resource_slice("gpu", nodeName=NODE)]).conflict


def test_a_class_whose_selectors_cannot_be_narrowed_counts_every_driver() -> None:
    # (driver == X && a) || b: the && conjunct does not bind the whole expression
    cls = device_class(
        "gpus", expressions=(f'device.driver == "{DRIVER}" && true || device.driver == "other"',)
    )
    assert class_drivers(cls) is None
    result = check([cls], [resource_slice("nic", driver="nic.example.com", nodeName=NODE)])
    assert result.conflict
    assert result.publishers[0].any_driver
    assert "may select any driver's devices" in result.message()


def test_class_drivers_reads_only_plain_conjuncts() -> None:
    assert class_drivers(device_class("a")) is None
    reversed_equality = device_class("a", expressions=(f"'{DRIVER}' == device.driver",))
    assert class_drivers(reversed_equality) == frozenset({DRIVER})
    assert (
        class_drivers(device_class("a", expressions=(f'!(device.driver == "{DRIVER}")',))) is None
    )
    # two selectors naming different drivers: no device can satisfy both
    both = device_class("a", expressions=('device.driver == "x"', 'device.driver == "y"'))
    assert class_drivers(both) == frozenset()
    assert not check([both], [resource_slice("s", driver="x", nodeName=NODE)]).conflict


def test_all_nodes_and_node_selector_slices_publish_for_matching_nodes() -> None:
    selector = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
        ]
    }
    assert devices_for_node(resource_slice("s", allNodes=True), node=NODE, labels={}) == 2
    assert (
        devices_for_node(
            resource_slice("s", nodeSelector=selector), node=NODE, labels={"gpu": "h100"}
        )
        == 2
    )
    assert (
        devices_for_node(
            resource_slice("s", nodeSelector=selector), node=NODE, labels={"gpu": "a100"}
        )
        == 0
    )


def test_per_device_node_selection_counts_the_nodes_own_devices() -> None:
    s = resource_slice("s", perDeviceNodeSelection=True, devices=0)
    s["spec"]["devices"] = [
        {"name": "a", "nodeName": NODE},
        {"name": "b", "nodeName": "gpu-2"},
        {"name": "c", "allNodes": True},
    ]
    assert devices_for_node(s, node=NODE, labels={}) == 2
    assert devices_for_node(s, node="gpu-3", labels={}) == 1


def test_node_selector_semantics() -> None:
    def term(*exprs: dict[str, Any], fields: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
        return {
            "nodeSelectorTerms": [{"matchExpressions": list(exprs), "matchFields": list(fields)}]
        }

    labels = {"zone": "a", "gpus": "8"}
    assert node_selector_matches(
        term({"key": "zone", "operator": "NotIn", "values": ["b"]}), node=NODE, labels=labels
    )
    assert not node_selector_matches(
        term({"key": "zone", "operator": "DoesNotExist"}), node=NODE, labels=labels
    )
    assert node_selector_matches(
        term({"key": "gpus", "operator": "Gt", "values": ["4"]}), node=NODE, labels=labels
    )
    assert not node_selector_matches(
        term({"key": "gpus", "operator": "Lt", "values": ["4"]}), node=NODE, labels=labels
    )
    name_is = {"key": "metadata.name", "operator": "In", "values": [NODE]}
    assert node_selector_matches(term(fields=(name_is,)), node=NODE, labels={})
    assert not node_selector_matches(term(fields=(name_is,)), node="gpu-2", labels={})
    # an empty term matches nothing; terms are ORed
    assert not node_selector_matches({"nodeSelectorTerms": [{}]}, node=NODE, labels=labels)
    either = {"nodeSelectorTerms": [{}, {"matchFields": [name_is]}]}
    assert node_selector_matches(either, node=NODE, labels={})


def test_every_mapping_class_and_slice_is_named() -> None:
    result = check(
        [device_class("b-gpus"), device_class("a-gpus")],
        [resource_slice("s2", nodeName=NODE), resource_slice("s1", allNodes=True)],
    )
    assert [(p.device_class, p.resource_slice) for p in result.publishers] == [
        ("a-gpus", "s1"),
        ("a-gpus", "s2"),
        ("b-gpus", "s1"),
        ("b-gpus", "s2"),
    ]


def test_not_served_is_no_conflict_and_says_why() -> None:
    result = not_served(node=NODE, resource=GPU)
    assert not result.served
    assert not result.conflict
    assert "resource.k8s.io/v1 is not served" in result.message()
