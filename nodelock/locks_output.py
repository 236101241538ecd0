"""Machine-readable output of ``nodelock locks`` (``-o json`` / ``-o yaml``), kubectl style.

Guarantees: the output is one document, ``{"apiVersion": "v1", "kind": "List", "items": [...]}``
with one item per node lock (``show``: the item alone), keys in a fixed order, and nothing else
on stdout, so ``kubectl nodelock locks -o json | jq`` works.  Every item has ``node``, ``lease``
(namespace, name, resourceVersion), ``token``, ``holder`` (``null`` when free, else ``pod``,
``uid`` and ``state``), ``acquireTime``, ``renewTime``, ``durationSeconds``, ``ageSeconds``
(``null`` when unknown), ``expired`` (as the table says it), ``expiredJudgedBy`` (``timestamps``
or ``observation``), ``state`` (the table's STATE text) and ``last`` (the previous handoff, or
``null``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

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
