"""One retry pace for every loop that retries the API server: capped exponential backoff with
jitter.

Without jitter, every device plugin of a large cluster that lost the API server at the same
moment retries at the same moments, and the API server comes back to synchronized bursts.  With
it, their retries spread over each step.

Guarantees: the n-th delay after a ``reset`` is the step ``first_s * factor**(n-1)`` capped at
``cap_s``, scaled by a factor drawn uniformly from [1 - jitter, 1] ("equal jitter" for the
default 0.5: never less than half the step, so a retry loop never spins); no delay exceeds
``cap_s``; ``rand`` (default ``random.random``) makes it deterministic in tests.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable


class Backoff:
    """The delays of one retry loop; ``reset`` after a success."""

    def __init__(
        self,
        first_s: float,
        cap_s: float,
        *,
        factor: float = 2.0,
        jitter: float = 0.5,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if not 0 < first_s <= cap_s:
            raise ValueError(f"backoff needs 0 < first ({first_s}) <= cap ({cap_s})")
        if factor < 1 or not 0 <= jitter <= 1:
            raise ValueError(f"backoff needs factor >= 1 ({factor}) and 0 <= jitter <= 1")
        self.first_s = first_s
        self.cap_s = cap_s
        self.factor = factor
        self.jitter = jitter
        self._rand = rand
        self._step = first_s

    def next_s(self) -> float:
        """The next delay (and move one step on)."""
        step = self._step
        self._step = min(self._step * self.factor, self.cap_s)
        return step * (1.0 - self.jitter * self._rand())

    def reset(self) -> None:
        """Start again from ``first_s`` (after a success)."""
        self._step = self.first_s

    async def sleep(self) -> float:
        """Sleep the next delay; returns it."""
        delay = self.next_s()
        await asyncio.sleep(delay)
        return delay
