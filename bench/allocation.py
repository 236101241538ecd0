"""Allocation quality: topology-aware choice against lowest-index binpack, on one job stream.

A seeded stream of 1/2/4/8-GPU jobs arrives (Poisson) and finishes (exponential run times) over
a fleet of ``--nodes`` x 8 GPUs of mixed layouts (``deviceplugin.simulated.LAYOUTS``, in turn).
Both strategies see the same jobs in the same order and schedule like kube-scheduler with the
extender: every pending job is tried at every step in arrival order (no head-of-line blocking),
nodes are filtered and ranked by the extender's own ``filter_nodes`` / ``prioritize_nodes``
(binpack), the highest score wins (ties to the lower node name), and the devices come from
``choose``.

- ``topology``: the extender as it is (links and NUMA nodes in the inventory).
- ``naive``: the same code on inventories stripped of links and NUMA nodes, so it takes the
  lowest-index free GPUs -- the extender before topology.  The link class of what it took is
  judged on the real layout.

Reported per strategy: GPU utilization (mean, and per tenth of the run), 8-GPU jobs that had to
wait while the fleet had 8 or more GPUs free (fragmentation), mean wait by job size, and the
share of multi-GPU jobs whose set is of the best link class their node's layout offers for that
size.  No cluster, no I/O besides the JSON result.

    .venv/bin/python -m bench.allocation [--nodes 64] [--steps 1500] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from deviceplugin.simulated import LAYOUTS, SimSpec, inventory
from handoff.request import ContainerKind, ContainerNeed
from handoff.topology import NO_TOPO, Link, NumaPolicy, set_link
from handoff.wire import GPU, ContainerName, DeviceID
from lockd.model import NodeName
from scheduler_ext.choose import NodeGPUs, Policy, choose
from scheduler_ext.need import PodNeed, plan_slots
from scheduler_ext.topology import Pick, place
from scheduler_ext.verbs import filter_nodes, prioritize_nodes

SIZES = (1, 2, 4, 8)
WEIGHTS = (0.4, 0.3, 0.2, 0.1)
GPUS = 8


@dataclass
class Job:
    name: str
    size: int
    arrives: int
    runs: int


@dataclass
class Fleet:
    """One strategy's nodes, what is taken, and what it measured."""

    name: str
    layouts: dict[NodeName, tuple[GPU, ...]]  # the real inventories
    seen: dict[NodeName, tuple[GPU, ...]]  # what the extender is shown
    taken: dict[NodeName, set[DeviceID]] = field(default_factory=dict)
    running: list[tuple[int, NodeName, list[DeviceID]]] = field(default_factory=list)
    utilization: list[float] = field(default_factory=list)
    blocked_8: int = 0  # job-steps an 8-GPU job waited with >= 8 GPUs free in the fleet
    blocked_8_jobs: set[str] = field(default_factory=set)
    waits: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    best_class: dict[int, list[bool]] = field(default_factory=lambda: defaultdict(list))
    classes: dict[int, dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int))
    )

    def picture(self, node: NodeName) -> NodeGPUs:
        return NodeGPUs(
            node=node,
            devices=self.seen[node],
            taken=frozenset(self.taken.get(node, ())),
            allocatable=GPUS,
        )


def need_of(size: int) -> PodNeed:
    return plan_slots([ContainerNeed(ContainerName("c"), size, ContainerKind.APP)])


def best_possible(devices: tuple[GPU, ...], size: int) -> Link:
    """The best link class a set of ``size`` GPUs can have on an empty node of this layout."""
    outcome = place(devices, devices, need_of(size), NumaPolicy.NONE)
    return outcome.link if isinstance(outcome, Pick) else Link.SYSTEM


def make_fleets(nodes: int) -> tuple[Fleet, Fleet, dict[NodeName, str]]:
    layouts: dict[NodeName, tuple[GPU, ...]] = {}
    kinds: dict[NodeName, str] = {}
    for i in range(nodes):
        name = NodeName(f"node-{i:03d}")
        kind = LAYOUTS[i % len(LAYOUTS)]
        layouts[name] = tuple(inventory(name, SimSpec(count=GPUS), {"layout": kind}))
        kinds[name] = kind
    flat = {n: tuple(replace(g, numa=None, topo=NO_TOPO) for g in d) for n, d in layouts.items()}
    return Fleet("topology", layouts, layouts), Fleet("naive", layouts, flat), kinds


def jobs_stream(seed: int, steps: int, rate: float, mean_run: float) -> list[Job]:
    rng = random.Random(seed)
    jobs: list[Job] = []
    for t in range(steps):
        # Poisson arrivals by inversion (no numpy)
        arrivals, p, limit = 0, rng.random(), pow(2.718281828459045, -rate)
        while p > limit:
            arrivals += 1
            p *= rng.random()
        for _ in range(arrivals):
            size = rng.choices(SIZES, WEIGHTS)[0]
            runs = max(1, round(rng.expovariate(1 / mean_run)))
            jobs.append(Job(f"j{len(jobs)}", size, t, runs))
    return jobs


