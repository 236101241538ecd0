"""The ``nodelock`` command: one entry point, each part registers its own subcommands.

Each part's ``cli`` module exposes ``register(subparsers)``, which adds its commands and sets
``func`` to a callable taking the parsed arguments and returning an exit code.  Errors a person
can act on are printed as one line (``nodelock: …``) with exit code 2, never as a traceback.

What this module adds to every subcommand, over the whole argparse tree:

- ``--version`` (also ``nodelock <subcommand> --version``): the package version and git commit.
- Every flag can be set by an environment variable ``NODELOCK_<FLAG>`` (``--lock-namespace`` ->
  ``NODELOCK_LOCK_NAMESPACE``; an on/off flag takes ``true``/``false``, ``1``/``0``,
  ``yes``/``no``, ``on``/``off``).  The command line beats the environment, which beats the
  default.  A bad value is a one-line error naming the variable — only when the command being
  run has that flag.  Not settable this way: ``--help``, ``--version`` and ``--yes`` (a
  confirmation is given per command, never left lying in a shell's environment).
- A command with ``--log-level`` also gets ``--log-format text|json``; both are validated and
  logging is configured (``kube.process.configure_logging``) before the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

from devcluster import cli as devcluster_cli
from deviceplugin import cli as deviceplugin_cli
from kube.build import build_info
from kube.process import LOG_LEVELS, LogConfigError, LogFormat, configure_logging
from nodelock import audit, demo
from nodelock import locks as locks_cli
from scheduler_ext import cli as extender_cli

ENV_PREFIX = "NODELOCK_"
NOT_FROM_ENVIRONMENT = frozenset({"help", "version", "yes"})  # argparse ``dest`` names
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
PRECEDENCE = (
    "Every flag can also be set by an environment variable NODELOCK_<FLAG> (e.g. "
    "--lock-namespace: NODELOCK_LOCK_NAMESPACE; on/off flags take true or false). "
    "The command line beats the environment, which beats the default."
)


class EnvironmentValueError(ValueError):
    """An environment variable holds a value its flag cannot take."""

    user_facing = True


class _BadEnvironmentValue:
    """Stands in as a flag's default when its variable holds a bad value; reported only if the
    parsed command ends up with it (the flag belongs to the command and was not given)."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:  # shown as the default in --help
        return "<invalid in environment>"


class _VersionAction(argparse.Action):
    """``--version``: print the build (computed only when asked) and exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> NoReturn:
        print(build_info().describe())
        parser.exit(0)


def environment_name(action: argparse.Action) -> str:
    """``NODELOCK_<FLAG>`` for the action's first long option (``--lock-aware`` for the pair
    ``--lock-aware``/``--no-lock-aware``)."""
    long = next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])
    return ENV_PREFIX + long.lstrip("-").upper().replace("-", "_")


def _is_switch(action: argparse.Action) -> bool:
    return action.nargs == 0 and isinstance(
        action,
        argparse._StoreTrueAction
        | argparse._StoreFalseAction
        | argparse._StoreConstAction
        | argparse.BooleanOptionalAction,
    )


def value_from_environment(action: argparse.Action, name: str, raw: str) -> object:
    """What ``raw`` (the value of variable ``name``) means for ``action``, converted as argparse
    would convert it on the command line; ``EnvironmentValueError`` when it cannot be."""
    flag = "/".join(action.option_strings)

    def bad(why: str) -> EnvironmentValueError:
        return EnvironmentValueError(f"{name}={raw!r}: {why} (for {flag})")

    if _is_switch(action):
        word = raw.strip().lower()
        if word in TRUE_WORDS:
            on = True
        elif word in FALSE_WORDS:
            on = False
        else:
            raise bad("not an on/off value; use true or false")
        if isinstance(action, argparse._StoreFalseAction):
            return not on
        if isinstance(action, argparse._StoreConstAction) and not isinstance(
            action, argparse._StoreTrueAction
        ):
            return action.const if on else action.default
        return on
    if isinstance(action, argparse._CountAction):
        try:
            return int(raw)
        except ValueError:
            raise bad("not a whole number") from None
    several = (
        isinstance(action, argparse._AppendAction)
        or action.nargs in ("*", "+")
        or (isinstance(action.nargs, int) and action.nargs > 1)
    )
    words = [w.strip() for w in raw.split(",") if w.strip()] if several else [raw]
    convert: Callable[[str], object] = action.type if callable(action.type) else str
    values = []
    for word in words:
        try:
            value = convert(word)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            raise bad(str(exc) or "not a valid value") from None
        if action.choices is not None and value not in action.choices:
            raise bad(f"use one of {', '.join(map(str, action.choices))}")
        values.append(value)
    return values if several else values[0]


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser below it, each once (aliases share one)."""
    seen: set[int] = set()
    todo = [parser]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())


