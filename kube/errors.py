"""Errors of the Kubernetes API, each mapped from the wire with its cause chained.

``ApiError`` and its subclasses describe what the Kubernetes API server said; ``ApiUnavailable``
says it could not be reached.  What they mean for a caller (a lock held, a lock lost) is the
caller's to decide.
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
