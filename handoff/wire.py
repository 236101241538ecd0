"""The handoff's wire format: annotation keys, the assignment, the GPU inventory.

See docs/handoff.md.

Pure functions of plain data.  Parsing never trusts its input: every malformed value raises
``MalformedAnnotation`` with a message that names the annotation and what is wrong, so the device
plugin can refuse Allocate with an error a person can act on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NewType

from handoff.topology import NO_TOPO, Topo, format_topo, parse_topo
from lockd.model import FencingToken

DEFAULT_PREFIX = "nodelock.io/"  # the annotation prefix of pods, nodes and Leases
DEFAULT_RESOURCE = "nvidia.com/gpu"  # the extended resource the device plugin advertises
DEFAULT_LOCK_NAMESPACE = "nodelock-system"  # where the node locks (Leases) live

# The key of the assignment in a node lock's holder data (``Holder.data``): on the Lease it is the
# annotation ``<prefix>assignment``, the same key as the pod's (``Keys.assignment``).  The extender
# writes it when it takes the lock; the device plugin serves it.
LEASE_ASSIGNMENT = "assignment"

DeviceID = NewType("DeviceID", str)
ContainerName = NewType("ContainerName", str)

# container name -> device IDs, in the order the plugin will serve them (init containers first)
Assignment = dict[ContainerName, list[DeviceID]]

MAX_DEVICE_ID_LEN = 63  # kubelet's limit on device IDs
MAX_DEVICES_PER_CONTAINER = 1024
MAX_SPLIT = 64  # most virtual devices per shared GPU (``handoff.sharing``)
_DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")

# A MIG instance is a device of its own resource, named as the NVIDIA device plugin's mixed
# strategy names it: ``nvidia.com/mig-<profile>``; profiles are ``<g>g.<m>gb`` or
# ``<c>c.<g>g.<m>gb`` (compute slices, GPU instance slices, memory in GB)
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_MIG_PROFILE = re.compile(r"^(?:[1-9][0-9]?c\.)?[1-9][0-9]?g\.[1-9][0-9]{0,3}gb$")


class MalformedAnnotation(ValueError):
    """An annotation's value does not parse or breaks a rule of the format."""


@dataclass(frozen=True)
class Keys:
    """Annotation keys under one prefix (``nodelock.io/`` by default)."""

    prefix: str = DEFAULT_PREFIX

    @property
    def assignment(self) -> str:
        return f"{self.prefix}assignment"

    @property
    def token(self) -> str:
        return f"{self.prefix}token"

    @property
    def bound_at(self) -> str:
        return f"{self.prefix}bound-at"

    @property
    def gpus(self) -> str:
        """Node annotation: the node's GPU inventory (``format_inventory``)."""
        return f"{self.prefix}gpus"

    @property
    def numa_policy(self) -> str:
        """Node label: kubelet's topology manager policy on the node (docs/handoff.md)."""
        return f"{self.prefix}topology-manager-policy"

    @property
    def topology(self) -> str:
        """Pod annotation: required | preferred | none (docs/extender.md)."""
        return f"{self.prefix}topology"

    @property
    def policy(self) -> str:
        """Pod annotation: binpack | spread, overriding the extender's node policy."""
        return f"{self.prefix}policy"

    @property
    def gpu_model(self) -> str:
        return f"{self.prefix}gpu-model"

    @property
    def gpu_model_exclude(self) -> str:
        return f"{self.prefix}gpu-model-exclude"

    @property
    def gpu_uuid(self) -> str:
        return f"{self.prefix}gpu-uuid"

    @property
    def gpu_uuid_exclude(self) -> str:
        return f"{self.prefix}gpu-uuid-exclude"


def _json_annotation(raw: str | None, key: str) -> Any:
    """The JSON value of annotation ``key``; ``MalformedAnnotation`` when missing or not JSON."""
    if raw is None:
        raise MalformedAnnotation(f"annotation {key} is missing")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise MalformedAnnotation(f"annotation {key} is not JSON: {exc}") from exc


def format_assignment(assignment: Mapping[ContainerName, Sequence[DeviceID]]) -> str:
    """Serialize an assignment; key order (container order) is kept."""
    return json.dumps({name: list(ids) for name, ids in assignment.items()}, separators=(",", ":"))


def parse_assignment(raw: str | None, *, key: str = Keys().assignment) -> Assignment:
    """Parse an assignment annotation, checking every rule of the format."""
    value = _json_annotation(raw, key)
    if not isinstance(value, dict) or not value:
        raise MalformedAnnotation(
            f"annotation {key} must be a non-empty JSON object of container name -> device IDs"
        )
    out: Assignment = {}
    for name, ids in value.items():
        if not isinstance(ids, list) or not ids:
            raise MalformedAnnotation(
                f"annotation {key}: container {name!r} must map to a non-empty list of device IDs"
            )
        if len(ids) > MAX_DEVICES_PER_CONTAINER:
            raise MalformedAnnotation(f"annotation {key}: container {name!r} lists too many IDs")
        for dev in ids:
            if not isinstance(dev, str) or not valid_device_id(dev):
                raise MalformedAnnotation(
                    f"annotation {key}: container {name!r} has an invalid device ID {dev!r}"
                )
        if len(set(ids)) != len(ids):
            raise MalformedAnnotation(f"annotation {key}: container {name!r} repeats a device ID")
        out[ContainerName(name)] = [DeviceID(d) for d in ids]
    return out


