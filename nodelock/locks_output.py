"""Machine-readable output of ``nodelock locks`` (``-o json`` / ``-o yaml``), kubectl style.

Guarantees: the output is one document, ``{"apiVersion": "v1", "kind": "List", "items": [...]}``
with one item per node lock (``show``: the item alone), keys in a fixed order, and nothing else
on stdout, so ``kubectl nodelock locks -o json | jq`` works.  Every item has ``node``, ``lease``
(namespace, name, resourceVersion), ``token``, ``holder`` (``null`` when free, else ``pod``,
``uid`` and ``state``), ``acquireTime``, ``renewTime``, ``durationSeconds``, ``ageSeconds``
(``null`` when unknown), ``expired`` (as the table says it), ``expiredJudgedBy`` (``timestamps``
or ``observation``), ``state`` (the table's STATE text) and ``last`` (the previous handoff, or
``null``).  ``show`` of a node that shares its GPUs (``--gpu-split`` > 1) adds ``gpus``: per GPU
its ``gpu`` UUID, ``memoryMiB``, ``split``, committed ``memoryCommittedMiB``/``coresCommitted``,
``slices`` and ``holders`` (``pod``, ``memoryMiB``, ``cores``, ``whole``), from the assignments
and requests of the pods bound to the node (``handoff.sharing.bound_slices``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

from handoff.sharing import Held, node_use
from handoff.wire import GPU
from lockd.model import LockRecord

OUTPUT_FORMATS = ("table", "json", "yaml")


def lock_item(
    record: LockRecord,
    *,
    namespace: str,
    holder_state: str | None,
    age_s: float | None,
    expired: str,
    observed: bool,
    state: str,
) -> dict[str, Any]:
    """One node lock as a plain object (pure)."""
    holder = None
    if record.holder is not None:
        holder = {"pod": record.holder.key, "uid": record.holder.uid, "state": holder_state}
    last = None
    if record.last is not None:
        last = {
            "pod": record.last.holder,
            "uid": record.last.uid,
            "token": record.last.token,
            "outcome": record.last.outcome,
        }
    return {
        "node": record.node,
        "lease": {
            "namespace": namespace,
            "name": record.node,
            "resourceVersion": record.resource_version,
        },
        "token": record.token,
        "holder": holder,
        "acquireTime": record.acquire_time,
        "renewTime": record.renew_time,
        "durationSeconds": record.duration_s,
        "ageSeconds": None if age_s is None else round(age_s, 3),
        "expired": expired,
        "expiredJudgedBy": "observation" if observed else "timestamps",
        "state": state,
        "last": last,
    }


def render_items(items: Sequence[dict[str, Any]], output: str, *, single: bool = False) -> str:
    """``items`` as one JSON or YAML document: a ``List``, or the item alone with ``single``."""
    doc: Any = items[0] if single else {"apiVersion": "v1", "kind": "List", "items": list(items)}
    if output == "json":
        return json.dumps(doc, indent=2)
    if output == "yaml":
        return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False).rstrip("\n")
    raise ValueError(f"output format {output!r} is not one of {', '.join(OUTPUT_FORMATS)}")


def gpu_slices(devices: Sequence[GPU], held: Sequence[Held]) -> list[dict[str, Any]]:
    """Per GPU of ``devices`` (inventory order) what it holds and who holds it (pure)."""
    use = node_use(devices, held)
    out: list[dict[str, Any]] = []
    for g in devices:
        u = use[g.id]
        holders = [
            {
                "pod": h.pod,
                "memoryMiB": h.claim.memory_on(g),
                "cores": h.claim.cores_claimed,
                "whole": h.claim.exclusive,
            }
            for h in held
            if h.gpu == g.id
        ]
        out.append(
            {
                "gpu": g.id,
                "memoryMiB": g.memory_mib,
                "split": g.split,
                "memoryCommittedMiB": u.memory_mib,
                "coresCommitted": u.cores,
                "slices": u.slices,
                "holders": holders,
            }
        )
    return out


def gpu_slices_text(gpus: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """``gpu_slices`` as ``describe`` fields: one per GPU, then one per holder (pure)."""
    fields: list[tuple[str, str]] = []
    for g in gpus:
        fields.append(
            (
                f"gpu {g['gpu']}",
                f"{g['memoryCommittedMiB']}/{g['memoryMiB']} MiB, {g['coresCommitted']}/100% "
                f"cores, {g['slices']}/{g['split']} slices",
            )
        )
        for h in g["holders"]:
            what = "whole GPU" if h["whole"] else f"{h['memoryMiB']} MiB, {h['cores']}% cores"
            fields.append((f"  slice {h['pod']}", what))
    return fields
