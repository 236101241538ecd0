"""``nodelock extender``: serve the kube-scheduler extender (filter, prioritize, bind)."""

from __future__ import annotations

import argparse
import asyncio

from handoff.flags import add_flags as add_handoff_flags
from handoff.wire import DEFAULT_RESOURCE
from kube.client import KubeClient
from kube.process import configure_logging, run_until_signalled
from scheduler_ext.binder import DEFAULT_WAIT_BUDGET_S
from scheduler_ext.choose import Policy
from scheduler_ext.config import DEFAULT_HTTP_TIMEOUT_S
from scheduler_ext.server import DEFAULT_MAX_BODY_BYTES
from scheduler_ext.service import Extender, Settings, check_settings, parse_listen
from scheduler_ext.takeover import DEFAULT_REQUEST_TIMEOUT_S

DEFAULT_METRICS_PORT = 8889


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "extender",
        help="serve the kube-scheduler extender that picks GPUs and binds under node locks",
        description="Serve the kube-scheduler extender protocol: filter and prioritize nodes by "
        "free GPUs, and bind by taking the node's lock, writing the pod's GPU assignment on the "
        "Binding and leaving the lock for the device plugin to release.",
    )
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig (default: $KUBECONFIG, or in-cluster credentials)",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:8888",
        help="host:port of the extender protocol: filter, prioritize, bind and the probes, "
        "never /metrics; [::]:port is every address of IPv4 and IPv6 (default 127.0.0.1:8888)",
    )
    p.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        help="address of the plain-HTTP port serving /metrics, /healthz and /readyz, no client "
        "certificate needed and no verb reachable; :: is every address of IPv4 and IPv6 "
        "(default 127.0.0.1)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_METRICS_PORT,
        help=f"port of that plain-HTTP port (default {DEFAULT_METRICS_PORT}; 0: any free port)",
    )
    add_handoff_flags(p)
    p.add_argument(
        "--resource-name",
        default=DEFAULT_RESOURCE,
        help=f"extended resource of the GPUs (default {DEFAULT_RESOURCE})",
    )
    p.add_argument(
        "--policy",
        choices=[x.value for x in Policy],
        default=Policy.BINPACK.value,
        help="binpack: fill nodes first; spread: most free GPUs first",
    )
    p.add_argument(
        "--lease-duration",
        type=int,
        default=15,
        metavar="SECONDS",
        help="node lock duration: a lock unchanged this long may be taken over once "
        "its holder left the handoff (default 15)",
    )
    p.add_argument(
        "--bind-wait-budget",
        type=float,
        default=DEFAULT_WAIT_BUDGET_S,
        metavar="SECONDS",
        help="how long a bind waits its turn for a held node lock before failing; 0 fails at "
        "once, as peers do (the "
        f"scheduler then retries the pod later; default {DEFAULT_WAIT_BUDGET_S:g})",
    )
    p.add_argument(
        "--scheduler-http-timeout",
        type=float,
        default=DEFAULT_HTTP_TIMEOUT_S,
        metavar="SECONDS",
        help="kube-scheduler's httpTimeout for this extender: the extender refuses to start when "
        "a bind that waits its whole budget could outlast it "
        f"(default {DEFAULT_HTTP_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--apiserver-request-timeout",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        metavar="SECONDS",
        help="kube-apiserver's --request-timeout: an expired lock whose holder was never bound "
        "is taken over only once a binding its bind sent can no longer be applied "
        f"(default {DEFAULT_REQUEST_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--lock-aware",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="prioritize nodes by the wait a bind there should expect: the lock's holder and "
        "the binds queued for it (default on)",
    )
    p.add_argument(
        "--events",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write Kubernetes Events on pods and nodes: a bind waiting for or refused by a "
        "node lock (naming its holder), an expired lock taken over; at most one write per "
        "pod and reason a minute (default on)",
    )
    p.add_argument(
        "--ask-again-turned-away",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="once the cache shows room for a pod that filter turned away from every node in the "
        "last 30 s, update the pod (annotation <prefix>room-seen) so that kube-scheduler tries "
        "it again at once instead of after up to five minutes; needs patch on pods "
        '(docs/extender.md, "Pods turned away"; default off)',
    )
    p.add_argument("--tls-cert", default=None, help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-key", default=None, help="private key of --tls-cert (PEM)")
    p.add_argument(
        "--client-ca",
        default=None,
        help="require client certificates signed by "
        "this CA (kube-scheduler's tlsConfig certFile/keyFile)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"largest request body accepted (default {DEFAULT_MAX_BODY_BYTES})",
    )
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    p.set_defaults(func=_run)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The extender's settings from parsed flags; raises ``ConfigError`` if unusable."""
    host, port = parse_listen(args.listen)
    settings = Settings(
        host=host,
        port=port,
        lock_namespace=args.lock_namespace,
        annotation_prefix=args.annotation_prefix,
        resource_name=args.resource_name,
        policy=Policy(args.policy),
        lease_duration_s=args.lease_duration,
        wait_budget_s=args.bind_wait_budget,
        scheduler_http_timeout_s=args.scheduler_http_timeout,
        apiserver_request_timeout_s=args.apiserver_request_timeout,
        lock_aware=args.lock_aware,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        client_ca=args.client_ca,
        max_body_bytes=args.max_body_bytes,
        metrics_host=args.metrics_address,
        metrics_port=args.metrics_port,
        events=args.events,
        ask_again=args.ask_again_turned_away,
    )
    check_settings(settings)
    return settings


async def _serve(args: argparse.Namespace, settings: Settings) -> None:
    async with await KubeClient.connect(args.kubeconfig) as kube:
        await run_until_signalled(Extender(kube, settings).serve_forever())


def _run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    settings = settings_from_args(args)
    asyncio.run(_serve(args, settings))
    return 0
