"""Node locks as ``coordination.k8s.io/v1`` Lease objects, with fencing tokens and expiry judged on
the local clock.  Knows nothing about GPUs; talks to the API server through ``kube``.  See
``lockd.locks`` for the guarantees."""

from lockd.errors import LockError, LockHeld, LockLost, StaleToken
from lockd.lease import LeaseFormat, MalformedLease
from lockd.locks import NodeLocks, TakeoverCheck
from lockd.metrics import AcquireResult, LockMetrics
from lockd.microtime import format_microtime, now_microtime, parse_microtime
from lockd.model import (
    FencingToken,
    HeldLock,
    Holder,
    HolderKey,
    LastHandoff,
    LockRecord,
    NodeLockView,
    NodeName,
    Outcome,
)

__all__ = [
    "AcquireResult",
    "FencingToken",
    "HeldLock",
    "Holder",
    "HolderKey",
    "LastHandoff",
    "LeaseFormat",
    "LockError",
    "LockHeld",
    "LockLost",
    "LockMetrics",
    "LockRecord",
    "MalformedLease",
    "NodeLockView",
    "NodeLocks",
    "NodeName",
    "Outcome",
    "StaleToken",
    "TakeoverCheck",
    "format_microtime",
    "now_microtime",
    "parse_microtime",
]
