"""The stock device plugin's preference (``devcluster.stockplugin.preferred``): kubelet's
must-include devices first, then its available ones in its order."""

from hypothesis import given
from hypothesis import strategies as st

from devcluster.stockplugin import preferred

IDS = st.lists(st.sampled_from([f"GPU-{i}" for i in range(8)]), max_size=8)


def test_must_include_first_then_available_in_kubelets_order() -> None:
    assert preferred(["GPU-5"], ["GPU-1", "GPU-5", "GPU-2", "GPU-3"], 3) == [
        "GPU-5",
        "GPU-1",
        "GPU-2",
    ]


def test_fewer_when_kubelet_offers_fewer() -> None:
    assert preferred([], ["GPU-1"], 2) == ["GPU-1"]


@given(must=IDS, available=IDS, size=st.integers(0, 8))
def test_never_a_device_twice_and_never_more_than_asked(
    must: list[str], available: list[str], size: int
) -> None:
    got = preferred(must, available, size)
    assert len(got) == len(set(got))
    assert len(got) == min(size, len(set(must) | set(available)))
    assert set(got) <= set(must) | set(available)
    kept = list(dict.fromkeys(must))[:size]
    assert got[: len(kept)] == kept
