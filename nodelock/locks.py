"""``nodelock locks``: list node locks, show one, break one by hand.

``nodelock locks`` prints one line per node lock: node, holder, fencing token, age, whether it is
expired, and what its holder is doing — for a stuck lock, *why* (the holder is still Pending on the
node and not admitted).  ``nodelock locks show NODE`` prints everything the Lease says.
``nodelock locks break NODE`` releases a lock by force after confirmation (``--yes`` to skip it)
and says whose lock it broke.  It refuses, exit status 3, unless ``--force`` is given, when
breaking could hand the holder's GPUs to a second pod: the holder is bound to the node and not
admitted by kubelet yet (kubelet may still admit it), or the holder is not bound yet and its lock
is younger than its duration (the extender's binding may still land).  The break names who broke
the lock (the username the API server knows the caller by, from a SelfSubjectReview) and why
(``--reason``) in the Lease's ``broken-by``/``broken-reason`` annotations: the chart's admission
policy admits a person's change of a lock's holder only in such a write.

Age and expiry shown without ``--observe`` are read from the Lease's own timestamps against this
machine's clock, which is informational only (clocks differ); lockd itself judges expiry by how
long *it* has seen a record unchanged.  ``--observe SECONDS`` watches the Leases that long and
judges the same way lockd does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from prometheus_client import CollectorRegistry

from handoff.flags import add_flags as add_handoff_flags
from handoff.holder import HolderState, HolderStatus, holder_status
from handoff.sharing import bound_slices, split_of
from handoff.wire import Keys, MalformedAnnotation, parse_inventory
from kube.client import KubeClient, lease_path, node_path, pod_path
from kube.errors import ApiError, Conflict, Forbidden, NotFound
from kube.events import EventRecorder, EventType, ObjectRef
from lockd.locks import NodeLocks
from lockd.metrics import LockMetrics
from lockd.microtime import now_microtime, parse_microtime
from lockd.model import FencingToken, LockRecord, NodeLockView, NodeName
from nodelock.locks_output import (
    OUTPUT_FORMATS,
    gpu_slices,
    gpu_slices_text,
    lock_item,
    render_items,
)

HANDOFF_WARNING = (
    "WARNING: {holder} is still Pending on node {node} and not admitted by kubelet. Breaking its "
    "lock lets another pod take node {node}'s lock while kubelet may still admit {holder}: two "
    "pods could get the same GPUs. The lock ends by itself when the pod is admitted, rejected or "
    "deleted."
)
BIND_WARNING = (
    "WARNING: {holder} is not bound yet and its lock on node {node} changed {age} ago, within its "
    "duration of {duration}s: the extender's binding of {holder} to node {node} may still land. "
    "Breaking its lock lets another pod take node {node}'s lock while kubelet may then admit "
    "{holder}: two pods could get the same GPUs. Wait {duration}s and look again."
)
NEEDS_FORCE = 3  # exit status of a break refused for want of --force
MAX_BREAK_WRITES = 3
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


class CliError(Exception):
    """A problem the person running the command can fix; printed as one line."""

    user_facing = True


Confirm = Callable[[str], bool]


def register(sub: Any) -> None:
    """Add ``locks`` (with ``show`` and ``break``) to the ``nodelock`` command."""
    p = sub.add_parser(
        "locks",
        help="list node locks, show one, or break one by hand",
        description="List node locks (no ACTION), show one, or break one by hand.",
        epilog=(
            "Without --observe, AGE and EXPIRED are read from the Leases' timestamps against this"
            " machine's clock (informational); lockd judges expiry by observed time."
        ),
    )
    _common(p, suppress=False)
    p.add_argument(
        "--observe",
        type=float,
        metavar="SECONDS",
        default=None,
        help="watch the Leases this long and judge expiry by observed time, as lockd does",
    )
    p.set_defaults(func=run_command, locks_action="list")
    actions = p.add_subparsers(dest="locks_action", metavar="[ACTION]")
    show = actions.add_parser("show", help="everything one node's lock says")
    _common(show, suppress=True)
    show.add_argument("node", help="node name (= Lease name)")
    brk = actions.add_parser("break", help="release a node's lock by force")
    _common(brk, suppress=True)
    brk.add_argument("node", help="node name (= Lease name)")
    brk.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    brk.add_argument(
        "--reason",
        default=None,
        help="why the lock is broken, recorded on the Lease (default: the holder's state)",
    )
    brk.add_argument(
        "--force",
        action="store_true",
        help="break even when the holder may still get its GPUs (refused otherwise, exit 3)",
    )


def _common(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    def default(value: str | None) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--kubeconfig", default=default(None), help="kubeconfig file (default $KUBECONFIG)"
    )
    add_handoff_flags(parser, suppress_defaults=suppress)
    parser.add_argument(
        "--context",
        default=default(None),
        help="kubeconfig context to use (default: the kubeconfig's current context)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUT_FORMATS,
        default=default("table"),
        help="table (default), or one JSON or YAML document for scripts (list and show)",
    )


def run_command(args: argparse.Namespace) -> int:
    """Entry point of ``nodelock locks``: runs the chosen action."""
    return asyncio.run(run_locks(args, out=sys.stdout, err=sys.stderr, confirm=ask_terminal))


def ask_terminal(question: str) -> bool:
    """Ask on the terminal; refuse to guess when there is none."""
    if not sys.stdin.isatty():
        raise CliError("not breaking without confirmation: stdin is not a terminal (use --yes)")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


async def run_locks(args: argparse.Namespace, *, out: TextIO, err: TextIO, confirm: Confirm) -> int:
    """Run one ``nodelock locks`` action with the given streams (testable without a process)."""
    try:
        kube = await KubeClient.connect(args.kubeconfig, context=getattr(args, "context", None))
    except Exception as exc:  # kubeconfig missing or malformed: say so in one line
        raise CliError(f"cannot load the kubeconfig: {exc}") from exc
    try:
        locks = NodeLocks(
            kube,
            namespace=args.lock_namespace,
            prefix=args.annotation_prefix,
            metrics=LockMetrics(registry=CollectorRegistry()),  # nothing to export
        )
        action = getattr(args, "locks_action", None) or "list"
        output = getattr(args, "output", "table")
        if action == "show":
            return await _show(locks, kube, NodeName(args.node), out, output=output)
        if action == "break":
            return await _break(
                locks,
                kube,
                NodeName(args.node),
                yes=args.yes,
                force=getattr(args, "force", False),
                reason=getattr(args, "reason", None),
                out=out,
                err=err,
                confirm=confirm,
            )
        return await _list(locks, kube, args.observe, out, output=output)
    finally:
        await kube.close()


# -- reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One node lock as the CLI shows it."""

    view: NodeLockView
    holder: HolderStatus | None
    age_s: float | None
    expired: str  # "yes", "no", or "no (unchanged 5s of 15s)"
    observed: bool


