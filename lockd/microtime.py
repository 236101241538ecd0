"""Kubernetes ``MicroTime`` strings, formatted by hand.

The API server accepts a MicroTime only as RFC 3339 with exactly six fraction digits in UTC
(``2024-05-01T12:00:00.000000Z``).  ``datetime.isoformat()`` drops the fraction when the
microsecond is 0 and writes ``+00:00`` instead of ``Z``; one in a million writes would then be
rejected.  Every MicroTime lockd sends goes through ``format_microtime``.

MicroTimes on a Lease are informational: lockd never compares them with the local clock.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime

_MICROTIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$"
)


def format_microtime(moment: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC, always six fraction digits.

    A naive ``datetime`` is taken to be UTC.
    """
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T"
        f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}.{moment.microsecond:06d}Z"
    )


def microtime_from_epoch(seconds: float) -> str:
    """Format a POSIX timestamp (seconds since the epoch) as a MicroTime."""
    whole = int(seconds // 1)
    micros = round((seconds - whole) * 1_000_000)
    if micros == 1_000_000:
        whole, micros = whole + 1, 0
    return format_microtime(datetime.fromtimestamp(whole, UTC).replace(microsecond=micros))


def now_microtime(wall_clock: Callable[[], float] = time.time) -> str:
    """The wall clock now, as a MicroTime (for ``acquireTime``/``renewTime``)."""
    return microtime_from_epoch(wall_clock())


def parse_microtime(value: str) -> datetime:
    """Parse a MicroTime or Time string (any fraction length, ``Z`` or an offset) to aware UTC.

    Raises ``ValueError`` for anything else.
    """
    match = _MICROTIME.match(value)
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {value!r}")
    year, month, day, hour, minute, second, frac, zone = match.groups()
    micros = int((frac or "0")[:6].ljust(6, "0"))
    tz = UTC if zone == "Z" else datetime.strptime(zone.replace(":", ""), "%z").tzinfo
    moment = datetime(
        int(year), int(month), int(day), int(hour), int(minute), int(second), micros, tzinfo=tz
    )
    return moment.astimezone(UTC)
