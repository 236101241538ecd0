"""The extender's picture of the cluster: nodes' GPUs and pods' assignments, fed by watches.

``ClusterCache`` is a plain in-memory state machine: ``replace_*`` takes a full LIST, ``apply_*``
one watch event, in the order the API server sent them.  It never calls the API server, so filter
and prioritize (which read ``node_gpus``) are pure functions of what was seen.

Guarantees:
- A GPU counts as taken while any bound, non-terminal pod's assignment names it; a pod that asks
  for GPUs but has no (or a malformed) assignment is counted as holding that many unknown GPUs.
- A pod's GPUs are freed when it is seen terminal (Succeeded/Failed) or deleted, or disappears
  from a relist.
- ``pictures()`` holds, for every known node, exactly what ``node_gpus`` would build from scratch
  out of the node and its pods as now cached: each write rebuilds the pictures of the nodes it
  touched (and only those) before it returns, so filter and prioritize read a ready picture per
  node and never rebuild one.  ``fit_keys()`` holds each of those pictures' ``fit_key``, and
  ``with_key`` a picture for each such key, so a request can look up each name's key and judge
  a picture per distinct key.
- ``pending_demand()`` is, at every moment, the GPUs and the largest GPU count asked for by the
  cached pods that are neither bound nor terminal (kept as pods are written, O(1) to read).
- ``seen_bound_or_gone(uid)`` is true once this cache saw the pod bound or deleted; because a
  watch delivers writes in order, the cache has then also seen every write before that one.
- Pods not bound yet, and pods that ask for GPUs or carry nodelock's annotations, are kept; a
  bound CPU pod (``PodState.quiet``) is read and dropped, so ``pod(uid)`` is None for it,
  ``pods_on`` leaves it out and its deletion leaves no tombstone.  Nothing filter, prioritize
  or bind decide reads such a pod (kube-scheduler calls the extender only for pods asking for
  its managed resources, before they are bound); a pod that turns quiet is forgotten.
Non-guarantee: the cache lags the API server; bind proves its choice against that lag separately
(``scheduler_ext.binder``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from handoff.request import BadPod
from handoff.wire import DEFAULT_RESOURCE, DeviceID, Keys
from lockd.model import NodeName
from scheduler_ext.choose import FitKey, NodeGPUs
from scheduler_ext.need import NEED_MEMO_SIZE, NeedMemo, PodNeed
from scheduler_ext.sharing import Holding, holdings, sharing_node
from scheduler_ext.state import (
    BadObject,
    NodeState,
    PodPhase,
    PodState,
    node_state,
    pod_state,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Dropped:
    """A pod the cache read and keeps nothing of (a CPU pod), by uid."""

    uid: str


JSON = dict[str, Any]
TOMBSTONES = 50_000  # deleted pod UIDs remembered for the bind's confirm step


def node_gpus(node: NodeState, pods: Iterable[PodState]) -> NodeGPUs:
    """A node's GPU picture from its state and the pods bound to it (pure)."""
    taken: set[DeviceID] = set()
    unattributed = 0
    whole = node.whole  # MIG instances are not GPUs
    shares = sharing_node(whole)
    held: list[Holding] = []  # sharing nodes: each bound pod's slices (scheduler_ext.sharing)
    for pod in pods:
        if not pod.holds_gpus:
            continue
        if pod.assignment is not None:
            taken.update(d for ids in pod.assignment.values() for d in ids)
            if shares:
                held.extend(holdings(pod.need, pod.assignment))
        elif pod.need is not None:
            unattributed += pod.need.total
        else:
            unattributed += 1  # malformed spec but bound: at least one unknown device
    return NodeGPUs(
        node=node.name,
        devices=whole,
        taken=frozenset(taken),
        unattributed=unattributed,
        allocatable=node.allocatable,
        problem=node.problem,
        numa_policy=node.numa_policy,
        held=tuple(held),
        mig=node.instances,
    )


