"""How nodelock's long-running processes (extender, device plugin) start and stop.

``configure_logging`` sets one log format for every part; ``run_until_signalled`` runs a
service coroutine until it returns or SIGINT/SIGTERM arrives, then cancels it so its cleanup
runs (a Kubernetes pod is stopped with SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Coroutine
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Log to stderr at ``level`` (a name such as ``info``) in the common format."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


async def run_until_signalled(service: Coroutine[Any, Any, object]) -> None:
    """Run ``service``; SIGINT or SIGTERM cancels it, which ends this call without an error."""
    task = asyncio.create_task(service)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task
