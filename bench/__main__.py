"""``make bench``: every benchmark in one command, each printing ratios against its baseline.

Runs, one after another (each starts what it needs and stops it):

- ``bench.lockd_requests``: API requests and round trips per acquire and release, counted by
  kube-apiserver, against a client-go-style get-then-update baseline;
- ``bench.extender_bench``: filter and prioritize latency for 5,000 nodes x 8 GPUs, against an
  empty aiohttp handler;
- ``bench.watch_events``: the extender's CPU per pod watch event, against parsing every event;
- ``bench.handoff``: pods/s through the extender against the default binder, API requests per
  pod, handoff overhead, lock-aware prioritize on and off;
- ``bench.scale``: the extender's start-to-synced time and peak RSS restarted on 50 nodes and
  2,000 pods of a real API server (the quick size; larger ones are flags);
- ``bench.pod_memory``: the chart's pods' memory cgroups on containerd nodes (root), the device
  plugin with ``nodelock audit --node-local`` exec'd in it against the plugin at rest, and both
  against the chart's request and limit;
- ``bench.allocation``: allocation quality of the topology-aware choice against lowest-index
  binpack on one seeded job stream (pure, no cluster).

Results are JSON files in ``bench/results/``.
"""

from __future__ import annotations

import os
import subprocess
import sys

RESULTS = "bench/results"
BENCHMARKS = [
    ["bench.lockd_requests", "--json", f"{RESULTS}/lockd_requests.json"],
    ["bench.extender_bench"],
    ["bench.watch_events"],
    ["bench.handoff"],
    ["bench.scale"],
    ["bench.pod_memory"],
    ["bench.allocation", "--json", f"{RESULTS}/allocation.json"],
]


def main() -> int:
    os.makedirs(RESULTS, exist_ok=True)
    failed = []
    for module, *args in BENCHMARKS:
        print(f"\n==> python -m {module} {' '.join(args)}", flush=True)
        if subprocess.run([sys.executable, "-m", module, *args], check=False).returncode:
            failed.append(module)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
