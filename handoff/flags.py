"""The command-line flags that say where the handoff's facts live: the node locks' namespace and
the annotation prefix.

Every component of one install (the extender, the device plugin, the operator's lock commands)
must be given the same values, so the flags are declared once, here, with the defaults of
``handoff.wire``.
"""

from __future__ import annotations

import argparse

from handoff.wire import DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX


def add_flags(parser: argparse.ArgumentParser, *, suppress_defaults: bool = False) -> None:
    """Add ``--lock-namespace`` and ``--annotation-prefix`` (``args.lock_namespace`` and
    ``args.annotation_prefix``).  With ``suppress_defaults`` a flag that is not given sets
    nothing, so that a subcommand keeps the value its parent parser read."""
    parser.add_argument(
        "--lock-namespace",
        default=argparse.SUPPRESS if suppress_defaults else DEFAULT_LOCK_NAMESPACE,
        help=f"namespace of the node lock Leases (default {DEFAULT_LOCK_NAMESPACE})",
    )
    parser.add_argument(
        "--annotation-prefix",
        default=argparse.SUPPRESS if suppress_defaults else DEFAULT_PREFIX,
        help=f"prefix of nodelock's annotations (default {DEFAULT_PREFIX})",
    )