async def _holder(kube: KubeClient, record: LockRecord) -> HolderStatus | None:
    if record.holder is None:
        return None
    namespace, _, name = record.holder.key.partition("/")
    if not name:
        return HolderStatus(HolderState.GONE, f"holder {record.holder.key!r} is not a pod key")
    try:
        pod = await kube.get(pod_path(namespace, name))
    except NotFound:
        pod = None
    except ApiError as exc:
        return HolderStatus(HolderState.UNKNOWN, f"cannot read the holder pod: {exc}")
    return holder_status(pod, uid=record.holder.uid, node=record.node)


def _by_timestamps(record: LockRecord, now: float) -> tuple[float | None, str]:
    """(age, expired) read from the Lease's own times against this machine's clock."""
    if record.holder is None:
        return None, "-"
    age: float | None = None
    expired = "?"
    with contextlib.suppress(ValueError, TypeError):
        age = now - parse_microtime(str(record.acquire_time)).timestamp()
    with contextlib.suppress(ValueError, TypeError):
        renewed = parse_microtime(str(record.renew_time)).timestamp()
        expired = "yes" if now - renewed >= record.duration_s else "no"
    return age, expired


def _by_observation(view: NodeLockView) -> str:
    if view.record.holder is None:
        return "-"
    if view.expired:
        return "yes"
    return f"no (unchanged {view.unchanged_for_s:.0f}s of {view.record.duration_s}s)"


