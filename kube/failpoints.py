"""Named fault points for fault-injection tests, off unless ``NODELOCK_FAILPOINTS`` names them.

``NODELOCK_FAILPOINTS`` is a comma-separated list of ``name`` or ``name=action``:

- ``exit`` (the default): ``hit(name)`` ends the process at once (``os._exit``, no cleanup, like
  a SIGKILL);
- ``sleep:SECONDS``: ``await pause(name)`` waits that long (a slow step, e.g. a kubelet
  admission that takes a while).

The end-to-end tests use them to crash or stall a component at the exact step that threatens an
invariant.  With the variable unset — always, in production — both are a dictionary lookup and
do nothing.
"""

from __future__ import annotations

import asyncio
import os
import sys

EXIT_CODE = 86


def _parse(raw: str) -> dict[str, str]:
    points: dict[str, str] = {}
    for item in raw.split(","):
        name, _, action = item.strip().partition("=")
        if name:
            points[name] = action or "exit"
    return points


_ACTIVE = _parse(os.environ.get("NODELOCK_FAILPOINTS", ""))


def hit(name: str) -> None:
    """Crash here if the failpoint ``name`` is active with the ``exit`` action."""
    if _ACTIVE.get(name) == "exit":
        print(f"nodelock failpoint {name}: exiting now", file=sys.stderr, flush=True)
        os._exit(EXIT_CODE)


async def pause(name: str) -> None:
    """Wait here if the failpoint ``name`` is active with a ``sleep:SECONDS`` action."""
    action = _ACTIVE.get(name, "")
    if action.startswith("sleep:"):
        seconds = float(action.removeprefix("sleep:"))
        print(f"nodelock failpoint {name}: sleeping {seconds}s", file=sys.stderr, flush=True)
        await asyncio.sleep(seconds)
