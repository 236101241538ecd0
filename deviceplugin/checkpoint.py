"""The plugin's node-local checkpoint: handoff progress and releases still to be made.

kubelet keeps its own device checkpoint and, after a restart, asks again only for containers it
has no devices for; the plugin's progress must survive its own restart the same way, or it would
repeat or skip a container.  A release that could not be written (API server down) is kept here
too, so a restart retries it instead of leaking the lock.

Guarantees: ``save`` writes a temporary file, fsyncs it, renames it over the checkpoint and, when
``durable``, fsyncs the directory.  The file's data is on the disk before the rename, so neither a
process crash nor a power loss leaves a torn or empty checkpoint: the old one or the new one.
Without ``durable`` the rename itself may be lost in a power loss (the previous checkpoint
returns), which callers use only where resuming from the previous one is safe.

``load`` of a *damaged* file (empty, not JSON, fields of the wrong shape) does not refuse to
start: it logs an error naming the file, sets the file aside (``<name>.damaged``, nothing is
deleted) and starts from the safe state, the state of a first start: no progress, no pending
release, no served pod.  Why that gives no GPU twice: a pod's devices come from the Lease's
assignment, which the extender proved against every bound pod, never from this file; a lost
pending release leaves the lock held, which expires and is taken over only once its holder has
left the handoff (docs/design.md, "Expiry and takeover"); a lost served-pod list only makes the
plugin wait for kubelet's own records.  A handoff under way at the damage is decided as if none
of its containers had been served: kubelet asks again only for containers it has no devices
for, and picks among devices it has not given; the plugin serves kubelet's pick when it lies in
the pod's assigned devices and otherwise refuses the container (the pod is recreated by its
controller) under ``--mismatch-policy=refuse``, the default.  Under ``--mismatch-policy=assignment``
it would serve the next container's expected devices, which may be an earlier container's of
the same pod: the error log says a checkpoint was set aside, so that pod can be checked.  A file
of another version or of another node is not damage but a setting to fix: ``load`` refuses it
(``CheckpointError``, user-facing).
Not guaranteed: safety when two processes use one file (one plugin per node and state dir).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from deviceplugin.decide import HandoffProgress
from handoff.wire import ContainerName, DeviceID, valid_device_id
from lockd.model import FencingToken, Holder, HolderKey, NodeName, Outcome

log = logging.getLogger(__name__)

VERSION = 1
DAMAGED_SUFFIX = ".damaged"
SERVED_PODS_KEPT = 64  # UIDs of the pods served most recently (their statuses may still lag)


class CheckpointError(Exception):
    """The checkpoint file exists but cannot be used."""

    user_facing = True


class ForeignCheckpoint(ValueError):
    """A well-formed checkpoint of another format version or of another node."""


@dataclass(frozen=True)
class PendingRelease:
    """A lock release decided but not yet written: holder, token and how the handoff ended."""

    holder: HolderKey
    uid: str
    token: FencingToken
    outcome: Outcome

    @classmethod
    def of(cls, holder: Holder, token: FencingToken, outcome: Outcome) -> PendingRelease:
        return cls(holder.key, holder.uid, token, outcome)


@dataclass(frozen=True)
class Checkpoint:
    """Everything the plugin must not forget across a restart."""

    node: NodeName
    progress: HandoffProgress | None = None
    pending: tuple[PendingRelease, ...] = ()
    served_pods: tuple[str, ...] = ()  # UIDs, oldest first, at most SERVED_PODS_KEPT

    def with_pending(self, release: PendingRelease) -> Checkpoint:
        kept = tuple(p for p in self.pending if p.token != release.token)
        return replace(self, pending=(*kept, release))

    def without_pending(self, token: FencingToken) -> Checkpoint:
        return replace(self, pending=tuple(p for p in self.pending if p.token != token))

    def with_progress(self, progress: HandoffProgress | None) -> Checkpoint:
        return replace(self, progress=progress)

    def with_served(self, uid: str) -> Checkpoint:
        """Remember that a container of pod ``uid`` was served (bounded, newest last)."""
        kept = tuple(u for u in self.served_pods if u != uid)
        return replace(self, served_pods=(*kept, uid)[-SERVED_PODS_KEPT:])


def checkpoint_path(state_dir: Path, node: NodeName) -> Path:
    """One file per node, so simulated nodes may share a state directory."""
    return state_dir / f"deviceplugin-{node}.json"


def to_json(cp: Checkpoint) -> dict[str, Any]:
    progress = None
    if cp.progress is not None:
        progress = {
            "holder": cp.progress.holder,
            "uid": cp.progress.uid,
            "token": cp.progress.token,
            "served": list(cp.progress.served),
            "given": [list(ids) for ids in cp.progress.given],
        }
        if cp.progress.resources:  # absent while every served container had whole GPUs
            progress["resources"] = list(cp.progress.resources)
    return {
        "version": VERSION,
        "node": cp.node,
        "progress": progress,
        "pending": [
            {"holder": p.holder, "uid": p.uid, "token": p.token, "outcome": p.outcome.value}
            for p in cp.pending
        ],
        "served_pods": list(cp.served_pods),
    }


def from_json(raw: Any, node: NodeName) -> Checkpoint:
    """Parse a checkpoint; raises ``ValueError`` (with what is wrong) for anything unexpected."""
    if not isinstance(raw, dict):
        raise ValueError(f"not a version {VERSION} device plugin checkpoint")
    if raw.get("version") != VERSION:
        if isinstance(raw.get("version"), int) and raw.get("node") == node:
            raise ForeignCheckpoint(f"checkpoint version {raw['version']}, not {VERSION}")
        raise ValueError(f"not a version {VERSION} device plugin checkpoint")
    if raw.get("node") != node:
        if isinstance(raw.get("node"), str):
            raise ForeignCheckpoint(f"it belongs to node {raw.get('node')!r}, not {node!r}")
        raise ValueError("it names no node")
    progress = None
    p = raw.get("progress")
    if p is not None:
        served = p["served"]
        if not isinstance(served, list) or not all(isinstance(c, str) for c in served):
            raise ValueError("progress.served must be a list of container names")
        given = p.get("given") or []  # absent in checkpoints written before it was kept
        if (
            not isinstance(given, list)
            or len(given) > len(served)
            or not all(isinstance(g, list) and all(valid_device_id(d) for d in g) for g in given)
        ):
            raise ValueError(
                "progress.given must be a list (one per served container) of device ID lists"
            )
        resources = p.get("resources") or []  # absent: every entry had whole GPUs
        if (
            not isinstance(resources, list)
            or len(resources) > len(served)
            or not all(isinstance(r, str) and r for r in resources)
        ):
            raise ValueError(
                "progress.resources must be a list (one per served container) of resource names"
            )
        progress = HandoffProgress(
            holder=HolderKey(str(p["holder"])),
            uid=str(p["uid"]),
            token=FencingToken(_int(p["token"])),
            served=tuple(ContainerName(c) for c in served),
            given=tuple(tuple(DeviceID(d) for d in g) for g in given),
            resources=tuple(str(r) for r in resources),
        )
    pending = tuple(
        PendingRelease(
            holder=HolderKey(str(r["holder"])),
            uid=str(r["uid"]),
            token=FencingToken(_int(r["token"])),
            outcome=Outcome(r["outcome"]),
        )
        for r in raw.get("pending") or []
    )
    served_pods = raw.get("served_pods") or []  # absent in files written before it was kept
    if not isinstance(served_pods, list) or not all(isinstance(u, str) for u in served_pods):
        raise ValueError("served_pods must be a list of pod UIDs")
    return Checkpoint(node, progress, pending, tuple(served_pods[-SERVED_PODS_KEPT:]))


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value


def load(path: Path, node: NodeName) -> Checkpoint:
    """Read the checkpoint at ``path``; an empty one when the file does not exist, and the safe
    state (also empty) when it is damaged, the file then set aside (module docstring)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Checkpoint(node)
    except (OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, UnicodeDecodeError):
            return _damaged(path, node, f"not UTF-8 text ({exc})")
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    try:
        return from_json(json.loads(text), node)
    except ForeignCheckpoint as exc:
        raise CheckpointError(
            f"checkpoint {path} is not this plugin's ({exc}); it records which containers of "
            "the pod in handoff were served — move it aside only when no GPU pod is being "
            "admitted here"
        ) from exc
    except (ValueError, KeyError, TypeError) as exc:
        return _damaged(path, node, "empty" if not text.strip() else str(exc))


def _damaged(path: Path, node: NodeName, why: str) -> Checkpoint:
    """Set the damaged checkpoint aside and return the safe state (the module docstring)."""
    aside = path.with_name(path.name + DAMAGED_SUFFIX)
    try:
        os.replace(path, aside)
        kept = f"kept as {aside}"
    except OSError as exc:
        kept = f"could not be set aside ({exc}); it is overwritten by the next save"
    log.error(
        "device plugin checkpoint %s is damaged (%s); %s. Starting from the safe state: no "
        "handoff progress, no pending lock release, no served pod. A pod whose handoff was "
        "under way is refused if kubelet asks for a container it cannot match, and a lock whose "
        "release was pending expires and is taken over once its holder left the handoff",
        path,
        why,
        kept,
    )
    return Checkpoint(node)


def save(path: Path, cp: Checkpoint, *, durable: bool = True) -> None:
    """Replace the checkpoint at ``path`` atomically: write a temporary file, fsync it, rename it
    over ``path``, then fsync the directory unless ``durable`` is False (then a power loss may
    undo the rename and leave the previous checkpoint, which must be safe to resume from — never
    an empty or torn file: the data is on the disk before the rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(to_json(cp), indent=1, sort_keys=True).encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
