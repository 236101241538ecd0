"""``make model``: the deep profile, or the search for one known hole with its shortest trace.

    python -m tests.model [--examples N] [--seed S] [--steps K]
    python -m tests.model --hole cancel-after-write [--examples N] [--quick]   (as in CI)

The deep run ends with one line: ``model: N examples, F failures, seed S, ...``; a failure
prints the shrunk (shortest) interleaving as a trace first and exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time

from hypothesis import seed
from hypothesis.stateful import run_state_machine_as_test

from tests.model.holes import KNOWN_HOLES, Hole
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


def hole(name: str, examples: int, *, quick: bool) -> int:
    """Search one hole from its seed, then (unless ``quick``) shrink it to the shortest trace."""
    finding = find(
        Hole(name),
        ci_settings(max_examples=examples, shrink=not quick),
        stop_after_first=quick,
    )
    if finding.violation is None:
        print(f"hole {name}: not found in {finding.runs} examples")
        return 1
    print(finding.violation)
    print(
        f"hole {name}: found ({finding.violation.invariant}) after {finding.first_run} examples "
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
    args = parser.parse_args(argv)
    if args.hole:
        return hole(args.hole, args.examples, quick=args.quick)
    return 1 if deep(args.examples, args.steps, args.seed) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
