"""The holes the model knows, how it steers around each one, and how to plant each again.

Each ``Hole`` is a way the handoff broke (or breaks) under one behaviour of the cluster.
``KNOWN_HOLES`` lists those the current code still has: the CI profile runs the model with all
of them *avoided* (it does not generate what triggers them), and
``tests/unit/test_handoff_model.py`` runs it once per hole with only that one allowed and
asserts that the model *finds* it.  When a fix lands, take its hole out of ``KNOWN_HOLES``: the
CI profile then searches for it too, and the same test asserts the hole's search finds nothing.

``PLANTS`` reverts a fix inside the search (``python -m tests.model --hole NAME --planted``):
it patches the project's function (or the model's copy of a guard) the fix lives in, for the
search's duration only.  The unit run asserts each planted search finds its hole, so a model
that stopped generating the behaviour behind a hole fails a test.

What "avoid" means for each hole is in ``AVOIDED_BY``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from enum import StrEnum
from unittest import mock

from tests.model import reverted


class Hole(StrEnum):
    BYPASS_POD = "bypass-pod"
    STALE_LEASE_VIEW = "stale-lease-view"
    LEASE_RESET = "lease-reset"
    INIT_REUSE = "init-reuse"
    CANCEL_AFTER_WRITE = "cancel-after-write"
    DOUBLE_BIND = "double-bind"
    ORPHANED_LOCK = "orphaned-lock"  # found by this model; not in #12
    LATE_READ = "late-read"  # found by the two-replica burst e2e (#11); then modelled
    LATE_BINDING = "late-binding"  # a binding applied after its client gave up
    REJECTED_MID_HANDOFF = "rejected-mid-handoff"  # kubelet rejects a pod after Allocate
    LISTED_REJECTED_POD = "listed-rejected-pod"  # #29.1: List returns rejected/finished pods
    SERVED_AFTER_CHECKPOINT_LOSS = "served-after-checkpoint-loss"  # #31.1
    PROGRESS_AHEAD_OF_KUBELET = "progress-ahead-of-kubelet"  # found by this model (#31.1's kin)
    ABANDONED_BIND_WRITES = "abandoned-bind-writes"  # #31.2: a caller that left still writes
    QUEUE_ORDER = "queue-order"  # decision 0003: a node's binds take their turns in FIFO order
    ABANDONED_RETRY = "abandoned-retry"  # found by this model: a retry's caller cannot abandon it
    BINDING_PAST_DEADLINE = "binding-past-deadline"  # found by this model: #31.2's deadline
    # releases a lock whose binding may still land
    HOLDER_SLICE = "holder-slice"  # #31.6: filter ignored a lock holder's slice
    SLICE_CAPACITY = "slice-capacity"  # sharing: a GPU's slices within its memory
    MIG_RELEASE = "mig-release"  # MIG: the lock released after the last call of every resource
    MIG_HOLDER = "mig-holder"  # MIG: filter counts a lock holder's instances as taken
    # found by this model: progress-ahead-of-kubelet for a container of several resources
    MIG_PROGRESS_AHEAD = "mig-progress-ahead"
    # the extender's sweep of expired locks released one whose holder is still in handoff
    SWEEP_IN_HANDOFF = "sweep-in-handoff"
    # the extender's sweep of locks whose holder is bound elsewhere released one bound here
    SWEEP_BOUND_HERE = "sweep-bound-here"
    # a lock released at once as its holder ended (issue 52) for a holder merely not seen yet
    ENDED_UNSEEN = "ended-unseen"
    # (issue 52's first attempt) an extender released a rejected holder's lock at once: with
    # the node's device plugin down, every pod bound there is rejected at once (a storm)
    REJECTED_RELEASED_UNSERVED = "rejected-released-unserved"
    # issue 51 F1: a static pod served the lock holder's devices when List failed
    STATIC_POD_FALLBACK = "static-pod-fallback"


AVOIDED_BY: dict[Hole, str] = {
    Hole.BYPASS_POD: "(#12.1) no pod is created with spec.nodeName set (bypassing the extender)",
    Hole.STALE_LEASE_VIEW: (
        "(#12.2) the device plugin's Lease watch is caught up before each kubelet step"
    ),
    Hole.LEASE_RESET: "(#12.3) no Lease is deleted or reset by hand",
    Hole.INIT_REUSE: (
        "(#12.6) kubelet reuses init containers' devices in the plan's (sorted) order, not in "
        "arbitrary order"
    ),
    Hole.CANCEL_AFTER_WRITE: "(#12.7) a bind is never cancelled once its binding write was sent",
    Hole.DOUBLE_BIND: (
        "(#12.8) kube-scheduler never gives up on a bind in flight, and does not schedule a pod "
        "again while a binding request of it (from a crashed replica, or one whose answer was "
        "lost) may still land, so a pod is never bound by two calls at once"
    ),
    Hole.ORPHANED_LOCK: (
        "(new) a lock left by a holder that is gone or bound elsewhere blocks its devices "
        "forever: filter counts the Lease holder's assignment as taken unless the cache saw the "
        "holder deleted or terminal, and takeover happens only inside a Bind that filter then "
        "never sends there.  Avoided: no extender restarts while a Lease is held by a pod that "
        "no longer exists (a restart loses the cache's tombstone), and kube-scheduler retries "
        "a pod whose bind died holding a lock on that same node"
    ),
    Hole.LATE_READ: (
        "(#11) a Lease read's answer is never taken in after a watch event newer than it: no "
        "GET is answered late"
    ),
    Hole.LATE_BINDING: (
        "the API server never applies a binding after its client's timeout (a request whose "
        "client went away is dropped at once)"
    ),
    Hole.REJECTED_MID_HANDOFF: (
        "kubelet never rejects a pod after Allocate answered one of its containers"
    ),
    Hole.LISTED_REJECTED_POD: (
        "(#29.1) kubelet's PodResources List returns active pods only (1.34+ with "
        "KubeletPodResourcesListUseActivePods on), never a rejected or finished pod"
    ),
    Hole.SERVED_AFTER_CHECKPOINT_LOSS: (
        "(#31.1) kubelet never loses a device record: it never dies between the plugin's "
        "answer and its checkpoint write, and its checkpoint survives every restart"
    ),
    Hole.PROGRESS_AHEAD_OF_KUBELET: (
        "(new) the same as served-after-checkpoint-loss: the plugin's progress of a handoff "
        "counts a container kubelet has no record of only if kubelet never loses one"
    ),
    Hole.ABANDONED_BIND_WRITES: (
        "(#31.2) kube-scheduler stops waiting for a bind only while it is queued or after its "
        "binding was sent, never between its turn and its binding"
    ),
    Hole.QUEUE_ORDER: (
        "kube-scheduler never sends a replica a second bind to a node while one to that node is "
        "under way there, so no queue holds two binds"
    ),
    Hole.HOLDER_SLICE: (
        "(#31.6) no pod takes a slice of a sharing node's GPU while a lock holder of that node "
        "is not yet seen bound: no slice pods are created"
    ),
    Hole.SLICE_CAPACITY: "no slice pods are created (every pod asks for whole GPUs)",
    Hole.MIG_RELEASE: (
        "no pod asks for more than one resource (whole GPUs and MIG instances, or two MIG "
        "profiles): no mixed pods are created"
    ),
    Hole.MIG_HOLDER: "no MIG pods are created (every pod asks for whole GPUs or slices)",
    Hole.MIG_PROGRESS_AHEAD: (
        "kubelet writes its device checkpoint once per container, after the Allocate "
        "of each of its resources (manager.go allocateContainerResources: the loop over the "
        "container's limits, then writeCheckpoint; v1.31.9 lines 836 and 919, v1.37.2 lines "
        "871 and 959).  A kubelet that dies after the plugin answered one resource of a "
        "container asks for that container's resources again after its restart, in its map "
        "order.  When it asks for another resource first, the plugin confirms its progress "
        "against kubelet's records of that resource only (decide.kubelet_confirmed keeps the "
        "other resources' entries), counts the lost one as served, and releases the lock "
        "allocated with that answer; kubelet's call for the lost resource then finds no holder "
        "and the pod fails.  Avoided: kubelet never loses the record of a container that asks "
        "for several resources"
    ),
    Hole.ABANDONED_RETRY: (
        "(new) a bind call for a pod arriving while an earlier call for that pod and node is "
        "still under way on the same replica is not in Binder._deadlines (only the first call's "
        "deadline is), so when kube-scheduler stops waiting for it after the first call ended, "
        "abandon() reaches nothing and the bind goes on to write the Lease and send its "
        "binding.  Avoided: kube-scheduler never sends a replica a bind for a pod and node "
        "while an earlier one for them is under way there"
    ),
    Hole.BINDING_PAST_DEADLINE: (
        "(new) a binding sent when the bind's deadline is nearer than the end of its binding "
        "window gets the deadline as its timeout; when its answer does not come, the GET that "
        "checks whether it landed (Binder._bound_anyway) is past the deadline, its "
        "BindCancelled is not caught there, and keep_lock_after releases the lock while the "
        "binding may still land (the API server applies it up to its request timeout later).  "
        "Avoided: a bind never takes the lock after its wait's end (a head that is ready only "
        "after its wait ended gives up instead), so its binding window ends before its deadline"
    ),
    Hole.SWEEP_IN_HANDOFF: (
        "the extender's sweep (Binder.release_expired_left) releases an expired lock whose "
        "holder is still Pending on the node and not admitted, so the next bind takes the free "
        "lock while kubelet may still admit the holder.  Avoided: the extender never sweeps"
    ),
    Hole.SWEEP_BOUND_HERE: (
        "the extender's sweep (Binder.release_bound_elsewhere) releases a held lock whose holder "
        "is bound to that lock's own node and not admitted yet, so the next bind takes the free "
        "lock while kubelet may still admit the holder.  Avoided: the extender never sweeps"
    ),
    Hole.ENDED_UNSEEN: (
        "(issue 52) the lock of a holder that ended (Failed, Succeeded, deleted) is released at "
        "once, by the extender's sweep (Binder.release_ended) and by the device plugin "
        "(Admission.release_ended); a holder the view has merely not seen yet (a replica's "
        "cache lagging behind its Lease watch) taken for deleted releases the lock while "
        "kubelet may still admit it.  Avoided: neither part releases the lock of a holder that "
        "ended (the extender never sweeps)"
    ),
    Hole.REJECTED_RELEASED_UNSERVED: (
        "(issue 52, decision 0012) a holder kubelet rejected because the node's device plugin "
        "did not serve is released at once by the extender's sweep: the node's next pod is "
        "bound at once and rejected too, a burst drains into a node whose plugin is down.  "
        "Avoided: no plugin ever stops serving (BrakeModel is not used)"
    ),
    Hole.STATIC_POD_FALLBACK: (
        "(issue 51 F1) kubelet admits a static pod the API server does not know while the lock's "
        "holder is bound and not admitted and kubelet's PodResources List fails (after a kubelet "
        "restart); GetPreferredAllocation steers kubelet to the holder's devices and Allocate, "
        "deciding from the API server's view (bystanders), which cannot see the static pod, "
        "serves it the holder's devices and releases the lock.  Avoided: no static pods"
    ),
}

# The holes of the current code.  Remove a hole here once its fix is merged.
KNOWN_HOLES: frozenset[Hole] = frozenset(Hole) - {
    Hole.BYPASS_POD,  # fixed: Allocate refuses (keeping the lock) unless kubelet's own
    # PodResources List holds the holder as the one pod that may still await devices
    Hole.STALE_LEASE_VIEW,  # fixed: a holder that left the handoff is refused; Allocate is
    # decided from fresh reads only
    Hole.INIT_REUSE,  # fixed: any subset of the pod's unserved pool is served
    Hole.LEASE_RESET,  # fixed: no last holder -> LIST; the Lease re-checked before the binding
    Hole.CANCEL_AFTER_WRITE,  # fixed: keep_lock_after keeps the lock once the binding was sent
    Hole.DOUBLE_BIND,  # fixed: a second bind of a lock-holding pod fails, and never re-acquires
    # the lock (reacquire=False) even when its replica's Lease view has not shown it held
    Hole.ORPHANED_LOCK,  # fixed: filter counts a holder bound elsewhere by its own annotations,
    # and leaves out an expired lock's copy when the cache has no record of its holder
    Hole.LATE_READ,  # fixed: Observations keeps the resourceVersion order for reads too
    Hole.LATE_BINDING,  # fixed: binding_may_still_land keeps a never-bound holder's lock
    Hole.REJECTED_MID_HANDOFF,  # fixed: an interrupted handoff of a pod that left is dropped
    Hole.LISTED_REJECTED_POD,  # fixed: a finished or rejected pod kubelet lists never blocks
    Hole.SERVED_AFTER_CHECKPOINT_LOSS,  # fixed: a served pod counts until kubelet records its
    # devices, on the List path and the fallback path alike
    Hole.PROGRESS_AHEAD_OF_KUBELET,  # fixed: the holder's progress counts a container as served
    # only while kubelet's checkpoint records it (decide.kubelet_confirmed)
    Hole.ABANDONED_BIND_WRITES,  # fixed: the bind's deadline is cancelled with its caller and
    # checked before every write (BindDeadline.check)
    Hole.QUEUE_ORDER,  # never a hole: only the head of a node's queue takes its turn
    Hole.HOLDER_SLICE,  # fixed: each of the holder's GPUs counts as held whole on a sharing node,
    # also one with known slices (scheduler_ext.verbs.with_holder)
    Hole.SLICE_CAPACITY,  # never a hole: room_for keeps a GPU's slices within its memory
    Hole.ABANDONED_RETRY,  # fixed: abandon cancels every call under way for the pod and
    # node (scheduler_ext.deadline.CallDeadlines)
    Hole.BINDING_PAST_DEADLINE,  # fixed: Binder._bound_anyway answers "not bound" when its GET
    # is past the deadline, so the lock is kept as for any unknown outcome
    Hole.MIG_RELEASE,  # never a hole: the lock is released after the last container of every
    # resource the pod asks for (deviceplugin.decide._all_served)
    Hole.MIG_HOLDER,  # never a hole: the holder's instances are devices of its assignment,
    # taken like its GPUs (scheduler_ext.verbs.with_holder)
    Hole.MIG_PROGRESS_AHEAD,  # fixed: a container's entry of another resource counts while
    # kubelet's List or checkpoint holds its devices (decide.kubelet_confirmed, held_other)
    Hole.SWEEP_IN_HANDOFF,  # never a hole: the sweep releases only on a cached judgement that
    # allows (takeover.expired_and_left: gone, finished, admitted, bound elsewhere)
    Hole.SWEEP_BOUND_HERE,  # never a hole: the sweep releases only a holder the cache saw bound
    # to another node (takeover.bound_elsewhere)
    Hole.ENDED_UNSEEN,  # never a hole: only a pod seen Failed or Succeeded, or seen deleted,
    # has ended (handoff.holder.ended)
    Hole.REJECTED_RELEASED_UNSERVED,  # fixed by decision 0012: an extender never releases a
    # rejected holder at once (handoff.holder.released_by_extender), the plugin only serving
    Hole.STATIC_POD_FALLBACK,  # fixed (issue 51): a List that fails on kubelet's socket refuses
    # (decide.another_pod_may_be_admitted), and the preference follows the same rule
}

# The invariants a hole is expected to break (its finding test checks the model breaks one).
BREAKS: dict[Hole, frozenset[str]] = {
    Hole.BYPASS_POD: frozenset({"S2"}),
    Hole.STALE_LEASE_VIEW: frozenset({"S1", "S2"}),
    Hole.LEASE_RESET: frozenset({"S1", "S2"}),
    Hole.INIT_REUSE: frozenset({"L1"}),
    Hole.CANCEL_AFTER_WRITE: frozenset({"S2", "S4"}),
    Hole.DOUBLE_BIND: frozenset({"S4", "L1"}),
    Hole.ORPHANED_LOCK: frozenset({"L1"}),
    Hole.LATE_READ: frozenset({"V1"}),
    Hole.LATE_BINDING: frozenset({"S1", "S3", "S4"}),
    Hole.REJECTED_MID_HANDOFF: frozenset({"L1"}),
    Hole.LISTED_REJECTED_POD: frozenset({"L1"}),
    Hole.SERVED_AFTER_CHECKPOINT_LOSS: frozenset({"S1", "S2"}),
    Hole.PROGRESS_AHEAD_OF_KUBELET: frozenset({"S2"}),
    Hole.ABANDONED_BIND_WRITES: frozenset({"W2"}),
    Hole.QUEUE_ORDER: frozenset({"W1"}),
    Hole.HOLDER_SLICE: frozenset({"F1"}),
    Hole.SLICE_CAPACITY: frozenset({"S1"}),
    Hole.ABANDONED_RETRY: frozenset({"W2"}),
    Hole.BINDING_PAST_DEADLINE: frozenset({"S1", "S3", "S4"}),
    Hole.MIG_RELEASE: frozenset({"S1", "S2", "L1"}),
    Hole.MIG_HOLDER: frozenset({"F1", "S1"}),
    Hole.MIG_PROGRESS_AHEAD: frozenset({"S2"}),
    Hole.SWEEP_IN_HANDOFF: frozenset({"S3"}),
    Hole.ENDED_UNSEEN: frozenset({"S3"}),
    Hole.REJECTED_RELEASED_UNSERVED: frozenset({"R1"}),
    Hole.SWEEP_BOUND_HERE: frozenset({"S3"}),
    Hole.STATIC_POD_FALLBACK: frozenset({"S1", "S2"}),
}


def _patched(targets: dict[str, object]) -> Callable[[], AbstractContextManager[None]]:
    """A plant that replaces each ``module.attribute`` of ``targets`` while it is active."""

    @contextmanager
    def plant() -> Iterator[None]:
        with ExitStack() as stack:
            for where, value in targets.items():
                stack.enter_context(mock.patch(where, value))
            yield

    return plant


def _never(*_args: object, **_kwargs: object) -> bool:
    return False


# Each plant reverts the fix of its hole (see the module docstring).
PLANTS: dict[Hole, Callable[[], AbstractContextManager[None]]] = {
    # the takeover guard for a binding that may still land, deleted
    Hole.LATE_BINDING: _patched({"scheduler_ext.takeover.binding_may_still_land": _never}),
    # entries of another resource than the one kubelet asks for stand, held by kubelet or not
    Hole.MIG_PROGRESS_AHEAD: _patched(
        {"deviceplugin.decide.kubelet_confirmed": reverted.kubelet_confirmed_one_resource}
    ),
    # the drop of an interrupted handoff whose pod left (kubelet rejected it after Allocate)
    Hole.REJECTED_MID_HANDOFF: _patched({"deviceplugin.decide.handoff_abandoned": _never}),
    # the rule of who kubelet may be admitting as it was before #29 and #31: a listed pod's
    # phase ignored; a pod this plugin served skipped whatever kubelet records of it
    Hole.LISTED_REJECTED_POD: _patched(
        {"deviceplugin.decide.kubelet_admitting": reverted.kubelet_admitting}
    ),
    # (and GetPreferredAllocation's steering by the same rule, issue 51, which otherwise hides
    # it: kubelet is then steered off the holder's devices, and Allocate refuses the mismatch)
    Hole.SERVED_AFTER_CHECKPOINT_LOSS: _patched(
        {
            "deviceplugin.decide.kubelet_admitting": reverted.kubelet_admitting,
            "deviceplugin.decide.bystanders": reverted.bystanders,
            "deviceplugin.decide.decide_preferred": reverted.decide_preferred_unsteered,
        }
    ),
    # the holder's progress trusted as it stands, whatever kubelet recorded of its containers
    Hole.PROGRESS_AHEAD_OF_KUBELET: _patched(
        {"deviceplugin.decide.kubelet_confirmed": reverted.kubelet_confirmed}
    ),
    # a bind's deadline checked for time alone, its caller's leaving ignored (before #31.2, a
    # caller that left was noticed only while its bind waited in the queue)
    Hole.ABANDONED_BIND_WRITES: _patched(
        {"scheduler_ext.deadline.BindDeadline.check": reverted.deadline_check}
    ),
    # the head check deleted: every waiter takes itself for its queue's head
    Hole.QUEUE_ORDER: _patched({"scheduler_ext.waiting.BindQueues.position": reverted.position}),
    # with_holder's early return when the holder's GPUs are taken already, before #31.6
    Hole.HOLDER_SLICE: _patched({"scheduler_ext.verbs.with_holder": reverted.with_holder}),
    # the memory check deleted from the room a GPU has for a slice
    Hole.SLICE_CAPACITY: _patched(
        {
            "handoff.sharing.room_for": reverted.room_for,
            "scheduler_ext.sharing.room_for": reverted.room_for,
        }
    ),
    # only the first call under way for a pod and node kept, so abandon misses a retry
    Hole.ABANDONED_RETRY: _patched(
        {"scheduler_ext.deadline.CallDeadlines.begin": reverted.first_call_begin}
    ),
    # the GET past the deadline in _bound_anyway not caught: the lock is released
    Hole.BINDING_PAST_DEADLINE: _patched({"tests.model.extender.UNKNOWN_WHEN": ()}),
    # the release after the last container of the resource asked for, not of every resource
    Hole.MIG_RELEASE: _patched(
        {"deviceplugin.decide._all_served": reverted.all_served_one_resource}
    ),
    # the holder's MIG instances left out of what filter and Bind count as taken
    Hole.MIG_HOLDER: _patched({"scheduler_ext.verbs.with_holder": reverted.with_holder_gpus_only}),
    # the sweep's judgement of the holder deleted: every expired lock is released
    Hole.SWEEP_IN_HANDOFF: _patched(
        {"scheduler_ext.takeover.expired_and_left": reverted.expired_and_left_unjudged}
    ),
    # the sweep's check of the holder's node deleted: a lock whose holder is bound anywhere is
    # released
    Hole.SWEEP_BOUND_HERE: _patched(
        {"scheduler_ext.takeover.bound_elsewhere": reverted.bound_anywhere}
    ),
    # the extender releases a rejected holder at once, as the plugin does once it serves
    Hole.REJECTED_RELEASED_UNSERVED: _patched(
        {"scheduler_ext.takeover.released_by_extender": reverted.released_by_anyone}
    ),
    # a holder not in the view counts as deleted, seen so or not
    Hole.ENDED_UNSEEN: _patched(
        {
            "scheduler_ext.takeover.ended": reverted.ended_unseen_gone,
            "deviceplugin.decide.ended": reverted.ended_unseen_gone,
        }
    ),
    # before issue 51: a List that failed for any reason decided by the API server's view
    # (bystanders), kubelet's socket there or not; the preference steered to the holder's
    # devices whoever kubelet was admitting
    Hole.STATIC_POD_FALLBACK: _patched(
        {
            "deviceplugin.decide.another_pod_may_be_admitted": (
                reverted.another_pod_may_be_admitted_fallback
            ),
            "deviceplugin.decide.decide_preferred": reverted.decide_preferred_unsteered,
        }
    ),
}
