"""The extender's Kubernetes Events: what a bind waited for, why it was refused, an expired lock
taken over, and a lock released because its holder ended, on the pod (``kubectl describe pod``)
and the node (``describe node``).

Guarantees: the messages name the node, the lock's holder and its fencing token where known;
writes are rate-limited per object and reason and never delay or fail a bind
(``kube.events.EventRecorder``).
"""

from __future__ import annotations

from handoff.holder import RELEASED_EVENT, Ended, released_message
from kube.events import EventRecorder, EventType, ObjectRef
from lockd.model import FencingToken, Holder, LockRecord, NodeLockView, NodeName
from scheduler_ext.metrics import Result
from scheduler_ext.protocol import BindingArgs

WAITING = "WaitingForNodeLock"
REFUSED = "BindRefused"
TAKEOVER = "NodeLockTakenOver"
# a bind still waiting this long says so on its pod (shorter: no Event): half the default wait
# budget.  In a burst on a busy machine a bind's turn comes after 1-2 s; an Event for each such
# wait was a fourth to a half of an API write per pod that nobody would read in time.
NOTICE_AFTER_S = 2.0


def waiting_message(
    args: BindingArgs, view: NodeLockView, budget_s: float, waited_s: float
) -> str | None:
    """Why the bind of ``args`` waits, when another pod holds the node's lock (else None)."""
    holder = view.record.holder
    if holder is None or holder.uid == args.pod_uid:
        return None
    return (
        f"node {args.node}'s GPU lock is held by {holder.key} (token {view.record.token}, "
        f"held {view.held_for_s:.1f}s{', expired' if view.expired else ''}); this bind has "
        f"waited {waited_s:.1f}s and waits its turn for up to {budget_s:g}s"
    )


class BindEvents:
    """The extender's Events over one recorder."""

    def __init__(
        self, recorder: EventRecorder, *, budget_s: float, notice_after_s: float = NOTICE_AFTER_S
    ) -> None:
        self.recorder = recorder
        self.budget_s = budget_s
        self.notice_after_s = notice_after_s  # the caller asks ``still_waiting`` after that

    def still_waiting(self, args: BindingArgs, view: NodeLockView | None, waited_s: float) -> None:
        """A bind is still waiting ``notice_after_s`` after it arrived: say so on the pod when
        another pod holds the node's lock.  The waits of a burst that the nodes serve sooner
        write no Event: each would be an API write per pod for a wait nobody notices."""
        if view is None:
            return
        message = waiting_message(args, view, self.budget_s, waited_s)
        if message is not None:
            pod = ObjectRef.pod(args.key, args.pod_uid)
            self.recorder.record(pod, EventType.NORMAL, WAITING, message)

    def bind_failed(self, args: BindingArgs, result: Result, error: str) -> None:
        """A bind answered with ``error``: on the pod, with the reason kube-scheduler got."""
        if result is Result.BAD_REQUEST:
            return
        pod = ObjectRef.pod(args.key, args.pod_uid)
        self.recorder.record(
            pod, EventType.WARNING, REFUSED, f"bind to {args.node} ({result.value}): {error}"
        )

    def takeover(self, record: LockRecord, why: str) -> None:
        """An expired lock is about to be taken over: on the node and the previous holder."""
        holder = record.holder
        who = holder.key if holder is not None else "nobody"
        message = (
            f"node {record.node}'s GPU lock held by {who} (token {record.token}) expired and "
            f"is taken over: {why}"
        )
        self.recorder.record(ObjectRef.node(record.node), EventType.WARNING, TAKEOVER, message)
        if holder is not None and "/" in holder.key:
            pod = ObjectRef.pod(holder.key, holder.uid)
            self.recorder.record(pod, EventType.WARNING, TAKEOVER, message)

    def released_ended(
        self, node: NodeName, holder: Holder, token: FencingToken, end: Ended
    ) -> None:
        """The lock of a holder that ended was released: on the node and the holder pod."""
        message = released_message(node, holder.key, token, end)
        self.recorder.record(ObjectRef.node(node), EventType.WARNING, RELEASED_EVENT, message)
        if "/" in holder.key:
            pod = ObjectRef.pod(holder.key, holder.uid)
            self.recorder.record(pod, EventType.WARNING, RELEASED_EVENT, message)
