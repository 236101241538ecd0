"""The device plugin's Kubernetes Events: an Allocate refused, and why, where admins look; the
lock of a holder that ended released.

kubelet's Allocate names devices, not a pod; the pod being admitted is the node lock's holder
when there is one.  So a refusal is reported on the holder pod (``kubectl describe pod``) when
the lock names one, else on the Node (``kubectl describe node``).

Guarantees: rate-limited per object and refusal kind, never delays or fails an Allocate
(``kube.events.EventRecorder``).
"""

from __future__ import annotations

from deviceplugin.decide import EndedHolder, Refusal
from handoff.holder import RELEASED_EVENT, released_message
from kube.events import EventRecorder, EventType, ObjectRef
from lockd.model import Holder, NodeName

REFUSED = "AllocateRefused"
FALLBACK = "KubeletListUnavailable"


class AllocateEvents:
    """One node's Allocate refusals as Events."""

    def __init__(self, recorder: EventRecorder, node: NodeName) -> None:
        self.recorder = recorder
        self.node = node

    def refused(self, refusal: Refusal, holder: Holder | None) -> None:
        message = (
            f"kubelet's Allocate on node {self.node} refused ({refusal.kind.value}): "
            f"{refusal.message}"
        )
        if holder is not None and "/" in holder.key:
            target = ObjectRef.pod(holder.key, holder.uid)
            message += f" (the node lock's holder is {holder.key})"
        else:
            target = ObjectRef.node(self.node)
        self.recorder.record(target, EventType.WARNING, REFUSED, message)

    def fallback(self, message: str) -> None:
        """kubelet's PodResources List could not be read: Allocate decided from the API server
        and kubelet's checkpoint instead (an Event on the node)."""
        self.recorder.record(ObjectRef.node(self.node), EventType.WARNING, FALLBACK, message)

    def released_ended(self, found: EndedHolder) -> None:
        """The lock of a holder that ended was released by this plugin: on the node and the
        holder pod (the same Event the extender writes when its release was first)."""
        holder = found.holder
        message = released_message(self.node, holder.key, found.token, found.end)
        self.recorder.record(ObjectRef.node(self.node), EventType.WARNING, RELEASED_EVENT, message)
        if "/" in holder.key:
            pod = ObjectRef.pod(holder.key, holder.uid)
            self.recorder.record(pod, EventType.WARNING, RELEASED_EVENT, message)
