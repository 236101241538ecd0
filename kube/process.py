"""How nodelock's long-running processes (extender, device plugin) start and stop.

``configure_logging`` sets one log format for every part — ``text`` lines for people, or
``json``, one JSON object per line for log collectors — and validates the level and the format
(a bad value is a ``LogConfigError``, one line for the person who typed it).
``run_until_signalled`` runs a service coroutine until it returns or SIGINT/SIGTERM arrives,
then cancels it so its cleanup runs (a Kubernetes pod is stopped with SIGTERM).
``freeze_long_lived`` takes what a process holds after its first listing out of the garbage
collector's full passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import json
import logging
import signal
import sys
import time
from collections.abc import Coroutine
from enum import StrEnum
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


class LogFormat(StrEnum):
    """How log records are written to stderr."""

    TEXT = "text"  # LOG_FORMAT: time, level, logger, message
    JSON = "json"  # one object per line: time, level, logger, message[, exception]


class LogConfigError(ValueError):
    """A log level or format that does not exist; the message says which ones do."""

    user_facing = True


def parse_log_level(text: str) -> int:
    """The ``logging`` level named ``text`` (any case), or ``LogConfigError``."""
    level = LOG_LEVELS.get(text.strip().lower())
    if level is None:
        choices = ", ".join(LOG_LEVELS)
        raise LogConfigError(f"log level {text!r} does not exist; use one of {choices}")
    return level


def parse_log_format(text: str) -> LogFormat:
    """The ``LogFormat`` named ``text`` (any case), or ``LogConfigError``."""
    try:
        return LogFormat(text.strip().lower())
    except ValueError:
        choices = ", ".join(f.value for f in LogFormat)
        raise LogConfigError(f"log format {text!r} does not exist; use one of {choices}") from None


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, RFC 3339, milliseconds), ``level``, ``logger``,
    ``message``, and ``exception`` (the formatted traceback) when the record carries one.  A
    message with newlines stays one line (JSON escapes them)."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        line: dict[str, str] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False)


_handler: logging.Handler | None = None  # the stderr handler this module installed
_format = LogFormat.TEXT  # the format chosen last in this process


def formatter_for(log_format: LogFormat) -> logging.Formatter:
    return JsonFormatter() if log_format is LogFormat.JSON else logging.Formatter(LOG_FORMAT)


def configure_logging(level: str, *, log_format: str | None = None) -> None:
    """Log to stderr at ``level`` (a name such as ``info``) in ``log_format`` (``text`` or
    ``json``).  Without ``log_format`` the format chosen earlier in this process is kept (text
    at first), so the ``nodelock`` command can choose it before a part configures its level.
    Calling again replaces this module's handler, never anyone else's.  Bad values raise
    ``LogConfigError`` before anything changes."""
    global _handler, _format
    parsed_level = parse_log_level(level)
    chosen = parse_log_format(log_format) if log_format is not None else _format
    root = logging.getLogger()
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        root.addHandler(_handler)
    _handler.setFormatter(formatter_for(chosen))
    root.setLevel(parsed_level)
    _format = chosen


async def run_until_signalled(service: Coroutine[Any, Any, object]) -> None:
    """Run ``service``; SIGINT or SIGTERM cancels it, which ends this call without an error."""
    task = asyncio.create_task(service)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def freeze_long_lived() -> float:
    """Collect garbage once, then move every object alive now into the garbage collector's
    permanent generation (``gc.freeze``); returns the seconds that collection took.

    For a process whose caches were just listed: the collector's full passes then scan only the
    objects created since, instead of the whole cache.  Over a 5,000-node extender cache one
    full pass blocks the event loop for about a tenth of a second (``bench.extender_bench``
    measures it), and such passes recur as the cache's objects are replaced.  Frozen objects are
    still freed when no longer referenced; only reference cycles among them are never collected,
    so call it once per process, after the first listing, not in a loop.
    """
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    return time.perf_counter() - started
