"""A gateway built on aiohttp alone: a bare aiohttp + uvloop pass-through, nothing else.

    .venv/bin/python bench/passthrough.py --upstream http://127.0.0.1:9000 --port 9001

Every POST /v1/chat/completions goes to the upstream on one keep-alive ClientSession;
a non-streaming answer is read whole and returned, a stream is relayed chunk by chunk.
No parsing, auth, pools, metrics or logs. slotgate shares its server (aiohttp) but not
its client (router/upstream/client.py instead of ClientSession): the gap between the two
in the same run is slotgate's own work, less what its leaner client saves. GET /health
answers for the suite's start probe.

`--client slotgate`: the same server relaying through slotgate's own upstream client
(router.upstream.client.HttpPool) instead of ClientSession, whole answers only. That is
the floor of slotgate itself (its server and its client, none of its work), which
bench/instructions.py measures beside the two.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import aiohttp
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)
REPO = Path(__file__).resolve().parent.parent
LEAN = web.AppKey("lean", tuple)  # slotgate's client: its pool and the engine's target


async def relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    session, url = request.app[SESSION], request.app[UPSTREAM] + request.path
    async with session.post(url, data=body,
                            headers={"Content-Type": "application/json"}) as up:
        if up.content_type != "text/event-stream":
            return web.Response(body=await up.read(), status=up.status,
                                content_type=up.content_type)
        out = web.StreamResponse(status=up.status,
                                 headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        async for chunk in up.content.iter_any():
            await out.write(chunk)
        await out.write_eof()
        return out


async def relay_lean(request: web.Request) -> web.Response:
    body = await request.read()
    pool, target = request.app[LEAN]
    up = await pool.request("POST", target, _JSON, body, connect_timeout_s=5.0,
                            first_byte_timeout_s=60.0, idle_timeout_s=60.0)
    try:
        data = await up.read(1 << 24)
    finally:
        up.release()
    return web.Response(body=data, status=up.status, content_type="application/json")


_JSON = (("Content-Type", "application/json"),)


async def health(_: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def serve(upstream: str, host: str, port: int, client: str = "aiohttp") -> None:
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/")
    app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         auto_decompress=False)
    if client == "slotgate":
        sys.path.insert(0, str(REPO))
        from router.upstream.client import HttpPool
        from router.upstream.wire import Target

        app[LEAN] = (HttpPool(), Target.parse(app[UPSTREAM] + "/v1/chat/completions"))
    app.router.add_post("/v1/chat/completions", relay_lean if client == "slotgate" else relay)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=1024).start()
    print(f"passthrough listening on http://{host}:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await app[SESSION].close()
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--client", choices=("aiohttp", "slotgate"), default="aiohttp")
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.upstream, args.host, args.port, args.client))
    else:
        uvloop.run(serve(args.upstream, args.host, args.port, args.client))


if __name__ == "__main__":
    main()
