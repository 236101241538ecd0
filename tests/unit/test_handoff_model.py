"""The handoff model (tests/model, docs/model.md) in the unit run: the CI profile and the holes.

- ``TestHandoffModel``: the CI profile; every known hole avoided, so it must find nothing.
- ``test_hole_search``: per hole, the derandomized search with only that hole allowed, run as
  ``python -m tests.model --hole``: a known hole must be found (exit 0, its "found" line,
  breaking one of the invariants it is known to break); a fixed one must not (exit
  ``NOT_FOUND``, the "not found in N examples" line, N at least its budget).  Any other exit
  or output fails, so a search that crashes cannot pass.
- ``test_planted_hole_search``: per hole with a plant (``holes.PLANTS``), the search with the
  hole's fix reverted must find it: the model still generates the behaviour behind the hole.
- ``test_ci_profile_finds_mig_plant``: the CI profile's own examples, each MIG plant in
  place, break one of its invariants (MIG pods are common enough there).
- ``test_replay_*``: fixed interleavings, replayed step by step, each asserting that its
  critical step took the path it exists to show: traces the search found (the permanent
  regression examples) and the stale-Lease-view hole's first form.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
from hypothesis.stateful import run_state_machine_as_test

from deviceplugin.checkpoint import Checkpoint
from lockd import NodeName
from tests.model.__main__ import NOT_FOUND
from tests.model.holes import BREAKS, KNOWN_HOLES, PLANTS, Hole
from tests.model.machine import (
    BrakeModel,
    EndedModel,
    Fault,
    HandoffModel,
    ModelConfig,
    StaticPodModel,
    SweepingModel,
    Violation,
    machine,
)
from tests.model.profiles import CI_EXAMPLES, ci_settings
from tests.model.search import SEARCH_SEEDS, focus

ROOT = Path(__file__).resolve().parents[2]
COMMAND = (sys.executable, "-m", "tests.model")

HandoffModelCI = machine(ModelConfig(), "HandoffModelCI")
HandoffModelCI.TestCase.settings = ci_settings(max_examples=CI_EXAMPLES)
TestHandoffModel = HandoffModelCI.TestCase

# Each search starts from its hole's seed (``SEARCH_SEEDS``) and stops at its first violation;
# docs/model.md records after how many examples each hole is found with its fix reverted.  A
# fixed hole's search runs its whole budget (``FIXED_BUDGET``: about twice what the reverted
# fix needed), which bounds the unit run's time.
SEARCH_BUDGET = 2_000
FIXED_BUDGET: dict[Hole, int] = {
    Hole.BYPASS_POD: 300,
    Hole.STALE_LEASE_VIEW: 1_600,
    Hole.LEASE_RESET: 300,
    Hole.INIT_REUSE: 300,
    Hole.CANCEL_AFTER_WRITE: 700,
    Hole.DOUBLE_BIND: 700,
    Hole.ORPHANED_LOCK: 300,
    Hole.LATE_READ: 300,
    Hole.LATE_BINDING: 700,
    Hole.REJECTED_MID_HANDOFF: 100,
    Hole.LISTED_REJECTED_POD: 100,
    Hole.SERVED_AFTER_CHECKPOINT_LOSS: 300,
    Hole.PROGRESS_AHEAD_OF_KUBELET: 300,
    Hole.ABANDONED_BIND_WRITES: 100,
    Hole.QUEUE_ORDER: 200,
    Hole.HOLDER_SLICE: 100,
    Hole.SLICE_CAPACITY: 200,
    Hole.ABANDONED_RETRY: 200,
    Hole.BINDING_PAST_DEADLINE: 400,
    Hole.MIG_RELEASE: 100,
    Hole.MIG_HOLDER: 100,
    Hole.MIG_PROGRESS_AHEAD: 250,
    Hole.SWEEP_IN_HANDOFF: 900,
    Hole.SWEEP_BOUND_HERE: 300,
    Hole.ENDED_UNSEEN: 300,
    Hole.REJECTED_RELEASED_UNSERVED: 100,
    Hole.STATIC_POD_FALLBACK: 100,
}
INVARIANT = r"(S[1-4]|V1|F1|W[12]|R1|L1)"


def search(hole: Hole, examples: int, *, planted: bool = False) -> tuple[int, str]:
    """Run ``python -m tests.model --hole`` as a plain process (Hypothesis draws other examples
    inside pytest than in a plain process even from the same explicit seed, and the recorded
    numbers are the plain process's): its exit status and its output."""
    done = subprocess.run(
        [
            *COMMAND,
            "--hole",
            hole.value,
            "--quick",
            "--examples",
            str(examples),
            *(["--planted"] if planted else []),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def assert_found(hole: Hole, rc: int, out: str, *, planted: bool = False) -> int:
    """The search found ``hole`` (exit 0, its last line says so, one of its invariants)."""
    label = re.escape(f"hole {hole.value}{' (planted)' if planted else ''}")
    last = out.rstrip("\n").rsplit("\n", 1)[-1]
    found = re.fullmatch(
        rf"{label}: found \({INVARIANT}\) after (\d+) examples "
        rf"\(seed {SEARCH_SEEDS[hole]}\); shortest trace above",
        last,
    )
    why = f"the model does not find {hole} (exit {rc}):\n{out[-3000:]}"
    assert rc == 0, why
    assert found is not None, why
    assert found.group(1) in BREAKS[hole], out[-3000:]
    return int(found.group(2))


def assert_not_found(hole: Hole, rc: int, out: str, *, budget: int) -> int:
    """The search ran its whole budget and found nothing (exit ``NOT_FOUND``, its last line)."""
    last = out.rstrip("\n").rsplit("\n", 1)[-1]
    empty = re.fullmatch(rf"hole {re.escape(hole.value)}: not found in (\d+) examples", last)
    why = f"{hole}: exit {rc}:\n{out[-3000:]}"
    assert rc == NOT_FOUND, why
    assert empty is not None, why
    assert int(empty.group(1)) >= budget, out[-3000:]
    return int(empty.group(1))


@pytest.mark.parametrize("hole", sorted(Hole), ids=str)
def test_hole_search(hole: Hole) -> None:
    if hole in KNOWN_HOLES:
        assert_found(hole, *search(hole, SEARCH_BUDGET))
    else:  # fixed: the same search must come back empty
        assert_not_found(hole, *search(hole, FIXED_BUDGET[hole]), budget=FIXED_BUDGET[hole])


@pytest.mark.parametrize("hole", sorted(PLANTS), ids=str)
def test_planted_hole_search(hole: Hole) -> None:
    """With the fix reverted, the search finds the hole within the fixed hole's budget."""
    assert (
        assert_found(hole, *search(hole, FIXED_BUDGET[hole], planted=True), planted=True)
        <= (FIXED_BUDGET[hole])
    )


def test_a_search_that_crashes_fails_both_checks() -> None:
    """A runner that raises exits 1 with a traceback: neither outcome may accept it."""
    rc, out = search(Hole.LATE_READ, -1)  # Hypothesis refuses max_examples=-1: it raises
    assert rc not in (0, NOT_FOUND), out
    with pytest.raises(AssertionError):
        assert_found(Hole.LATE_READ, rc, out)
    with pytest.raises(AssertionError):
        assert_not_found(Hole.LATE_READ, rc, out, budget=0)


def replay(
    hole: Hole,
    faults: frozenset[Fault],
    steps: Callable[[HandoffModel], None],
    *,
    planted: bool = False,
) -> HandoffModel:
    """Run ``steps`` on a fresh model searching ``hole``, checking safety after each call;
    a known hole (or a planted one) must break one of its invariants, a fixed one none.
    Returns the model, settled."""
    model = machine(focus(hole), f"Replay_{hole.name}")()
    model.start((0.0, 0.0), faults)

    def run() -> None:
        steps(model)
        model.check_safety()
        model.settle()

    if hole in KNOWN_HOLES or planted:
        with PLANTS[hole]() if planted else _nothing(), pytest.raises(Violation) as caught:
            run()
        assert caught.value.invariant in BREAKS[hole], str(caught.value)
    else:
        run()
    return model


def _nothing() -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


def did(m: HandoffModel, *expected: str) -> None:
    """The model's last action took the path ``expected`` names (each a part of its line)."""
    line = m.trace[-1]
    for part in expected:
        assert part in line, f"expected {part!r} in the last step:\n" + "\n".join(m.trace[-8:])


def test_replay_cancel_after_binding_write() -> None:
    """Found by the search (hole #12.7, shrunk): a bind cancelled after its binding was sent
    releases the lock ``bind-failed``; the binding then lands with a token nobody holds."""

    def steps(m: HandoffModel) -> None:
        m.create_pod(0)  # team/one-1
        m.schedule(0, "E0", 0)  # Bind team/one-1 -> n1 on E0
        m.extender_step(0)  # acquired n1 token 1
        m.extender_step(0)  # confirmed
        m.extender_step(0)  # sent binding request #1 (token 1)
        m.bind_cancelled(0)  # kube-scheduler cancels: was "released token 1 bind-failed"
        did(m, "the binding was sent: the lock is kept")
        m.check_safety()
        m.server_applies(0)  # the binding lands: was S4
        did(m, "binding #1 of team/one-1: ok")

    replay(Hole.CANCEL_AFTER_WRITE, frozenset({Fault.CANCEL}), steps)


def test_replay_stale_lease_view_serves_finished_holder() -> None:
    """Hole #12.2: the plugin's release of a served holder fails, the holder finishes, its lock is
    taken over for the next pod, and the plugin -- its Lease view still showing the finished
    holder -- answers the next pod with the finished holder's handoff."""

    def steps(m: HandoffModel) -> None:
        m.create_pod(0)  # team/one-1
        m.schedule(0, "E0", 0)
        for _ in range(4):  # acquire, confirm, send, bound
            m.extender_step(0)
        m.deliver_to("kubelet/n1")
        m.plugin_loses_api(0)  # the release after one-1's last container will not get through
        m.kubelet_step(0, 0)  # one-1 served; release kept pending
        m.kubelet_step(0, 0)  # one-1 admitted
        m.pod_completes(0)  # one-1 Succeeded: kubelet frees n1-g0
        m.tick(16.0)  # one-1's lock expires on E0's clock
        m.create_pod(0)  # team/one-2
        m.deliver_to("E0")
        m.schedule(0, "E0", 0)
        for _ in range(4):  # takes the lock over (one-1 admitted), binds one-2 with token 2
            m.extender_step(0)
        m.check_safety()
        m.deliver_to("kubelet/n1")  # the plugin's Lease watch is not delivered
        m.kubelet_step(0, 0)  # was: served n1-g0 as team/one-1 token 1 (S2)
        did(m, "team/one-2: main: Allocate", "as team/one-2 token 2")

    replay(Hole.STALE_LEASE_VIEW, frozenset({Fault.RELEASE_FAILS}), steps)


def test_replay_rejected_holder_and_lagging_plugin_watches() -> None:
    """Found by the model (hole #12.2's second form): kubelet rejects the lock holder before
    Allocate, the lock is taken over for the next pod, and the plugin -- its Lease watch and its
    node pod watch both behind -- would serve the next pod the rejected holder's handoff if it
    decided from its watches (the holder's watched copy still Pending).  Allocate is decided
    from fresh reads only."""

    def steps(m: HandoffModel) -> None:
        m.create_pod(0)  # team/one-1
        m.schedule(0, "E0", 0)
        for _ in range(4):  # acquire, confirm, send, bound
            m.extender_step(0)
        for watcher in ("plugin/n1", "plugin-pods/n1", "kubelet/n1"):
            m.deliver_to(watcher)  # the plugin sees one-1 holding the lock, bound, Pending
        m.watch_stalls(0)  # the plugin's watches stall (the only non-prompt process)
        m.kubelet_rejects(0)  # one-1 Failed before Allocate; the lock is not released
        m.create_pod(0)  # team/one-2
        m.deliver_to("E0")
        m.tick(16.0)
        m.schedule(0, "E0", 0)
        for _ in range(4):  # takes the lock over (one-1 failed), binds one-2 with token 2
            m.extender_step(0)
        m.check_safety()
        m.deliver_to("kubelet/n1")
        m.kubelet_step(0, 0)  # from the watches: n1-g0 "as team/one-1 token 1"; fresh: as one-2
        did(m, "team/one-2: main: Allocate", "as team/one-2 token 2")

    replay(Hole.STALE_LEASE_VIEW, frozenset({Fault.ADMISSION_REJECT, Fault.WATCH_STALL}), steps)


def test_replay_orphaned_lock_after_an_extender_restart() -> None:
    """Found by the model (its "orphaned lock"): an extender takes a lock for a 2-GPU pod and
    crashes before the binding; the pod is deleted; both replicas restart (no tombstone for
    it).  Filter counted the dead holder's Lease copy forever, so no pod fit the node and no
    Bind came to take the lock over; once the lock has expired the copy is left out."""

    def steps(m: HandoffModel) -> None:
        m.create_pod(1)  # team/two-1 (two GPUs: the whole node)
        m.schedule(0, "E0", 0)
        m.extender_step(0)  # acquired n1 token 1
        m.extender_crashes("E0")  # the bind is lost with the lock held
        m.pod_deleted(0)
        m.extender_crashes("E0")
        m.extender_crashes("E1")
        m.create_pod(1)  # team/two-2: fits n1 only once two-1's lock is taken over

    m = replay(Hole.ORPHANED_LOCK, frozenset({Fault.CRASH, Fault.POD_DELETE}), steps)
    assert any("team/two-2->n1" in line and "took over n1 token 2" in line for line in m.trace), (
        "\n".join(m.trace)
    )


def test_replay_second_bind_on_a_lagging_replica() -> None:
    """Found by the deep profile (hole #12.8's remaining path): kube-scheduler gives up on a bind
    whose binding is on its way and retries the pod on the other replica, whose Lease watch has
    not shown the first bind's lock; re-acquiring it for the same pod gave token 2, and the first
    binding then landed with token 1.  The bind now never re-acquires its own pod's lock."""

    def steps(m: HandoffModel) -> None:
        m.create_pod(0)  # team/init-1
        m.schedule(0, "E1", 0)  # Bind team/init-1 -> n1 on E1
        m.extender_step(0)  # acquired n1 token 1
        m.extender_step(0)  # confirmed
        m.extender_step(0)  # sent binding request #1 (token 1)
        m.scheduler_gives_up(0, False)  # the binding is on its way; the pod may be retried
        m.schedule(0, "E0", 0)  # retried on E0, whose watches have delivered nothing
        m.extender_step(1)  # bind#2: was "acquired n1 token 2"; now its acquire is refused
        did(m, "bind#2", "lost the race", "waits again")
        m.check_safety()
        m.server_applies(0)  # binding #1 lands with token 1

    replay(Hole.DOUBLE_BIND, frozenset({Fault.GIVE_UP}), steps)


def test_replay_bypass_pod_seen_by_kubelet_beside_the_holder() -> None:
    """Hole #12.1(b)'s liveness side: a pod bound by hand reaches kubelet beside the lock holder.
    kubelet admits the holder first (the older pod); the bypass pod, bound and Pending, was
    "another pod kubelet may be admitting" by a LIST of the node's pods, so the holder was
    refused and failed (L1).  kubelet's own PodResources List does not hold the bypass pod
    until kubelet reaches it: the holder is served, the bypass pod refused alone."""

    def steps(m: HandoffModel) -> None:
        m.create_pod(0)  # team/one-1
        m.schedule(0, "E0", 0)
        for _ in range(4):  # acquire, confirm, send, bound
            m.extender_step(0)
        m.bypass_pod_created(0)  # team/bypass-2 bound to n1 at create
        m.deliver_to("kubelet/n1")  # kubelet sees both; the older one-1 is admitted first
        m.kubelet_step(0, 0)  # Allocate for one-1: was refused (L1); now served, lock released
        did(m, "team/one-1: main: Allocate", "as team/one-1 token 1 (last; released)")
        # settling: bypass-2 is refused (no pod holds the lock) and fails alone

    replay(Hole.BYPASS_POD, frozenset({Fault.BYPASS}), steps)


def late_binding_steps(m: HandoffModel, *, check: bool = True) -> None:
    """one-1's bind sends its binding and gives up waiting for it; the lock expires;
    kube-scheduler retries one-1, whose second bind finds it not bound and asks to take the
    expired lock over; the server applies the first binding afterwards."""
    m.create_pod(0)  # team/one-1
    m.schedule(0, "E0", 0)
    for _ in range(3):  # acquire, confirm, send
        m.extender_step(0)
    m.tick(16.0)  # past the client's deadline and the lock's duration
    m.extender_step(0)  # no answer: the GET shows one-1 not bound; the lock is kept
    if check:
        did(m, "bind#1", "keeping the lock")
    m.schedule(0, "E0", 0)  # kube-scheduler retries one-1
    m.extender_step(0)  # bind#2 asks to take the expired lock over
    if check:  # not bound, but its first binding may still land: was "took over n1 token 2"
        did(m, "bind#2", "lost the race", "waits again")
    m.check_safety()
    m.server_applies(0)  # one-1's first binding lands after its client gave up
    if check:
        did(m, "binding #1 of team/one-1: ok")


def test_replay_late_binding_keeps_the_lock() -> None:
    """A binding the server applies after its client's timeout: the lock of a holder seen not
    bound is not taken over while that binding may still land (``binding_may_still_land``)."""
    replay(Hole.LATE_BINDING, frozenset(), late_binding_steps)


def test_replay_late_binding_without_the_guard_breaks() -> None:
    """The same steps with the guard deleted: the second bind takes the lock over (token 2)
    and the first binding then lands with token 1 (S4)."""
    replay(
        Hole.LATE_BINDING, frozenset(), lambda m: late_binding_steps(m, check=False), planted=True
    )


def rejected_mid_handoff_steps(m: HandoffModel, *, check: bool = True) -> None:
    """kubelet rejects pair-1 after its first container was served; the lock is taken over
    for pair-2, whose first Allocate meets pair-1's interrupted handoff in the checkpoint."""
    m.create_pod(0)  # team/pair-1
    m.schedule(0, "E0", 0)
    for _ in range(4):  # acquire, confirm, send, bound
        m.extender_step(0)
    m.kubelet_step(0, 0)  # pair-1's left container served
    if check:
        did(m, "team/pair-1: left: Allocate", "as team/pair-1 token 1")
    m.kubelet_rejects_after_allocate(0)
    m.create_pod(0)  # team/pair-2
    m.tick(16.0)
    m.schedule(0, "E0", 0)
    for _ in range(4):  # takes the lock over (pair-1 failed), binds pair-2 with token 2
        m.extender_step(0)
    m.check_safety()
    m.kubelet_step(0, 0)  # pair-1's progress dropped (it left the handoff): pair-2 served
    if check:  # was: refused taken-over; pair-2 failed (L1)
        did(m, "team/pair-2: left: Allocate", "as team/pair-2 token 2")


def test_replay_rejected_after_allocate() -> None:
    """kubelet rejects a pod after Allocate answered one of its containers: the next holder
    is served at once (the interrupted handoff of a pod that left is dropped)."""
    replay(
        Hole.REJECTED_MID_HANDOFF,
        frozenset({Fault.REJECT_AFTER_ALLOCATE}),
        rejected_mid_handoff_steps,
    )


def test_replay_rejected_after_allocate_without_the_drop_breaks() -> None:
    """The same steps with the drop deleted: pair-2's first Allocate is refused (L1)."""
    replay(
        Hole.REJECTED_MID_HANDOFF,
        frozenset({Fault.REJECT_AFTER_ALLOCATE}),
        lambda m: rejected_mid_handoff_steps(m, check=False),
        planted=True,
    )


def progress_ahead_of_kubelet_steps(m: HandoffModel, *, check: bool = True) -> None:
    """kubelet dies after the plugin served pair-1's first container and before writing its
    checkpoint, then re-admits pair-1 and asks Allocate for that container again."""
    m.create_pod(1)  # team/pair-1
    m.schedule(0, "E0", 0)
    for _ in range(4):  # acquire, confirm, send, bound
        m.extender_step(0)
    m.kubelet_dies_after_answer(0, 0)  # left served n1-g0; kubelet's record of it lost
    did(m, "team/pair-1: left: Allocate", "kubelet died before writing its checkpoint")
    m.check_safety()
    m.kubelet_step(0, 0)  # re-admission: Allocate for left again
    did(m, "team/pair-1: left: Allocate")
    if check:  # was: served right's devices as left, lock released; right then refused (S2)
        did(m, "as team/pair-1 token 1")
        assert "(last; released)" not in m.trace[-1], m.trace[-1]
        m.kubelet_step(0, 0)  # then right, the last one: the lock released
        did(m, "team/pair-1: right: Allocate", "(last; released)")


def test_replay_progress_ahead_of_kubelet() -> None:
    """Found by the model (a kin of #31.1): re-admitting pair-1 after kubelet lost the record
    of its first container, kubelet asks for that container again; it gets its own devices
    again (kubelet's checkpoint does not confirm the plugin's progress), and the lock is
    released only with the second container answered."""
    replay(
        Hole.PROGRESS_AHEAD_OF_KUBELET,
        frozenset({Fault.CHECKPOINT_LOST}),
        progress_ahead_of_kubelet_steps,
    )


def test_replay_progress_ahead_of_kubelet_with_the_old_rule_breaks() -> None:
    """The same steps with the plugin's progress trusted as it stands: the repeated container
    is answered with the next one's devices and the lock released as if complete (S2)."""
    replay(
        Hole.PROGRESS_AHEAD_OF_KUBELET,
        frozenset({Fault.CHECKPOINT_LOST}),
        lambda m: progress_ahead_of_kubelet_steps(m, check=False),
        planted=True,
    )


def abandoned_bind_steps(m: HandoffModel, *, check: bool = True) -> None:
    """kube-scheduler stops waiting for a bind as its reads before the Lease write are in
    flight, and for another once it holds the lock: neither writes the Lease again nor sends a
    binding; the one holding the lock releases it."""
    m.create_pod(0)  # team/one-1
    m.create_pod(0)  # team/one-2
    m.deliver_to("E0")
    m.schedule(0, "E0", 0)  # bind#1: team/one-1
    m.scheduler_gives_up(0, True)  # the disconnect comes as bind#1 is about to write the Lease
    if check:
        did(m, "bind#1", "the scheduler stopped waiting for this bind; stopped before write lease")
    m.check_safety()  # planted: bind#1 wrote the Lease after its caller left (W2)
    m.schedule(0, "E0", 0)  # bind#2
    m.extender_step(0)  # bind#2 acquired n1 token 1
    did(m, "bind#2", "acquired n1 token 1")
    m.scheduler_gives_up(0, False)  # abandoned with the lock held
    m.extender_step(0)  # stops before confirming and releases the lock
    did(m, "bind#2", "the scheduler stopped waiting", "released token 1 bind-failed")


def test_replay_abandoned_binds_write_nothing() -> None:
    """#31.2: a bind whose caller left sends no Lease write and no binding, and releases a lock
    it took (``Binder.abandon`` cancels its deadline; every write checks it)."""
    replay(Hole.ABANDONED_BIND_WRITES, frozenset({Fault.GIVE_UP}), abandoned_bind_steps)


def test_replay_abandoned_binds_with_the_old_check_break() -> None:
    """The same steps with the deadline checked for time alone: the bind that holds the lock
    goes on to send its binding after its caller left (W2)."""
    replay(
        Hole.ABANDONED_BIND_WRITES,
        frozenset({Fault.GIVE_UP}),
        lambda m: abandoned_bind_steps(m, check=False),
        planted=True,
    )


def queue_order_steps(m: HandoffModel, *, check: bool = True) -> None:
    """Two binds to n1 on E0: the first holds the expired lock (its bind still under way), the
    second joins the queue behind it."""
    m.create_pod(0)  # team/one-1
    m.create_pod(0)  # team/one-2
    m.deliver_to("E0")
    m.schedule(0, "E0", 0)  # bind#1: team/one-1
    m.extender_step(0)  # bind#1 acquired n1 token 1 (and stays at its queue's head)
    m.tick(16.0)  # the lock expires; bind#1 is still under way
    m.schedule(0, "E0", 0)  # bind#2: team/one-2
    m.extender_step(1)  # bind#2 queued behind bind#1; planted: takes its turn (W1)
    if check:  # expected to wait the holder's age again: more than its budget
        did(m, "bind#2", "1 ahead of this one", "cannot be served")


def test_replay_queue_order() -> None:
    """Decision 0003: only a node queue's head takes its turn; the one behind it, expecting to
    wait longer than its budget, fails fast."""
    replay(Hole.QUEUE_ORDER, frozenset(), queue_order_steps)


def test_replay_queue_order_without_the_head_check_breaks() -> None:
    """The same steps with every waiter taken for its queue's head: the second bind takes its
    turn while the first is still under way (W1)."""
    replay(
        Hole.QUEUE_ORDER,
        frozenset(),
        lambda m: queue_order_steps(m, check=False),
        planted=True,
    )


def binding_past_deadline_steps(m: HandoffModel, *, fixed: bool = True) -> None:
    """A bind takes the lock late in its deadline (a slow API server) and sends its binding
    with the deadline, nearer than the end of its binding window, as the timeout; no answer
    comes, and the GET that checks whether it landed would be past the deadline."""
    m.create_pod(0)  # team/one-1
    m.schedule(0, "E0", 0)  # arrives at t=0: deadline t=9.75
    m.tick(4.0)
    m.slow_extender_step(0, 1.0)  # t=5: queued; acquired n1 token 1
    did(m, "bind#1", "acquired n1 token 1")
    m.extender_step(0)  # confirmed
    m.extender_step(0)  # sent with 4.75 s left of the deadline (5 s of the window)
    did(m, "bind#1", "sent binding request #1")
    m.tick(16.0)
    m.extender_step(0)  # no answer by 9.75, no GET past it
    if fixed:  # an unknown outcome: the lock is kept
        did(m, "bind#1", "keeping the lock")
    else:  # planted: the GET's BindCancelled releases it
        did(m, "bind#1", "past its deadline", "released token 1 bind-failed")
    m.check_safety()
    m.server_applies(0)  # binding #1 lands with token 1; planted: on a free lock (S4)


def test_replay_binding_past_deadline_keeps_the_lock() -> None:
    """Found by the model, then fixed: a binding whose answer did not come by the bind's
    deadline leaves the lock held (its outcome unknown), so it lands on a lock still held."""
    replay(Hole.BINDING_PAST_DEADLINE, frozenset({Fault.SLOW_API}), binding_past_deadline_steps)


def test_replay_binding_past_deadline_planted_releases_a_lock_whose_binding_may_land() -> None:
    """The same steps with ``BindCancelled`` not caught in ``_bound_anyway``: the lock is
    released while the binding may still land, which it then does with a token nobody holds."""
    replay(
        Hole.BINDING_PAST_DEADLINE,
        frozenset({Fault.SLOW_API}),
        lambda m: binding_past_deadline_steps(m, fixed=False),
        planted=True,
    )


def abandoned_retry_steps(m: HandoffModel, *, fixed: bool = True) -> None:
    """kube-scheduler stops waiting for a bind before it began and retries the pod on the same
    replica and node while that first call is still under way, then stops waiting for the
    retry too, after the first call ended."""
    m.create_pod(0)  # team/one-1
    m.deliver_to("E1")
    m.schedule(0, "E1", 0)  # bind#1
    m.scheduler_gives_up(0, False)  # bind#1 abandoned before it began
    m.schedule(0, "E1", 0)  # bind#2 for the same pod and node
    m.extender_step(0)  # bind#1 stops before taking the lock
    did(m, "bind#1", "the scheduler stopped waiting for this bind")
    m.scheduler_gives_up(0, False)  # bind#2 abandoned
    m.extender_step(0)  # fixed: bind#2 stops too; planted: it acquires n1 (W2)
    if fixed:
        did(m, "bind#2", "the scheduler stopped waiting for this bind")


def test_replay_abandoned_retry_stops() -> None:
    """Found by the model, then fixed: abandoning a retry that arrived while an earlier call
    for the same pod and node still ran reaches the retry, which then writes nothing."""
    replay(Hole.ABANDONED_RETRY, frozenset({Fault.GIVE_UP}), abandoned_retry_steps)


def test_replay_abandoned_retry_planted_goes_on_writing() -> None:
    """The same steps keeping only the first call's deadline: once the first call ended,
    abandoning the retry reaches nothing, and it takes the lock (W2)."""
    replay(
        Hole.ABANDONED_RETRY,
        frozenset({Fault.GIVE_UP}),
        lambda m: abandoned_retry_steps(m, fixed=False),
        planted=True,
    )


def mig_release_steps(m: HandoffModel, *, check: bool = True) -> None:
    """mixed-1 asks for a whole GPU (train) and an instance of each MIG profile (side): kubelet
    calls Allocate for train, then for side's 2g.20gb instance, then its 1g.10gb one."""
    m.create_pod(0)  # team/mixed-1
    m.schedule(0, "E0", 0)
    for _ in range(4):  # acquire, confirm, send, bound
        m.extender_step(0)
    m.kubelet_step(0, 0)  # train: nvidia.com/gpu
    did(m, "team/mixed-1: train: Allocate(n1-g0)")
    if check:  # planted: the lock released here, the last container of nvidia.com/gpu
        assert "(last; released)" not in m.trace[-1], m.trace[-1]
    m.check_safety()
    m.kubelet_step(0, 1)  # side: the search's pick 1 of its two resources, 2g.20gb first
    did(m, "team/mixed-1: side[2g.20gb]: Allocate(MIG-n1-g2-2g.20gb-0)")
    if check:
        did(m, "as team/mixed-1 token 1")
        assert "(last; released)" not in m.trace[-1], m.trace[-1]
        m.kubelet_step(0, 0)  # side's 1g.10gb instance: the last call of every resource
        did(m, "team/mixed-1: side[1g.10gb]: Allocate(MIG-n1-g2-1g.10gb-0)", "(last; released)")


def test_replay_mig_release() -> None:
    """A pod of a whole GPU and two MIG profiles is served per resource, in kubelet's order;
    the lock is released with the last call of every resource, not of one."""
    replay(Hole.MIG_RELEASE, frozenset(), mig_release_steps)


def test_replay_mig_release_after_one_resource_breaks() -> None:
    """The same steps with the release after one resource's last container: train's answer
    releases the lock while side awaits both its instances (S2); side's first Allocate would
    find the lock free and be refused (L1)."""
    replay(Hole.MIG_RELEASE, frozenset(), lambda m: mig_release_steps(m, check=False), planted=True)


def mig_holder_steps(m: HandoffModel) -> None:
    """mig-1 takes n1's lock for a 1g.10gb instance; no replica has seen its binding yet."""
    m.create_pod(0)  # team/mig-1
    m.create_pod(0)  # team/mig-2
    m.schedule(0, "E0", 0)
    m.extender_step(0)  # acquired n1 token 1 for mig-1's instance
    did(m, "acquired n1 token 1", "MIG-n1-g2-1g.10gb-0")
    m.check_safety()  # planted: E0's picture leaves that instance free (F1)


def test_replay_mig_holder() -> None:
    """The lock holder's MIG instances count as taken in filter's and Bind's picture until
    the replica's cache counts the holder's binding."""
    replay(Hole.MIG_HOLDER, frozenset(), mig_holder_steps)


def test_replay_mig_holder_instances_left_out_breaks() -> None:
    """The same steps with the holder's instances left out of the picture: F1."""
    replay(Hole.MIG_HOLDER, frozenset(), mig_holder_steps, planted=True)


@pytest.mark.parametrize("hole", [Hole.MIG_RELEASE, Hole.MIG_HOLDER], ids=str)
def test_ci_profile_finds_mig_plant(hole: Hole) -> None:
    """The CI profile itself (every node, pod shape and fault kind; not the hole's focused
    search) breaks one of the hole's invariants within its examples when the MIG fix is
    planted: MIG pods are common enough in it."""
    cls = machine(ModelConfig(stop_after_first=True), f"CIPlanted_{hole.name}")
    with PLANTS[hole](), contextlib.suppress(Exception):
        run_state_machine_as_test(cls, settings=ci_settings(max_examples=CI_EXAMPLES, shrink=False))
    assert cls.stats.violations, f"{hole}: not found in {cls.stats.runs} runs of the CI profile"
    assert cls.stats.violations[0].invariant in BREAKS[hole], str(cls.stats.violations[0])
    assert cls.stats.first_violation_run is not None
    assert cls.stats.first_violation_run <= CI_EXAMPLES


def mig_progress_ahead_steps(m: HandoffModel, *, fixed: bool) -> None:
    """kubelet dies after the plugin served side's 1g.10gb instance, before writing its
    checkpoint (once per container), and after its restart asks for side's 2g.20gb instance
    first."""
    m.create_pod(0)  # team/mixed-1
    m.schedule(0, "E0", 0)
    for _ in range(4):  # acquire, confirm, send, bound
        m.extender_step(0)
    m.kubelet_step(0, 0)  # train: its GPU
    did(m, "team/mixed-1: train: Allocate(n1-g0)")
    m.kubelet_dies_after_answer(0, 0)  # side's 1g.10gb served; kubelet's record of it lost
    did(m, "side[1g.10gb]: Allocate", "kubelet died before writing its checkpoint")
    m.check_safety()
    m.kubelet_step(0, 1)  # side again, 2g.20gb first
    if not fixed:  # the lost 1g.10gb call counted as served: the lock released with this one
        did(m, "side[2g.20gb]: Allocate", "(last; released)")
        return
    did(m, "side[2g.20gb]: Allocate", "served")
    assert "(last; released)" not in m.trace[-1]
    m.kubelet_step(0, 1)  # side's 1g.10gb again: served, and the lock released with it
    did(m, "side[1g.10gb]: Allocate", "(last; released)")


def test_replay_mig_progress_ahead_of_kubelet() -> None:
    """Fixed hole ``mig-progress-ahead`` (found by the model): kubelet's List after the
    restart does not hold side's 1g.10gb devices, so that entry no longer counts as served;
    the 2g.20gb answer keeps the lock and the 1g.10gb call that follows gets its instance."""
    replay(
        Hole.MIG_PROGRESS_AHEAD,
        frozenset({Fault.CHECKPOINT_LOST}),
        lambda m: mig_progress_ahead_steps(m, fixed=True),
    )


def test_replay_mig_progress_ahead_of_kubelet_planted_breaks() -> None:
    """The same steps with the other resources' entries standing as they were (the plant):
    the plugin counts the lost 1g.10gb call as served and releases the lock with the 2g.20gb
    answer (S2); the 1g.10gb call would find no holder."""
    replay(
        Hole.MIG_PROGRESS_AHEAD,
        frozenset({Fault.CHECKPOINT_LOST}),
        lambda m: mig_progress_ahead_steps(m, fixed=False),
        planted=True,
    )


def sweep_steps(m: HandoffModel, *, reject: bool, expire: bool = True) -> None:
    """one-1 is bound and holds n1's lock; kubelet rejects it before any Allocate (``reject``)
    or has not admitted it yet; the lock's duration passes (``expire``) with no other bind, and
    E0 sweeps."""
    m.create_pod(0)  # team/one-1
    m.schedule(0, "E0", 0)
    for _ in range(4):  # acquire, confirm, send, bound
        m.extender_step(0)
    for watcher in list(m.watchers()):
        m.deliver_to(watcher)
    if reject:
        m.kubelet_rejects(0)
        m.deliver_to("E0")
    if expire:
        m.tick(16.0)
    assert isinstance(m, SweepingModel)
    m.extender_sweeps("E0")


@pytest.mark.parametrize("expire", [True, False])
def test_replay_sweep_releases_the_lock_of_a_rejected_holder_only_once_expired(
    expire: bool,
) -> None:
    """kubelet rejected the holder before any Allocate: the extender's sweep leaves its lock to
    the node's serving plugin until it expires (decision 0012: a node whose plugin is down must
    not take the next pod at once), and releases it ``expired`` after."""
    m = replay(
        Hole.SWEEP_IN_HANDOFF,
        frozenset({Fault.ADMISSION_REJECT}),
        partial(sweep_steps, reject=True, expire=expire),
    )
    swept = [line for line in m.trace if "sweep:" in line]
    if expire:
        assert any("sweep: n1: released token 1 expired (holder pod Failed" in s for s in swept)
    else:
        assert swept == [], "\n".join(m.trace)


def plugin_sees_rejection_steps(m: HandoffModel, *, serving: bool = True) -> None:
    """one-1 is bound and holds n1's lock; kubelet rejects it before any Allocate (with n1's
    plugin not ``serving``: for lack of devices); n1's plugin sees the pod Failed on its pod
    watch and looks at its lock's holder."""
    m.create_pod(0)  # team/one-1
    m.schedule(0, "E0", 0)
    for _ in range(4):  # acquire, confirm, send, bound
        m.extender_step(0)
    for watcher in list(m.watchers()):
        m.deliver_to(watcher)
    if not serving:
        assert isinstance(m, BrakeModel)
        m.plugin_serving(0, False)
    m.kubelet_rejects(0)
    m.deliver_to("plugin-pods/n1")
    assert isinstance(m, EndedModel)
    m.plugin_releases_ended(0)


def test_replay_the_plugin_releases_the_lock_of_a_holder_kubelet_rejected_at_once() -> None:
    """issue 52: kubelet fails the holder without calling Allocate; the plugin releases its
    lock ``rejected`` from its node's pod watch, long before the lock expires."""
    m = replay(Hole.ENDED_UNSEEN, frozenset({Fault.ADMISSION_REJECT}), plugin_sees_rejection_steps)
    assert any(
        "plugin/n1" in line
        and "holder team/one-1 ended (the holder pod is Failed (UnexpectedAdmissionError)" in line
        and line.endswith("released token 1 rejected  [n1:rv6/t1/free]")
        for line in m.trace
    ), "\n".join(m.trace)


def test_replay_a_plugin_not_serving_releases_a_rejected_holder_only_once_it_serves() -> None:
    """Decision 0012: kubelet rejected the holder because n1's plugin had sent it no device;
    the plugin keeps the lock while it does not serve, and releases it ``rejected`` at once when
    it serves again; the extender's sweep meanwhile leaves it alone (R1)."""

    def steps(m: HandoffModel) -> None:
        plugin_sees_rejection_steps(m, serving=False)
        assert m.trace[-1].endswith("ended (rejected): not serving  [n1:rv3/t1/one-1]"), m.trace[-1]
        m.deliver_to("E0")
        assert isinstance(m, BrakeModel)
        m.extender_sweeps("E0")
        assert "sweep:" not in m.trace[-1]
        m.plugin_serving(0, True)
        m.plugin_releases_ended(0)
        did(m, "plugin/n1", "released token 1 rejected")

    replay(Hole.REJECTED_RELEASED_UNSERVED, frozenset({Fault.ADMISSION_REJECT}), steps)


def test_replay_an_extender_releasing_a_rejected_holder_at_once_breaks_the_brake() -> None:
    """Planted (issue 52's first attempt): the extender's sweep releases the holder kubelet
    rejected for lack of devices at once, while the node's plugin does not serve: R1."""

    def steps(m: HandoffModel) -> None:
        plugin_sees_rejection_steps(m, serving=False)
        m.deliver_to("E0")
        assert isinstance(m, BrakeModel)
        m.extender_sweeps("E0")

    replay(
        Hole.REJECTED_RELEASED_UNSERVED,
        frozenset({Fault.ADMISSION_REJECT}),
        steps,
        planted=True,
    )


def test_replay_a_holder_not_yet_seen_is_not_taken_for_deleted() -> None:
    """E1's pod watch has not shown one-1 when its Lease watch shows one-1 holding n1's lock:
    its sweep leaves the lock alone (the holder has merely not been seen) and one-1 is served;
    planted (a holder missing from the cache counts as deleted), the lock is released while
    kubelet may still admit one-1 (S3)."""

    def steps(m: HandoffModel) -> None:
        m.create_pod(0)  # team/one-1
        m.schedule(0, "E0", 0)
        for _ in range(4):
            m.extender_step(0)
        e1 = m.replicas["E1"]
        for event in e1.leases.deliver(None):  # E1's Lease watch only: its pod watch lags
            e1.locks.take_event(event)
        assert isinstance(m, SweepingModel)
        m.extender_sweeps("E1")

    m = replay(Hole.ENDED_UNSEEN, frozenset(), steps)
    assert not any("sweep:" in line for line in m.trace)
    replay(Hole.ENDED_UNSEEN, frozenset(), steps, planted=True)


def test_replay_sweep_leaves_the_expired_lock_of_a_holder_in_handoff() -> None:
    """The holder is bound and kubelet has not admitted it: however old, the sweep leaves its
    lock held (the holder's last step is still to come)."""
    m = replay(Hole.SWEEP_IN_HANDOFF, frozenset(), partial(sweep_steps, reject=False))
    assert not any("sweep:" in line for line in m.trace)
    assert any("team/one-1: main: Allocate" in line for line in m.trace)  # settled: served


def test_replay_sweep_without_the_judgement_breaks() -> None:
    """The same steps with the sweep's judgement of the holder deleted: the lock is released
    while kubelet may still admit its holder (S3)."""
    replay(
        Hole.SWEEP_IN_HANDOFF,
        frozenset(),
        partial(sweep_steps, reject=False),
        planted=True,
    )


def bound_elsewhere_steps(m: HandoffModel) -> None:
    """one-1's binding to n1 gets no answer and never lands, so E0 keeps n1's lock; once the
    binding can no longer land, kube-scheduler binds one-1 to n2, and E0 sweeps."""
    m.create_pod(0)  # team/one-1
    m.schedule(0, "E0", 0)  # n1
    for _ in range(3):  # acquire, confirm, send
        m.extender_step(0)
    m.binding_answer_lost(0, False, False)  # not applied, and the GET shows it unbound
    m.tick(16.0)
    m.tick(16.0)  # past the binding's deadline: it can no longer land
    for watcher in list(m.watchers()):
        m.deliver_to(watcher)
    bind_and_sweep(m, 1)  # n2


def bind_and_sweep(m: HandoffModel, choice: int) -> None:
    """E0 binds the first schedulable pod to the ``choice``-th node that fits (every step of the
    bind), every watch delivers, and E0 sweeps."""
    m.schedule(0, "E0", choice)
    for _ in range(4):  # acquire, confirm, send, bound
        m.extender_step(0)
    for watcher in list(m.watchers()):
        m.deliver_to(watcher)
    assert isinstance(m, SweepingModel)
    m.extender_sweeps("E0")


def test_replay_sweep_releases_the_lock_of_a_holder_bound_elsewhere() -> None:
    """n1's lock is held by a pod now bound to n2, which no kubelet of n1 will ever admit: the
    sweep releases it (``bind-failed``) at once, before it expires."""
    m = replay(Hole.SWEEP_BOUND_HERE, frozenset({Fault.ANSWER_LOST}), bound_elsewhere_steps)
    assert any(
        "sweep: n1: released token 1 bind-failed (its holder team/one-1 is bound to n2)" in line
        for line in m.trace
    )


def bound_here_steps(m: HandoffModel) -> None:
    """one-1 is bound to n1 and holds its lock; kubelet has not admitted it when E0 sweeps."""
    m.create_pod(0)  # team/one-1
    bind_and_sweep(m, 0)  # n1


def test_replay_sweep_leaves_the_lock_of_a_holder_bound_to_its_node() -> None:
    """The holder is bound to the lock's own node: the sweep leaves the lock to its handoff."""
    m = replay(Hole.SWEEP_BOUND_HERE, frozenset(), bound_here_steps)
    assert not any("sweep:" in line for line in m.trace)
    assert any("team/one-1: main: Allocate" in line for line in m.trace)  # settled: served


def test_replay_sweep_of_holders_bound_anywhere_breaks() -> None:
    """The same steps with the sweep's check of the holder's node deleted: the lock is released
    while kubelet may still admit its holder (S3)."""
    replay(Hole.SWEEP_BOUND_HERE, frozenset(), bound_here_steps, planted=True)


def pending_tokens(cp: Checkpoint) -> list[int]:
    return [p.token for p in cp.pending]


def test_replay_a_release_a_plugin_crash_takes_back_is_repeated_harmlessly() -> None:
    """The plugin releases one-1's lock and crashes before its next checkpoint write (a finished
    release is written with the next one): it restarts with that release pending again, one-2
    takes n1's lock, and the repeated release finds a newer token and leaves one-2's lock."""
    config = replace(
        focus(Hole.SERVED_AFTER_CHECKPOINT_LOSS), fault_kinds=frozenset({Fault.PLUGIN_CRASH})
    )
    m = machine(config, "Replay_release_taken_back")()
    m.start((0.0, 0.0), frozenset({Fault.PLUGIN_CRASH}))
    m.create_pod(0)  # team/one-1
    m.schedule(0, "E0", 0)
    for _ in range(4):  # acquire, confirm, send, bound
        m.extender_step(0)
    m.deliver_to("kubelet/n1")
    m.kubelet_step(0, 0)  # one-1 served; its lock released
    plugin = m.plugins[NodeName("n1")]
    assert pending_tokens(plugin.cp) == []
    assert pending_tokens(plugin.saved) == [1]  # the file still names it
    m.plugin_crashes(0)
    assert pending_tokens(plugin.cp) == [1]
    m.create_pod(0)  # team/one-2
    m.deliver_to("E0")
    m.schedule(0, "E0", 0)
    for _ in range(4):  # acquires n1 with token 2
        m.extender_step(0)
    m.plugin_retries_releases(0)
    did(m, "token 1 needs no release")
    m.check_safety()
    m.settle()
    assert any("team/one-2: main: Allocate" in line and "token 2" in line for line in m.trace)


def static_pod_steps(m: HandoffModel, *, fixed: bool) -> None:
    """Issue 51 F1: one-1 holds n1's lock, bound and not admitted; a static pod's manifest is
    written, kubelet restarts and its PodResources ``List`` fails; kubelet admits the static
    pod first."""
    m.create_pod(0)  # team/one-1
    m.schedule(0, "E0", 0)
    for _ in range(4):  # acquire, confirm, send, bound
        m.extender_step(0)
    assert isinstance(m, StaticPodModel)
    m.static_pod_written(0, 0)  # kube-system/static-1, one GPU
    m.kubelet_restarts_list_failing(0)
    did(m, "restart: relisted its pods, static pods first; PodResources List fails")
    m.kubelet_step(0, 0)  # the static pod's GetPreferredAllocation and Allocate
    if not fixed:  # steered to one-1's GPU and served as one-1's handoff
        did(m, "kube-system/static-1: main: Allocate(n1-g0) [preferred hit] -> served n1-g0")
        return
    did(m, "kube-system/static-1: main: Allocate(", "refused unavailable; pod failed")
    m.check_safety()
    m.podresources_fails(0)  # List answers again
    did(m, "PodResources List answers again")
    m.kubelet_step(0, 0)  # one-1: served its own device, the lock released
    did(m, "team/one-1: main: Allocate(n1-g0) [preferred hit] -> served n1-g0 as team/one-1")


def test_replay_static_pod_after_a_kubelet_restart_gets_no_device() -> None:
    """The static pod's Allocate, its ``List`` failing on kubelet's socket, is refused (no
    release); once ``List`` answers again, the holder gets its own device."""
    replay(
        Hole.STATIC_POD_FALLBACK,
        frozenset({Fault.PODRESOURCES_DOWN}),
        partial(static_pod_steps, fixed=True),
    )


def test_replay_static_pod_with_the_old_fallback_gets_the_holders_device() -> None:
    """With the fallback planted (the API server's view decides when ``List`` fails, the
    preference unsteered), the static pod is steered to one-1's GPU and served it: S2."""
    replay(
        Hole.STATIC_POD_FALLBACK,
        frozenset({Fault.PODRESOURCES_DOWN}),
        partial(static_pod_steps, fixed=False),
        planted=True,
    )


def test_replay_a_holder_read_before_its_binding_is_read_again_for_its_own_allocate() -> None:
    """Found by the deep profile with static pods (seed 51): a static pod's Allocate comes while
    one-1 holds n1's lock and its binding has not landed; the plugin reads one-1 (not bound) and
    keeps that copy for the same holder and token.  kubelet sees one-1 bound before the plugin's
    node pod watch does, and one-1's own Allocate found only that copy, on both tries: refused
    ``not-bound``, one-1 failed with nothing to excuse it (L1).  The second try reads the holder
    afresh, as a decision that refuses from a watch-fed copy must."""
    config = replace(focus(Hole.STATIC_POD_FALLBACK), prompt=frozenset({"E0", "E1", "kubelet"}))
    m = machine(config, "Replay_holder_read_before_binding")()
    m.start((0.0, 0.0), frozenset())
    m.create_pod(0)  # team/one-1
    m.schedule(0, "E0", 0)
    m.extender_step(0)  # acquired n1 token 1; not bound yet
    assert isinstance(m, StaticPodModel)
    m.static_pod_written(0, 0)
    m.kubelet_step(0, 0)  # the static pod: the plugin reads one-1, not bound yet
    did(m, "kube-system/static-1: main: Allocate(", "refused not-bound; pod failed")
    for _ in range(3):  # confirm, send, bound
        m.extender_step(0)
    assert "team/one-1" not in m.plugins[NodeName("n1")].bound  # its node pod watch lags
    m.kubelet_step(0, 0)
    did(m, "team/one-1: main: Allocate(n1-g0) [preferred hit] -> served n1-g0 as team/one-1")
    m.check_safety()
    m.settle()
