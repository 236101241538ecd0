"""Node locks as ``coordination.k8s.io/v1`` Lease objects, with fencing tokens and expiry judged on
the local clock.  Knows nothing about GPUs; see ``lockd.locks`` for the guarantees."""

from lockd.errors import (
    ApiError,
    ApiUnavailable,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    LockError,
    LockHeld,
    LockLost,
    NotFound,
    StaleToken,
)
from lockd.kube import KubeClient
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
    "ApiError",
    "ApiUnavailable",
    "Conflict",
    "FencingToken",
    "Forbidden",
    "Gone",
    "HeldLock",
    "Holder",
    "HolderKey",
    "Invalid",
    "KubeClient",
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
    "NotFound",
    "Outcome",
    "StaleToken",
    "TakeoverCheck",
    "format_microtime",
    "now_microtime",
    "parse_microtime",
]
