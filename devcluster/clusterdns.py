"""The cluster DNS of devcluster's containerd nodes: A records of Services, nothing else.

devcluster builds no CoreDNS, and what the chart's pods resolve is one kind of name: a Service's
``<service>.<namespace>.svc.<domain>`` (kube-scheduler reaches the extender so).  This server
answers exactly that, with the Service's ClusterIP read from the API server (cached for
``TTL_S``), over UDP on the node network's gateway address, which kubelet hands pods as their
``nameserver`` (``clusterDNS``).  Every other name is NXDOMAIN, an existing Service without a
ClusterIP (headless) or a question for another record type is answered with no record; a packet
that is not a DNS query is dropped.

Run as ``python -m devcluster.clusterdns --listen ADDR:PORT --kubeconfig FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import struct
import time
from dataclasses import dataclass
from typing import cast

from kube.client import KubeClient
from kube.errors import NotFound

TTL_S = 5
DOMAIN = "cluster.local"
TYPE_A = 1
CLASS_IN = 1
RCODE_NXDOMAIN = 3
_HEADER = struct.Struct("!HHHHHH")


@dataclass(frozen=True)
class Question:
    """The one question of a query: its id, flags, name (lower case, no final dot), type."""

    ident: int
    flags: int
    name: str
    qtype: int
    qclass: int
    raw: bytes  # the question section as sent, echoed in the answer


def parse_query(packet: bytes) -> Question | None:
    """The question of a standard query with one question, else None."""
    if len(packet) < _HEADER.size:
        return None
    ident, flags, qdcount, _an, _ns, _ar = _HEADER.unpack_from(packet)
    if flags & 0x8000 or (flags >> 11) & 0xF or qdcount != 1:
        return None  # a response, not a standard query, or not one question
    labels: list[str] = []
    at = _HEADER.size
    while True:
        if at >= len(packet):
            return None
        length = packet[at]
        at += 1
        if length == 0:
            break
        if length > 63 or at + length > len(packet):
            return None  # compression pointers never appear in a question
        labels.append(packet[at : at + length].decode("ascii", "replace").lower())
        at += length
    if at + 4 > len(packet):
        return None
    qtype, qclass = struct.unpack_from("!HH", packet, at)
    return Question(ident, flags, ".".join(labels), qtype, qclass, packet[_HEADER.size : at + 4])


def service_of(name: str, domain: str = DOMAIN) -> tuple[str, str] | None:
    """(namespace, service) a ``<service>.<namespace>.svc.<domain>`` name asks for, else None."""
    suffix = f".svc.{domain}"
    if not name.endswith(suffix):
        return None
    parts = name[: -len(suffix)].split(".")
    if len(parts) != 2 or not all(parts):
        return None
    return parts[1], parts[0]


def answer(q: Question, address: str | None, *, known: bool) -> bytes:
    """The response to ``q``: an A record for ``address``; no record when the name is
    ``known`` without one; NXDOMAIN when it is not known."""
    flags = 0x8000 | 0x0400 | (q.flags & 0x0100)  # response, authoritative, recursion desired
    records = b""
    if address is not None and q.qtype == TYPE_A and q.qclass == CLASS_IN:
        rdata = ipaddress.IPv4Address(address).packed
        records = struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, TTL_S, len(rdata)) + rdata
    elif not known:
        flags |= RCODE_NXDOMAIN
    count = 1 if records else 0
    return _HEADER.pack(q.ident, flags, 1, count, 0, 0) + q.raw + records


class Resolver:
    """ClusterIPs of Services from the API server, cached for ``TTL_S``."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._cache: dict[tuple[str, str], tuple[float, bool, str | None]] = {}

    async def lookup(self, namespace: str, service: str) -> tuple[bool, str | None]:
        """(whether the Service exists, its IPv4 ClusterIP or None)."""
        now = time.monotonic()
        hit = self._cache.get((namespace, service))
        if hit is not None and now - hit[0] < TTL_S:
            return hit[1], hit[2]
        try:
            svc = await self.kube.get(f"/api/v1/namespaces/{namespace}/services/{service}")
        except NotFound:
            known, ip = False, None
        else:
            cluster_ip = str((svc.get("spec") or {}).get("clusterIP") or "")
            known = True
            try:
                ip = str(ipaddress.IPv4Address(cluster_ip))
            except ValueError:
                ip = None
        self._cache[(namespace, service)] = (now, known, ip)
        return known, ip


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver
        self.transport: asyncio.DatagramTransport | None = None
        self.answering: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        q = parse_query(data)
        if q is not None:
            task = asyncio.ensure_future(self._answer(q, addr))
            self.answering.add(task)
            task.add_done_callback(self.answering.discard)

    async def _answer(self, q: Question, addr: tuple[str, int]) -> None:
        wanted = service_of(q.name)
        known, ip = (False, None) if wanted is None else await self.resolver.lookup(*wanted)
        if self.transport is not None:
            self.transport.sendto(answer(q, ip, known=known), addr)


async def serve(listen: str, kubeconfig: str) -> None:
    host, _, port = listen.rpartition(":")
    async with await KubeClient.connect(kubeconfig) as kube:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Protocol(Resolver(kube)), local_addr=(host, int(port))
        )
        try:
            await asyncio.Event().wait()
        finally:
            transport.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, help="ADDR:PORT to answer on (UDP)")
    p.add_argument("--kubeconfig", required=True)
    args = p.parse_args()
    asyncio.run(serve(args.listen, args.kubeconfig))


if __name__ == "__main__":
    main()