def schedule(
    fleet: Fleet,
    pending: list[Job],
    t: int,
    best: dict[tuple[str, int], Link],
    kinds: dict[NodeName, str],
) -> list[Job]:
    names = sorted(fleet.layouts)
    left: list[Job] = []
    for job in pending:
        need = need_of(job.size)
        pictures = {n: fleet.picture(n) for n in names}
        passed = filter_nodes(need, names, pictures.get).passed
        if not passed:
            free = sum(GPUS - len(fleet.taken.get(n, ())) for n in names)
            if job.size == GPUS and free >= GPUS:
                fleet.blocked_8 += 1
                fleet.blocked_8_jobs.add(job.name)
            left.append(job)
            continue
        scores = prioritize_nodes(need, passed, pictures.get, policy=Policy.BINPACK)
        ranked = zip(passed, scores, strict=True)
        node = max(ranked, key=lambda s: (s[1], [-ord(c) for c in s[0]]))[0]
        got = choose(pictures[node], need)[ContainerName("c")]
        fleet.taken.setdefault(node, set()).update(got)
        fleet.running.append((t + job.runs, node, got))
        fleet.waits[job.size].append(t - job.arrives)
        if job.size > 1:
            real = {g.id: g for g in fleet.layouts[node]}
            cls = set_link([real[d] for d in got])
            fleet.best_class[job.size].append(cls >= best[(kinds[node], job.size)])
            fleet.classes[job.size][cls.name] += 1
    return left


def run(fleet: Fleet, jobs: list[Job], steps: int, kinds: dict[NodeName, str]) -> None:
    best = {
        (kinds[n], size): best_possible(fleet.layouts[n], size)
        for n in fleet.layouts
        for size in SIZES
    }
    pending: list[Job] = []
    by_step: dict[int, list[Job]] = defaultdict(list)
    for job in jobs:
        by_step[job.arrives].append(job)
    for t in range(steps):
        still = []
        for ends, node, got in fleet.running:
            if ends <= t:
                fleet.taken[node].difference_update(got)
            else:
                still.append((ends, node, got))
        fleet.running = still
        pending = schedule(fleet, pending + by_step.get(t, []), t, best, kinds)
        used = sum(len(v) for v in fleet.taken.values())
        fleet.utilization.append(used / (GPUS * len(fleet.layouts)))


def summary(fleet: Fleet, warmup: int) -> dict[str, Any]:
    util = fleet.utilization[warmup:]
    tenth = max(1, len(fleet.utilization) // 10)
    return {
        "utilization_mean": round(statistics.fmean(util), 4),
        "utilization_by_tenth": [
            round(statistics.fmean(fleet.utilization[i : i + tenth]), 3)
            for i in range(0, len(fleet.utilization), tenth)
        ],
        "blocked_8gpu_job_steps_with_8_free": fleet.blocked_8,
        "blocked_8gpu_jobs_with_8_free": len(fleet.blocked_8_jobs),
        "mean_wait_steps": {
            str(s): round(statistics.fmean(w), 2) for s, w in sorted(fleet.waits.items()) if w
        },
        "placed": {str(s): len(w) for s, w in sorted(fleet.waits.items())},
        "best_class_share": {
            str(s): round(sum(b) / len(b), 4) for s, b in sorted(fleet.best_class.items()) if b
        },
        "best_class_share_all_multi_gpu": round(
            sum(sum(b) for b in fleet.best_class.values())
            / max(1, sum(len(b) for b in fleet.best_class.values())),
            4,
        ),
        "link_classes": {str(s): dict(c) for s, c in sorted(fleet.classes.items())},
    }


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.allocation", description=__doc__)
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--load", type=float, default=0.95, help="offered load, share of the GPUs")
    p.add_argument("--mean-run", type=float, default=60.0, help="mean job run time in steps")
    p.add_argument("--json", default="bench/results/allocation.json")
    args = p.parse_args()
    mean_size = sum(s * w for s, w in zip(SIZES, WEIGHTS, strict=True))
    rate = args.load * args.nodes * GPUS / (mean_size * args.mean_run)
    jobs = jobs_stream(args.seed, args.steps, rate, args.mean_run)
    out: dict[str, Any] = {
        "nodes": args.nodes,
        "gpus_per_node": GPUS,
        "layouts": list(LAYOUTS),
        "steps": args.steps,
        "seed": args.seed,
        "offered_load": args.load,
        "jobs": len(jobs),
        "jobs_by_size": {str(s): sum(1 for j in jobs if j.size == s) for s in SIZES},
    }
    warmup = args.steps // 10
    for fleet, kinds in _fleets(args.nodes):
        started = time.perf_counter()
        run(fleet, jobs, args.steps, kinds)
        out[fleet.name] = summary(fleet, warmup)
        out[fleet.name]["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out, indent=2))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


def _fleets(nodes: int) -> list[tuple[Fleet, dict[NodeName, str]]]:
    topo, naive, kinds = make_fleets(nodes)
    return [(topo, kinds), (naive, kinds)]


if __name__ == "__main__":
    raise SystemExit(main())
