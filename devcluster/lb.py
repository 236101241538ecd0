"""A round-robin HTTP proxy on loopback: extender replicas behind one address, like a Service.

Run as ``python -m devcluster.lb --listen PORT --backend HOST:PORT --backend HOST:PORT``.  Each
*request* goes to the next backend in turn (a Service balances connections, and kube-scheduler
keeps its connection open, so per-connection balancing could send every call to one replica;
per request, filter, prioritize and bind of one pod regularly land on different replicas, which
is the harder case).  A backend that refuses the connection is skipped; the answer is relayed
unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections.abc import Sequence

import aiohttp
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


def make_app(backends: Sequence[str]) -> web.Application:
    turn = itertools.cycle(range(len(backends)))
    app = web.Application(client_max_size=64 << 20)

    async def on_startup(app: web.Application) -> None:
        app[SESSION] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))

    async def on_cleanup(app: web.Application) -> None:
        await app[SESSION].close()

    async def proxy(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        for _ in range(len(backends)):
            url = f"http://{backends[next(turn)]}{request.rel_url}"
            try:
                async with app[SESSION].request(
                    request.method, url, data=body, headers=headers
                ) as resp:
                    payload = await resp.read()
                    out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP}
                    return web.Response(status=resp.status, body=payload, headers=out)
            except aiohttp.ClientConnectorError:
                continue
        return web.Response(status=502, text="no extender replica accepted the connection")

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


async def serve(listen: int, backends: Sequence[tuple[str, int]]) -> None:
    """Serve the proxy on 127.0.0.1:``listen`` until cancelled."""
    runner = web.AppRunner(make_app([f"{h}:{p}" for h, p in backends]))
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", listen).start()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--backend", action="append", required=True, help="HOST:PORT")
    args = parser.parse_args(argv)
    web.run_app(make_app(args.backend), host="127.0.0.1", port=args.listen, print=None)


if __name__ == "__main__":
    main()
