"""``kube.events.EventRecorder`` against the real API server: Events ``kubectl describe`` finds,
and no storm (one Event per object and reason, counted up, at most one write per interval)."""

from __future__ import annotations

from typing import Any

from kube.client import KubeClient, event_path, pod_path
from kube.events import EventRecorder, EventType, ObjectRef


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def events(kube: KubeClient, namespace: str, name: str) -> list[Any]:
    selector = f"involvedObject.name={name}"
    items: list[Any] = (await kube.list(event_path(namespace), field_selector=selector))["items"]
    return items


async def test_repeats_are_one_event_counted_up_and_written_once_per_interval(
    kube: KubeClient, namespace: str
) -> None:
    pod = await kube.create(
        pod_path(namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "waiter"},
            "spec": {
                "schedulerName": "nodelock-test-nobody",
                "containers": [{"name": "main", "image": "example.invalid/none"}],
            },
        },
    )
    clock = Clock()
    recorder = EventRecorder(kube, component="nodelock-test", interval_s=60, clock=clock)
    ref = ObjectRef.pod(f"{namespace}/waiter", pod["metadata"]["uid"])
    for i in range(50):  # a burst: 50 refusals of the same pod
        recorder.record(ref, EventType.WARNING, "BindRefused", f"refusal {i}")
    await recorder.flush()
    [event] = await events(kube, namespace, "waiter")
    assert (recorder.created, recorder.patched, recorder.suppressed) == (1, 0, 49)
    assert event["count"] == 50  # the occurrences seen when it was written, one write
    assert event["message"] == "refusal 0"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "waiter",
        "namespace": namespace,
        "uid": pod["metadata"]["uid"],
    }
    # after the interval, the next repeat updates the same Event with every occurrence
    clock.now += 61
    recorder.record(ref, EventType.WARNING, "BindRefused", "refusal 50")
    await recorder.flush()
    [event] = await events(kube, namespace, "waiter")
    assert event["count"] == 51
    assert event["message"] == "refusal 50"
    assert recorder.patched == 1
    # another reason is another Event
    recorder.record(ref, EventType.NORMAL, "WaitingForNodeLock", "held by x")
    await recorder.flush()
    assert sorted(e["reason"] for e in await events(kube, namespace, "waiter")) == [
        "BindRefused",
        "WaitingForNodeLock",
    ]


async def test_a_refused_write_is_counted_and_never_raises(kube: KubeClient) -> None:
    recorder = EventRecorder(kube, component="nodelock-test")
    # a namespace that does not exist: the API server refuses the Event
    ref = ObjectRef.pod("no-such-namespace-x/p", "uid-1")
    recorder.record(ref, EventType.WARNING, "BindRefused", "x")
    await recorder.flush()
    assert (recorder.created, recorder.failed) == (0, 1)


async def test_node_events_use_the_name_as_uid_as_kubelet_does(kube: KubeClient) -> None:
    recorder = EventRecorder(kube, component="nodelock-test", host="somewhere")
    name = "nl-events-node"
    recorder.record(ObjectRef.node(name), EventType.WARNING, "AllocateRefused", "why")
    await recorder.flush()
    try:
        [event] = await events(kube, "default", name)
        assert event["involvedObject"]["uid"] == name
        assert event["source"] == {"component": "nodelock-test", "host": "somewhere"}
    finally:
        await kube.delete(event_path("default", event["metadata"]["name"]))
