"""DirChanges: inotify wakes a waiter for the named files only, latches changes between waits, and
falls back to sleeping the timeout where there is nothing to watch."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from pathlib import Path

import pytest

from deviceplugin.dirwatch import (
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MODIFY,
    IN_Q_OVERFLOW,
    DirChanges,
    matters,
    parse_events,
)

pytestmark = pytest.mark.unit

NAMES = frozenset({"kubelet.sock", "gpu.sock"})
LONG_S = 10.0  # a wait that a change must end well before
SHORT_S = 0.3  # a wait that nothing should end


def event(mask: int, name: str = "", wd: int = 1) -> bytes:
    raw = name.encode()
    padded = raw + b"\0" * (16 - len(raw) % 16) if raw else b""
    return struct.pack("iIII", wd, mask, 0, len(padded)) + padded


def test_events_are_parsed_from_one_read() -> None:
    buf = event(IN_CREATE, "kubelet.sock") + event(IN_MODIFY, "kubelet_internal_checkpoint")
    buf += event(IN_DELETE_SELF) + event(IN_IGNORED)
    assert parse_events(buf) == [
        (IN_CREATE, "kubelet.sock"),
        (IN_MODIFY, "kubelet_internal_checkpoint"),
        (IN_DELETE_SELF, ""),
        (IN_IGNORED, ""),
    ]


def test_only_watched_names_and_lost_events_count() -> None:
    assert matters([(IN_CREATE, "gpu.sock")], NAMES) == (True, False)
    assert matters([(IN_DELETE, "kubelet.sock")], NAMES) == (True, False)
    # kubelet writes its checkpoint beside the sockets on every allocation: no wake-up
    assert matters([(IN_CLOSE_WRITE, "kubelet_internal_checkpoint")], NAMES) == (False, False)
    assert matters([(IN_MODIFY, "gpu.sock")], NAMES) == (False, False)
    assert matters([(IN_Q_OVERFLOW, "")], NAMES) == (True, False)
    assert matters([(IN_DELETE_SELF, ""), (IN_IGNORED, "")], NAMES) == (True, True)


async def test_a_socket_created_or_removed_ends_the_wait(tmp_path: Path) -> None:
    changes = DirChanges(tmp_path, NAMES)
    try:
        assert await changes.wait(LONG_S)  # starting the watch: look once more
        assert changes.available
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(tmp_path / "kubelet.sock"))
        assert await changes.wait(LONG_S)
        sock.close()
        (tmp_path / "kubelet.sock").unlink()
        assert await changes.wait(LONG_S)
        assert not await changes.wait(SHORT_S)
    finally:
        changes.close()


async def test_other_files_do_not_wake_and_a_change_between_waits_is_kept(tmp_path: Path) -> None:
    changes = DirChanges(tmp_path, NAMES)
    try:
        assert await changes.wait(LONG_S)
        (tmp_path / "kubelet_internal_checkpoint").write_text("{}")
        assert not await changes.wait(SHORT_S)
        (tmp_path / "gpu.sock").write_text("")  # while nobody waits
        assert await changes.wait(LONG_S)
        assert not await changes.wait(SHORT_S)  # latched once, not counted
    finally:
        changes.close()


async def test_replacing_a_file_by_rename_wakes(tmp_path: Path) -> None:
    changes = DirChanges(tmp_path, {"sim.json"})
    try:
        (tmp_path / "sim.json").write_text("{}")
        assert await changes.wait(LONG_S)
        assert not await changes.wait(SHORT_S)
        (tmp_path / "sim.json.tmp").write_text('{"count": 2}')
        os.replace(tmp_path / "sim.json.tmp", tmp_path / "sim.json")
        assert await changes.wait(LONG_S)
    finally:
        changes.close()


async def test_a_removed_directory_falls_back_to_the_timeout_until_it_is_back(
    tmp_path: Path,
) -> None:
    watched = tmp_path / "device-plugins"
    watched.mkdir()
    changes = DirChanges(watched, NAMES)
    try:
        assert await changes.wait(LONG_S)
        watched.rmdir()
        assert await changes.wait(LONG_S)  # the directory went: look once more
        assert not changes.available
        assert not await changes.wait(SHORT_S)  # nothing to watch: the timeout only
        watched.mkdir()
        assert await changes.wait(LONG_S)  # watched again, and a look at what it holds
        assert changes.available
        (watched / "gpu.sock").write_text("")
        assert await changes.wait(LONG_S)
    finally:
        changes.close()


async def test_a_missing_directory_is_only_a_timeout(tmp_path: Path) -> None:
    changes = DirChanges(tmp_path / "absent", NAMES)
    assert not await changes.wait(SHORT_S)
    assert not changes.available
    changes.close()


async def test_a_waiter_cancelled_as_a_change_arrives_stays_cancelled(tmp_path: Path) -> None:
    """The endpoint's loop ends only through this cancellation (a plugin's stop): a wait that
    returned its change instead would keep it running."""
    changes = DirChanges(tmp_path, NAMES)
    try:
        assert await changes.wait(LONG_S)
        waiter = asyncio.create_task(changes.wait(LONG_S))
        await asyncio.sleep(0)  # the waiter is parked on the event
        changes._changed.set()  # what the inotify reader does, in the same turn as the cancel
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    finally:
        changes.close()