class ClusterCache:
    """Nodes and pods as last seen, indexed for the extender's questions.

    Not thread-safe; use from one event loop.  ``clock`` is a monotonic clock (seconds).
    """

    def __init__(
        self,
        *,
        keys: Keys | None = None,
        resource: str = DEFAULT_RESOURCE,
        clock: Callable[[], float] = time.monotonic,
        need_memo_size: int = NEED_MEMO_SIZE,
    ) -> None:
        self.keys = keys or Keys()
        self.resource = resource
        self._clock = clock
        self._nodes: dict[NodeName, NodeState] = {}
        self._pods: dict[str, PodState] = {}  # by UID
        self._on_node: dict[NodeName, set[str]] = {}  # node -> UIDs of pods bound to it
        self._gpus: dict[NodeName, NodeGPUs] = {}  # every known node's picture, kept current
        self._keys: dict[NodeName, FitKey] = {}  # every known node's picture's fit key
        self._with_key: dict[FitKey, NodeGPUs] = {}  # a picture per fit key seen (some stale)
        self._stale: set[NodeName] = set()  # pictures the write in progress invalidated
        self._changed_nodes: set[NodeName] = set()  # pictures rebuilt since take_changed_nodes
        # UIDs seen deleted -> whether the pod was last seen Failed (``gone_failed``)
        self._gone: OrderedDict[str, bool] = OrderedDict()
        self._pending_sizes: Counter[int] = Counter()  # GPUs per unbound GPU pod -> pods
        self._pending_gpus = 0
        self.nodes_synced = False
        self.pods_synced = False
        self.last_event: dict[str, float] = {}  # "nodes"/"pods" -> clock of last event or relist
        self._changed = asyncio.Event()
        self._needs = NeedMemo(resource, self.keys, size=need_memo_size)

    # ---- parsing ----------------------------------------------------------------------------

    def pod_need(self, obj: Mapping[str, Any]) -> PodNeed:
        """``need.pod_need`` of ``obj`` for this cache's resource and keys, parsed once for
        equal containers and annotations (``need.NeedMemo``); raises ``BadPod`` as it does."""
        return self._needs(obj)

    def pod_state(self, obj: Mapping[str, Any]) -> PodState:
        """``state.pod_state`` of ``obj`` for this cache's resource and keys, its need from
        ``pod_need``; raises ``BadObject`` as it does."""
        return pod_state(obj, keys=self.keys, resource=self.resource, need_of=self._needs)

    # ---- reading ----------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self.nodes_synced and self.pods_synced

    def node_names(self) -> list[NodeName]:
        return sorted(self._nodes)

    def node(self, name: NodeName) -> NodeState | None:
        return self._nodes.get(name)

    def pod(self, uid: str) -> PodState | None:
        return self._pods.get(uid)

    def pending_demand(self) -> tuple[int, int]:
        """(GPUs, the largest pod's GPUs) asked for by the pods not bound yet and not terminal
        (whole GPUs: slices of shared GPUs do not count): what a burst still needs, whether or
        not its binds are already on their way."""
        largest = max(self._pending_sizes, default=0)
        return self._pending_gpus, largest

    def pending_sizes(self, *, above: int = 0) -> dict[int, int]:
        """GPUs per pod -> pods not bound yet and not terminal, for pods asking more than
        ``above`` GPUs."""
        return {size: n for size, n in self._pending_sizes.items() if size > above}

    def pods_on(self, node: NodeName) -> list[PodState]:
        return [self._pods[u] for u in sorted(self._on_node.get(node, ()))]

    def is_gone(self, uid: str) -> bool:
        return uid in self._gone

    def gone_failed(self, uid: str) -> bool:
        """Whether this cache saw the pod of ``uid`` deleted after seeing it Failed (or its
        deletion's last state Failed): a rejected pod its controller deleted."""
        return self._gone.get(uid, False)

    def finished(self, uid: str) -> bool:
        """Whether this cache saw the pod deleted or terminal (it holds no GPUs any more)."""
        pod = self._pods.get(uid)
        return uid in self._gone or (pod is not None and pod.phase.terminal)

    def accounts_for(self, uid: str) -> bool:
        """Whether this cache needs no Lease's copy of the pod's assignment: it saw the pod
        deleted or terminal (its GPUs are free), or bound (its own annotations count them on
        its node: a holder bound elsewhere takes nothing here).  A lock holder it has no record
        of is counted from the Lease's copy (its pod may not have reached the cache yet)."""
        pod = self._pods.get(uid)
        if pod is None:
            return uid in self._gone
        return pod.node is not None or pod.phase.terminal

    def seen_bound_or_gone(self, uid: str) -> bool:
        """Whether this cache saw the pod bound to a node, or deleted."""
        pod = self._pods.get(uid)
        return uid in self._gone or (pod is not None and pod.node is not None)

    def node_gpus(self, name: NodeName, *, exclude_uid: str | None = None) -> NodeGPUs | None:
        """The node's GPUs from cached pods (without lock holders); None for an unknown node."""
        node = self._nodes.get(name)
        if node is None:
            return None
        if exclude_uid is None:
            return self._gpus[name]
        return node_gpus(node, [p for p in self.pods_on(name) if p.uid != exclude_uid])

    def pictures(self) -> Mapping[NodeName, NodeGPUs]:
        """Every known node's GPU picture (without lock holders), by node name.

        The mapping is live (it follows later writes) and read-only to callers; reading it is one
        dictionary lookup per node, which is what filter and prioritize do for thousands of nodes.
        """
        return self._gpus

    def fit_keys(self) -> Mapping[NodeName, FitKey]:
        """Every known node's ``NodeGPUs.fit_key`` (of its ``pictures()`` entry), by node name;
        live and read-only to callers, like ``pictures()``."""
        return self._keys

    def with_key(self, key: FitKey) -> NodeGPUs | None:
        """A picture whose ``fit_key`` is ``key`` (any node's, current or not: equal keys judge
        alike), if this cache built one; every key in ``fit_keys()`` has one."""
        return self._with_key.get(key)

    def staleness_s(self, resource: str) -> float | None:
        """Seconds since the last watch event or relist of ``resource`` ("nodes"/"pods")."""
        last = self.last_event.get(resource)
        return None if last is None else max(0.0, self._clock() - last)

    async def wait_until(self, predicate: Callable[[], bool], *, timeout_s: float) -> bool:
        """Wait until ``predicate()`` holds after some cache change; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not predicate():
            left = deadline - loop.time()
            if left <= 0:
                return False
            event = self._changed
            try:
                async with asyncio.timeout(left):  # not wait_for: it can drop a cancellation
                    await event.wait()
            except TimeoutError:
                return predicate()
        return True

    # ---- writing ----------------------------------------------------------------------------

    def take_changed_nodes(self) -> set[NodeName]:
        """The nodes whose pictures were rebuilt since the last call (a superset of those
        whose pictures differ), forgotten as they are returned."""
        changed, self._changed_nodes = self._changed_nodes, set()
        return changed

    def has_changed_nodes(self) -> bool:
        """Whether ``take_changed_nodes`` would return any node."""
        return bool(self._changed_nodes)

    def _refresh(self) -> None:
        """Rebuild the pictures of the nodes the last write touched (only those)."""
        self._changed_nodes |= self._stale
        for name in self._stale:
            node = self._nodes.get(name)
            if node is None:
                self._gpus.pop(name, None)
                self._keys.pop(name, None)
            else:
                gpus = self._gpus[name] = node_gpus(node, self.pods_on(name))
                self._keys[name] = gpus.fit_key
                self._with_key.setdefault(gpus.fit_key, gpus)
        self._stale.clear()
        if len(self._with_key) > 2 * len(self._gpus) + 1024:  # keys no node has any more
            self._with_key = {g.fit_key: g for g in self._gpus.values()}

    def _touch(self, resource: str) -> None:
        self._refresh()
        self.last_event[resource] = self._clock()
        self._changed.set()
        self._changed = asyncio.Event()

    def mark_alive(self, resource: str) -> None:
        """A bookmark or an empty watch round: the stream is live though nothing changed."""
        self.last_event[resource] = self._clock()

    def keep_node(self, obj: Mapping[str, Any]) -> NodeState | None:
        """What the cache keeps of a Node object (None, with a warning, for one without a
        name): a list's reflector turns each object into this as its page arrives."""
        try:
            return node_state(obj, keys=self.keys, resource=self.resource)
        except BadObject as exc:
            log.warning("ignoring a node without identity: %s", exc)
            return None

    def _put_node(self, state: NodeState | None) -> None:
        if state is None:
            return
        self._nodes[state.name] = state
        self._stale.add(state.name)

    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Take a full LIST of nodes."""
        self.replace_node_states([self.keep_node(obj) for obj in items])

    def replace_node_states(self, states: Iterable[NodeState | None]) -> None:
        """Take a full LIST of nodes as ``keep_node`` made them (Nones are skipped)."""
        self._stale.update(self._nodes)
        self._nodes.clear()
        for state in states:
            self._put_node(state)
        self.nodes_synced = True
        self._touch("nodes")

    def apply_node(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Take one node watch event (ADDED, MODIFIED, DELETED)."""
        if kind == "DELETED":
            name = (obj.get("metadata") or {}).get("name")
            if isinstance(name, str):
                self._nodes.pop(NodeName(name), None)
                self._stale.add(NodeName(name))
        else:
            self._put_node(self.keep_node(obj))
        self._touch("nodes")

    @staticmethod
    def _pending_size(pod: PodState) -> int:
        if pod.node is not None or pod.phase.terminal or pod.need is None or pod.need.slices:
            return 0  # slices of shared GPUs are no whole-GPU demand
        return pod.need.total

    def _unindex(self, pod: PodState) -> None:
        size = self._pending_size(pod)
        if size:
            self._pending_gpus -= size
            self._pending_sizes[size] -= 1
            if not self._pending_sizes[size]:
                del self._pending_sizes[size]
        if pod.node is not None:
            on = self._on_node.get(pod.node)
            if on is not None:
                on.discard(pod.uid)
                if not on:
                    del self._on_node[pod.node]
            self._stale.add(pod.node)

    def _index(self, pod: PodState) -> None:
        size = self._pending_size(pod)
        if size:
            self._pending_gpus += size
            self._pending_sizes[size] += 1
        if pod.node is not None:
            self._on_node.setdefault(pod.node, set()).add(pod.uid)
            self._stale.add(pod.node)

    def keep_pod(self, obj: Mapping[str, Any]) -> PodState | Dropped | None:
        """What the cache keeps of a Pod object: only its uid (``Dropped``) for a CPU pod
        (``PodState.quiet``), and None (with a warning) for one without identity.  A list's
        reflector turns each object into this as its page arrives."""
        try:
            state = self.pod_state(obj)
        except (BadObject, BadPod) as exc:
            log.warning("ignoring a pod without identity: %s", exc)
            return None
        return Dropped(state.uid) if state.quiet else state

    def _put_pod(self, state: PodState | None) -> bool:
        """Keep the pod's state; False when it equals what was kept already but for its
        resourceVersion (most of a running pod's updates: status conditions, the kubelet's
        writes), so nothing is re-indexed."""
        if state is None:
            return False
        old = self._pods.get(state.uid)
        if (
            old is not None
            and dataclasses.replace(state, resource_version=old.resource_version) == old
        ):
            self._pods[state.uid] = state  # the newer version, equal in every fact indexed
            return False
        if old is not None:
            self._unindex(old)
        self._pods[state.uid] = state
        self._index(state)
        return True

    def _drop_pod(self, uid: str, *, failed: bool = False) -> None:
        old = self._pods.pop(uid, None)
        if old is not None:
            self._unindex(old)
        failed = failed or self._gone.get(uid, False)
        self._gone[uid] = failed or (old is not None and old.phase is PodPhase.FAILED)
        self._gone.move_to_end(uid)
        while len(self._gone) > TOMBSTONES:
            self._gone.popitem(last=False)

    def replace_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Take a full LIST of pods; pods missing from it count as deleted."""
        self.replace_pod_states([self.keep_pod(obj) for obj in items])

    def replace_pod_states(self, states: Iterable[PodState | Dropped | None]) -> None:
        """Take a full LIST of pods as ``keep_pod`` made them (Nones are skipped, a ``Dropped``
        forgets what an earlier entry of the same pod kept: the last entry of a pod wins); pods
        missing from it count as deleted."""
        before = set(self._pods)
        self._pods.clear()
        self._on_node.clear()
        self._pending_sizes.clear()
        self._pending_gpus = 0
        self._stale.update(self._nodes)
        for state in states:
            if isinstance(state, Dropped):
                kept = self._pods.pop(state.uid, None)
                if kept is not None:
                    self._unindex(kept)
            else:
                self._put_pod(state)
        for uid in before - set(self._pods):
            self._drop_pod(uid)
        self.pods_synced = True
        self._touch("pods")

    def apply_pod(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Take one pod watch event (ADDED, MODIFIED, DELETED).  An update that changes nothing
        the cache keeps rebuilds no node picture and wakes no waiter (``wait_until``: nothing
        it could test has changed); it only marks the stream alive."""
        meta = obj.get("metadata")
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        if kind == "DELETED":
            if uid not in self._pods:  # a CPU pod (or one never seen): nothing kept of it
                self.mark_alive("pods")
                return
            assert isinstance(uid, str)
            status = obj.get("status")
            phase = status.get("phase") if isinstance(status, Mapping) else None
            self._drop_pod(uid, failed=phase == PodPhase.FAILED.value)
        else:
            state = self.keep_pod(obj)
            if isinstance(state, Dropped):
                if state.uid not in self._pods:  # a CPU pod: nothing kept of it
                    self.mark_alive("pods")
                    return
                self._unindex(self._pods.pop(state.uid))  # it turned quiet: forget it
            elif not self._put_pod(state):
                self.mark_alive("pods")
                return
        self._touch("pods")

    # ---- for metrics ------------------------------------------------------------------------

    def gpu_counts(self) -> dict[NodeName, tuple[int, int]]:
        """Per node with an inventory: (GPUs in inventory, GPUs assigned)."""
        out: dict[NodeName, tuple[int, int]] = {}
        for name, node in self._nodes.items():
            if not node.devices:
                continue
            gpus = self.node_gpus(name)
            assert gpus is not None
            out[name] = (len(gpus.devices), gpus.assigned)  # whole GPUs (MIG: not GPUs)
        return out
