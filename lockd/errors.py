"""Errors a lock caller can act on, each mapped from the wire with its cause chained.

``ApiError`` and its subclasses describe what the Kubernetes API server said; ``LockError`` and
its subclasses describe what that means for a node lock.  A 409 on a conditional write is always
turned into ``LockHeld``/``LockLost``/``StaleToken`` by the caller, never retried blindly.
"""

from __future__ import annotations


class ApiError(Exception):
    """The API server answered a request with an error status."""

    user_facing = True

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    """404: the object does not exist."""


class Conflict(ApiError):
    """409: the object changed since it was read, or already exists."""


class Gone(ApiError):
    """410: the resourceVersion asked for is too old (a watch must relist)."""


class Invalid(ApiError):
    """422 or 400: the server rejected the object as malformed."""


class Forbidden(ApiError):
    """403: the caller's identity may not do this."""


class ApiUnavailable(Exception):
    """The API server could not be reached, timed out, or answered 5xx/429."""

    user_facing = True


def api_error(status: int, reason: str, message: str) -> ApiError:
    """Map an HTTP error status to the most specific ``ApiError`` subclass."""
    cls: type[ApiError] = {
        404: NotFound,
        409: Conflict,
        410: Gone,
        422: Invalid,
        400: Invalid,
        403: Forbidden,
    }.get(status, ApiError)
    return cls(status, reason, message)


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
