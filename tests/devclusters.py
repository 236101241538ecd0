"""The one way the tests start a devcluster of their own (a session's, a module's).

Guarantee: the control plane runs with its state in a fresh folder under /tmp (unix socket
paths must stay short) and is stopped when the ``with`` block ends, however it ends; the state
folder is removed then, unless ``NODELOCK_KEEP_STATE`` is set (to read the logs of a failure).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devcluster.binaries import ensure_control_plane
from devcluster.cluster import Cluster


@contextmanager
def own_cluster(prefix: str) -> Iterator[Cluster]:
    """A running devcluster control plane whose state folder's name starts with ``prefix``."""
    state = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    cluster = Cluster(state, binaries=ensure_control_plane())
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
        if not os.environ.get("NODELOCK_KEEP_STATE"):
            shutil.rmtree(state, ignore_errors=True)
