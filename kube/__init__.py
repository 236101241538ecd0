"""The generic Kubernetes layer at the bottom of nodelock: the API client (``kube.client``) and its
errors (``kube.errors``), the list-then-watch loop (``kube.watch``), process setup
(``kube.process``), build information (``kube.build``) and failpoints (``kube.failpoints``).

It knows nothing about locks, GPUs or the handoff; it is the only package that imports a
Kubernetes client library.
"""

from kube.client import KubeClient
from kube.errors import (
    ApiError,
    ApiUnavailable,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
)

__all__ = [
    "ApiError",
    "ApiUnavailable",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeClient",
    "NotFound",
]