async def _rows(
    locks: NodeLocks, kube: KubeClient, views: Sequence[NodeLockView], *, observed: bool
) -> list[Row]:
    now = time.time()
    rows = []
    for view in views:
        age, expired = _by_timestamps(view.record, now)
        if observed:
            expired = _by_observation(view)
        rows.append(Row(view, await _holder(kube, view.record), age, expired, observed))
    return rows


def state_text(row: Row) -> str:
    """What the lock is doing, and for a stuck one, why."""
    record = row.view.record
    if record.holder is None or row.holder is None:
        if record.last is None:
            return "free"
        return f"free (last: {record.last.holder} {record.last.outcome}, token {record.last.token})"
    expired = row.expired.startswith("yes")
    if row.holder.in_handoff:
        if expired:
            return (
                f"STUCK: {row.holder.why}; never taken over, ends when the pod is admitted, "
                "rejected or deleted"
            )
        return f"in handoff: {row.holder.why}"
    if expired:
        return f"expired, can be taken over: {row.holder.why}"
    return row.holder.why


def duration_text(seconds: float | None) -> str:
    """``42s``, ``3m12s``, ``2h5m``, ``4d3h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def render_table(rows: Sequence[Row]) -> str:
    """The ``nodelock locks`` table, columns aligned."""
    header = ["NODE", "HOLDER", "TOKEN", "AGE", "EXPIRED", "STATE"]
    lines = [header]
    for row in rows:
        record = row.view.record
        lines.append(
            [
                record.node,
                record.holder.key if record.holder else "-",
                str(record.token),
                duration_text(row.age_s),
                row.expired,
                state_text(row),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    text = [
        "  ".join(cell.ljust(w) for cell, w in zip(line[:-1], widths, strict=True))
        + "  "
        + line[-1]
        for line in lines
    ]
    return "\n".join(text)


def _item(row: Row, namespace: str) -> dict[str, Any]:
    return lock_item(
        row.view.record,
        namespace=namespace,
        holder_state=row.holder.state.value if row.holder is not None else None,
        age_s=row.age_s,
        expired=row.expired,
        observed=row.observed,
        state=state_text(row),
    )


async def _list(
    locks: NodeLocks,
    kube: KubeClient,
    observe: float | None,
    out: TextIO,
    *,
    output: str = "table",
) -> int:
    if observe is not None:
        watching = asyncio.create_task(locks.watch())
        try:
            await asyncio.sleep(observe)
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
        views = locks.views()
    else:
        views = await locks.list()
    rows = await _rows(locks, kube, views, observed=observe is not None)
    if output != "table":
        print(render_items([_item(r, locks.namespace) for r in rows], output), file=out)
        return 0
    if not views:
        print(f"no node locks in namespace {locks.namespace}", file=out)
        return 0
    print(render_table(rows), file=out)
    if observe is None and any(v.record.holder is not None for v in views):
        print(
            "\nAGE and EXPIRED come from the Leases' own timestamps against this machine's clock"
            " (informational); lockd judges expiry by observed time: use --observe SECONDS.",
            file=out,
        )
    return 0


async def _show(
    locks: NodeLocks, kube: KubeClient, node: NodeName, out: TextIO, *, output: str = "table"
) -> int:
    view = await locks.inspect(node)
    if view is None:
        raise CliError(f"node {node} has no lock (no Lease {node} in namespace {locks.namespace})")
    (row,) = await _rows(locks, kube, [view], observed=False)
    gpus = await _gpu_slices(kube, node, Keys(locks.prefix))
    if output != "table":
        item = _item(row, locks.namespace)
        if gpus is not None:
            item["gpus"] = gpus
        print(render_items([item], output, single=True), file=out)
        return 0
    print(describe(row, namespace=locks.namespace, gpus=gpus), file=out)
    return 0


async def _gpu_slices(kube: KubeClient, node: NodeName, keys: Keys) -> list[dict[str, Any]] | None:
    """Each GPU's slices on a node that shares its GPUs (None: it does not, or the caller may
    not read its inventory or its pods; ``show`` then prints the lock alone)."""
    try:
        obj = await kube.get(node_path(node))
        devices = parse_inventory(
            ((obj.get("metadata") or {}).get("annotations") or {}).get(keys.gpus), key=keys.gpus
        )
    except (NotFound, Forbidden, MalformedAnnotation):
        return None
    if split_of(devices) <= 1:
        return None
    try:
        pods = await kube.list(pod_path(), field_selector=f"spec.nodeName={node}")
    except Forbidden:  # the caller may not list pods cluster-wide: the lock alone
        return None
    return gpu_slices(devices, bound_slices(pods.get("items") or [], keys=keys))


def describe(row: Row, *, namespace: str, gpus: Sequence[dict[str, Any]] | None = None) -> str:
    """Everything one node lock says, one field per line; then, on a node that shares its GPUs,
    each GPU's slices (``gpus``: ``gpu_slices``)."""
    record = row.view.record
    fields: list[tuple[str, str]] = [
        ("node", record.node),
        ("lease", f"{namespace}/{record.node} (resourceVersion {record.resource_version})"),
        ("fencing token", str(record.token)),
    ]
    if record.holder is None:
        fields.append(("holder", "none (free)"))
    else:
        fields += [
            ("holder", f"{record.holder.key} (uid {record.holder.uid or '?'})"),
            ("acquired", f"{record.acquire_time} ({duration_text(row.age_s)} ago by this clock)"),
            ("renewed", str(record.renew_time)),
            ("duration", f"{record.duration_s}s"),
            ("expired", f"{row.expired} (by the Lease's timestamps; informational)"),
        ]
        if row.holder is not None:
            fields.append(("holder pod", f"{row.holder.state}: {row.holder.why}"))
        fields.append(("state", state_text(row)))
        for key, value in sorted(record.holder.data.items()):
            fields.append((f"data {key}", value))
    if record.last is not None:
        last = record.last
        fields.append(
            (
                "last handoff",
                f"{last.holder} (uid {last.uid or '?'}), token {last.token}, {last.outcome}",
            )
        )
    if gpus is not None:
        fields += gpu_slices_text(gpus)
    width = max(len(k) for k, _ in fields) + 1
    return "\n".join(f"{(k + ':').ljust(width)} {v}" for k, v in fields)


