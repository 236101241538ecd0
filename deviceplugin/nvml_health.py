"""GPU health decisions of the NVML backend, as plain data (no NVML here).

Which XIDs make a GPU unhealthy follows NVIDIA's k8s-device-plugin, environment variables
included, so a node moved from it to nodelock keeps its settings:

- XIDs an application can cause leave a GPU healthy: 13, 31, 43, 45, 68, 109.
- ``DP_DISABLE_HEALTHCHECKS``: ``all`` (or anything listing ``xids``) turns XID health checks
  off; otherwise a comma list of further XIDs to ignore.  Entries that are not numbers are
  skipped, as NVIDIA's plugin does.
- ``DP_ENABLE_HEALTHCHECKS``: a comma list of XIDs that *are* fatal even when ignored above
  (application XIDs and ``DP_DISABLE_HEALTHCHECKS=all`` included), or ``all`` for every XID.
  Departure, documented: with ``DP_DISABLE_HEALTHCHECKS=all`` and some XIDs enabled, those XIDs
  are checked (NVIDIA documents this; its code then turns every check off).
- nodelock's own ignore list (``--ignored-xids`` / ``NODELOCK_IGNORED_XIDS``) adds to the
  ignored XIDs like ``DP_DISABLE_HEALTHCHECKS``; a malformed entry there is an error.

A GPU is healthy while it has no ``Reason`` against it.  Each reason has its own way back
(``HealthBook``): an XID until NVML reports no recovery action is needed; a failed event wait
until a wait answers again; a GPU that stopped answering until it answers; MIG mode until it is
switched off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from handoff.wire import GPU, DeviceID

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
ALL_WORDS = frozenset({"all", "xids"})
DISABLE_ENV = "DP_DISABLE_HEALTHCHECKS"
ENABLE_ENV = "DP_ENABLE_HEALTHCHECKS"
IGNORED_ENV = "NODELOCK_IGNORED_XIDS"
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


@dataclass(frozen=True)
class XidList:
    """One of NVIDIA's XID lists: ``all`` or particular XIDs."""

    every: bool = False
    xids: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str | None) -> XidList:
        """Lenient, as NVIDIA's plugin: ``all``/``xids`` anywhere means every XID, entries that
        are not whole numbers are skipped."""
        words = [w.strip().lower() for w in (text or "").split(",")]
        if any(w in ALL_WORDS for w in words):
            return cls(every=True)
        return cls(xids=frozenset(int(w) for w in words if w.isdigit()))


def parse_ignored_xids(text: str) -> frozenset[int]:
    """nodelock's ``--ignored-xids``: a comma list of XIDs; anything else is a ``ValueError``."""
    xids: set[int] = set()
    for word in text.split(","):
        word = word.strip()
        if not word:
            continue
        if not word.isdigit():
            raise ValueError(f"not an XID: {word!r} (expected comma-separated whole numbers)")
        xids.add(int(word))
    return frozenset(xids)


@dataclass(frozen=True)
class XidPolicy:
    """Which XIDs make a GPU unhealthy."""

    disabled: XidList = XidList(xids=APPLICATION_XIDS)
    enabled: XidList = XidList()

    @classmethod
    def from_settings(
        cls, *, disable: str | None, enable: str | None, ignored: Iterable[int] = ()
    ) -> XidPolicy:
        """From ``DP_DISABLE_HEALTHCHECKS``, ``DP_ENABLE_HEALTHCHECKS`` and nodelock's list."""
        off = XidList.parse(disable)
        return cls(
            disabled=XidList(off.every, off.xids | APPLICATION_XIDS | frozenset(ignored)),
            enabled=XidList.parse(enable),
        )

    @classmethod
    def from_environment(cls, env: Mapping[str, str], *, ignored: Iterable[int] = ()) -> XidPolicy:
        return cls.from_settings(
            disable=env.get(DISABLE_ENV), enable=env.get(ENABLE_ENV), ignored=ignored
        )

    @property
    def checks_off(self) -> bool:
        """No XID can make a GPU unhealthy: watching NVML events is pointless."""
        return self.disabled.every and not self.enabled.every and not self.enabled.xids

    def fatal(self, xid: int) -> bool:
        """Whether XID ``xid`` makes its GPU unhealthy (enabled beats disabled)."""
        if self.enabled.every or xid in self.enabled.xids:
            return True
        return not (self.disabled.every or xid in self.disabled.xids)

    def describe(self) -> str:
        if self.checks_off:
            return "XID health checks off"
        if self.enabled.every:
            return "every XID is fatal"
        ignored = "all" if self.disabled.every else ",".join(map(str, sorted(self.disabled.xids)))
        fatal = ",".join(map(str, sorted(self.enabled.xids))) or "none"
        return f"XIDs ignored: {ignored}; always fatal: {fatal}"


class Reason(StrEnum):
    """Why a GPU is unhealthy; each clears its own way."""

    XID = "xid"  # a fatal XID; clears when NVML's recovery action is "none"
    EVENT_WAIT = "event-wait"  # NVML's event wait failed; clears when a wait answers again
    NOT_ANSWERING = "not-answering"  # a polled GPU did not answer; clears when it answers
    NO_HEALTH_EVENTS = "no-health-events"  # NVML refused to watch it; until the plugin restarts
    MIG = "mig"  # MIG mode switched on: not a whole GPU any more; clears when switched off


class HealthBook:
    """The reasons against each GPU.  A GPU with none is healthy."""

    def __init__(self, ids: Iterable[DeviceID]) -> None:
        self._reasons: dict[DeviceID, set[Reason]] = {i: set() for i in ids}

    @property
    def ids(self) -> tuple[DeviceID, ...]:
        return tuple(self._reasons)

    def mark(self, ids: Iterable[DeviceID], reason: Reason) -> None:
        for i in ids:
            if i in self._reasons:
                self._reasons[i].add(reason)

    def clear(self, ids: Iterable[DeviceID], reason: Reason) -> None:
        for i in ids:
            self._reasons.get(i, set()).discard(reason)

    def having(self, reason: Reason) -> list[DeviceID]:
        return [i for i, reasons in self._reasons.items() if reason in reasons]

    def reasons(self, i: DeviceID) -> frozenset[Reason]:
        return frozenset(self._reasons.get(i, ()))

    def healthy(self, i: DeviceID) -> bool:
        return not self._reasons.get(i)

    def apply(self, gpus: Sequence[GPU]) -> list[GPU]:
        """``gpus`` with ``healthy`` as this book says (GPUs it does not know are unchanged)."""
        return [
            replace(g, healthy=self.healthy(g.id)) if g.id in self._reasons else g for g in gpus
        ]


def wait_backoff_s(failures: int) -> float:
    """Pause after the ``failures``-th failed event wait in a row: 0.5 s doubling to 30 s."""
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** max(0, failures - 1))
