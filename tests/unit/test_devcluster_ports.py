"""``processes.free_port`` never hands the same port out twice in a row of starts.

The kernel answers ``bind(port 0)`` from a random offset, so 256 plain asks repeat a port in
most runs (a component's listen port then equals the next one's metrics port, and it refuses
to start)."""

from __future__ import annotations

import socket

from devcluster import processes


def test_256_answers_in_a_row_are_distinct_and_free() -> None:
    ports = [processes.free_port() for _ in range(256)]
    assert len(set(ports)) == len(ports)
    for port in ports[-8:]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))