def _options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if (
            action.option_strings
            and action.dest not in NOT_FROM_ENVIRONMENT
            and not isinstance(action, argparse._HelpAction | _VersionAction)
        ):
            yield action


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """``--version`` on every parser; ``--log-format`` (validated with ``--log-level`` when the
    command runs) beside every ``--log-level``; the precedence of flags over the environment in
    every ``--help``."""
    for each in _parsers(parser):
        each.add_argument(
            "--version", action=_VersionAction, help="print the version and git commit, and exit"
        )
        options = {o for action in each._actions for o in action.option_strings}
        if "--log-level" in options:
            level = next(a for a in each._actions if "--log-level" in a.option_strings)
            level.help = f"logging level: {', '.join(LOG_LEVELS)} (default {level.default})"
            if "--log-format" not in options:
                each.add_argument(
                    "--log-format",
                    default=LogFormat.TEXT.value,
                    help="log lines as text, or json: one object per line "
                    "(time, level, logger, message) (default text)",
                )
        each.epilog = f"{each.epilog}\n\n{PRECEDENCE}" if each.epilog else PRECEDENCE


def apply_environment(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Make each flag's ``NODELOCK_<FLAG>`` variable its default (so the command line still
    wins), and name the variable in the flag's help.  A flag whose default is ``SUPPRESS`` (a
    subcommand repeating its parent's flag) is left alone: the parent's default applies."""
    for each in _parsers(parser):
        for action in _options(each):
            if action.default is argparse.SUPPRESS:
                continue
            name = environment_name(action)
            if action.help is not argparse.SUPPRESS:
                action.help = f"{action.help or ''} [env {name}]".strip()
            if name not in environ:
                continue
            try:
                action.default = value_from_environment(action, name, environ[name])
            except EnvironmentValueError as exc:
                action.default = _BadEnvironmentValue(str(exc))
            action.required = False


def build_parser(
    environ: Mapping[str, str] | None = None, *, prog: str = "nodelock"
) -> argparse.ArgumentParser:
    """The whole command tree; flags default to their ``NODELOCK_<FLAG>`` variables from
    ``environ`` (the process environment unless given)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Node locks between a GPU scheduler extender and a kubelet device plugin.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    devcluster_cli.register(sub)
    locks_cli.register(sub)
    extender_cli.register(sub)
    deviceplugin_cli.register(sub)
    demo.register(sub)
    audit.register(sub)
    add_common_flags(parser)
    apply_environment(parser, os.environ if environ is None else environ)
    return parser


def check_environment_values(args: argparse.Namespace) -> None:
    """Raise ``EnvironmentValueError`` for a bad variable the parsed command actually uses."""
    for value in vars(args).values():
        if isinstance(value, _BadEnvironmentValue):
            raise EnvironmentValueError(value.message)


def set_up_logging(args: argparse.Namespace) -> None:
    """For a command with ``--log-level``: validate it and ``--log-format``, configure logging."""
    if hasattr(args, "log_level"):
        configure_logging(args.log_level, log_format=getattr(args, "log_format", None))


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl-nodelock``: the same commands as a kubectl plugin (``kubectl nodelock locks -o
    json``); kubectl finds the executable on $PATH and passes the words after ``nodelock``."""
    return main(argv, prog="kubectl nodelock")


def main(argv: Sequence[str] | None = None, *, prog: str = "nodelock") -> int:
    parser = build_parser(prog=prog)
    args = parser.parse_args(argv)
    try:
        check_environment_values(args)
        set_up_logging(args)
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a known, explained error: one line, no traceback
        if getattr(exc, "user_facing", False) or isinstance(exc, LogConfigError):
            print(f"nodelock: {exc}", file=sys.stderr)
            return 2
        raise
    return code


if __name__ == "__main__":
    sys.exit(main())
