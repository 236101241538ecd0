"""The model's two profiles: CI (inside ``pytest -m unit``) and deep (``make model``).

Both are seeded and reproducible: CI derandomizes (the seed is derived from the test), deep
takes an explicit seed; neither reads or writes Hypothesis's example database.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

CI_EXAMPLES = 600
CI_STEPS = 40
DEEP_EXAMPLES = 10_000
DEEP_STEPS = 50
DEFAULT_SEED = 17


def ci_settings(*, max_examples: int = CI_EXAMPLES, shrink: bool = True) -> settings:
    """Derandomized, no database; shrinking only where a failure should be read."""
    phases = [Phase.explicit, Phase.generate, *([Phase.shrink] if shrink else [])]
    return settings(
        max_examples=max_examples,
        stateful_step_count=CI_STEPS,
        deadline=None,
        database=None,
        derandomize=True,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
    )


def deep_settings(*, max_examples: int = DEEP_EXAMPLES, steps: int = DEEP_STEPS) -> settings:
    """For ``make model``: many examples, longer runs, an explicit seed (``seed`` decorator)."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
