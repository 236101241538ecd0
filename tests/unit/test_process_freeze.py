"""``kube.process.freeze_long_lived``: what is alive at the call leaves the collector's passes."""

import gc

from kube.process import freeze_long_lived


def test_objects_alive_at_the_call_leave_the_collectors_generations() -> None:
    cache = [{"node": f"gpu-node-{i}"} for i in range(1000)]
    try:
        took = freeze_long_lived()
        assert took >= 0
        assert gc.get_freeze_count() >= len(cache)
        assert not any(o is cache for o in gc.get_objects())  # a full pass no longer scans it
        created_after = [{"node": "gpu-node-new"}]
        assert any(o is created_after for o in gc.get_objects())  # new objects still are
    finally:
        gc.unfreeze()  # the rest of the test process keeps its collector as it was
    assert any(o is cache for o in gc.get_objects())
