"""Every flag of every subcommand from ``NODELOCK_<FLAG>``: the command line beats the
environment, which beats the default; bad values are one line naming the variable."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nodelock.cli import (
    EnvironmentValueError,
    build_parser,
    check_environment_values,
    environment_name,
)


def parse(argv: list[str], environ: dict[str, str]) -> argparse.Namespace:
    args = build_parser(environ).parse_args(argv)
    check_environment_values(args)
    return args


def test_the_command_line_beats_the_environment_which_beats_the_default() -> None:
    assert parse(["extender"], {}).lock_namespace == "nodelock-system"
    env = {"NODELOCK_LOCK_NAMESPACE": "from-env"}
    assert parse(["extender"], env).lock_namespace == "from-env"
    assert parse(["extender", "--lock-namespace", "cli"], env).lock_namespace == "cli"


def test_values_are_converted_as_on_the_command_line() -> None:
    env = {
        "NODELOCK_LEASE_DURATION": "30",
        "NODELOCK_BIND_WAIT_BUDGET": "2.5",
        "NODELOCK_POLICY": "spread",
    }
    args = parse(["extender"], env)
    assert args.lease_duration == 30
    assert args.bind_wait_budget == 2.5
    assert args.policy == "spread"
    plugin = parse(["device-plugin", "--node-name", "n1"], {"NODELOCK_STATE_DIR": "/tmp/s"})
    assert plugin.state_dir == Path("/tmp/s")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("1", True), ("ON", True), ("false", False), ("no", False)],
)
def test_switches_take_on_off_words(value: str, expected: bool) -> None:
    assert parse(["demo"], {"NODELOCK_KEEP": value}).keep is expected  # store_true
    assert parse(["extender"], {"NODELOCK_LOCK_AWARE": value}).lock_aware is expected  # --no-…
    # the command line still wins over the environment, either way
    on, off = {"NODELOCK_LOCK_AWARE": "true"}, {"NODELOCK_LOCK_AWARE": "false"}
    assert parse(["extender", "--no-lock-aware"], on).lock_aware is False
    assert parse(["extender", "--lock-aware"], off).lock_aware is True


def test_nested_subcommands_take_their_parents_flags_from_the_environment() -> None:
    env = {"NODELOCK_LOCK_NAMESPACE": "env-ns"}
    assert parse(["locks", "show", "n1"], env).lock_namespace == "env-ns"
    # given on the parent's command line it still wins
    assert parse(["locks", "--lock-namespace", "cli", "show", "n1"], env).lock_namespace == "cli"
    assert parse(["locks", "show", "--lock-namespace", "cli", "n1"], env).lock_namespace == "cli"


@pytest.mark.parametrize(
    ("env", "argv", "says"),
    [
        ({"NODELOCK_POLICY": "fastest"}, ["extender"], "NODELOCK_POLICY='fastest': use one of"),
        ({"NODELOCK_LEASE_DURATION": "soon"}, ["extender"], "NODELOCK_LEASE_DURATION='soon'"),
        ({"NODELOCK_KEEP": "maybe"}, ["demo"], "not an on/off value"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    env: dict[str, str], argv: list[str], says: str
) -> None:
    with pytest.raises(EnvironmentValueError) as raised:
        parse(argv, env)
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)
    assert getattr(raised.value, "user_facing", False)


def test_a_bad_value_matters_only_to_commands_that_have_the_flag_unless_overridden() -> None:
    env = {"NODELOCK_POLICY": "fastest"}
    assert parse(["locks"], env).command == "locks"  # `locks` has no --policy
    assert parse(["extender", "--policy", "binpack"], env).policy == "binpack"


def test_confirmations_are_never_taken_from_the_environment() -> None:
    assert parse(["locks", "break", "n1"], {"NODELOCK_YES": "true"}).yes is False


def test_every_flag_names_its_variable_in_help() -> None:
    parser = build_parser({})
    seen = 0
    stack = [parser]
    while stack:
        current = stack.pop()
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            elif (
                action.option_strings
                and action.dest not in {"help", "yes", argparse.SUPPRESS}
                and action.default is not argparse.SUPPRESS
            ):
                seen += 1
                assert f"[env {environment_name(action)}]" in (action.help or ""), action
        assert "command line beats the environment" in (current.epilog or "")
    assert seen > 40


def test_variable_names_follow_the_long_flag() -> None:
    parser = build_parser({})
    extender = next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["extender"]
    names = {environment_name(a) for a in extender._actions if a.option_strings}
    assert {"NODELOCK_LOCK_NAMESPACE", "NODELOCK_LOCK_AWARE", "NODELOCK_LOG_FORMAT"} <= names
