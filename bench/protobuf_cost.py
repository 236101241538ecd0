"""What JSON and protobuf cost kube-apiserver for a node lock's Lease: writes and watch events.

    .venv/bin/python -m bench.protobuf_cost [--writes 400] [--watchers 8] [--blocks 3]

Starts a throwaway devcluster (kube-apiserver and etcd only) and reads kube-apiserver's CPU time
from /proc around each block:

- **writes**: ``--writes`` PUTs of one Lease as lockd writes a held node lock
  (``LeaseFormat``: the lock's labels and annotations, holder, duration, acquire and renew
  times), each conditional on the last resourceVersion as lockd's are, body and answer in JSON
  (``application/json``) or in protobuf (``application/vnd.kubernetes.protobuf``: the ``k8s\\0``
  envelope around the ``coordination.k8s.io/v1`` Lease); and, as a third kind, the same PUTs in
  JSON of a bare Lease (no labels or annotations: ``bare``), so that what the lock's own fields
  cost a write shows apart from what any Lease write costs;
- **watch events**: the same writes (in JSON) while ``--watchers`` watches of the Lease's
  namespace read every event, all of them asking for JSON or all for protobuf
  (``;stream=watch``); the API server's CPU per event delivered is the block's CPU less the
  writes' own, over writes x watchers.

Blocks alternate the kinds ``--blocks`` times each; the report gives the median of each
kind.  The protobuf bodies are encoded here by hand (field numbers of
``k8s.io/api/coordination/v1/generated.proto`` and ``k8s.io/apimachinery/pkg/apis/meta/v1/
generated.proto``, Kubernetes 1.37); nothing here decodes protobuf: the benchmark reads the
answers as bytes, so what it measures is the API server's side only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from devcluster.cluster import Cluster, throwaway_cluster
from devcluster.namespaces import create_namespace
from handoff.wire import (
    DEFAULT_LOCK_NAMESPACE,
    DEFAULT_PREFIX,
    LEASE_ASSIGNMENT,
    ContainerName,
    DeviceID,
    format_assignment,
)
from kube.client import KubeClient, lease_path
from lockd.lease import LeaseFormat
from lockd.model import FencingToken, Holder, HolderKey, NodeName, Outcome

PROTOBUF = "application/vnd.kubernetes.protobuf"
JSON = "application/json"
BARE = "bare"  # JSON writes of a Lease without the lock's labels and annotations
WRITE_KINDS = (JSON, PROTOBUF, BARE)
NAMESPACE = "bench-protobuf"
NAME = "gpu-node-01"
HOLDER = "bench-nodelock/p17"


def _held_lock_metadata() -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations of a node lock as lockd writes it in a burst: held by
    ``HOLDER`` (its UID and one-GPU assignment) after an earlier handoff that ended
    ``allocated`` (the ``last-*`` record)."""
    form = LeaseFormat(DEFAULT_LOCK_NAMESPACE, DEFAULT_PREFIX)
    now = "2026-01-01T00:00:00.000000Z"

    def holder(key: str, uid: str) -> Holder:
        gpu = DeviceID(f"GPU-{uid}")
        return Holder(
            HolderKey(key),
            uid,
            {LEASE_ASSIGNMENT: format_assignment({ContainerName("main"): [gpu]})},
        )

    first = form.new_lease(
        NodeName(NAME),
        holder("bench-nodelock/p16", "6f1c1e8e-5f55-4c1e-9d0e-3a3c7b1d2e40"),
        duration_s=15,
        now=now,
    )
    released = form.released(first, outcome=Outcome.ALLOCATED, now=now)
    held = form.acquired(
        released,
        holder(HOLDER, "6f1c1e8e-5f55-4c1e-9d0e-3a3c7b1d2e4f"),
        token=FencingToken(2),
        duration_s=15,
        now=now,
    )
    return dict(held["metadata"]["labels"]), dict(held["metadata"]["annotations"])


LABELS, ANNOTATIONS = _held_lock_metadata()


# -- a minimal protobuf writer (wire types 0 and 2 are all a Lease needs) ----------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int(field: int, n: int) -> bytes:
    return _varint(field << 3) + _varint(n)


