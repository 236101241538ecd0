"""The ``nodelock`` command: one entry point, each part registers its own subcommands.

Each part's ``cli`` module exposes ``register(subparsers)``, which adds its commands and sets
``func`` to a callable taking the parsed arguments and returning an exit code.  Errors a person
can act on are printed as one line (``nodelock: …``) with exit code 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from devcluster import cli as devcluster_cli
from deviceplugin import cli as deviceplugin_cli
from lockd import cli as lockd_cli
from nodelock import demo
from scheduler_ext import cli as extender_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nodelock",
        description="Node locks between a GPU scheduler extender and a kubelet device plugin.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    devcluster_cli.register(sub)
    lockd_cli.register(sub)
    extender_cli.register(sub)
    deviceplugin_cli.register(sub)
    demo.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a known, explained error: one line, no traceback
        if getattr(exc, "user_facing", False):
            print(f"nodelock: {exc}", file=sys.stderr)
            return 2
        raise
    return code


if __name__ == "__main__":
    sys.exit(main())
