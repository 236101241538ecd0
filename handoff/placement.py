"""A pod's placement wishes, read from its annotations (pure).

| annotation (default prefix) | alias (HAMi) | value |
| --- | --- | --- |
| ``nodelock.io/topology`` | | ``required``, ``preferred`` (default) or ``none`` |
| ``nodelock.io/policy`` | | ``binpack`` or ``spread`` (default: the extender's ``--policy``) |
| ``nodelock.io/gpu-model`` | ``nvidia.com/use-gputype`` | comma list of models to use |
| ``nodelock.io/gpu-model-exclude`` | ``nvidia.com/nouse-gputype`` | comma list of models to avoid |
| ``nodelock.io/gpu-uuid`` | ``nvidia.com/use-gpuuuid`` | comma list of GPU UUIDs to use |
| ``nodelock.io/gpu-uuid-exclude`` | ``nvidia.com/nouse-gpuuuid`` | comma list of UUIDs to avoid |

A nodelock annotation wins over its alias when both are set.  A model entry matches a device
whose inventory model equals it or contains it, ignoring case (``H100`` matches ``NVIDIA H100
80GB HBM3``, as HAMi matches types); a UUID entry matches the device ID exactly.

Guarantee: ``parse_wishes`` raises ``ValueError`` naming the annotation for every value it does
not accept; an empty list (``""``, ``" , "``) is an error, not "anything".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from handoff.wire import Keys

HAMI_USE_TYPE = "nvidia.com/use-gputype"
HAMI_NOUSE_TYPE = "nvidia.com/nouse-gputype"
HAMI_USE_UUID = "nvidia.com/use-gpuuuid"
HAMI_NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
MAX_ENTRIES = 64
POLICIES = ("binpack", "spread")


class TopologyWish(StrEnum):
    """How much a pod cares about how its GPUs are connected."""

    REQUIRED = "required"  # a node fits only with a set of the best class the node's layout has
    PREFERRED = "preferred"  # best-connected free set, but any set will do
    NONE = "none"  # lowest-index free devices (NUMA alignment kubelet enforces still applies)


@dataclass(frozen=True, slots=True)
class Wishes:
    """What a pod asks of its GPUs beyond their count."""

    topology: TopologyWish = TopologyWish.PREFERRED
    policy: str | None = None  # "binpack" | "spread"; None: the extender's
    models: tuple[str, ...] = ()  # empty: any model
    exclude_models: tuple[str, ...] = ()
    uuids: frozenset[str] = frozenset()  # empty: any device
    exclude_uuids: frozenset[str] = frozenset()

    @property
    def selects(self) -> bool:
        """Whether the pod restricts which devices it may get."""
        return bool(self.models or self.exclude_models or self.uuids or self.exclude_uuids)

    @property
    def names_devices(self) -> bool:
        """Whether the wishes name device IDs (then nodes cannot be judged by shape alone)."""
        return bool(self.uuids or self.exclude_uuids)

    def allows(self, device_id: str, model: str) -> bool:
        """Whether a device with this ID and model may be given to the pod."""
        if self.uuids and device_id not in self.uuids:
            return False
        if device_id in self.exclude_uuids:
            return False
        m = model.lower()
        if self.models and not any(x.lower() in m for x in self.models):
            return False
        return not any(x.lower() in m for x in self.exclude_models)

    def describe(self) -> str:
        """The selection in words, for filter reasons ("" when nothing is selected)."""
        parts = []
        if self.models:
            parts.append(f"model {'|'.join(self.models)}")
        if self.exclude_models:
            parts.append(f"not model {'|'.join(self.exclude_models)}")
        if self.uuids:
            parts.append(f"UUID {'|'.join(sorted(self.uuids))}")
        if self.exclude_uuids:
            parts.append(f"not UUID {'|'.join(sorted(self.exclude_uuids))}")
        return ", ".join(parts)


NO_WISHES = Wishes()


def parse_wishes(annotations: Mapping[str, object], keys: Keys) -> Wishes:
    """The pod's wishes from its annotations (see the module docstring)."""

    def get(key: str, alias: str | None = None) -> tuple[str, str] | None:
        for k in (key, alias):
            if k is not None and k in annotations:
                value = annotations[k]
                if not isinstance(value, str):
                    raise ValueError(f"annotation {k} must be a string")
                return k, value
        return None

    topology = TopologyWish.PREFERRED
    if (found := get(keys.topology)) is not None:
        k, v = found
        try:
            topology = TopologyWish(v.strip().lower())
        except ValueError:
            raise ValueError(
                f"annotation {k}: {v!r} is not one of {', '.join(w.value for w in TopologyWish)}"
            ) from None
    policy: str | None = None
    if (found := get(keys.policy)) is not None:
        k, v = found
        policy = v.strip().lower()
        if policy not in POLICIES:
            raise ValueError(f"annotation {k}: {v!r} is not one of {', '.join(POLICIES)}")
    return Wishes(
        topology=topology,
        policy=policy,
        models=_list(get(keys.gpu_model, HAMI_USE_TYPE)),
        exclude_models=_list(get(keys.gpu_model_exclude, HAMI_NOUSE_TYPE)),
        uuids=frozenset(_list(get(keys.gpu_uuid, HAMI_USE_UUID))),
        exclude_uuids=frozenset(_list(get(keys.gpu_uuid_exclude, HAMI_NOUSE_UUID))),
    )


def _list(found: tuple[str, str] | None) -> tuple[str, ...]:
    if found is None:
        return ()
    key, value = found
    items = tuple(dict.fromkeys(x.strip() for x in value.split(",") if x.strip()))
    if not items:
        raise ValueError(f"annotation {key} must list at least one entry (comma-separated)")
    if len(items) > MAX_ENTRIES:
        raise ValueError(f"annotation {key} lists more than {MAX_ENTRIES} entries")
    return items