def _bytes(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _str(field: int, text: str) -> bytes:
    return _bytes(field, text.encode())


def _map(field: int, entries: dict[str, str]) -> bytes:
    return b"".join(_bytes(field, _str(1, k) + _str(2, v)) for k, v in sorted(entries.items()))


def _micro_time(seconds: float) -> bytes:
    whole = int(seconds)
    return _int(1, whole) + _int(2, int((seconds - whole) * 1e9) // 1000 * 1000)


def _fields(data: bytes) -> dict[int, bytes]:
    """The length-delimited fields of one message (the last of each number; others skipped)."""
    out, i = {}, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _read_varint(data, i)
        elif wire == 2:
            size, i = _read_varint(data, i)
            out[number] = data[i : i + size]
            i += size
        else:
            raise ValueError(f"wire type {wire} not expected in a Lease")
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n, shift = 0, 0
    while True:
        byte = data[i]
        i += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return n, i


def resource_version_of(answer: bytes) -> str:
    """metadata.resourceVersion of a Lease the API server answered in protobuf."""
    lease = _fields(answer.removeprefix(b"k8s\x00"))[2]
    return _fields(_fields(lease)[1])[6].decode()


def lease_protobuf(now: float, rv: str) -> bytes:
    """The Lease, in the API server's protobuf envelope (``runtime.Unknown`` after ``k8s\\0``)."""
    meta = (
        _str(1, NAME) + _str(3, NAMESPACE) + _str(6, rv) + _map(11, LABELS) + _map(12, ANNOTATIONS)
    )
    spec = (
        _str(1, HOLDER)
        + _int(2, 15)
        + _bytes(3, _micro_time(now))
        + _bytes(4, _micro_time(now))
        + _int(5, 7)
    )
    lease = _bytes(1, meta) + _bytes(2, spec)
    type_meta = _str(1, "coordination.k8s.io/v1") + _str(2, "Lease")
    return b"k8s\x00" + _bytes(1, type_meta) + _bytes(2, lease)


def _rfc3339_micro(seconds: float) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{int(seconds % 1 * 1e6):06d}Z"


def lease_json(now: float, rv: str = "", *, bare: bool = False) -> bytes:
    """The same Lease in JSON; ``bare``: without its labels and annotations (an update then
    removes them)."""
    return json.dumps(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": NAME,
                "namespace": NAMESPACE,
                **({"resourceVersion": rv} if rv else {}),
                **({} if bare else {"labels": LABELS, "annotations": ANNOTATIONS}),
            },
            "spec": {
                "holderIdentity": HOLDER,
                "leaseDurationSeconds": 15,
                "acquireTime": _rfc3339_micro(now),
                "renewTime": _rfc3339_micro(now),
                "leaseTransitions": 7,
            },
        }
    ).encode()


# -- measuring ----------------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _call(kube: KubeClient, method: str, path: str, body: bytes, kind: str) -> str:
    """Send ``body`` as ``kind``, the answer asked in ``kind`` too; the Lease's new
    resourceVersion."""
    api: Any = kube._api  # the bench sets its own Accept and Content-Type
    sent: Any = json.loads(body) if kind == JSON else body  # JSON: the client encodes
    resp = await api.call_api(
        path,
        method,
        header_params={"Accept": kind, "Content-Type": kind},
        body=sent,
        auth_settings=["BearerToken"],
        _preload_content=False,
    )
    answer = await resp.read()
    resp.release()
    if resp.status >= 300:
        raise RuntimeError(f"{method} {path} as {kind}: {resp.status} {answer[:300]!r}")
    if kind == PROTOBUF:
        return resource_version_of(answer)
    return str(json.loads(answer)["metadata"]["resourceVersion"])


_rv = [""]  # the Lease's last resourceVersion: every PUT is a conditional update, as lockd's


async def writes(kube: KubeClient, n: int, kind: str) -> None:
    """``n`` conditional PUTs of the Lease as ``kind`` (``BARE``: JSON, without the lock's
    labels and annotations)."""
    path = lease_path(NAMESPACE, NAME)
    for _ in range(n):
        if kind == PROTOBUF:
            body = lease_protobuf(time.time(), _rv[0])
        else:
            body = lease_json(time.time(), _rv[0], bare=kind == BARE)
        _rv[0] = await _call(kube, "PUT", path, body, PROTOBUF if kind == PROTOBUF else JSON)


