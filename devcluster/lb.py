"""A round-robin TCP proxy on loopback: two extender replicas behind one address, like a Service.

Run as ``python -m devcluster.lb --listen PORT --backend HOST:PORT --backend HOST:PORT``.  Each
new connection goes to the next backend that accepts it; bytes are copied both ways unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections.abc import Sequence


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(listen: int, backends: Sequence[tuple[str, int]]) -> None:
    turn = itertools.cycle(range(len(backends)))

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        for _ in range(len(backends)):
            host, port = backends[next(turn)]
            try:
                up_r, up_w = await asyncio.open_connection(host, port)
            except OSError:
                continue
            await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))
            return
        client_w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--backend", action="append", required=True, help="HOST:PORT")
    args = parser.parse_args(argv)
    backends = [(b.rsplit(":", 1)[0], int(b.rsplit(":", 1)[1])) for b in args.backend]
    asyncio.run(serve(args.listen, backends))


if __name__ == "__main__":
    main()
