"""Shared pieces of the lockd benchmarks: a control plane to run against, and small statistics.

Not a test: numbers printed here describe one machine at one moment.  Every benchmark takes
``--kubeconfig`` (a running cluster, e.g. ``nodelock devcluster up``); without it, it starts a
throwaway devcluster (the real kube-apiserver and etcd, built by ``devcluster``) and stops it at
the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import secrets
import statistics
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from devcluster.namespaces import create_namespace
from kube.client import KubeClient

Results = TypeVar("Results")


def add_cluster_args(parser: argparse.ArgumentParser) -> None:
    """``--kubeconfig`` and ``--json``, which ``run_and_report`` reads."""
    parser.add_argument(
        "--kubeconfig", help="a running cluster (default: start a throwaway devcluster)"
    )
    parser.add_argument("--json", help="also write the results to this file")


def run_and_report(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace, str], Coroutine[Any, Any, Results]],
    report: Callable[[Results], str],
) -> int:
    """Run one benchmark against ``--kubeconfig`` (or a throwaway devcluster), print its report
    and, with ``--json``, write its results there; the exit status."""
    with cluster_kubeconfig(args.kubeconfig) as kubeconfig:
        results = asyncio.run(run(args, kubeconfig))
    print(report(results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


@contextlib.contextmanager
def cluster_kubeconfig(kubeconfig: str | None) -> Iterator[str]:
    """``kubeconfig`` itself, or the admin kubeconfig of a devcluster started for the run."""
    if kubeconfig:
        yield kubeconfig
        return
    from devcluster.cluster import throwaway_cluster

    print("starting a throwaway devcluster ...", flush=True)
    with throwaway_cluster("nl-bench-") as cluster:
        print(f"a throwaway devcluster is up in {cluster.state_dir}", flush=True)
        yield str(cluster.kubeconfig)


async def fresh_namespace(kube: KubeClient, prefix: str) -> str:
    """Create a namespace for the run and wait for its default ServiceAccount."""
    return await create_namespace(kube, f"{prefix}-{secrets.token_hex(3)}")


_REQUEST_LINE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


async def lease_requests(kube: KubeClient) -> dict[str, float]:
    """The API server's own count of Lease requests so far, by verb.

    From ``apiserver_request_total`` on kube-apiserver's ``/metrics`` (needs an admin identity).
    """
    text = await kube.request_text("GET", "/metrics")
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _REQUEST_LINE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("resource") != "leases" or labels.get("group") != "coordination.k8s.io":
            continue
        verb = labels.get("verb", "?")
        out[verb] = out.get(verb, 0.0) + float(match["value"])
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {
        verb: after[verb] - before.get(verb, 0.0)
        for verb in sorted(after)
        if after[verb] - before.get(verb, 0.0) > 0
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"
    rule = "| " + " | ".join("-" * w for w in widths) + " |"
    body = [
        "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    return "\n".join([line, rule, *body])
