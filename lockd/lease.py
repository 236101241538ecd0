"""The Lease object of a node lock, read and written as plain JSON (docs/handoff.md).

Pure functions: a Lease dict in, a ``LockRecord`` or a new Lease dict out.  Every body written
keeps the fields and annotations lockd does not own, and formats MicroTimes itself.

Layout: ``spec.holderIdentity`` is the holder's ``namespace/name`` (absent when free),
``spec.leaseTransitions`` the fencing token (the number of acquisitions so far; the first is 1),
``<prefix>holder-uid`` the holder's UID, ``<prefix><key>`` the holder's data, and
``<prefix>last-holder``/``last-holder-uid``/``last-token``/``last-outcome`` the previous handoff.
A lock broken by hand also carries ``<prefix>broken-by`` (the username that broke it) and
``<prefix>broken-reason`` until its next acquisition; the chart's admission policy lets a person
clear a lock's holder only in a write that names them so (docs/install.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from lockd.model import (
    FencingToken,
    Holder,
    HolderKey,
    LastHandoff,
    LockRecord,
    NodeName,
    Outcome,
)

JSON = dict[str, Any]

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "nodelock"
LABEL_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

HOLDER_UID = "holder-uid"
LAST_HOLDER = "last-holder"
LAST_HOLDER_UID = "last-holder-uid"
LAST_TOKEN = "last-token"
LAST_OUTCOME = "last-outcome"
BROKEN_BY = "broken-by"
BROKEN_REASON = "broken-reason"
RESERVED = frozenset(
    {HOLDER_UID, LAST_HOLDER, LAST_HOLDER_UID, LAST_TOKEN, LAST_OUTCOME, BROKEN_BY, BROKEN_REASON}
)
_LAST = (LAST_HOLDER, LAST_HOLDER_UID, LAST_TOKEN, LAST_OUTCOME)

_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class MalformedLease(ValueError):
    """A Lease does not have the shape of a node lock (e.g. a token that is not a number)."""


@dataclass(frozen=True)
class LeaseFormat:
    """Where node locks live and under which annotation prefix their data is kept.

    Both are the caller's: the lock library has no defaults of its own (nodelock's are in
    ``handoff.wire``: ``DEFAULT_LOCK_NAMESPACE``, ``DEFAULT_PREFIX``)."""

    namespace: str
    prefix: str

    def key(self, name: str) -> str:
        """The annotation key of ``name`` under the prefix."""
        return f"{self.prefix}{name}"

    def parse(self, lease: Mapping[str, Any]) -> LockRecord:
        """Read a Lease as a ``LockRecord``; raises ``MalformedLease`` if it is not one."""
        meta = lease.get("metadata") or {}
        spec = lease.get("spec") or {}
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        node = NodeName(str(meta.get("name", "")))
        token = _int(spec.get("leaseTransitions", 0), "spec.leaseTransitions")
        duration = _int(spec.get("leaseDurationSeconds", 0), "spec.leaseDurationSeconds")
        holder_key = spec.get("holderIdentity") or None
        holder: Holder | None = None
        if holder_key:
            data = {
                k[len(self.prefix) :]: v
                for k, v in annotations.items()
                if k.startswith(self.prefix) and k[len(self.prefix) :] not in RESERVED
            }
            holder = Holder(
                key=HolderKey(str(holder_key)),
                uid=str(annotations.get(self.key(HOLDER_UID), "")),
                data=data,
            )
        last: LastHandoff | None = None
        if self.key(LAST_HOLDER) in annotations:
            last = LastHandoff(
                holder=HolderKey(annotations[self.key(LAST_HOLDER)]),
                uid=annotations.get(self.key(LAST_HOLDER_UID), ""),
                token=FencingToken(
                    _int(annotations.get(self.key(LAST_TOKEN), "0"), self.key(LAST_TOKEN))
                ),
                outcome=annotations.get(self.key(LAST_OUTCOME), ""),
            )
        return LockRecord(
            node=node,
            holder=holder,
            token=FencingToken(token),
            duration_s=duration,
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            resource_version=str(meta.get("resourceVersion", "")),
            last=last,
        )

    def new_lease(self, node: NodeName, holder: Holder, *, duration_s: int, now: str) -> JSON:
        """A Lease to create for the first acquisition of ``node`` (token 1)."""
        lease: JSON = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node, "namespace": self.namespace},
            "spec": {},
        }
        return self.acquired(lease, holder, token=FencingToken(1), duration_s=duration_s, now=now)

    def acquired(
        self,
        lease: Mapping[str, Any],
        holder: Holder,
        *,
        token: FencingToken,
        duration_s: int,
        now: str,
        taken_from: LockRecord | None = None,
    ) -> JSON:
        """``lease`` held by ``holder`` with ``token``; ``taken_from`` records a takeover."""
        self.check_data(holder)
        out = _copy(lease)
        meta = out.setdefault("metadata", {})
        meta.setdefault("labels", {})[MANAGED_BY_LABEL] = MANAGED_BY
        annotations = self._without_holder(meta.get("annotations") or {})
        annotations.update(self._last(taken_from, Outcome.TAKEN_OVER))
        annotations[self.key(HOLDER_UID)] = holder.uid
        annotations.update({self.key(k): v for k, v in holder.data.items()})
        meta["annotations"] = annotations
        spec = out.setdefault("spec", {})
        spec.update(
            holderIdentity=holder.key,
            leaseDurationSeconds=duration_s,
            acquireTime=now,
            renewTime=now,
            leaseTransitions=token,
        )
        return out

    def renewed(self, lease: Mapping[str, Any], holder: Holder, *, now: str) -> JSON:
        """``lease`` with ``renewTime`` moved to ``now`` and the holder's data rewritten."""
        self.check_data(holder)
        out = _copy(lease)
        meta = out.setdefault("metadata", {})
        annotations = {
            k: v
            for k, v in (meta.get("annotations") or {}).items()
            if not k.startswith(self.prefix) or k[len(self.prefix) :] in RESERVED
        }
        annotations[self.key(HOLDER_UID)] = holder.uid
        annotations.update({self.key(k): v for k, v in holder.data.items()})
        meta["annotations"] = annotations
        out.setdefault("spec", {})["renewTime"] = now
        return out

    def released(self, lease: Mapping[str, Any], *, outcome: Outcome, now: str) -> JSON:
        """``lease`` free again, its token kept and its last holder recorded as ``last-*``."""
        out = _copy(lease)
        record = self.parse(out)
        meta = out.setdefault("metadata", {})
        annotations = self._without_holder(meta.get("annotations") or {})
        annotations.update(self._last(record, outcome))
        meta["annotations"] = annotations
        spec = out.setdefault("spec", {})
        spec.pop("holderIdentity", None)
        spec.pop("acquireTime", None)
        spec["renewTime"] = now
        return out

    def broken(self, lease: Mapping[str, Any], *, by: str, reason: str, now: str) -> JSON:
        """``lease`` released with outcome ``broken``, naming who broke it and why."""
        if not by or not reason:
            raise ValueError("breaking a lock needs who breaks it and why")
        out = self.released(lease, outcome=Outcome.BROKEN, now=now)
        out["metadata"]["annotations"].update(
            {self.key(BROKEN_BY): by, self.key(BROKEN_REASON): reason}
        )
        return out

    def check_data(self, holder: Holder) -> None:
        """Raise ``ValueError`` unless every data key makes a valid, unreserved annotation key."""
        for key in holder.data:
            if key in RESERVED:
                raise ValueError(f"holder data key {key!r} is reserved by lockd")
            if not _NAME_PART.match(key):
                raise ValueError(f"holder data key {key!r} is not a valid annotation name")

    def _without_holder(self, annotations: Mapping[str, str]) -> dict[str, str]:
        """Annotations without the holder's (keeps ``last-*`` and everything not ours)."""
        return {
            k: v
            for k, v in annotations.items()
            if not k.startswith(self.prefix) or k[len(self.prefix) :] in _LAST
        }

    def _last(self, record: LockRecord | None, outcome: Outcome) -> dict[str, str]:
        """The ``last-*`` annotations recording that ``record``'s holder left with ``outcome``
        (none when there was no holder)."""
        if record is None or record.holder is None:
            return {}
        return {
            self.key(LAST_HOLDER): record.holder.key,
            self.key(LAST_HOLDER_UID): record.holder.uid,
            self.key(LAST_TOKEN): str(record.token),
            self.key(LAST_OUTCOME): outcome.value,
        }


def _int(value: object, field: str) -> int:
    try:
        return int(str(value))
    except ValueError as exc:
        raise MalformedLease(f"{field} is not an integer: {value!r}") from exc


def _copy(lease: Mapping[str, Any]) -> JSON:
    """A deep copy of a Lease as the API server sent it (JSON values only), by one encode and
    decode: several times cheaper than ``copy.deepcopy`` over its ``managedFields``."""
    copied: JSON = orjson.loads(orjson.dumps(dict(lease)))
    return copied
