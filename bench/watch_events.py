"""The extender's CPU per pod watch event, with its parse memo against parsing every event.

The extender follows every pod through one watch (``scheduler_ext.cache``); in a burst each GPU
pod reaches it about five times: created, bound with its assignment and fencing token, then
kubelet's status writes (scheduled, started, ready).  Each event is parsed into a ``PodState``,
and only the first two change what the pod's GPU need is read from (its containers and
annotations).  This replays that sequence for ``--pods`` pods on ``--nodes`` nodes through
``ClusterCache.apply_pod`` twice in the same process, alternating ``--repeats`` times:

- **memo** (as shipped): ``ClusterCache``'s ``need.NeedMemo`` keeps each need by what it is
  read from;
- **baseline**: the same cache with a memo of size 0, which parses every event's need again
  (what the extender did before the memo).

It reports the CPU time (``time.process_time``) per event and per pod, the median over the
repeats, and the ratio memo / baseline.  Pure: no cluster, no API server.

    .venv/bin/python -m bench.watch_events [--pods 4096] [--nodes 512] [--repeats 5]

Writes ``bench/results/watch_events.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from handoff.wire import (
    GPU,
    ContainerName,
    DeviceID,
    Keys,
    format_assignment,
    format_inventory,
    format_token,
)
from lockd.model import FencingToken
from scheduler_ext.cache import ClusterCache

RES = "nvidia.com/gpu"
GPUS = 8
RESULTS = Path(__file__).parent / "results" / "watch_events.json"
JSON = dict[str, Any]


def nodes(count: int) -> list[JSON]:
    """``count`` nodes of ``GPUS`` GPUs each, with their inventory annotation."""
    out = []
    for n in range(count):
        name = f"gpu-node-{n:04d}"
        inventory = format_inventory(
            [
                GPU(DeviceID(f"GPU-{name}-{i}"), i, "NVIDIA H100 80GB HBM3", 81559, i // 4, True)
                for i in range(GPUS)
            ]
        )
        out.append(
            {
                "metadata": {"name": name, "annotations": {Keys().gpus: inventory}},
                "status": {"allocatable": {RES: str(GPUS), "cpu": "128", "pods": "110"}},
            }
        )
    return out


def pod_events(index: int, node_count: int) -> list[JSON]:
    """The watch events one single-GPU pod of a Job sends the extender in a burst, in order."""
    keys = Keys()
    name = f"burst-{index:05d}"
    node = f"gpu-node-{index % node_count:04d}"
    device = f"GPU-{node}-{(index // node_count) % GPUS}"
    created: JSON = {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": {"job-name": "burst", "batch.kubernetes.io/job-name": "burst"},
            "ownerReferences": [{"kind": "Job", "name": "burst", "uid": "uid-job"}],
        },
        "spec": {
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/train:1",
                    "command": ["python", "train.py"],
                    "env": [{"name": "EPOCHS", "value": "3"}],
                    "resources": {
                        "limits": {RES: "1", "cpu": "4", "memory": "16Gi"},
                        "requests": {RES: "1", "cpu": "4", "memory": "16Gi"},
                    },
                }
            ],
        },
        "status": {"phase": "Pending", "qosClass": "Guaranteed"},
    }
    events = [created]

    def then(version: int, change: JSON) -> None:
        obj = copy.deepcopy(events[-1])
        obj["metadata"]["resourceVersion"] = str(version)
        for part, fields in change.items():
            obj.setdefault(part, {}).update(fields)
        events.append(obj)

    annotations = {
        keys.assignment: format_assignment({ContainerName("main"): [DeviceID(device)]}),
        keys.token: format_token(FencingToken(index + 1)),
    }
    then(2, {"metadata": {"annotations": annotations}, "spec": {"nodeName": node}})
    scheduled = {"type": "PodScheduled", "status": "True"}
    then(3, {"status": {"conditions": [scheduled]}})
    started = {"name": "main", "ready": False, "state": {"running": {"startedAt": "now"}}}
    then(4, {"status": {"phase": "Running", "containerStatuses": [started]}})
    ready = [scheduled, {"type": "Ready", "status": "True"}]
    then(5, {"status": {"conditions": ready, "containerStatuses": [{**started, "ready": True}]}})
    return events


def replay(node_objs: list[JSON], events: list[list[JSON]], *, memo_size: int) -> float:
    """CPU seconds for a fresh cache (``memo_size``) to take every pod's events, pod by pod."""
    cache = ClusterCache(resource=RES, need_memo_size=memo_size)
    cache.replace_nodes(node_objs)
    cache.replace_pods([])
    started = time.process_time()
    for pod in events:
        for i, obj in enumerate(pod):
            cache.apply_pod("ADDED" if i == 0 else "MODIFIED", obj)
    spent = time.process_time() - started
    on_nodes = sum(len(cache.pods_on(n)) for n in cache.node_names())
    if on_nodes != len(events):  # every pod must have landed, or the figure measures nothing
        raise SystemExit(f"the cache holds {on_nodes} bound pods, not {len(events)}")
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=4096)
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    node_objs = nodes(args.nodes)
    events = [pod_events(i, args.nodes) for i in range(args.pods)]
    count = sum(len(e) for e in events)
    runs: dict[str, list[float]] = {"baseline": [], "memo": []}
    for _ in range(args.repeats):
        runs["baseline"].append(replay(node_objs, events, memo_size=0))
        runs["memo"].append(replay(node_objs, events, memo_size=args.pods))
    median = {k: statistics.median(v) for k, v in runs.items()}
    ratios = [m / b for m, b in zip(runs["memo"], runs["baseline"], strict=True)]
    print(
        f"{args.pods} pods, {count} watch events, {args.nodes} nodes; "
        f"CPU, median of {args.repeats}:"
    )
    for kind in ("baseline", "memo"):
        print(
            f"  {kind:<9} {median[kind] * 1e6 / count:7.1f} us per event"
            f"  {median[kind] * 1e6 / args.pods:8.1f} us per pod"
        )
    print(
        f"  memo / baseline {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "pods": args.pods,
                "nodes": args.nodes,
                "events": count,
                "repeats": args.repeats,
                "cpu_us_per_event": {k: v * 1e6 / count for k, v in median.items()},
                "cpu_us_per_pod": {k: v * 1e6 / args.pods for k, v in median.items()},
                "memo_vs_baseline": statistics.median(ratios),
                "runs_s": runs,
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
