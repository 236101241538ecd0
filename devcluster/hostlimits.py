"""The host's inotify instance limit, which several clusters of real kubelets exhaust.

Every ``inotify_init`` counts against ``fs.inotify.max_user_instances`` of its user, 128 by
default, and every devcluster component runs as the same user.  A kubelet holds several
(its open files that link to ``anon_inode:inotify``), as do containerd and the API server, so a
machine running a few clusters of real kubelets at once (``make test`` runs two or
three) runs out, and the next kubelet exits at start: ``initializeRuntimeDependentModules``
exits the process when cAdvisor cannot start ("Failed to start cAdvisor" err="inotify_init: too
many open files": ``pkg/kubelet/kubelet.go``, Kubernetes 1.31.9 and 1.37.2).  Kubernetes' own
GCE nodes set the limit to 8192 (``cluster/gce/gci/configure-helper.sh``, ``setup-os-params``,
1.37.2); devcluster raises it to ``INOTIFY_INSTANCES`` when it is lower and it may, and
otherwise says which sysctl to run.
"""

from __future__ import annotations

import sys
from pathlib import Path

from devcluster.errors import DevclusterError

MAX_USER_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_INSTANCES = 8192


def needed_raise(current: int, wanted: int = INOTIFY_INSTANCES) -> int | None:
    """The value to write, or None when ``current`` is already enough (never lowers it)."""
    return wanted if current < wanted else None


def ensure_inotify_instances(
    path: Path = MAX_USER_INSTANCES, wanted: int = INOTIFY_INSTANCES, *, strict: bool = True
) -> None:
    """``fs.inotify.max_user_instances`` is at least ``wanted`` afterwards, or, where it cannot be
    raised (not root), a DevclusterError names the sysctl an administrator can run; with
    ``strict`` false that is a warning on stderr instead (a cluster of simulated kubelets runs
    within the default, and needs no root).  A limit that is higher already is left alone."""
    try:
        current = int(path.read_text().strip())
    except (OSError, ValueError) as exc:
        raise DevclusterError(f"cannot read the inotify instance limit in {path}: {exc}") from exc
    value = needed_raise(current, wanted)
    if value is None:
        return
    try:
        path.write_text(f"{value}\n")
    except OSError as exc:
        message = (
            f"real kubelets need more inotify instances than the {current} of "
            f"fs.inotify.max_user_instances, and raising it failed ({exc}): run "
            f"`sysctl -w fs.inotify.max_user_instances={value}` as root"
        )
        if strict:
            raise DevclusterError(message) from exc
        print(f"devcluster: warning: {message}", file=sys.stderr)
