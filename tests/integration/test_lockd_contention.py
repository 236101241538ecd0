"""Many contenders, one node: mutual exclusion and fencing tokens over 1,000 rounds.

Each contender is its own ``KubeClient`` (its own connections) and its own ``NodeLocks`` (its own
observations and watch), as separate processes would be.  They share only this event loop, which
lets the test check exclusion directly: between an ``acquire`` returning and the matching
``release`` being sent, no other contender may get the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from devcluster.cluster import Cluster
from handoff.wire import DEFAULT_PREFIX
from kube import KubeClient
from kube.client import lease_path
from lockd import (
    Holder,
    HolderKey,
    LockHeld,
    LockMetrics,
    NodeLocks,
    NodeLockView,
    NodeName,
    Outcome,
)

NODE = NodeName("contended")
CONTENDERS = 8
ROUNDS = 1000


@dataclass
class Shared:
    holder: str | None = None
    tokens: list[int] = field(default_factory=list)
    wins: dict[str, int] = field(default_factory=dict)
    refusals: int = 0


async def contender(index: int, locks: NodeLocks, shared: Shared) -> None:
    me = Holder(HolderKey(f"ns/pod-{index}"), f"uid-{index}")
    freed = asyncio.Event()

    def on_change(view: NodeLockView | None, node: NodeName) -> None:
        if view is None or view.record.holder is None:
            freed.set()

    watching = asyncio.create_task(locks.watch(node=NODE, on_change=on_change))
    rng = random.Random(index)
    try:
        while len(shared.tokens) < ROUNDS:
            try:
                lock = await locks.acquire(NODE, me)
            except LockHeld:
                shared.refusals += 1
                freed.clear()
                seen = locks.view(NODE)
                if seen is not None and seen.record.holder is not None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(freed.wait(), timeout=1.0)
                await asyncio.sleep(rng.random() * 0.004)
                continue
            assert shared.holder is None, f"{me.key} got the lock while {shared.holder} held it"
            shared.holder = me.key
            shared.tokens.append(lock.token)
            shared.wins[me.key] = shared.wins.get(me.key, 0) + 1
            await asyncio.sleep(0)  # let every other task run while we hold it
            shared.holder = None
            await locks.release(lock, outcome=Outcome.ALLOCATED)
    finally:
        watching.cancel()


async def test_contenders_exclude_each_other_and_tokens_strictly_increase(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    registry = CollectorRegistry()
    metrics = LockMetrics(registry=registry)
    clients = [await KubeClient.connect(str(cluster.kubeconfig)) for _ in range(CONTENDERS)]
    shared = Shared()
    try:
        contenders = [
            contender(
                i,
                NodeLocks(
                    client,
                    namespace=namespace,
                    duration_s=60,
                    metrics=metrics,
                    prefix=DEFAULT_PREFIX,
                ),
                shared,
            )
            for i, client in enumerate(clients)
        ]
        await asyncio.wait_for(asyncio.gather(*contenders), timeout=600)
    finally:
        for client in clients:
            await client.close()

    acquired = len(shared.tokens)
    assert acquired >= ROUNDS
    assert all(b > a for a, b in zip(shared.tokens, shared.tokens[1:], strict=False))
    # no acquisition lost or counted twice: tokens are exactly 1..n and the Lease says n
    assert shared.tokens == list(range(1, acquired + 1))
    lease = await kube.get(lease_path(namespace, NODE))
    assert lease["spec"]["leaseTransitions"] == acquired
    assert "holderIdentity" not in lease["spec"]
    assert len(shared.wins) == CONTENDERS  # everyone got it at least once
    assert shared.refusals > 0  # there was contention to exclude
    assert registry.get_sample_value(
        "nodelock_lock_acquisitions_total", {"node": NODE, "result": "acquired"}
    ) == float(acquired)
