"""Errors a lock caller can act on.

``LockError`` and its subclasses describe what an API answer (``kube.errors``) means for a node
lock.  A 409 on a conditional write is always turned into ``LockHeld``/``LockLost``/``StaleToken``
by the caller, never retried blindly.
"""

from __future__ import annotations


class LockError(Exception):
    """A node lock operation could not be done as asked."""

    user_facing = True

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"node {node}: {message}")
        self.node = node


class LockHeld(LockError):
    """Another holder has the node's lock (contention); says who, for how long, with which token."""

    def __init__(self, node: str, holder: str, held_for_s: float, token: int) -> None:
        super().__init__(
            node, f"lock held by {holder} for {held_for_s:.1f}s (fencing token {token})"
        )
        self.holder = holder
        self.held_for_s = held_for_s
        self.token = token


class LockLost(LockError):
    """The caller's lock is no longer its own: released, taken over or changed under it."""


class StaleToken(LockError):
    """A write carried a fencing token older than the Lease's; nothing was changed."""

    def __init__(self, node: str, token: int, current: int) -> None:
        super().__init__(node, f"stale fencing token {token}: the lock is at token {current}")
        self.token = token
        self.current = current