# -- breaking -------------------------------------------------------------------------------


def break_risk(row: Row) -> str | None:
    """Why breaking this lock could give the holder's GPUs to a second pod; None when it cannot.

    Risky: the holder is in handoff (bound to the node, not admitted; or its phase is Unknown), or
    it is not bound yet and the Lease changed less than its duration ago by this machine's clock
    (the extender's binding may still be on its way; an unreadable time counts as recent).
    """
    record = row.view.record
    if record.holder is None or row.holder is None:
        return None
    if row.holder.in_handoff:
        return HANDOFF_WARNING.format(holder=record.holder.key, node=record.node)
    if row.holder.state is HolderState.NOT_BOUND:
        changed = _changed_ago(record, time.time())
        if changed is None or changed < record.duration_s:
            return BIND_WARNING.format(
                holder=record.holder.key,
                node=record.node,
                age=duration_text(changed) if changed is not None else "an unknown time",
                duration=record.duration_s,
            )
    return None


def _changed_ago(record: LockRecord, now: float) -> float | None:
    """Seconds since the Lease's last change by its own timestamps (None: unreadable)."""
    times = []
    for value in (record.acquire_time, record.renew_time):
        with contextlib.suppress(ValueError, TypeError):
            times.append(parse_microtime(str(value)).timestamp())
    return now - max(times) if times else None


