"""A planted bug for the fault campaign's own test (``python -m bench.soak --plant
no-pending-guard``), never loaded otherwise: Python imports this ``sitecustomize`` at start only
in the extender replicas the campaign starts with this folder on ``PYTHONPATH``.

It removes the takeover guard for a holder Pending on the lock's node (``scheduler_ext.takeover``
forbids taking an expired lock from a holder kubelet may still admit): such a holder's expired
lock is taken over like any other.
"""

from __future__ import annotations

import sys
from typing import Any

import scheduler_ext.takeover as takeover
from handoff.holder import HolderState

_guarded = takeover.judge


def _judge_without_the_guard(pod: Any, **kwargs: Any) -> takeover.Judgement:
    verdict = _guarded(pod, **kwargs)
    if verdict.allowed is False and verdict.state is HolderState.IN_HANDOFF:
        return takeover.Judgement(True, verdict.state, "planted bug: the guard is off")
    return verdict


takeover.judge = _judge_without_the_guard
print("nodelock soak: planted bug loaded: no takeover guard for a Pending holder", file=sys.stderr)
