"""The Lease of a node lock as plain JSON: what lockd writes and reads back."""

from __future__ import annotations

import pytest

from lockd.lease import LeaseFormat, MalformedLease
from lockd.model import FencingToken, Holder, HolderKey, LastHandoff, NodeName, Outcome

FMT = LeaseFormat(namespace="locks", prefix="nl.example/")
NODE = NodeName("gpu-1")
POD = Holder(HolderKey("team/train-0"), "uid-0", {"assignment": '{"c":["GPU-0"]}'})
T0 = "2024-05-01T12:00:00.000000Z"
T1 = "2024-05-01T12:00:01.000000Z"


def test_new_lease_is_held_with_token_one_and_labelled() -> None:
    lease = FMT.new_lease(NODE, POD, duration_s=15, now=T0)
    assert lease["metadata"] == {
        "name": "gpu-1",
        "namespace": "locks",
        "labels": {"app.kubernetes.io/managed-by": "nodelock"},
        "annotations": {
            "nl.example/holder-uid": "uid-0",
            "nl.example/assignment": '{"c":["GPU-0"]}',
        },
    }
    assert lease["spec"] == {
        "holderIdentity": "team/train-0",
        "leaseDurationSeconds": 15,
        "acquireTime": T0,
        "renewTime": T0,
        "leaseTransitions": 1,
    }
    record = FMT.parse(lease)
    assert record.holder == POD
    assert record.token == 1
    assert record.last is None


def test_release_keeps_token_and_foreign_annotations_and_records_last() -> None:
    lease = FMT.new_lease(NODE, POD, duration_s=15, now=T0)
    lease["metadata"]["annotations"]["someone.else/note"] = "keep me"
    lease["metadata"]["resourceVersion"] = "7"
    released = FMT.released(lease, outcome=Outcome.ALLOCATED, now=T1)
    assert released["metadata"]["annotations"] == {
        "someone.else/note": "keep me",
        "nl.example/last-holder": "team/train-0",
        "nl.example/last-holder-uid": "uid-0",
        "nl.example/last-token": "1",
        "nl.example/last-outcome": "allocated",
    }
    assert released["metadata"]["resourceVersion"] == "7"  # the write stays conditional
    record = FMT.parse(released)
    assert record.holder is None
    assert record.token == 1
    assert record.renew_time == T1
    assert record.last == LastHandoff(
        HolderKey("team/train-0"), "uid-0", FencingToken(1), "allocated"
    )
    assert lease["spec"]["holderIdentity"] == "team/train-0"  # the input is not modified


def test_acquire_after_release_drops_old_data_and_keeps_last() -> None:
    released = FMT.released(
        FMT.new_lease(NODE, POD, duration_s=15, now=T0), outcome=Outcome.REJECTED, now=T1
    )
    other = Holder(HolderKey("team/eval-0"), "uid-1")
    again = FMT.acquired(released, other, token=FencingToken(2), duration_s=30, now=T1)
    record = FMT.parse(again)
    assert record.holder == other  # no assignment carried over from the previous holder
    assert record.token == 2
    assert record.duration_s == 30
    assert record.last is not None
    assert record.last.outcome == "rejected"


def test_break_names_who_and_why_until_the_next_acquisition() -> None:
    lease = FMT.new_lease(NODE, POD, duration_s=15, now=T0)
    broken = FMT.broken(lease, by="alice", reason="node repair", now=T1)
    ann = broken["metadata"]["annotations"]
    assert ann["nl.example/broken-by"] == "alice"
    assert ann["nl.example/broken-reason"] == "node repair"
    assert ann["nl.example/last-outcome"] == "broken"
    assert ann["nl.example/last-holder"] == "team/train-0"
    record = FMT.parse(broken)
    assert record.holder is None
    assert record.token == 1
    other = Holder(HolderKey("team/eval-0"), "uid-1")
    again = FMT.acquired(broken, other, token=FencingToken(2), duration_s=15, now=T1)
    assert FMT.parse(again).holder == other  # the break's record is not the new holder's data
    assert not {"nl.example/broken-by", "nl.example/broken-reason"} & set(
        again["metadata"]["annotations"]
    )
    with pytest.raises(ValueError, match="who breaks it and why"):
        FMT.broken(lease, by="alice", reason="", now=T1)


def test_takeover_records_the_old_holder_as_taken_over() -> None:
    lease = FMT.new_lease(NODE, POD, duration_s=15, now=T0)
    old = FMT.parse(lease)
    other = Holder(HolderKey("team/eval-0"), "uid-1")
    taken = FMT.acquired(lease, other, token=FencingToken(2), duration_s=15, now=T1, taken_from=old)
    assert FMT.parse(taken).last == LastHandoff(
        HolderKey("team/train-0"), "uid-0", FencingToken(1), "taken-over"
    )


def test_renew_moves_renew_time_and_rewrites_data() -> None:
    lease = FMT.new_lease(NODE, POD, duration_s=15, now=T0)
    changed = Holder(POD.key, POD.uid, {"assignment": '{"c":["GPU-1"]}', "note": "x"})
    renewed = FMT.parse(FMT.renewed(lease, changed, now=T1))
    assert renewed.renew_time == T1
    assert renewed.acquire_time == T0
    assert renewed.holder == changed
    assert renewed.token == 1


@pytest.mark.parametrize(
    "key", ["holder-uid", "last-token", "broken-by", "has space", "-dash", "a" * 64]
)
def test_holder_data_keys_must_be_valid_and_unreserved(key: str) -> None:
    with pytest.raises(ValueError, match="holder data key"):
        FMT.new_lease(NODE, Holder(POD.key, POD.uid, {key: "v"}), duration_s=15, now=T0)


def test_parse_of_a_foreign_lease_without_our_annotations() -> None:
    record = FMT.parse(
        {
            "metadata": {"name": "n", "resourceVersion": "3"},
            "spec": {"holderIdentity": "kube-system/x", "leaseDurationSeconds": 40},
        }
    )
    assert record.holder == Holder(HolderKey("kube-system/x"), "", {})
    assert record.token == 0
    assert record.resource_version == "3"


def test_parse_rejects_a_token_that_is_not_a_number() -> None:
    with pytest.raises(MalformedLease, match="leaseTransitions"):
        FMT.parse({"metadata": {"name": "n"}, "spec": {"leaseTransitions": "many"}})
