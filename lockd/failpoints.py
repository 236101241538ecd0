"""Named crash points for fault-injection tests, off unless ``NODELOCK_FAILPOINTS`` names them.

``hit("bind.after-acquire")`` ends the process at once (``os._exit``, no cleanup, like a
SIGKILL) when the environment variable ``NODELOCK_FAILPOINTS`` lists that name (comma
separated).  The end-to-end tests use it to crash a component at the exact step whose crash
threatens an invariant.  With the variable unset — always, in production — ``hit`` is a dictionary
lookup and does nothing.
"""

from __future__ import annotations

import os
import sys

EXIT_CODE = 86
_ACTIVE = frozenset(
    name.strip() for name in os.environ.get("NODELOCK_FAILPOINTS", "").split(",") if name.strip()
)


def hit(name: str) -> None:
    """Crash here if the failpoint ``name`` is active."""
    if name in _ACTIVE:
        print(f"nodelock failpoint {name}: exiting now", file=sys.stderr, flush=True)
        os._exit(EXIT_CODE)
