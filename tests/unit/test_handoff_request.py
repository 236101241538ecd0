"""One reading of a pod's GPU request for both sides of the handoff (``handoff.request``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceplugin.decide import gpu_containers
from handoff.request import BadPod, container_needs
from handoff.wire import DEFAULT_RESOURCE, ContainerName
from scheduler_ext.need import pod_need

pytestmark = pytest.mark.unit

GPU = DEFAULT_RESOURCE


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": spec}


def c(name: str, **resources: Mapping[str, object]) -> dict[str, Any]:
    return {"name": name, "image": "busybox", "resources": resources}


def test_the_limit_wins_when_request_and_limit_disagree() -> None:
    # The API server rejects such a pod; kubelet reads the limit, so both sides must too.
    p = pod(c("main", limits={GPU: "2"}, requests={GPU: "1"}))
    assert [n.count for n in container_needs(p, GPU)] == [2]
    assert pod_need(p, GPU).total == 2
    assert gpu_containers(p, GPU) == [(ContainerName("main"), 2)]


def test_the_request_is_read_when_there_is_no_limit() -> None:
    p = pod(c("main", requests={GPU: "3"}))
    assert pod_need(p, GPU).total == 3
    assert gpu_containers(p, GPU) == [(ContainerName("main"), 3)]


def test_both_sides_parse_quantities_the_same_way() -> None:
    p = pod(c("main", limits={GPU: "2000m"}), init=(c("setup", limits={GPU: "1e0"}),))
    assert gpu_containers(p, GPU) == [(ContainerName("setup"), 1), (ContainerName("main"), 2)]
    assert [(n.name, n.count) for n in container_needs(p, GPU)] == gpu_containers(p, GPU)


@pytest.mark.parametrize("raw", ["1.5", "-1", "two", "500m", ""])
def test_a_count_that_is_not_a_whole_number_is_refused_by_both(raw: str) -> None:
    p = pod(c("main", limits={GPU: raw}))
    with pytest.raises(BadPod, match="main"):
        pod_need(p, GPU)
    with pytest.raises(ValueError, match="main"):
        gpu_containers(p, GPU)


_count = st.integers(min_value=0, max_value=16)


@given(
    inits=st.lists(st.tuples(_count, st.booleans()), max_size=3),
    apps=st.lists(st.tuples(_count, st.booleans()), min_size=1, max_size=4),
)
def test_the_extender_and_the_device_plugin_read_the_same_counts(
    inits: list[tuple[int, bool]], apps: list[tuple[int, bool]]
) -> None:
    def spec(prefix: str, rows: list[tuple[int, bool]]) -> tuple[dict[str, Any], ...]:
        out = []
        for i, (n, as_limit) in enumerate(rows):
            field = "limits" if as_limit else "requests"
            out.append(c(f"{prefix}{i}", **{field: {GPU: str(n)}}))
        return tuple(out)

    p = pod(*spec("a", apps), init=spec("i", inits))
    extender = [(n.name, n.count) for n in container_needs(p, GPU) if n.count]
    assert extender == gpu_containers(p, GPU)
    assert [n for _, n in extender] == [n for n, _ in inits + apps if n]