async def _drain(kube: KubeClient, kind: str, ready: asyncio.Event, counts: list[int]) -> None:
    api: Any = kube._api
    accept = f"{kind};stream=watch" if kind == PROTOBUF else kind
    resp = await api.call_api(
        lease_path(NAMESPACE),
        "GET",
        query_params=[("watch", "true"), ("timeoutSeconds", "600")],
        header_params={"Accept": accept},
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=600,
    )
    ready.set()
    try:
        async for chunk in resp.content.iter_any():
            counts.append(len(chunk))
    finally:
        resp.release()


async def watched_writes(kube: KubeClient, n: int, watchers: int, kind: str) -> int:
    """``n`` JSON writes while ``watchers`` watches asking for ``kind`` read them; bytes read."""
    counts: list[int] = []
    readies = [asyncio.Event() for _ in range(watchers)]
    tasks = [asyncio.create_task(_drain(kube, kind, r, counts)) for r in readies]
    await asyncio.gather(*(r.wait() for r in readies))
    await asyncio.sleep(0.5)
    await writes(kube, n, JSON)
    await asyncio.sleep(0.5)  # the last events delivered
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return sum(counts)


async def measure(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    pid = cluster.state.procs()["kube-apiserver"].pid
    out: dict[str, Any] = {"write_ms": {}, "event_ms": {}, "write_bytes": {}, "event_bytes": {}}
    async with await KubeClient.connect(str(cluster.kubeconfig), timeout_s=30) as kube:
        await create_namespace(kube, NAMESPACE)
        created = await kube.create(lease_path(NAMESPACE), json.loads(lease_json(time.time())))
        _rv[0] = created["metadata"]["resourceVersion"]
        for kind in WRITE_KINDS:  # warm every path up
            await writes(kube, 50, kind)
        samples: dict[str, dict[str, list[float]]] = {"write": {}, "watch": {}}
        for _ in range(args.blocks):
            for kind in WRITE_KINDS:
                before = cpu_s(pid)
                await writes(kube, args.writes, kind)
                used = cpu_s(pid) - before
                samples["write"].setdefault(kind, []).append(used / args.writes)
        plain = statistics.median(samples["write"][JSON])
        for _ in range(args.blocks):
            for kind in (JSON, PROTOBUF):
                before = cpu_s(pid)
                got = await watched_writes(kube, args.writes, args.watchers, kind)
                used = cpu_s(pid) - before
                per_event = (used / args.writes - plain) / args.watchers
                samples["watch"].setdefault(kind, []).append(per_event)
                out["event_bytes"][kind] = got / (args.writes * args.watchers)
        out["write_bytes"] = {
            JSON: len(lease_json(time.time(), _rv[0])),
            PROTOBUF: len(lease_protobuf(time.time(), _rv[0])),
            BARE: len(lease_json(time.time(), _rv[0], bare=True)),
        }
    for kind in WRITE_KINDS:
        out["write_ms"][kind] = statistics.median(samples["write"][kind]) * 1000
    for kind in (JSON, PROTOBUF):
        out["event_ms"][kind] = statistics.median(samples["watch"][kind]) * 1000
    out["samples"] = samples
    return out


def report(r: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"kube-apiserver CPU per Lease PUT and per watch event delivered "
        f"({args.writes} writes x {args.blocks} blocks each; {args.watchers} watchers)",
        f"{'':<36}{'PUT ms':>9}{'body B':>9}{'event ms':>10}{'event B':>9}",
    ]
    for kind in (JSON, PROTOBUF):
        lines.append(
            f"{kind:<36}{r['write_ms'][kind]:>9.3f}{r['write_bytes'][kind]:>9}"
            f"{r['event_ms'][kind]:>10.3f}{r['event_bytes'].get(kind, 0):>9.0f}"
        )
    label = f"{JSON}, bare Lease"
    lines.append(f"{label:<36}{r['write_ms'][BARE]:>9.3f}{r['write_bytes'][BARE]:>9}")
    lines.append(
        "bare Lease: the same PUTs without the lock's labels and annotations; "
        f"lock-shaped / bare: {r['write_ms'][JSON] / r['write_ms'][BARE]:.2f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=400)
    parser.add_argument("--watchers", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    with throwaway_cluster("nlpb-") as cluster:
        results = asyncio.run(measure(cluster, args))
    print(report(results, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
