"""Named fault points for fault-injection tests, off unless ``NODELOCK_FAILPOINTS`` names them.

``NODELOCK_FAILPOINTS`` is a comma-separated list of ``name`` or ``name=action``:

- ``exit`` (the default): ``hit(name)`` ends the process at once (``os._exit``, no cleanup, like
  a SIGKILL);
- ``sleep:SECONDS``: ``await pause(name)`` waits that long (a slow step, e.g. a kubelet
  admission that takes a while).

Every failpoint is declared in ``KNOWN`` with the one action its call site can take.  The
variable is parsed when this module is imported: a name that is not declared, an action the point
cannot take, or a malformed sleep raises ``BadFailpoint`` there, so a misspelt failpoint stops
the process at its start instead of silently doing nothing.  ``hit`` and ``pause`` refuse a name
that is not declared, or declared for the other call.

When a failpoint fires it logs one line to stderr (``LINE``), which the end-to-end tests wait for
as proof that the fault happened.  With the variable unset — always, in production — both calls
are a dictionary lookup and do nothing.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from enum import StrEnum

EXIT_CODE = 86
ENV = "NODELOCK_FAILPOINTS"


class Action(StrEnum):
    """What a failpoint's call site can do."""

    EXIT = "exit"  # ``hit``: end the process
    SLEEP = "sleep"  # ``await pause``: wait ``sleep:SECONDS``


KNOWN: Mapping[str, Action] = {
    # scheduler_ext/binder.py: the lock taken, the pod not bound yet
    "bind.after-acquire": Action.EXIT,
    # scheduler_ext/binder.py: bound, kube-scheduler never hears so
    "bind.after-binding": Action.EXIT,
    # deviceplugin/admission.py: Allocate starts (a slow admission)
    "allocate.start": Action.SLEEP,
    # deviceplugin/admission.py: the answer recorded in the checkpoint, never sent
    "allocate.after-checkpoint": Action.EXIT,
    # deviceplugin/endpoint.py: a Register is about to be sent (a plugin slower to register
    # again than a restarted kubelet is to admit the pods already bound to it)
    "register.start": Action.SLEEP,
}

LINE = "nodelock failpoint {name}: "  # the start of the line a failpoint logs when it fires


class BadFailpoint(ValueError):
    """``NODELOCK_FAILPOINTS`` names an undeclared failpoint or an action it cannot take."""


def parse(raw: str) -> dict[str, str]:
    """Failpoint name -> action (``exit`` or ``sleep:SECONDS``); raises ``BadFailpoint``."""
    points: dict[str, str] = {}
    for item in raw.split(","):
        name, _, action = item.strip().partition("=")
        name, action = name.strip(), action.strip()
        if not name:
            continue
        kind = KNOWN.get(name)
        if kind is None:
            raise BadFailpoint(
                f"{ENV}: unknown failpoint {name!r}; known: {', '.join(sorted(KNOWN))}"
            )
        action = action or Action.EXIT.value
        if kind is Action.EXIT and action != Action.EXIT.value:
            raise BadFailpoint(f"{ENV}: failpoint {name!r} can only exit, not {action!r}")
        if kind is Action.SLEEP:
            seconds = action.removeprefix("sleep:")
            try:
                ok = action.startswith("sleep:") and float(seconds) >= 0
            except ValueError:
                ok = False
            if not ok:
                raise BadFailpoint(
                    f"{ENV}: failpoint {name!r} takes sleep:SECONDS (seconds >= 0), not {action!r}"
                )
        points[name] = action
    return points


_ACTIVE = parse(os.environ.get(ENV, ""))


def _declared(name: str, kind: Action) -> None:
    if KNOWN.get(name) is not kind:
        raise BadFailpoint(f"failpoint {name!r} is not declared in KNOWN as {kind.value}")


def hit(name: str) -> None:
    """Crash here if the failpoint ``name`` is active (its action is ``exit``)."""
    _declared(name, Action.EXIT)
    if _ACTIVE.get(name) == Action.EXIT.value:
        print(f"{LINE.format(name=name)}exiting now", file=sys.stderr, flush=True)
        os._exit(EXIT_CODE)


async def pause(name: str) -> None:
    """Wait here if the failpoint ``name`` is active with a ``sleep:SECONDS`` action."""
    _declared(name, Action.SLEEP)
    action = _ACTIVE.get(name, "")
    if action.startswith("sleep:"):
        seconds = float(action.removeprefix("sleep:"))
        print(f"{LINE.format(name=name)}sleeping {seconds}s", file=sys.stderr, flush=True)
        await asyncio.sleep(seconds)
