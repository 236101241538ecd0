"""The plugin's side of pod admission: read the lock and its holder, decide, record, release.

The decisions are ``deviceplugin.decide``'s; this module only gathers their inputs (the node's
Lease from the ``NodeLocks`` watch, one GET of the holder pod per Allocate call), writes the
checkpoint and releases the lock.  Calls are serialized (kubelet makes them one at a time anyway).

Guarantees:
- Allocate is decided from a fresh read of who kubelet is admitting: kubelet's own
  PodResources ``List`` on the node, with the holder's spec from the node's pod watch; a
  ``List`` that fails on kubelet's socket refuses the call (``decide.KubeletUnreadable``);
  only without a socket, one GET of the holder and one LIST of the pods bound here at the API
  server.  GetPreferredAllocation decides who kubelet may be admitting from the same reads
  (``_who_admits``, ``decide.another_pod_may_be_admitted``).  The
  Lease comes from its watch, and again from one GET when that decision refuses.  kubelet's
  view of the node runs ahead of any watch, and a watch-fed view can miss a takeover, a holder
  kubelet rejected, or the pod kubelet is admitting (docs/deviceplugin.md, "Fresh reads").  A
  lagging watch thus never fails a pod nor serves the wrong one.  GetPreferredAllocation (only
  a preference) tries the watch view first.
- Progress is written to the checkpoint before kubelet gets the answer; if it cannot be written
  the container is refused (kubelet then fails the pod) and the lock released ``rejected``.
  Every write fsyncs the new file before renaming it over the old one, so no crash leaves a
  torn or empty checkpoint (``deviceplugin.checkpoint``).  While the pod has containers left to
  serve the directory is fsynced too; for the last container's record (served, release
  pending) it is not: a process crash keeps that record all the same, and a power loss that
  undoes its rename brings back the previous checkpoint and leaves the lock under a holder
  kubelet admitted, which expires and may then be taken over (docs/deviceplugin.md, "The
  checkpoint").  A damaged checkpoint is set aside as ``<name>.damaged`` and the plugin starts
  from the safe state of a first start; only a checkpoint of another version or of another
  node is refused (``CheckpointError``: the plugin does not start).
- The progress counts a container as served only while kubelet's device checkpoint records it
  too, when that checkpoint can be read (``decide.kubelet_confirmed``): a kubelet that died
  after the answer and before writing its checkpoint asks for that container again, which gets
  its own assignment again, and the lock is released only with the last container answered.
- Every release is first recorded in the checkpoint (pending), then written; one that fails
  (API server unreachable) is retried in the background, also after a restart, until it is
  written or the Lease has moved on (``StaleToken``/``LockLost``: nothing to do).  So the plugin
  never leaks a lock it decided to release.
- The lock is released ``allocated`` right after the holder's last GPU container is answered, and
  ``rejected`` only when ``decide`` says the holder can never be served.  Every other refusal
  leaves the lock alone (docs/deviceplugin.md, "Lock paths").
- A holder the node's pod watch shows Failed, Succeeded or deleted (``decide.holder_ended``) has
  its lock released at once (``rejected``, ``finished``, ``deleted``), with no Allocate: looked
  at on every change of the pod watch, the Lease watch and of ``serving`` (``holder_changed``,
  ``run_ended_releases``).  A Failed (rejected) holder only once the plugin serves (``serving``:
  its ListAndWatch has sent kubelet the devices), never before: while it does not, kubelet
  would reject the next pod too, and the lock's expiry is the brake
  (``handoff.holder.released_by_plugin``).  A pod the watch has merely not shown is not taken
  for deleted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from deviceplugin import checkpoint
from deviceplugin.answer import ContainerAnswer, DeviceMode, container_answer
from deviceplugin.checkpoint import Checkpoint, PendingRelease
from deviceplugin.decide import (
    Allocation,
    Context,
    EndedHolder,
    HandoffProgress,
    KubeletAdmission,
    KubeletRecords,
    KubeletSightings,
    KubeletUnreadable,
    MismatchPolicy,
    OtherResources,
    PodJSON,
    Preference,
    Refusal,
    RefusalKind,
    admitted_before,
    check_request,
    decide_allocate,
    decide_preferred,
    handoff_abandoned,
    hint,
    holder_ended,
    kubelet_admitting,
    kubelet_records,
    sight,
    unknown_listed,
)
from deviceplugin.devices import DeviceState
from deviceplugin.kubeletview import KubeletViewError, PodResources, read_checkpoint
from deviceplugin.metrics import PluginMetrics, ReleaseResult
from deviceplugin.podwatch import NodePods
from handoff.audit import KubeletPod
from handoff.holder import released_by_plugin
from handoff.wire import DEFAULT_RESOURCE, GPU, DeviceID, Keys
from kube import failpoints
from kube.backoff import Backoff
from kube.client import KubeClient, pod_path
from kube.errors import ApiError, ApiUnavailable, NotFound
from lockd.errors import LockLost, StaleToken
from lockd.lease import MalformedLease
from lockd.locks import NodeLocks
from lockd.model import FencingToken, HeldLock, Holder, HolderKey, NodeLockView, NodeName, Outcome

API_RETRY_S = 30.0  # how long a read may keep failing (API server restart) before refusing
RELEASE_INLINE_S = 5.0  # how long Allocate waits for its release before leaving it to the retrier
RELEASE_BACKOFF_S = (0.2, 10.0)
# how often kubelet's List is read between Allocate calls, so that a pod kubelet admitted before
# the next holder is known as such (``decide.admitted_before``)
SIGHTING_PERIOD_S = 1.0

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreferenceAsk:
    """One container request of GetPreferredAllocation."""

    available: Sequence[str]
    must_include: Sequence[str]
    size: int


@dataclass(frozen=True)
class _WhoAdmits:
    """The holder's pod and who kubelet may be admitting, as read for one decision."""

    held: PodJSON | None
    kubelet: KubeletAdmission | KubeletUnreadable | None
    bound_here: list[PodJSON]
    recorded: KubeletRecords | None


