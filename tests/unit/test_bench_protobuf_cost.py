"""``bench.protobuf_cost``'s hand-made protobuf: the Lease it sends carries what it says, and the
resourceVersion is read back out of an answer in the API server's envelope."""

import json

from bench.protobuf_cost import (
    ANNOTATIONS,
    HOLDER,
    NAME,
    lease_json,
    lease_protobuf,
    resource_version_of,
)
from bench.protobuf_cost import _fields as fields
from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX, LEASE_ASSIGNMENT
from lockd.lease import LeaseFormat


def test_the_envelope_holds_the_type_and_the_lease() -> None:
    data = lease_protobuf(1_700_000_000.25, "42")
    assert data.startswith(b"k8s\x00")
    envelope = fields(data[4:])
    type_meta = fields(envelope[1])
    assert type_meta == {1: b"coordination.k8s.io/v1", 2: b"Lease"}
    lease = fields(envelope[2])
    meta, spec = fields(lease[1]), fields(lease[2])
    assert meta[1] == NAME.encode()
    assert meta[6] == b"42"
    assert fields(spec[3]) == {}  # MicroTime: seconds and nanos are varints, no nested fields
    assert spec[1] == HOLDER.encode()
    assert resource_version_of(data) == "42"


def test_the_json_twin_says_the_same() -> None:
    body = json.loads(lease_json(1_700_000_000.25, "42"))
    assert body["metadata"]["resourceVersion"] == "42"
    assert body["metadata"]["annotations"] == ANNOTATIONS
    assert body["spec"]["holderIdentity"] == HOLDER
    assert body["spec"]["acquireTime"] == "2023-11-14T22:13:20.250000Z"
    assert "resourceVersion" not in json.loads(lease_json(0.0))["metadata"]


def test_the_bare_lease_differs_only_by_the_locks_labels_and_annotations() -> None:
    full = json.loads(lease_json(1_700_000_000.25, "42"))
    bare = json.loads(lease_json(1_700_000_000.25, "42", bare=True))
    assert "labels" not in bare["metadata"]
    assert "annotations" not in bare["metadata"]
    del full["metadata"]["labels"], full["metadata"]["annotations"]
    assert bare == full


def test_the_lock_shaped_lease_reads_back_as_a_held_lock_with_its_last_handoff() -> None:
    record = LeaseFormat(DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX).parse(
        json.loads(lease_json(1_700_000_000.25, "42"))
    )
    assert record.holder is not None
    assert record.holder.key == HOLDER
    assert "main" in json.loads(record.holder.data[LEASE_ASSIGNMENT])
    assert record.last is not None
    assert record.last.outcome == "allocated"
