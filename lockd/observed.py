"""What this process has seen of each node's Lease, timed on the local clock.

Expiry follows client-go's observed-time rule: a held lock is expired when its record (holder,
token, duration, acquire/renew times, holder data) has stood unchanged for ``leaseDurationSeconds``
*since this process saw it change*.  Remote timestamps are never compared with the local clock,
so clock skew between machines cannot expire a lock early; the price is that a process that has
just started (or just forgotten a node) must watch a record for a full duration before it can call
it expired.

Observations arrive out of order (a watch event may trail a write's response).  Records of one
node are ordered by their ``resourceVersion`` when both are integers (the API server's etcd
revision: every write of the Lease, also a hand edit or a delete and create, gets a higher one),
else by ``(token, free-after-held)``: a token only grows, and within one token the lock is first
held, then free.  An older observation is ignored; so a held Lease reset by hand to token 0 is
still seen as the change it is.  ``replace=True`` (an authoritative read) overrides that only
where no resourceVersion order exists (the token order cannot see a hand edit that lowers the
token).  A read's answer older by resourceVersion is ignored like any other: it can reach this
process after a newer watch event (a GET after a lost race, answered just before the holder
released), and taking it would bring back a holder that has left, with no later write to
correct the view until the lock expired.  (Integer resourceVersions go back only when etcd is
restored from a backup, after which Kubernetes' components, this one too, must be restarted.)

No I/O: times are passed in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lockd.model import Holder, LockRecord, NodeLockView, NodeName

JSON = dict[str, Any]


def history_key(record: LockRecord) -> tuple[int, int]:
    """Orders records of one Lease: by token, and within a token held before free."""
    return (record.token, 0 if record.holder is not None else 1)


def _revision(record: LockRecord) -> int | None:
    text = record.resource_version
    return int(text) if text.isdigit() else None


def older(record: LockRecord, than: LockRecord) -> bool:
    """Whether ``record`` is an earlier state of its Lease than ``than``: by resourceVersion
    when both are integers, else by ``history_key`` (which cannot see a hand edit that lowers
    the token)."""
    mine, theirs = _revision(record), _revision(than)
    if mine is not None and theirs is not None:
        return mine < theirs
    return history_key(record) < history_key(than)


def _ordered(a: LockRecord, b: LockRecord) -> bool:
    """Whether both records carry integer resourceVersions (an order no hand edit can fool)."""
    return _revision(a) is not None and _revision(b) is not None


def same_content(a: LockRecord, b: LockRecord) -> bool:
    """Whether two records say the same thing (the resourceVersion aside)."""
    return a == dataclasses.replace(b, resource_version=a.resource_version)


@dataclass
class Seen:
    """The latest record of one node, the Lease it came in, and when it (or its holder) changed."""

    record: LockRecord
    lease: JSON
    changed_at: float
    held_since: float
    expiry_reported: bool = False

    def view(self, now: float) -> NodeLockView:
        """The record as of ``now`` on the local clock."""
        unchanged = max(0.0, now - self.changed_at)
        held = self.record.holder is not None
        return NodeLockView(
            record=self.record,
            unchanged_for_s=unchanged,
            expired=held and unchanged >= self.record.duration_s,
            held_for_s=max(0.0, now - self.held_since) if held else 0.0,
        )


class Observations:
    """Per node, the latest record seen and the local times of its last change.

    Also indexes the nodes whose latest record has a holder, so that ``holders()`` costs the
    number of held locks, not the number of nodes.
    """

    def __init__(self) -> None:
        self._seen: dict[NodeName, Seen] = {}
        self._held: dict[NodeName, Holder] = {}  # node -> holder of its latest record

    def observe(
        self, record: LockRecord, lease: JSON, now: float, *, replace: bool = False
    ) -> Seen:
        """Take in one observation at local time ``now``; returns what is now known."""
        node = record.node
        old = self._seen.get(node)
        if old is None:
            seen = Seen(record, lease, changed_at=now, held_since=now)
        elif older(record, old.record) and (not replace or _ordered(record, old.record)):
            return old  # an older state trailing a newer one: keep the newer
        elif same_content(old.record, record):
            old.record, old.lease = record, lease  # same content, maybe a new resourceVersion
            return old
        else:
            same_holding = (
                record.holder is not None
                and old.record.holder is not None
                and record.token == old.record.token
                and record.holder.key == old.record.holder.key
            )
            seen = Seen(
                record, lease, changed_at=now, held_since=old.held_since if same_holding else now
            )
        self._seen[node] = seen
        if record.holder is None:
            self._held.pop(node, None)
        else:
            self._held[node] = record.holder
        return seen

    def get(self, node: NodeName) -> Seen | None:
        """The latest observation of ``node``, if any."""
        return self._seen.get(node)

    def forget(self, node: NodeName) -> None:
        """Drop what is known of ``node`` (its Lease was deleted or is unknown)."""
        self._seen.pop(node, None)
        self._held.pop(node, None)

    def holders(self) -> dict[NodeName, Holder]:
        """Node -> holder, for every node whose latest record has one (expired or not)."""
        return dict(self._held)

    def held_ages(self, now: float) -> dict[NodeName, float]:
        """Node -> seconds its holder has held it as of local time ``now`` (since this process
        first saw that holder with that token), for every node ``holders()`` names: what a
        wait estimate needs of a held lock, without a view per node."""
        seen = self._seen
        return {node: max(0.0, now - seen[node].held_since) for node in self._held}

    def expired(self, node: NodeName, now: float) -> bool:
        """Whether ``node``'s latest record is held and expired at ``now`` (``view(...).expired``
        without building the view)."""
        seen = self._seen.get(node)
        return (
            seen is not None
            and seen.record.holder is not None
            and max(0.0, now - seen.changed_at) >= seen.record.duration_s
        )

    def nodes(self) -> list[NodeName]:
        """Nodes with an observation, sorted."""
        return sorted(self._seen)

    def view(self, node: NodeName, now: float) -> NodeLockView | None:
        """The view of ``node`` at local time ``now``, or None if never seen."""
        seen = self._seen.get(node)
        return seen.view(now) if seen is not None else None

    def report_expiry(self, node: NodeName, now: float) -> bool:
        """True exactly once per expired record: for counting expired locks seen."""
        seen = self._seen.get(node)
        if seen is None or seen.expiry_reported or not seen.view(now).expired:
            return False
        seen.expiry_reported = True
        return True
