"""``devcluster.shape.check_resume``: which recorded state ``up`` may resume (plain data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster.errors import DevclusterError
from devcluster.shape import SHAPE_FORMAT, Shape, check_resume, mig_layouts, shape_of, shape_record

DIR = Path("/tmp/dc")
THREE_BY_FOUR = Shape(3, 4)


def test_no_data_starts_fresh_in_any_shape() -> None:
    check_resume(None, has_data=False, wanted=THREE_BY_FOUR, state_dir=DIR)
    check_resume(shape_record(Shape(1, 8)), has_data=False, wanted=THREE_BY_FOUR, state_dir=DIR)


def test_the_same_shape_resumes() -> None:
    check_resume(shape_record(THREE_BY_FOUR), has_data=True, wanted=THREE_BY_FOUR, state_dir=DIR)


@pytest.mark.parametrize(
    "other",
    [
        Shape(2, 4),
        Shape(3, 8),
        Shape(3, 4, "nvlink-pairs"),
        Shape(0, 0),
        Shape(3, 4, gpu_split=4, shared_nodes=1),  # a node now shares its GPUs
    ],
)
def test_another_shape_is_refused_naming_purge(other: Shape) -> None:
    with pytest.raises(DevclusterError) as caught:
        check_resume(shape_record(THREE_BY_FOUR), has_data=True, wanted=other, state_dir=DIR)
    message = str(caught.value)
    assert "holds 3 GPU nodes x 4 GPUs" in message
    assert other.describe() in message
    assert "nodelock devcluster down --purge --state-dir /tmp/dc" in message


@pytest.mark.parametrize(
    ("recorded", "says"),
    [
        (None, "older nodelock version"),
        ({"format": SHAPE_FORMAT + 1, "nodes": 3, "gpus_per_node": 4}, "format"),
        ({"format": None}, "format"),
        ({"format": SHAPE_FORMAT, "nodes": "x", "gpus_per_node": 4}, "not readable"),
        ({"format": SHAPE_FORMAT}, "not readable"),
    ],
)
def test_data_of_another_version_is_refused(recorded: dict[str, object] | None, says: str) -> None:
    with pytest.raises(DevclusterError, match=says) as caught:
        check_resume(recorded, has_data=True, wanted=THREE_BY_FOUR, state_dir=DIR)
    assert "down --purge" in str(caught.value)


def test_sharing_is_part_of_the_shape() -> None:
    mixed = Shape(3, 4, gpu_split=4, shared_nodes=1)
    check_resume(shape_record(mixed), has_data=True, wanted=mixed, state_dir=DIR)
    assert mixed.describe() == "3 GPU nodes x 4 GPUs, 1 of them sharing each GPU 4 ways"
    with pytest.raises(DevclusterError, match="1 of them sharing"):
        check_resume(shape_record(mixed), has_data=True, wanted=THREE_BY_FOUR, state_dir=DIR)


def test_a_shape_recorded_before_sharing_was_recorded_reads_as_none_sharing() -> None:
    old = {"format": SHAPE_FORMAT, "nodes": 3, "gpus_per_node": 4, "gpu_topology": None}
    check_resume(old, has_data=True, wanted=THREE_BY_FOUR, state_dir=DIR)


def test_mig_layouts_and_gpu_memory_are_part_of_the_shape() -> None:
    mig = Shape(3, 4, mig=mig_layouts([(1, "3g.40gb+4x1g.10gb"), (0, "7x1g.10gb")]))
    assert mig.mig == "0=7x1g.10gb 1=3g.40gb+4x1g.10gb"
    check_resume(shape_record(mig), has_data=True, wanted=mig, state_dir=DIR)
    with pytest.raises(DevclusterError) as caught:
        check_resume(shape_record(mig), has_data=True, wanted=THREE_BY_FOUR, state_dir=DIR)
    assert "MIG 0=7x1g.10gb 1=3g.40gb+4x1g.10gb" in str(caught.value)
    assert "--mig" in str(caught.value)
    small = Shape(3, 4, gpu_memory_mib=20000)
    with pytest.raises(DevclusterError, match="20000 MiB per GPU"):
        check_resume(shape_record(THREE_BY_FOUR), has_data=True, wanted=small, state_dir=DIR)


def test_a_shape_recorded_before_mig_and_memory_were_recorded_reads_as_neither() -> None:
    old = {"format": SHAPE_FORMAT, "nodes": 3, "gpus_per_node": 4, "gpu_split": 1}
    assert shape_of(old) == THREE_BY_FOUR
    check_resume(old, has_data=True, wanted=THREE_BY_FOUR, state_dir=DIR)
    with pytest.raises(DevclusterError, match="not readable"):
        check_resume({**old, "mig": 7}, has_data=True, wanted=THREE_BY_FOUR, state_dir=DIR)