async def _break(
    locks: NodeLocks,
    kube: KubeClient,
    node: NodeName,
    *,
    yes: bool,
    force: bool,
    reason: str | None = None,
    out: TextIO,
    err: TextIO,
    confirm: Confirm,
) -> int:
    view = await locks.inspect(node)
    if view is None:
        raise CliError(f"node {node} has no lock (no Lease {node} in namespace {locks.namespace})")
    record = view.record
    if record.holder is None:
        print(f"node {node}: the lock is free; nothing to break", file=out)
        return 0
    (row,) = await _rows(locks, kube, [view], observed=False)
    who = f"{record.holder.key} (uid {record.holder.uid or '?'}, token {record.token})"
    print(f"node {node}: lock held by {who}; {state_text(row)}", file=out)
    risk = break_risk(row)
    if risk is not None:
        print(risk, file=err)
        if not force:
            print(
                f"not breaking node {node}'s lock without --force: {record.holder.key} may "
                "still get its GPUs (see the warning above)",
                file=err,
            )
            return NEEDS_FORCE
    if not yes and not confirm(f"Break node {node}'s lock held by {record.holder.key}?"):
        print("not broken", file=out)
        return 1
    by = await whoami(kube)
    why = reason or f"nodelock locks break: {state_text(row)}"
    broken = await _break_recorded(locks, kube, node, record.token, by=by, reason=why)
    if broken is None or broken.holder is None:
        print(f"node {node}: the lock was released meanwhile; nothing broken", file=out)
        return 0
    print(
        f"broke node {node}'s lock held by {broken.holder.key} "
        f"(uid {broken.holder.uid or '?'}, token {broken.token}) as {by}",
        file=out,
    )
    await record_broken(kube, node, broken, by=by, reason=why)
    return 0


async def record_broken(
    kube: KubeClient, node: NodeName, broken: LockRecord, *, by: str, reason: str
) -> None:
    """Events (``NodeLockBroken``) on the node and on the holder pod; best effort."""
    events = EventRecorder(kube, component="nodelock-cli", host=by)
    message = (
        f"node {node}'s GPU lock held by {broken.holder.key if broken.holder else '?'} "
        f"(token {broken.token}) was broken by hand by {by}: {reason}"
    )
    events.record(ObjectRef.node(node), EventType.WARNING, "NodeLockBroken", message)
    if broken.holder is not None and "/" in broken.holder.key:
        pod = ObjectRef.pod(broken.holder.key, broken.holder.uid)
        events.record(pod, EventType.WARNING, "NodeLockBroken", message)
    await events.flush()


async def whoami(kube: KubeClient) -> str:
    """The username the API server authenticates this client as (a SelfSubjectReview)."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        answer = await kube.create(SELF_SUBJECT_REVIEWS, review)
    except ApiError as exc:
        raise CliError(f"cannot tell who you are to record it on the Lease: {exc}") from exc
    username = str(((answer.get("status") or {}).get("userInfo") or {}).get("username") or "")
    if not username:
        raise CliError("the API server's SelfSubjectReview named no username")
    return username


async def _break_recorded(
    locks: NodeLocks,
    kube: KubeClient,
    node: NodeName,
    token: FencingToken,
    *,
    by: str,
    reason: str,
) -> LockRecord | None:
    """Release the lock with ``token`` (outcome ``broken``), naming ``by`` and ``reason`` on the
    Lease, in one conditional write; None when it was released meanwhile.  Nothing is written when
    the lock has changed hands since it was shown (CliError)."""
    path = lease_path(locks.namespace, node)
    for _ in range(MAX_BREAK_WRITES):
        try:
            lease = await kube.get(path)
        except NotFound:
            return None
        record = locks.format.parse(lease)
        if record.holder is None:
            return None
        if record.token != token:
            raise CliError(
                f"node {node}'s lock changed hands (now token {record.token}, held by "
                f"{record.holder.key}); nothing was broken"
            )
        body = locks.format.broken(lease, by=by, reason=reason, now=now_microtime())
        try:
            await kube.replace(path, body)
        except Conflict:
            continue
        except Forbidden as exc:
            raise CliError(f"the API server refused to break node {node}'s lock: {exc}") from exc
        return record
    raise CliError(f"node {node}'s Lease kept changing; nothing was broken")