class Admission:
    """Answers Allocate and GetPreferredAllocation for one node."""

    def __init__(
        self,
        *,
        node: NodeName,
        kube: KubeClient,
        locks: NodeLocks,
        state: DeviceState,
        checkpoint_file: Path,
        metrics: PluginMetrics,
        device_nodes: Callable[[Sequence[DeviceID]], list[str]] = lambda ids: [],
        resource: str = DEFAULT_RESOURCE,
        keys: Keys | None = None,
        policy: MismatchPolicy = MismatchPolicy.REFUSE,
        mode: DeviceMode = DeviceMode.DEVICE_NODES,
        api_retry_s: float = API_RETRY_S,
        pods: NodePods | None = None,
        on_refused: Callable[[Refusal, Holder | None], None] | None = None,
        on_ended: Callable[[EndedHolder], None] | None = None,
        serving: Callable[[], bool] = lambda: False,
        kubelet: PodResources | None = None,
        kubelet_checkpoint: Path | None = None,
        on_fallback: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kubelet = kubelet  # kubelet's PodResources List: who it admits (else a LIST)
        # kubelet's device checkpoint: which pods' devices kubelet records (None: not read)
        self._kubelet_checkpoint = kubelet_checkpoint
        self._on_fallback = on_fallback  # an Event on the node when List cannot be read
        self._clock = clock
        # listed pods the API server does not know, by namespace/name: when first seen so
        self._unknown_since: dict[str, float] = {}
        self._unknown_instance = ""  # the kubelet instance ``_unknown_since`` was timed on
        # which pods kubelet listed from which read on (``decide.sight``); one read at a time
        self._sightings = KubeletSightings()
        self._sight_lock = asyncio.Lock()
        self._on_refused = on_refused  # an Event on the holder pod (or the node)
        self._on_ended = on_ended  # an Event: the lock of a holder that ended was released
        # whether kubelet has this plugin's devices (ListAndWatch sent them): may a rejected
        # holder's lock be released at once (``handoff.holder.released_by_plugin``)
        self._serving = serving
        # set by the node's pod watch, the Lease watch and ListAndWatch's first answer: look
        # for a holder that ended
        self.holder_changed = asyncio.Event()
        self.node = node
        self._kube = kube
        self._locks = locks
        self._state = state
        self._file = checkpoint_file
        self._metrics = metrics
        self._device_nodes = device_nodes
        self._resource = resource
        self._keys = keys or Keys()
        self._policy = policy
        self._mode = mode
        self._api_retry_s = api_retry_s
        self._lock = asyncio.Lock()
        self._cp = Checkpoint(node)
        self._unsaved = False  # ``_cp`` has finished releases the file does not (``flush``)
        self._pod_cache: tuple[tuple[HolderKey, str, FencingToken], PodJSON] | None = None
        self._pods = pods
        self._pending_changed = asyncio.Event()

    # -- state ----------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the checkpoint: a damaged one is set aside and the safe state used; one of
        another version or node raises ``CheckpointError``."""
        self._cp = checkpoint.load(self._file, self.node)
        self._metrics.pending_releases.set(len(self._cp.pending))
        if self._cp.progress is not None:
            log.info("resuming handoff progress from checkpoint: %s", self._cp.progress)
        if self._cp.pending:
            self._pending_changed.set()

    @property
    def progress(self) -> HandoffProgress | None:
        return self._cp.progress

    @property
    def pending(self) -> tuple[PendingRelease, ...]:
        return self._cp.pending

    def resource_of(self, gpu: GPU) -> str:
        """The resource a device is served as: its MIG resource, else this plugin's."""
        return gpu.resource if gpu.profile else self._resource

    def _context(self, resource: str | None = None) -> Context:
        """The facts of a call for ``resource`` (None: whole GPUs): its devices, the others'."""
        resource = resource or self._resource
        mine = {g.id: g.healthy for g in self._state.gpus if self.resource_of(g) == resource}
        others = {
            g.id: self.resource_of(g) for g in self._state.gpus if self.resource_of(g) != resource
        }
        return Context(
            node=self.node, devices=mine, resource=resource, keys=self._keys, others=others
        )

    async def _save(self, cp: Checkpoint, *, durable: bool = True) -> None:
        """Write ``cp`` and adopt it; on failure keep the old one and raise ``OSError``."""
        await asyncio.to_thread(checkpoint.save, self._file, cp, durable=durable)
        self._cp = cp
        self._unsaved = False
        self._metrics.pending_releases.set(len(cp.pending))

    async def flush(self) -> None:
        """Write the releases finished since the last write (``_release`` leaves them to the
        next write); a failure is logged, and a restart then only repeats those releases."""
        if not self._unsaved:
            return
        try:
            await self._save(self._cp, durable=False)
        except OSError as exc:
            log.error("cannot record finished releases in %s: %s", self._file, exc)

    # -- reads ----------------------------------------------------------------------------------

    async def _retrying(self, read: Callable[[], Awaitable[T]]) -> T:
        deadline = time.monotonic() + self._api_retry_s
        backoff = Backoff(0.1, 1.0)
        while True:
            try:
                return await read()
            except ApiUnavailable:
                delay = backoff.next_s()
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)

    async def _view(self, *, fresh: bool) -> NodeLockView | None:
        if not fresh:
            return self._locks.view(self.node)
        return await self._retrying(lambda: self._locks.inspect(self.node))

    async def _pod(self, key: HolderKey) -> PodJSON | None:
        namespace, _, name = key.partition("/")
        if not namespace or not name:
            return None
        try:
            return await self._retrying(lambda: self._kube.get(pod_path(namespace, name)))
        except NotFound:
            return None

    async def _holder_pod(self, view: NodeLockView | None, *, fresh: bool) -> PodJSON | None:
        """The lock holder's pod: unless ``fresh``, from the node's pod watch when it has the
        holder (no request: the watch copy lags the API server, so a decision that refuses
        from it is made again from a fresh read); else one GET."""
        if view is None or view.record.holder is None:
            return None
        holder = view.record.holder
        if not fresh and self._pods is not None and self._pods.synced:
            watched = self._pods.get(holder.key)
            if watched is not None and (watched.get("metadata") or {}).get("uid") == holder.uid:
                return watched
        key = (holder.key, holder.uid, view.record.token)
        if not fresh and self._pod_cache is not None and self._pod_cache[0] == key:
            return self._pod_cache[1]
        pod = await self._pod(holder.key)
        if pod is not None:
            self._pod_cache = (key, pod)
        return pod

    # -- Allocate -------------------------------------------------------------------------------

    async def allocate(
        self, requests: Sequence[Sequence[str]], *, resource: str | None = None
    ) -> tuple[Allocation, ContainerAnswer] | Refusal:
        """Decide one Allocate call for ``resource`` (None: whole GPUs) and do what follows
        from it (checkpoint, release)."""
        started = time.monotonic()
        self._step("allocate")
        async with self._lock:
            await failpoints.pause("allocate.start")  # e2e: a slow admission
            result = await self._allocate(requests, resource)
        if isinstance(result, Refusal):
            self._metrics.allocations.labels(result=result.kind.value).inc()
            log.warning("Allocate refused (%s): %s", result.kind.value, result.message)
            if self._on_refused is not None:
                view = self._locks.view(self.node)
                holder = view.record.holder if view is not None else None
                self._on_refused(result, result.release[0] if result.release else holder)
        else:
            self._metrics.allocations.labels(result="allocated").inc()
        self._metrics.allocate_seconds.observe(time.monotonic() - started)
        return result

    async def _allocate(
        self, requests: Sequence[Sequence[str]], resource: str | None
    ) -> tuple[Allocation, ContainerAnswer] | Refusal:
        ctx = self._context(resource)
        ids = check_request(requests, ctx)
        if isinstance(ids, Refusal):
            return ids
        try:
            result = await self._decide(ids, ctx, fresh_lease=False)
            if isinstance(result, Refusal):
                result = await self._decide(ids, ctx, fresh_lease=True)
            if isinstance(result, Refusal) and result.kind is RefusalKind.TAKEN_OVER:
                result = await self._interrupted(ids, ctx, result)
        except (ApiUnavailable, ApiError, MalformedLease) as exc:
            return Refusal(
                RefusalKind.UNAVAILABLE,
                f"node {self.node}: cannot read the node lock or its holder pod: {exc}",
            )
        except OSError as exc:
            return self._checkpoint_refusal(exc)
        if isinstance(result, Refusal):
            if result.release is not None:
                await self._reject(result.release)
            return result
        return await self._serve(result)

    async def _decide(
        self, ids: Sequence[DeviceID], ctx: Context, *, fresh_lease: bool
    ) -> Allocation | Refusal:
        """``decide_allocate`` on the Lease from its watch (``fresh_lease``: one GET), who
        kubelet may be admitting, and the holder pod.  kubelet's PodResources List, read after
        kubelet called, holds the pod it admits and no longer holds a holder it rejected, so
        the holder's spec may come from the node's pod watch (one GET when the watch has not
        shown it).  Without kubelet's List, the holder (one GET) and the pods bound here (one
        LIST) are read afresh at the same time: those reads include everything kubelet knew,
        the LIST every pod it can be admitting, the GET the holder rejected, gone, admitted or
        elsewhere if it is.  A Lease watch that lags a takeover names the old holder, which
        kubelet no longer asks for; that decision refuses and the caller decides again with a
        fresh Lease.  A lock changing hands between the reads can only make a pod look like a
        bystander, which refuses (never serves) the call."""
        view = await self._view(fresh=fresh_lease)
        holder = view.record.holder if view is not None else None
        who = await self._who_admits(view, ctx, fresh=fresh_lease)
        held_other = await self._held_other(ctx.resource, holder)
        return decide_allocate(
            view,
            who.held,
            ids,
            self._cp.progress,
            ctx,
            policy=self._policy,
            bound_here=who.bound_here,
            kubelet=who.kubelet,
            recorded=who.recorded,
            held_other=held_other,
        )

    async def _who_admits(
        self, view: NodeLockView | None, ctx: Context, *, fresh: bool
    ) -> _WhoAdmits:
        """The holder's pod and the sources of "who kubelet may be admitting" that Allocate and
        GetPreferredAllocation both decide by (``decide.another_pod_may_be_admitted``): kubelet's
        List (with the holder's spec from the node's pod watch), or ``KubeletUnreadable`` when
        its socket is there and List fails, or, only without a socket, the pods bound here (one
        LIST) with the holder (one GET), read at the same time.  ``fresh``: the pods that count
        are read afresh before the call is refused for them (the watch may lag a status kubelet
        wrote)."""
        holder = view.record.holder if view is not None else None
        listed = await self._kubelet_list(ctx.resource)
        recorded = await self._recorded(ctx.resource)
        if isinstance(listed, KubeletUnreadable):
            return _WhoAdmits(await self._holder_pod(view, fresh=True), listed, [], recorded)
        if listed is None:

            async def bound() -> list[PodJSON]:
                return [] if self._pods is None else await self._retrying(self._pods.list_now)

            pod_read, list_read = await asyncio.gather(
                self._holder_pod(view, fresh=True), bound(), return_exceptions=True
            )
            if isinstance(pod_read, BaseException):
                raise pod_read
            if isinstance(list_read, BaseException):
                raise list_read
            return _WhoAdmits(pod_read, None, list_read, recorded)
        # ``fresh``: the call is decided again after a refusal, and the watch or the copy read
        # for the same holder and token may be from before its binding landed (read for another
        # pod's call, a static pod's), which kubelet has seen: read the holder afresh
        held = await self._holder_pod(view, fresh=fresh)
        if holder is None:
            return _WhoAdmits(held, None, [], recorded)
        specs = await self._specs(listed, holder.key)
        earlier = admitted_before(self._sightings, holder.key)
        kubelet = self._admitting(listed, specs, holder.key, held, recorded, ctx, earlier)
        if kubelet.admitted_before:
            # a pod is left out for a spec that kubelet cannot be resizing: read after
            # kubelet called, so a spec change before the call shows
            for key in kubelet.admitted_before:
                specs[key] = await self._pod(HolderKey(key))
            kubelet = self._admitting(listed, specs, holder.key, held, recorded, ctx, earlier)
        if fresh and kubelet.others:
            # the watch may lag a status kubelet wrote (a rejected or finished pod): the pods
            # that count are read afresh before the call is refused for them
            for key in kubelet.others:
                name = key.split(" ", 1)[0]
                if specs.get(name) is not None:
                    specs[name] = await self._pod(HolderKey(name))
            kubelet = self._admitting(listed, specs, holder.key, held, recorded, ctx, earlier)
        if kubelet.ignored_unknown:
            self._metrics.unknown_pods_ignored.inc(len(kubelet.ignored_unknown))
        return _WhoAdmits(held, kubelet, [], recorded)

    async def _held_other(self, resource: str, holder: Holder | None) -> OtherResources | None:
        """For each resource other than ``resource`` that the holder's progress has served
        containers of: the holder's containers kubelet holds devices of it for, in its
        checkpoint or its PodResources ``List`` (``decide.kubelet_confirmed``).  None when there
        is no such entry or ``List`` cannot be read (the entries then stand)."""
        progress = self._cp.progress
        if progress is None or holder is None or progress.uid != holder.uid:
            return None
        others = {progress.resource_at(i) for i in range(len(progress.served))} - {resource}
        if not others or self._kubelet is None:
            return None
        out: dict[str, set[str]] = {}
        for other in sorted(others):
            try:
                listed = await self._kubelet.list(resource=other)
            except KubeletViewError as exc:
                log.info("%s; the holder's %s progress stands as it is", exc, other)
                return None
            held = {
                container
                for entry in listed
                if entry.key == holder.key
                for container, ids in entry.containers.items()
                if ids
            }
            recorded = await self._recorded(other)
            held |= set((recorded or {}).get(holder.uid, ()))
            out[other] = held
        return out

    def _admitting(
        self,
        listed: Sequence[KubeletPod],
        specs: Mapping[str, PodJSON | None],
        holder: HolderKey,
        held: PodJSON | None,
        recorded: KubeletRecords | None,
        ctx: Context,
        earlier: Mapping[str, str],
    ) -> KubeletAdmission:
        """``kubelet_admitting`` with how long each listed pod unknown to the API server has
        been seen listed (from the first List that showed it; forgotten once it is known or no
        longer listed), and the pods kubelet admitted before the holder (``earlier``)."""
        unknown = {e.key for e in listed if e.key != holder and specs.get(e.key) is None}
        ages = self._time_unknown(unknown)
        return kubelet_admitting(
            listed,
            specs,
            holder,
            self._served(),
            ctx,
            holder_pod=held,
            recorded=recorded,
            unknown_for_s=ages,
            earlier=earlier,
        )

    def _time_unknown(self, unknown: set[str]) -> dict[str, float]:
        """How long each listed pod in ``unknown`` (unknown to the API server) has been listed
        by the kubelet that answered the last List (``_sight``), timed from the first read that
        showed it; a kubelet restart starts every such pod anew (``unknown_listed``)."""
        instance = self._sightings.instance  # "" when not known for sure
        same = bool(instance) and instance == self._unknown_instance
        self._unknown_instance = instance
        self._unknown_since, ages = unknown_listed(
            self._unknown_since, unknown, self._clock(), same_kubelet=same
        )
        return ages

    async def _recorded(self, resource: str) -> KubeletRecords | None:
        """kubelet's device checkpoint: pod UID -> the containers it records devices of
        ``resource`` for; None when not configured or unreadable (missing after a kubelet
        restart that lost it: then no pod counts as recorded)."""
        if self._kubelet_checkpoint is None:
            return None
        try:
            answers = await asyncio.to_thread(
                read_checkpoint, self._kubelet_checkpoint, resource=resource
            )
        except KubeletViewError as exc:
            log.info("%s; no pod counts as holding devices by kubelet's checkpoint", exc)
            return None
        return kubelet_records(answers)

    async def _kubelet_list(self, resource: str) -> list[KubeletPod] | KubeletUnreadable | None:
        """kubelet's PodResources List, with the devices of ``resource``; ``KubeletUnreadable``
        when its socket is there and List fails (the call is then refused); None when no
        socket is configured or there is none (the call decides from the API server's reads)."""
        if self._kubelet is None:
            return None
        try:
            listed = await self._sight(resource)
        except KubeletViewError as exc:
            self._metrics.kubelet_view.labels(result="error").inc()
            if self._kubelet.exists():
                message = (
                    f"{exc}; Allocate refuses while kubelet's List cannot be read (a pod the API "
                    "server does not know, such as a static pod, may be the one kubelet admits)"
                )
                unreadable: KubeletUnreadable | None = KubeletUnreadable(str(exc))
            else:
                message = (
                    f"{exc}; Allocate decides from a LIST of the node's pods and kubelet's "
                    "device checkpoint instead (every unfinished GPU pod whose devices that "
                    "checkpoint does not record blocks the call; a static pod the API server "
                    "does not know is not seen)"
                )
                unreadable = None
            log.warning("%s", message)
            if self._on_fallback is not None:
                self._on_fallback(message)
            return unreadable
        self._metrics.kubelet_view.labels(result="ok").inc()
        return listed

    async def _sight(self, resource: str) -> list[KubeletPod]:
        """kubelet's PodResources List (raises ``KubeletViewError``), recorded in the sightings
        with the UID the node's pod watch shows for each listed pod (none while it has none)."""
        assert self._kubelet is not None
        async with self._sight_lock:
            listed, instance = await self._kubelet.list_seen(resource=resource)
            uids: dict[str, str] = {}
            if self._pods is not None and self._pods.synced:
                for entry in listed:
                    pod = self._pods.get(HolderKey(entry.key))
                    uids[entry.key] = str(((pod or {}).get("metadata") or {}).get("uid") or "")
            keys = [e.key for e in listed]
            self._sightings = sight(self._sightings, instance, keys, uids)
            if uids:  # the watch has synced: a pod it does not have is timed from this read on
                self._time_unknown({key for key in keys if not uids.get(key)})
        return listed

    async def release_ended(self) -> bool:
        """Release the node's lock if its holder has ended for good as the node's pod watch
        shows it (``decide.holder_ended``: Failed, Succeeded, deleted): at once, not at expiry,
        recorded as a pending release first like every other, fenced by the token.  A Failed
        (rejected) holder only while the plugin serves (``serving``); before, nothing is sent.
        True when a release was decided."""
        if self._ended() is None:  # most calls: no request, and no wait for an Allocate
            return False
        async with self._lock:
            found = self._ended()
            if found is None:
                return False
            log.info(
                "node %s: lock holder %s (token %d) ended (%s): releasing its lock: %s",
                self.node,
                found.holder.key,
                found.token,
                found.end.outcome.value,
                found.end.why,
            )
            result = await self._reject((found.holder, found.token), found.end.outcome)
        # only the part whose write released the lock says so (the extender may have been first)
        if self._on_ended is not None and result is ReleaseResult.RELEASED:
            self._on_ended(found)
        return True

    def _ended(self) -> EndedHolder | None:
        found = self._holder_ended()
        if found is None or not released_by_plugin(found.end, serving=self._serving()):
            return None
        return found

    def _holder_ended(self) -> EndedHolder | None:
        if self._pods is None or not self._pods.synced:
            return None
        view = self._locks.view(self.node)
        holder = view.record.holder if view is not None else None
        return holder_ended(
            view,
            None if holder is None else self._pods.get(holder.key),
            seen_gone=holder is not None and self._pods.gone(holder.uid),
            failed_before_gone=holder is not None and self._pods.gone_failed(holder.uid),
            pending_tokens={p.token for p in self._cp.pending},
        )

    async def run_ended_releases(self) -> None:
        """Release the lock of a holder that ended as soon as the node's pod watch or the Lease
        watch shows it, and a rejected holder's as soon as the plugin serves too
        (``release_ended``), until cancelled."""
        while True:
            await self.holder_changed.wait()
            self.holder_changed.clear()
            try:
                await self.release_ended()
            except Exception:  # must never stop the plugin; the next change tries again
                log.exception("releasing the lock of a holder that ended failed")

    async def run_sightings(self, period_s: float = SIGHTING_PERIOD_S) -> None:
        """Read kubelet's List every ``period_s`` until cancelled, so that the pods it admitted
        before the next holder are known as such when that holder's Allocate comes
        (``decide.admitted_before``); without a PodResources socket there is nothing to read,
        and it only waits to be cancelled (the plugin's tasks run for its whole life)."""
        if self._kubelet is None:
            await asyncio.Event().wait()
        while True:
            try:
                await self._sight(self._resource)
            except KubeletViewError as exc:
                log.debug("kubelet's List between calls: %s", exc)
            await asyncio.sleep(period_s)

    async def _specs(
        self, listed: Sequence[KubeletPod], holder: HolderKey
    ) -> dict[str, PodJSON | None]:
        """The pods kubelet lists (the holder left out), from the node's pod watch; a pod the
        watch does not have yet is read (one GET each: None when the API server has none)."""
        out: dict[str, PodJSON | None] = {}
        for entry in listed:
            if entry.key == holder:
                continue
            key = HolderKey(entry.key)
            watched = self._pods.get(key) if self._pods is not None and self._pods.synced else None
            out[entry.key] = watched if watched is not None else await self._pod(key)
        return out

    def _served(self) -> set[str]:
        """UIDs of pods this plugin served: kubelet may not have written their statuses yet."""
        uids = set(self._cp.served_pods)
        uids.update(p.uid for p in self._cp.pending)
        if self._cp.progress is not None:
            uids.add(self._cp.progress.uid)
        return uids

    async def _interrupted(
        self, ids: Sequence[DeviceID], ctx: Context, refusal: Refusal
    ) -> Allocation | Refusal:
        """The checkpoint holds a partial handoff of a pod that no longer holds the lock.

        If that pod can no longer ask (gone, failed, admitted…) its progress is dropped and the
        call decided afresh; otherwise the call is refused once (it may be that pod's next
        container) and the progress dropped, so the lock's new holder is served next time.
        """
        old = self._cp.progress
        assert old is not None
        pod = await self._pod(old.holder)
        await self._save(self._cp.with_progress(None))
        log.info("dropped progress of interrupted handoff %s", old)
        if handoff_abandoned(pod, old, self.node):
            return await self._decide(ids, ctx, fresh_lease=True)
        return refusal

    async def _serve(self, alloc: Allocation) -> tuple[Allocation, ContainerAnswer] | Refusal:
        cp = self._cp.with_progress(None if alloc.last else alloc.progress)
        cp = cp.with_served(alloc.holder.uid)
        pending = None
        if alloc.last:
            pending = PendingRelease.of(alloc.holder, alloc.token, Outcome.ALLOCATED)
            cp = cp.with_pending(pending)
        try:
            await self._save(cp, durable=not alloc.last)
        except OSError as exc:
            await self._reject((alloc.holder, alloc.token))
            return self._checkpoint_refusal(exc)
        failpoints.hit("allocate.after-checkpoint")  # e2e: a plugin crash mid-handoff
        if alloc.kubelet_differs:
            log.warning(
                "served %s's assignment for container %s although kubelet chose other devices "
                "(--mismatch-policy=assignment)",
                alloc.holder.key,
                alloc.container,
            )
        if pending is not None:
            await self._release_soon(pending)
        answer = container_answer(
            alloc.devices, mode=self._mode, host_nodes=self._device_nodes(alloc.devices)
        )
        log.info(
            "Allocate: %s container %s -> %s%s",
            alloc.holder.key,
            alloc.container,
            ",".join(alloc.devices),
            " (last; lock released)" if alloc.last else "",
        )
        return alloc, answer

    def _checkpoint_refusal(self, exc: OSError) -> Refusal:
        return Refusal(
            RefusalKind.INTERNAL,
            f"node {self.node}: cannot write the device plugin checkpoint {self._file}: {exc}",
        )

    async def _reject(
        self, release: tuple[Holder, FencingToken], outcome: Outcome = Outcome.REJECTED
    ) -> ReleaseResult:
        """Release the holder's lock ``outcome`` (recorded first; retried if it fails)."""
        holder, token = release
        pending = PendingRelease.of(holder, token, outcome)
        cp = self._cp.with_pending(pending)
        if cp.progress is not None and cp.progress.token == token:
            cp = cp.with_progress(None)
        try:
            await self._save(cp)
        except OSError as exc:  # keep it in memory: the retrier still releases it
            log.error("cannot record a pending release in %s: %s", self._file, exc)
            self._cp = cp
        return await self._release_soon(pending)

    def _step(self, step: str) -> None:
        """Observe how long the node's lock has been held when the handoff reaches ``step``."""
        view = self._locks.view(self.node)
        if view is not None and view.record.holder is not None:
            self._metrics.handoff_steps.labels(step).observe(view.held_for_s)

    # -- GetPreferredAllocation -----------------------------------------------------------------

    async def preferred(
        self, asks: Sequence[PreferenceAsk], *, resource: str | None = None
    ) -> list[Preference]:
        """A preference per container request for ``resource`` (None: whole GPUs); only a
        single request can be a hit."""
        self._step("preferred")
        async with self._lock:
            out = [await self._preferred(ask, resource, single=len(asks) == 1) for ask in asks]
        for pref in out:
            self._metrics.preferred.labels(result="hit" if pref.hit else "miss").inc()
            if not pref.hit:
                log.info("GetPreferredAllocation miss: %s", pref.reason)
        return out

    async def _preferred(
        self, ask: PreferenceAsk, resource: str | None, *, single: bool
    ) -> Preference:
        if not single:
            return Preference(
                hint(ask.available, ask.must_include, ask.size),
                hit=False,
                reason="more than one container in one request",
            )
        ctx = self._context(resource)
        pref = Preference((), hit=False)
        try:
            for fresh in (False, True):
                view = await self._view(fresh=fresh)
                if fresh:
                    await self._drop_abandoned_progress(view)
                who = await self._who_admits(view, ctx, fresh=fresh)
                pref = decide_preferred(
                    view,
                    who.held,
                    ask.available,
                    ask.must_include,
                    ask.size,
                    self._cp.progress,
                    ctx,
                    recorded=who.recorded,
                    kubelet=who.kubelet,
                    bound_here=who.bound_here,
                )
                if pref.hit:
                    break
        except (ApiUnavailable, ApiError, MalformedLease) as exc:
            return Preference(
                hint(ask.available, ask.must_include, ask.size), hit=False, reason=str(exc)
            )
        return pref

    async def _drop_abandoned_progress(self, view: NodeLockView | None) -> None:
        """Forget the checkpointed progress of a pod that lost the lock and can no longer ask,
        so the new holder's preference is not refused for it (Allocate does the same)."""
        old = self._cp.progress
        if old is None or view is None:
            return
        holder = view.record.holder
        if holder is not None and holder.key == old.holder and view.record.token == old.token:
            return
        if handoff_abandoned(await self._pod(old.holder), old, self.node):
            await self._save(self._cp.with_progress(None))
            log.info("dropped progress of abandoned handoff %s", old)

    # -- releases -------------------------------------------------------------------------------

    async def _release_soon(self, pending: PendingRelease) -> ReleaseResult:
        """Try the release now (bounded); on failure the background retrier owns it."""
        result = ReleaseResult.RETRY
        try:
            result = await asyncio.wait_for(self._release(pending), RELEASE_INLINE_S)
        except TimeoutError:
            log.warning("release of token %d is slow; retrying in the background", pending.token)
        self._pending_changed.set()
        return result

    async def _release(self, pending: PendingRelease) -> ReleaseResult:
        lock = HeldLock(self.node, Holder(pending.holder, pending.uid), pending.token, "")
        before = self._locks.view(self.node)
        started = time.monotonic()
        try:
            await self._locks.release(lock, outcome=pending.outcome)
            result = ReleaseResult.RELEASED
            if before is not None and before.record.token == pending.token:
                self._metrics.handoff_steps.labels("released").observe(
                    before.held_for_s + time.monotonic() - started
                )
            log.info(
                "released node lock of %s (token %d): %s",
                pending.holder,
                pending.token,
                pending.outcome.value,
            )
        except (StaleToken, LockLost) as exc:
            result = ReleaseResult.ALREADY
            log.info("lock of %s needs no release: %s", pending.holder, exc)
        except (ApiUnavailable, ApiError, MalformedLease) as exc:
            # a Lease edited by hand out of a node lock's shape is retried like an unreachable
            # API server (with back-off) until it is a node lock again or gone
            self._metrics.releases.labels(
                outcome=pending.outcome.value, result=ReleaseResult.RETRY.value
            ).inc()
            if isinstance(exc, MalformedLease):
                log.error(
                    "cannot release lock of %s: node %s's Lease is not a node lock (%s); "
                    "retrying until it is mended or deleted",
                    pending.holder,
                    self.node,
                    exc,
                )
            else:
                log.warning("cannot release lock of %s yet: %s", pending.holder, exc)
            return ReleaseResult.RETRY
        self._metrics.releases.labels(outcome=pending.outcome.value, result=result.value).inc()
        # not written now: the next write carries it (every write starts from ``_cp``), and a
        # crash before then only repeats the release, which finds the token stale or the lock
        # free and changes nothing (``lockd.decide.decide_release``); one file write less per
        # handoff (decision 0007)
        self._cp = self._cp.without_pending(pending.token)
        self._unsaved = True
        self._metrics.pending_releases.set(len(self._cp.pending))
        return result

    async def run_releases(self) -> None:
        """Retry pending releases until cancelled (capped exponential backoff)."""
        backoff = Backoff(*RELEASE_BACKOFF_S)  # jittered: nodes must not retry in lockstep
        while True:
            await self._pending_changed.wait()
            self._pending_changed.clear()
            retry = False
            for pending in list(self._cp.pending):
                async with self._lock:
                    if pending in self._cp.pending:
                        retry |= await self._release(pending) is ReleaseResult.RETRY
            if retry:
                await backoff.sleep()
                self._pending_changed.set()
            else:
                backoff.reset()
