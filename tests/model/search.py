"""Searching the model for one known hole: the focused configuration and the search itself.

A hole is searched with every *other* known hole avoided and only the kinds of fault that can
lead to it enabled (fewer rules make a short interleaving likelier); ``find`` runs Hypothesis
until the first violation and reports how many runs (examples) that took.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace

from hypothesis import seed, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.model.holes import KNOWN_HOLES, PLANTS, Hole
from tests.model.machine import Fault, ModelConfig, Violation, machine
from tests.model.node import Listing

ONE_NODE = (("n1", 2),)

FOCUS: dict[Hole, ModelConfig] = {
    Hole.BYPASS_POD: ModelConfig(
        fault_kinds=frozenset({Fault.BYPASS, Fault.WATCH_STALL}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("one",),
        prompt=frozenset({"E0", "E1"}),
    ),
    Hole.STALE_LEASE_VIEW: ModelConfig(
        fault_kinds=frozenset({Fault.ADMISSION_REJECT, Fault.WATCH_STALL}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("one",),
        max_pods=3,
        prompt=frozenset({"E0", "E1", "kubelet"}),
    ),
    Hole.LEASE_RESET: ModelConfig(
        fault_kinds=frozenset({Fault.LEASE_BY_HAND}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("one",),
    ),
    Hole.INIT_REUSE: ModelConfig(
        fault_kinds=frozenset(),
        nodes=ONE_NODE,
        templates=("init", "one"),
        prompt=frozenset({"E0", "E1", "kubelet", "plugin"}),
    ),
    Hole.CANCEL_AFTER_WRITE: ModelConfig(
        fault_kinds=frozenset({Fault.CANCEL}), swarm=False, nodes=ONE_NODE, templates=("one",)
    ),
    Hole.DOUBLE_BIND: ModelConfig(
        fault_kinds=frozenset({Fault.GIVE_UP, Fault.ANSWER_LOST}), swarm=False
    ),
    Hole.ORPHANED_LOCK: ModelConfig(
        fault_kinds=frozenset({Fault.ANSWER_LOST, Fault.CRASH, Fault.POD_DELETE}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("one", "two"),
        prompt=frozenset({"kubelet", "plugin"}),
    ),
    Hole.LATE_READ: ModelConfig(
        fault_kinds=frozenset({Fault.LATE_READ}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("one",),
        max_pods=3,
        prompt=frozenset({"kubelet"}),
    ),
    Hole.LATE_BINDING: ModelConfig(
        fault_kinds=frozenset(),
        nodes=ONE_NODE,
        templates=("one",),
        max_pods=3,
        prompt=frozenset({"E0", "E1", "kubelet", "plugin"}),
    ),
    Hole.REJECTED_MID_HANDOFF: ModelConfig(
        fault_kinds=frozenset({Fault.REJECT_AFTER_ALLOCATE}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("pair",),
        max_pods=3,
        prompt=frozenset({"E0", "E1", "kubelet", "plugin"}),
    ),
    Hole.LISTED_REJECTED_POD: ModelConfig(
        fault_kinds=frozenset({Fault.ADMISSION_REJECT, Fault.REJECT_AFTER_ALLOCATE}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("one", "pair"),
        max_pods=3,
        prompt=frozenset({"E0", "E1", "kubelet", "plugin"}),
        listings=(Listing.ALL_PODS,),
    ),
    Hole.SERVED_AFTER_CHECKPOINT_LOSS: ModelConfig(
        fault_kinds=frozenset({Fault.CHECKPOINT_LOST, Fault.PODRESOURCES_DOWN}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("one",),
        max_pods=3,
        prompt=frozenset({"E0", "E1", "kubelet", "plugin"}),
        # the hole on the API server's path too: a plugin without a PodResources socket
        socketless=frozenset({"n1"}),
    ),
    Hole.PROGRESS_AHEAD_OF_KUBELET: ModelConfig(
        fault_kinds=frozenset({Fault.CHECKPOINT_LOST, Fault.PODRESOURCES_DOWN}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("one", "pair"),
        max_pods=3,
        prompt=frozenset({"E0", "E1", "kubelet", "plugin"}),
    ),
    Hole.ABANDONED_BIND_WRITES: ModelConfig(
        fault_kinds=frozenset({Fault.GIVE_UP}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("one",),
        max_pods=3,
        prompt=frozenset({"kubelet", "plugin"}),
    ),
    Hole.HOLDER_SLICE: ModelConfig(
        fault_kinds=frozenset(),
        nodes=ONE_NODE,
        shared=frozenset({"n1"}),
        templates=("half",),
        max_pods=3,
        prompt=frozenset({"kubelet", "plugin"}),
    ),
    Hole.SLICE_CAPACITY: ModelConfig(
        fault_kinds=frozenset(),
        nodes=ONE_NODE,
        shared=frozenset({"n1"}),
        templates=("half", "large"),
        max_pods=3,
        prompt=frozenset({"E0", "E1", "kubelet", "plugin"}),
    ),
    Hole.ABANDONED_RETRY: ModelConfig(
        fault_kinds=frozenset({Fault.GIVE_UP}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("one",),
        max_pods=2,
        prompt=frozenset({"kubelet", "plugin"}),
    ),
    Hole.BINDING_PAST_DEADLINE: ModelConfig(
        fault_kinds=frozenset({Fault.SLOW_API}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("one",),
        max_pods=2,
        prompt=frozenset({"E0", "E1", "kubelet", "plugin"}),
    ),
    Hole.QUEUE_ORDER: ModelConfig(
        fault_kinds=frozenset(),
        nodes=ONE_NODE,
        templates=("one",),
        max_pods=3,
        prompt=frozenset({"kubelet", "plugin"}),
    ),
    Hole.MIG_RELEASE: ModelConfig(
        fault_kinds=frozenset(),
        nodes=ONE_NODE,
        templates=("mixed", "mig"),
        max_pods=3,
        prompt=frozenset({"E0", "E1", "kubelet", "plugin"}),
    ),
    Hole.MIG_PROGRESS_AHEAD: ModelConfig(
        fault_kinds=frozenset({Fault.CHECKPOINT_LOST}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("mixed",),
        max_pods=2,
        prompt=frozenset({"E0", "E1", "kubelet", "plugin"}),
    ),
    Hole.MIG_HOLDER: ModelConfig(
        fault_kinds=frozenset(),
        nodes=ONE_NODE,
        templates=("mig",),
        max_pods=3,
        prompt=frozenset({"kubelet", "plugin"}),
    ),
    Hole.SWEEP_IN_HANDOFF: ModelConfig(
        fault_kinds=frozenset({Fault.ADMISSION_REJECT, Fault.RELEASE_FAILS, Fault.POD_DELETE}),
        nodes=ONE_NODE,
        templates=("one",),
        max_pods=2,
        prompt=frozenset({"E0", "E1"}),
    ),
    Hole.SWEEP_BOUND_HERE: ModelConfig(
        fault_kinds=frozenset({Fault.ANSWER_LOST}),
        templates=("one",),
        max_pods=2,
        prompt=frozenset({"E0", "E1"}),
    ),
    Hole.ENDED_UNSEEN: ModelConfig(
        fault_kinds=frozenset({Fault.ADMISSION_REJECT, Fault.POD_DELETE}),
        nodes=ONE_NODE,
        templates=("one",),
        max_pods=2,
        prompt=frozenset({"kubelet"}),
        plugin_releases_ended=True,
    ),
    Hole.REJECTED_RELEASED_UNSERVED: ModelConfig(
        fault_kinds=frozenset({Fault.ADMISSION_REJECT}),
        nodes=ONE_NODE,
        templates=("one",),
        max_pods=2,
        swarm=False,  # every run may reject
        prompt=frozenset({"E0", "E1", "kubelet", "plugin"}),
        plugin_releases_ended=True,
        plugin_stops_serving=True,
    ),
    Hole.STATIC_POD_FALLBACK: ModelConfig(
        fault_kinds=frozenset({Fault.PODRESOURCES_DOWN}),
        swarm=False,
        nodes=ONE_NODE,
        templates=("one",),
        max_pods=2,
        prompt=frozenset({"E0", "E1", "kubelet", "plugin"}),
        socketless=frozenset(),
    ),
}


# Actions no other hole's search needs, left out of it (each such search keeps the interleavings
# it was tuned on); the deep and CI profiles take them.
ONLY_WHEN_SEARCHED = frozenset(
    {
        Hole.SWEEP_IN_HANDOFF,
        Hole.SWEEP_BOUND_HERE,
        Hole.ENDED_UNSEEN,
        Hole.REJECTED_RELEASED_UNSERVED,
        Hole.STATIC_POD_FALLBACK,
    }
)


def focus(hole: Hole, *, avoid: frozenset[Hole] = KNOWN_HOLES) -> ModelConfig:
    """The configuration that searches for ``hole``: only it allowed of ``avoid`` (and of
    ``ONLY_WHEN_SEARCHED``)."""
    return replace(FOCUS[hole], avoid=(avoid | ONLY_WHEN_SEARCHED) - {hole}, stop_after_first=True)


@dataclass(frozen=True)
class Finding:
    """The outcome of a search: the violation (None: not found) after ``runs`` examples."""

    hole: Hole
    violation: Violation | None
    runs: int
    first_run: int | None


# The seed each hole is searched from (explicit, so pytest and ``python -m tests.model --hole``
# search the same examples; derandomized runs differ between the two).
SEARCH_SEEDS: dict[Hole, int] = {
    Hole.BYPASS_POD: 6,
    Hole.STALE_LEASE_VIEW: 2,
    Hole.LEASE_RESET: 2,
    Hole.INIT_REUSE: 2,
    Hole.CANCEL_AFTER_WRITE: 1,
    Hole.DOUBLE_BIND: 2,
    Hole.ORPHANED_LOCK: 3,
    Hole.LATE_READ: 1,
    Hole.LATE_BINDING: 2,
    Hole.REJECTED_MID_HANDOFF: 1,
    Hole.LISTED_REJECTED_POD: 1,
    Hole.SERVED_AFTER_CHECKPOINT_LOSS: 5,
    Hole.PROGRESS_AHEAD_OF_KUBELET: 1,
    Hole.ABANDONED_BIND_WRITES: 1,
    Hole.QUEUE_ORDER: 1,
    Hole.HOLDER_SLICE: 1,
    Hole.SLICE_CAPACITY: 1,
    Hole.ABANDONED_RETRY: 1,
    Hole.BINDING_PAST_DEADLINE: 3,
    Hole.MIG_RELEASE: 1,
    Hole.MIG_HOLDER: 1,
    Hole.MIG_PROGRESS_AHEAD: 1,
    Hole.SWEEP_IN_HANDOFF: 1,
    Hole.SWEEP_BOUND_HERE: 1,
    Hole.ENDED_UNSEEN: 1,
    Hole.REJECTED_RELEASED_UNSERVED: 5,
    Hole.STATIC_POD_FALLBACK: 1,
}


def find(
    hole: Hole,
    how: settings,
    *,
    chosen_seed: int | None = None,
    stop_after_first: bool = True,
    planted: bool = False,
) -> Finding:
    """Search the model for ``hole`` under ``how`` from its seed; the violation, if any.

    ``stop_after_first``: end every run after the first violation at once (no shrinking);
    without it Hypothesis shrinks the failure to the shortest interleaving it can.
    ``planted``: with the hole's fix reverted (``holes.PLANTS``) for the search.
    """
    with PLANTS[hole]() if planted else nullcontext():
        return _find(hole, how, chosen_seed=chosen_seed, stop_after_first=stop_after_first)


def _find(hole: Hole, how: settings, *, chosen_seed: int | None, stop_after_first: bool) -> Finding:
    config = replace(focus(hole), stop_after_first=stop_after_first)
    cls = machine(config, f"Search_{hole.name}")
    seed(SEARCH_SEEDS[hole] if chosen_seed is None else chosen_seed)(cls)
    how = settings(how, derandomize=False)
    try:
        run_state_machine_as_test(cls, settings=how)
    except Exception:
        # the run that found it raised a Violation; the early stop of later runs may make
        # Hypothesis complain of inconsistent generation, which is expected here
        if not cls.stats.violations:
            raise
        return Finding(hole, cls.stats.violations[0], cls.stats.runs, cls.stats.first_violation_run)
    return Finding(hole, None, cls.stats.runs, None)
