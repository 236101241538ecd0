"""The plugin's rules as they stood before their fixes: who kubelet may be admitting (before
issues #29 and #31), and how far the plugin trusts its own progress of a handoff (before
``progress-ahead-of-kubelet`` was fixed).

Planted by ``holes.PLANTS`` (``python -m tests.model --hole NAME --planted``) to show that the
model finds what those rules got wrong: a rejected or finished pod that kubelet's PodResources
``List`` still returns (Kubernetes before 1.34, or with ``KubeletPodResourcesListUseActivePods``
off) counted as a pod that may await devices; a pod this plugin served skipped even when
kubelet had lost its record and asks Allocate for it again; and a container of the holder
counted as served although kubelet lost its record and asks for it again.  Kept verbatim (the
project's own code at that time); nothing else imports it.

The extender's rules that a plant deletes or reverts (``deadline_check``, ``position``,
``with_holder``, ``room_for``, ``first_call_begin``) are written from the project's functions
with the one check taken out that the plant is about; each docstring names it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from deviceplugin.decide import (
    Context,
    HandoffProgress,
    KubeletAdmission,
    KubeletRecords,
    KubeletUnreadable,
    PodJSON,
    Preference,
    Refusal,
    gpu_containers,
)
from deviceplugin.decide import another_pod_may_be_admitted as _another_pod_may_be_admitted
from deviceplugin.decide import decide_preferred as _decide_preferred
from deviceplugin.decide import kubelet_confirmed as _kubelet_confirmed
from handoff.audit import KubeletPod
from handoff.holder import Ended, PodFacts, ended
from handoff.holder import holder_status as handoff_status
from handoff.sharing import FULL_CORES, WHOLE, Slice, Use
from handoff.wire import (
    GPU,
    LEASE_ASSIGNMENT,
    Keys,
    MalformedAnnotation,
    parse_assignment,
)
from lockd.model import Holder, HolderKey, NodeName
from scheduler_ext.choose import NodeGPUs, devices_of
from scheduler_ext.deadline import BindCancelled, BindDeadline, CallDeadlines
from scheduler_ext.sharing import sharing_node
from scheduler_ext.takeover import Judgement
from scheduler_ext.verbs import DEFAULT_KEYS


def kubelet_admitting(
    listed: Sequence[KubeletPod],
    specs: Mapping[str, PodJSON | None],
    holder: HolderKey,
    served_pods: Collection[str],
    ctx: Context,
    *,
    holder_pod: PodJSON | None = None,
    **_later: object,
) -> KubeletAdmission:
    """``deviceplugin.decide.kubelet_admitting`` before #29/#31 (extra keywords ignored)."""
    holder_listed = False
    others: list[str] = []
    for entry in listed:
        if entry.key == holder:
            holder_listed = holder_pod is None or _may_await(entry, holder_pod, ctx)
            continue
        spec = specs.get(entry.key)
        if spec is None:
            others.append(f"{entry.key} (unknown)")
            continue
        uid = str((spec.get("metadata") or {}).get("uid") or "")
        if uid and uid in served_pods:
            continue
        if _may_await(entry, spec, ctx):
            others.append(entry.key)
    return KubeletAdmission(holder_listed, tuple(sorted(others)))


def _may_await(entry: KubeletPod, spec: PodJSON, ctx: Context) -> bool:
    try:
        wanted = gpu_containers(spec, ctx.resource)
    except ValueError:
        return True
    if not wanted:
        return False
    names = [c for c, _ in wanted]
    if any(c in entry.containers and not entry.containers[c] for c in names):
        return True
    uid = str((spec.get("metadata") or {}).get("uid") or "")
    init_only = not any(c in entry.containers for c in names)
    return init_only and handoff_status(spec, uid=uid, node=ctx.node).in_handoff


def bystanders(
    bound_here: Sequence[PodJSON],
    holder_uid: str,
    served_pods: Collection[str],
    ctx: Context,
    **_later: object,
) -> list[str]:
    """``deviceplugin.decide.bystanders`` before #31 (extra keywords ignored)."""
    out: list[str] = []
    for other in bound_here:
        meta = other.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid or uid == holder_uid or uid in served_pods:
            continue
        try:
            if not gpu_containers(other, ctx.resource):
                continue
        except ValueError:
            pass
        if handoff_status(other, uid=uid, node=ctx.node).in_handoff:
            meta_ns, meta_name = meta.get("namespace", "?"), meta.get("name", "?")
            out.append(f"{meta_ns}/{meta_name} (uid {uid})")
    return sorted(out)