def valid_device_id(dev: str) -> bool:
    """Whether ``dev`` is a device ID kubelet accepts (≤ 63 characters, no odd characters)."""
    return 0 < len(dev) <= MAX_DEVICE_ID_LEN and _DEVICE_ID.match(dev) is not None


def format_token(token: FencingToken) -> str:
    """Serialize a fencing token for the pod's token annotation (decimal)."""
    return str(int(token))


def parse_token(raw: str | None, *, key: str = Keys().token) -> FencingToken:
    """Parse a fencing-token annotation (a non-negative decimal integer)."""
    if raw is None:
        raise MalformedAnnotation(f"annotation {key} is missing")
    if not raw.isdigit() or len(raw) > 18:
        raise MalformedAnnotation(f"annotation {key} must be a non-negative integer, got {raw!r}")
    return FencingToken(int(raw))


@dataclass(frozen=True)
class GPU:
    """One device of a node's inventory."""

    id: DeviceID
    index: int
    model: str
    memory_mib: int
    numa: int | None
    healthy: bool
    topo: Topo = NO_TOPO  # link facts (``handoff.topology``); NO_TOPO when unknown
    split: int = 1  # virtual devices kubelet sees for this GPU (> 1: shared, ``handoff.sharing``)
    # a MIG instance: its profile (e.g. ``1g.10gb``) and its parent GPU's UUID; "" / None for a
    # whole GPU.  A GPU in MIG mode is never a row of its own: only its instances are.
    profile: str = ""
    parent: DeviceID | None = None

    @property
    def resource(self) -> str:
        """The extended resource this device is advertised as (``resource_of``)."""
        return resource_of(self.profile)


def valid_mig_profile(profile: str) -> bool:
    """Whether ``profile`` is a MIG profile name this format accepts (``1g.10gb``,
    ``1c.2g.20gb``; not the ``+me`` media-extension profiles)."""
    return _MIG_PROFILE.match(profile) is not None


def resource_of(profile: str) -> str:
    """The extended resource of a device with MIG ``profile`` ("": a whole GPU)."""
    return f"{MIG_RESOURCE_PREFIX}{profile}" if profile else DEFAULT_RESOURCE


def mig_profile_of(resource: str) -> str | None:
    """The MIG profile a resource name asks for (None: not a MIG resource of a valid profile)."""
    if not resource.startswith(MIG_RESOURCE_PREFIX):
        return None
    profile = resource[len(MIG_RESOURCE_PREFIX) :]
    return profile if valid_mig_profile(profile) else None


def format_inventory(gpus: Sequence[GPU]) -> str:
    """Serialize a node's GPU inventory, sorted by index, deterministic for equal inputs."""
    rows: list[dict[str, Any]] = []
    for g in sorted(gpus, key=lambda g: (g.index, g.id)):
        row: dict[str, Any] = {
            "id": g.id,
            "index": g.index,
            "model": g.model,
            "memoryMiB": g.memory_mib,
            "numa": g.numa,
            "healthy": g.healthy,
        }
        if not g.topo.empty:  # absent rather than empty: inventories without topology unchanged
            row["topo"] = format_topo(g.topo)
        if g.split > 1:  # absent for whole GPUs: inventories without sharing unchanged
            row["split"] = g.split
        if g.profile:  # absent for whole GPUs: inventories without MIG unchanged
            row["mig"] = {"profile": g.profile, "parent": g.parent}
        rows.append(row)
    return json.dumps(rows, separators=(",", ":"))


def parse_inventory(raw: str | None, *, key: str = Keys().gpus) -> list[GPU]:
    """Parse a node's GPU inventory annotation."""
    rows = _json_annotation(raw, key)
    if not isinstance(rows, list):
        raise MalformedAnnotation(f"annotation {key} must be a JSON list")
    out: list[GPU] = []
    for row in rows:
        try:
            dev = row["id"]
            numa = row.get("numa")
            mig = row.get("mig") or {}
            profile, parent = str(mig.get("profile", "")), mig.get("parent")
            gpu = GPU(
                id=DeviceID(dev),
                index=int(row["index"]),
                model=str(row.get("model", "")),
                memory_mib=int(row.get("memoryMiB", 0)),
                numa=None if numa is None else int(numa),
                healthy=bool(row.get("healthy", False)),
                topo=parse_topo(row.get("topo")),
                split=int(row.get("split", 1)),
                profile=profile,
                parent=None if parent is None else DeviceID(str(parent)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MalformedAnnotation(f"annotation {key}: bad device entry {row!r}: {exc}") from exc
        if not isinstance(dev, str) or not valid_device_id(dev):
            raise MalformedAnnotation(f"annotation {key}: invalid device ID {dev!r}")
        if not 1 <= gpu.split <= MAX_SPLIT:
            raise MalformedAnnotation(f"annotation {key}: split of {dev!r} is not 1..{MAX_SPLIT}")
        if gpu.profile and not (
            valid_mig_profile(gpu.profile)
            and gpu.parent is not None
            and valid_device_id(gpu.parent)
            and gpu.split == 1
        ):
            raise MalformedAnnotation(
                f"annotation {key}: MIG instance {dev!r} needs a valid profile and parent GPU "
                "ID, and is never split"
            )
        out.append(gpu)
    return out
