"""``make model``: the deep profile, or the search for one known hole with its shortest trace.

    python -m tests.model [--examples N] [--seed S] [--steps K]
    python -m tests.model --hole cancel-after-write [--examples N] [--quick]   (as in CI)
    python -m tests.model --hole late-binding --planted [--examples N] [--quick]

The deep run ends with one line: ``model: N examples, F failures, seed S, ...``; a failure
prints the shrunk (shortest) interleaving as a trace first and exits 1.

A hole's search ends with one line: ``hole NAME: found (INVARIANT) after N examples ...``
(exit 0) or ``hole NAME: not found in N examples`` (exit 3, ``NOT_FOUND``); any other exit
status is a crash of the search itself.  ``--planted`` reverts the hole's fix for the search
(``holes.PLANTS``).
"""

from __future__ import annotations

import argparse
import sys
import time

from hypothesis import seed
from hypothesis.stateful import run_state_machine_as_test

from tests.model.holes import KNOWN_HOLES, PLANTS, Hole
from tests.model.machine import ModelConfig, Violation, machine
from tests.model.profiles import (
    DEEP_EXAMPLES,
    DEEP_STEPS,
    DEFAULT_SEED,
    ci_settings,
    deep_settings,
)
from tests.model.search import SEARCH_SEEDS, find


def deep(examples: int, steps: int, chosen_seed: int) -> int:
    cls = machine(ModelConfig(), "HandoffModelDeep")
    seed(chosen_seed)(cls)
    started = time.monotonic()
    failures = 0
    try:
        run_state_machine_as_test(cls, settings=deep_settings(max_examples=examples, steps=steps))
    except Violation as err:
        failures = 1
        print(err)
    took = time.monotonic() - started
    avoided = ",".join(sorted(h.value for h in KNOWN_HOLES)) or "none"
    print(
        f"model: {cls.stats.runs} examples, {failures} failures, seed {chosen_seed}, "
        f"{cls.stats.steps} steps, {took:.0f}s, known holes avoided: {avoided}"
    )
    return failures


NOT_FOUND = 3  # a hole search's exit status when it found nothing (1 and 2: Python's own)


def hole(name: str, examples: int, *, quick: bool, planted: bool = False) -> int:
    """Search one hole from its seed, then (unless ``quick``) shrink it to the shortest trace."""
    finding = find(
        Hole(name),
        ci_settings(max_examples=examples, shrink=not quick),
        stop_after_first=quick,
        planted=planted,
    )
    label = f"hole {name}{' (planted)' if planted else ''}"
    if finding.violation is None:
        print(f"{label}: not found in {finding.runs} examples")
        return NOT_FOUND
    print(finding.violation)
    print(
        f"{label}: found ({finding.violation.invariant}) after {finding.first_run} examples "
        f"(seed {SEARCH_SEEDS[Hole(name)]}); shortest trace above"
    )
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.model", description=__doc__)
    parser.add_argument("--examples", type=int, default=DEEP_EXAMPLES)
    parser.add_argument("--steps", type=int, default=DEEP_STEPS)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--hole", choices=[h.value for h in Hole])
    parser.add_argument(
        "--quick", action="store_true", help="with --hole: stop at the first violation, no shrink"
    )
    parser.add_argument(
        "--planted",
        action="store_true",
        help=f"with --hole: revert the hole's fix for the search ({', '.join(sorted(PLANTS))})",
    )
    args = parser.parse_args(argv)
    if args.planted and (not args.hole or Hole(args.hole) not in PLANTS):
        parser.error(f"--planted needs --hole with one of: {', '.join(sorted(PLANTS))}")
    if args.hole:
        return hole(args.hole, args.examples, quick=args.quick, planted=args.planted)
    return 1 if deep(args.examples, args.steps, args.seed) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
