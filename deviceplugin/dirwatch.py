"""Changes to named files of one directory, from Linux inotify, so that loops wait instead of poll.

A device plugin follows files it does not own: kubelet's ``kubelet.sock`` and its own socket
(kubelet deletes every socket in the plugin directory when it restarts), and the simulated
backend's device file.  ``DirChanges.wait(timeout_s)`` returns as soon as one of the named files
was created, deleted, renamed or written since the previous ``wait`` returned, or at the timeout,
whichever comes first; the caller then looks at the files itself.  A waiting loop thus wakes for
a change at once and otherwise only at its timeout.

Guarantees: a change made after a ``wait`` returned is never lost: it ends the next ``wait`` at
once (changes are latched, not counted).  Where inotify cannot be used (not Linux, the per-user
instance or watch limit reached, the directory missing) ``available`` is False and ``wait``
sleeps its timeout, so the caller's timeout is its polling period; the watch is tried again on
every ``wait`` while the directory is missing, and again after the directory was removed.
Not guaranteed: that a wake-up means a change the caller cares about (an event queue overflow
wakes it too).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import functools
import logging
import os
import struct
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

POLL_S = 0.2  # the waiters' polling period where inotify cannot be used
RECHECK_S = 5.0  # with inotify: a look without a change, in case one was missed

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000

# what changes a file's identity or content; ATTRIB catches a ctime change with no other event
WATCHED = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB
# what ends the watch itself: the directory removed or renamed away
WATCH_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name


class _Inotify:
    """The three libc calls, or None where libc has no inotify."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self.init1 = libc.inotify_init1
        self.init1.argtypes = [ctypes.c_int]
        self.init1.restype = ctypes.c_int
        self.add_watch = libc.inotify_add_watch
        self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.add_watch.restype = ctypes.c_int

    @staticmethod
    def load() -> _Inotify | None:
        name = ctypes.util.find_library("c")
        try:
            return _Inotify(ctypes.CDLL(name, use_errno=True))
        except (OSError, AttributeError):
            return None


@functools.cache
def _libc() -> _Inotify | None:
    return _Inotify.load()


def parse_events(buf: bytes) -> list[tuple[int, str]]:
    """The (mask, name) of each event in ``buf`` (what one read of an inotify descriptor gives);
    the name is empty for events on the watched directory itself."""
    out = []
    offset = 0
    while offset + _EVENT.size <= len(buf):
        _wd, mask, _cookie, length = _EVENT.unpack_from(buf, offset)
        offset += _EVENT.size
        raw = buf[offset : offset + length]
        offset += length
        out.append((mask, raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")))
    return out


def matters(events: Iterable[tuple[int, str]], names: frozenset[str]) -> tuple[bool, bool]:
    """(a watched name changed or events were dropped, the watch itself ended)."""
    changed = gone = False
    for mask, name in events:
        if mask & IN_Q_OVERFLOW or (name in names and mask & WATCHED):
            changed = True
        if mask & WATCH_GONE and not name:
            gone = changed = True
    return changed, gone


class DirChanges:
    """Wakes a waiter when one of ``names`` in ``directory`` changes; see the module docstring.

    Use from one event loop: ``open()`` (or the first ``wait``) starts the watch, ``close()`` ends
    it.
    """

    def __init__(self, directory: Path, names: Iterable[str]) -> None:
        self.directory = directory
        self.names = frozenset(names)
        self._fd: int | None = None
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._warned = False

    @property
    def available(self) -> bool:
        """Whether inotify is watching the directory now."""
        return self._fd is not None

    def period(self, poll_s: float = POLL_S) -> float:
        """How long a waiter waits for a change: ``RECHECK_S`` while inotify watches, ``poll_s``
        otherwise."""
        return RECHECK_S if self.available else poll_s

    def open(self) -> bool:
        """Start watching (again, after the directory was removed); whether it is watched."""
        if self._fd is not None:
            return True
        lib = _libc()
        if lib is None:
            self._warn("libc has no inotify")
            return False
        fd = lib.init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            self._warn(os.strerror(ctypes.get_errno()))
            return False
        wd = lib.add_watch(fd, os.fsencode(self.directory), WATCHED | WATCH_GONE | IN_ONLYDIR)
        if wd < 0:
            err = ctypes.get_errno()
            os.close(fd)
            if err != errno.ENOENT:  # a missing directory is tried again on the next wait
                self._warn(os.strerror(err))
            return False
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._readable)
        self._fd = fd
        # whatever happened before the watch started is unknown: the caller looks once more
        self._changed.set()
        return True

    def close(self) -> None:
        """Stop watching; ``wait`` then sleeps its timeout until ``open`` succeeds again."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._loop is not None:
            with contextlib.suppress(Exception):  # the loop may be closed already
                self._loop.remove_reader(fd)
        os.close(fd)

    async def wait(self, timeout_s: float) -> bool:
        """Return True as soon as a watched name changed since the last return, False after
        ``timeout_s`` with no change (or without inotify)."""
        if self._fd is None:
            self.open()
        if self._fd is None:
            await asyncio.sleep(timeout_s)
            return False
        if not self._changed.is_set():
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result and drops
            # a cancellation that arrives as the event is set, and the caller's loop would go on
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._changed.wait()
        changed = self._changed.is_set()
        self._changed.clear()
        return changed

    def _readable(self) -> None:
        fd = self._fd
        if fd is None:
            return
        events: list[tuple[int, str]] = []
        while True:
            try:
                buf = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                log.warning("reading inotify events of %s failed: %s", self.directory, exc)
                self.close()
                self._changed.set()
                return
            if not buf:
                break
            events.extend(parse_events(buf))
        changed, gone = matters(events, self.names)
        if gone:
            self.close()
        if changed:
            self._changed.set()

    def _warn(self, why: str) -> None:
        if not self._warned:
            log.info("not watching %s with inotify (%s); polling instead", self.directory, why)
            self._warned = True