def kubelet_confirmed(
    progress: HandoffProgress, *_later: object, **_named: object
) -> HandoffProgress:
    """``deviceplugin.decide.kubelet_confirmed`` before its fix: the plugin's progress of the
    holder's handoff stood as it was, whatever kubelet recorded."""
    return progress


def kubelet_confirmed_one_resource(
    progress: HandoffProgress,
    recorded: KubeletRecords | None,
    resource: str,
    *,
    held_other: object = None,
) -> HandoffProgress:
    """``deviceplugin.decide.kubelet_confirmed`` before the ``mig-progress-ahead`` fix: entries
    of resources other than ``resource`` stood as they were, whatever kubelet held."""
    return _kubelet_confirmed(progress, recorded, resource)


def deadline_check(self: BindDeadline, step: str, *, write: bool = True) -> float:
    """``BindDeadline.check`` without #31.2's cancellation: the deadline alone counts, so a bind
    whose caller left goes on writing once its wait is over (``write`` ignored)."""
    left = self.left_s()
    if left <= 0:
        raise BindCancelled(step, "past its deadline")
    return left


def position(self: Any, node: NodeName, waiter: Any) -> int:
    """``BindQueues.position`` with the queue's order deleted: every waiter is the head."""
    return 0


def with_holder(
    gpus: NodeGPUs,
    holder: Holder | None,
    *,
    pod_uid: str | None = None,
    keys: Keys = DEFAULT_KEYS,
    finished: Callable[[str], bool] | None = None,
) -> NodeGPUs:
    """``scheduler_ext.verbs.with_holder`` before #31.6: the holder's GPUs already taken (by
    known slices, on a sharing node) return the picture as it was, so the holder's own slice
    is not counted there."""
    if holder is None:
        return gpus
    if pod_uid is not None and holder.uid == pod_uid:
        return gpus
    if finished is not None and finished(holder.uid):
        return gpus
    raw = holder.data.get(LEASE_ASSIGNMENT)
    if raw is None:
        return gpus
    try:
        devices = devices_of(parse_assignment(raw, key=keys.assignment))
    except MalformedAnnotation:
        return gpus
    if devices <= gpus.taken:
        return gpus
    if sharing_node(gpus.devices):
        extra = tuple((d, WHOLE) for d in sorted(devices))
        return replace(gpus, taken=gpus.taken | devices, held=(*gpus.held, *extra))
    return replace(gpus, taken=gpus.taken | devices)


def room_for(gpu: GPU, use: Use, claim: Slice, split: int) -> str | None:
    """``handoff.sharing.room_for`` with its memory check deleted."""
    if not gpu.healthy:
        return "unhealthy"
    if use.exclusive:
        return "held whole by another pod"
    if claim.exclusive:
        return None if use.empty else f"shared by {use.slices} pods"
    if use.slices >= split:
        return f"all {split} slices in use"
    if use.cores + claim.cores > FULL_CORES:
        return f"{FULL_CORES - use.cores}% cores free"
    return None


def first_call_begin(self: CallDeadlines, node: str, uid: str, deadline: BindDeadline) -> None:
    """``CallDeadlines.begin`` before ``abandoned-retry`` was fixed: only the first call under
    way for a pod and node is kept, so a retry that arrives while it runs is out of
    ``cancel``'s reach once the first call ended."""
    calls = self._calls.setdefault((node, uid), [])
    if not calls:
        calls.append(deadline)


def all_served_one_resource(pod: PodJSON | None, progress: HandoffProgress, ctx: Context) -> bool:
    """``deviceplugin.decide._all_served`` with the other resources deleted: the lock is
    released once the last container of the resource kubelet asked for (``ctx.resource``) was
    served, whatever the pod still awaits of the node's other resources (MIG instances, or
    whole GPUs after a MIG resource's call)."""
    served = {(c, progress.resource_at(i)) for i, c in enumerate(progress.served)}
    try:
        wanted = gpu_containers(pod or {}, ctx.resource)
    except ValueError:
        return True
    return all((c, ctx.resource) in served for c, _ in wanted)


