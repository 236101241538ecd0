"""NodeLocks refuses, in its constructor, a configuration no Lease could carry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX
from kube.client import KubeClient
from lockd.locks import NodeLocks
from lockd.metrics import LockMetrics

pytestmark = pytest.mark.unit


def make(
    namespace: str = DEFAULT_LOCK_NAMESPACE, prefix: str = DEFAULT_PREFIX, **kw: object
) -> NodeLocks:
    metrics = LockMetrics(registry=CollectorRegistry())
    return NodeLocks(
        KubeClient(api_client=None),
        namespace=namespace,
        prefix=prefix,
        metrics=metrics,
        **kw,  # type: ignore[arg-type]
    )


def test_the_defaults_and_other_valid_names_are_accepted() -> None:
    assert make().namespace == DEFAULT_LOCK_NAMESPACE
    assert make("locks-2", "nl.example.com/", duration_s=1).prefix == "nl.example.com/"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"namespace": ""}, "namespace ''"),
        ({"namespace": "Node-Locks"}, "namespace 'Node-Locks'"),
        ({"namespace": "a" * 64}, "namespace"),
        ({"prefix": "nodelock.io"}, "prefix 'nodelock.io'"),
        ({"prefix": "/"}, "prefix '/'"),
        ({"prefix": "Nodelock.io/"}, "prefix"),
        ({"duration_s": 0}, "duration 0s"),
        ({"duration_s": -5}, "duration -5s"),
        ({"duration_s": 2**31}, "duration"),
        ({"duration_s": 1.5}, "duration 1.5"),
        ({"duration_s": True}, "duration True"),
    ],
)
def test_a_configuration_no_lease_could_carry_is_refused(
    kw: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make(**kw)  # type: ignore[arg-type]
