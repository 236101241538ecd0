"""Plain data of node locks: identities, the Lease record, and what this process observed.

No I/O here.  ``LockRecord`` is what a Lease says; ``NodeLockView`` adds what this process saw
(how long the record has stood unchanged on the local clock), which is the only basis for expiry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NewType

NodeName = NewType("NodeName", str)
FencingToken = NewType("FencingToken", int)
HolderKey = NewType("HolderKey", str)  # "namespace/name" of the pod in handoff


class Outcome(StrEnum):
    """How a handoff ended; kept on the Lease as ``last-outcome`` when it is released."""

    ALLOCATED = "allocated"
    REJECTED = "rejected"
    BIND_FAILED = "bind-failed"
    BROKEN = "broken"
    TAKEN_OVER = "taken-over"
    EXPIRED = "expired"  # released once expired, its holder gone, finished or admitted
    FINISHED = "finished"  # released at once: its holder Succeeded
    DELETED = "deleted"  # released at once: its holder was deleted


@dataclass(frozen=True)
class Holder:
    """Who holds (or wants) a node lock, with caller data kept in Lease annotations."""

    key: HolderKey
    uid: str
    data: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LastHandoff:
    """The previous holder of a released lock, its token and how its handoff ended."""

    holder: HolderKey
    uid: str
    token: FencingToken
    outcome: str


@dataclass(frozen=True)
class LockRecord:
    """What one node's Lease says, as plain data."""

    node: NodeName
    holder: Holder | None
    token: FencingToken
    duration_s: int
    acquire_time: str | None
    renew_time: str | None
    resource_version: str
    last: LastHandoff | None = None


@dataclass(frozen=True)
class NodeLockView:
    """A record plus how long this process has seen it unchanged (local clock)."""

    record: LockRecord
    unchanged_for_s: float
    expired: bool
    held_for_s: float = 0.0  # since this process first saw the current holder with this token

    @property
    def node(self) -> NodeName:
        return self.record.node


@dataclass(frozen=True)
class HeldLock:
    """Proof of holding a node lock: the token every later write is conditional on."""

    node: NodeName
    holder: Holder
    token: FencingToken
    resource_version: str