def with_holder_gpus_only(
    gpus: NodeGPUs,
    holder: Holder | None,
    *,
    pod_uid: str | None = None,
    keys: Keys = DEFAULT_KEYS,
    finished: Callable[[str], bool] | None = None,
) -> NodeGPUs:
    """``scheduler_ext.verbs.with_holder`` with the holder's MIG instances left out: only the
    whole GPUs of the Lease's copy of its assignment count as taken, so filter and Bind see
    the instances of a holder not yet seen bound as free."""
    if holder is None or (pod_uid is not None and holder.uid == pod_uid):
        return gpus
    if finished is not None and finished(holder.uid):
        return gpus
    raw = holder.data.get(LEASE_ASSIGNMENT)
    if raw is None:
        return gpus
    try:
        devices = devices_of(parse_assignment(raw, key=keys.assignment))
    except MalformedAnnotation:
        return gpus
    instances = {g.id for g in gpus.mig}
    devices = frozenset(d for d in devices if d not in instances)
    if sharing_node(gpus.devices):
        extra = tuple((d, WHOLE) for d in sorted(devices))
        return replace(gpus, taken=gpus.taken | devices, held=(*gpus.held, *extra))
    return replace(gpus, taken=gpus.taken | devices)


def expired_and_left_unjudged(
    held: Mapping[NodeName, Holder],
    *,
    expired: Callable[[NodeName], bool],
    cached_judgement: Callable[[NodeName, Holder], Judgement],
) -> list[tuple[NodeName, Holder, str]]:
    """``scheduler_ext.takeover.expired_and_left`` with the holder's judgement taken out: every
    expired lock counts as left behind."""
    del cached_judgement
    return [(node, holder, "expired") for node, holder in sorted(held.items()) if expired(node)]


def bound_anywhere(
    held: Mapping[NodeName, Holder], node_of: Callable[[str], NodeName | None]
) -> list[tuple[NodeName, Holder]]:
    """``scheduler_ext.takeover.bound_elsewhere`` without its check of the node: every held lock
    whose holder the cache saw bound, to any node, counts as left behind."""
    return [(node, holder) for node, holder in sorted(held.items()) if node_of(holder.uid)]


def decide_preferred_unsteered(*args: Any, **named: Any) -> Preference:
    """``deviceplugin.decide.decide_preferred`` before issue 51: the holder's devices preferred
    whoever kubelet may be admitting (the ``kubelet`` and ``bound_here`` sources ignored)."""
    named.pop("kubelet", None)
    named.pop("bound_here", None)
    return _decide_preferred(*args, **named)


def ended_unseen_gone(
    facts: PodFacts | None, *, uid: str, seen_gone: bool, failed_before_gone: bool = False
) -> Ended | None:
    """``handoff.holder.ended`` with ``seen_gone`` ignored: a holder missing from the view
    counts as deleted, as if the view could not lag."""
    del seen_gone
    return ended(facts, uid=uid, seen_gone=True, failed_before_gone=failed_before_gone)


def released_by_anyone(end: Ended) -> bool:
    """``handoff.holder.released_by_extender`` as issue 52's first attempt had it: every holder
    that ended, a rejected one too, is released at once by an extender."""
    del end
    return True


def another_pod_may_be_admitted_fallback(
    holder_pod: str,
    holder_uid: str,
    ctx: Context,
    *,
    kubelet: KubeletAdmission | KubeletUnreadable | None,
    bound_here: Sequence[PodJSON] = (),
    recorded: KubeletRecords | None = None,
    served_pods: Collection[str] = (),
) -> Refusal | None:
    """``deviceplugin.decide.another_pod_may_be_admitted`` before issue 51: a ``List`` that
    failed for any reason, kubelet's socket there or not, decided by the API server's view
    (``bystanders`` over the pods bound here and kubelet's checkpoint), which cannot see a
    static pod."""
    if isinstance(kubelet, KubeletUnreadable):
        kubelet = None
    return _another_pod_may_be_admitted(
        holder_pod,
        holder_uid,
        ctx,
        kubelet=kubelet,
        bound_here=bound_here,
        recorded=recorded,
        served_pods=served_pods,
    )
