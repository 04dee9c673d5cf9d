"""What an HTTP server costs before any gateway work: instructions per request of servers
that answer a fixed JSON body and do nothing else, counted by callgrind as
bench/instructions.py counts the gateways.

    .venv/bin/python bench/server_floor.py [--requests 1000]

The kinds, each on uvloop, each reading the request's body:

    response   aiohttp's `web.Application`, a handler returning `web.Response`
    whole      the same, returning slotgate's `WholeAnswer` (head and body in one write)
    lowlevel   aiohttp's low-level `web.Server` (no application, no router), `WholeAnswer`
    protocol   an `asyncio.Protocol` on httptools, writing the answer itself

The first is what every aiohttp gateway pays per request, bench/passthrough.py included;
the last is close to what the loop and the parser alone cost. Prints thousands of
instructions per request of each, and each against `response`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from aiohttp import web

REPO = Path(__file__).resolve().parent.parent
BODY = (b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":'
        b'"assistant","content":"hello there"},"finish_reason":"stop"}],"usage":'
        b'{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}')
JSON = {"Content-Type": "application/json"}
KINDS = ("response", "whole", "lowlevel", "protocol")


class _Answering(asyncio.Protocol):
    """HTTP/1.1 keep-alive, fixed answers: enough for the bench's client, nothing more."""

    def __init__(self) -> None:
        import httptools

        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_message_complete(self) -> None:
        body = b'{"ok": true}' if self.url == b"/health" else BODY
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%b" % (len(body), body))


async def serve(kind: str, host: str, port: int) -> None:
    sys.path.insert(0, str(REPO))
    from router.upstream.whole_answer import WholeAnswer

    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/health":
            return web.json_response({"ok": True})
        await request.read()
        if kind == "response":
            return web.Response(body=BODY, headers=JSON)
        return WholeAnswer(BODY, JSON)

    loop = asyncio.get_running_loop()
    if kind == "protocol":
        await loop.create_server(_Answering, host, port)
    elif kind == "lowlevel":
        await loop.create_server(web.Server(answer, access_log=None), host, port)
    else:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        app.router.add_get("/health", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
    await asyncio.Event().wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--host", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        import uvloop

        uvloop.run(serve(args.serve, args.host, args.port))
        return 0
    import shutil

    from harness import HOST, free_port
    from instructions import measure
    from peers import Fleet

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    found: dict[str, float] = {}
    with Fleet() as fleet:
        for kind in KINDS:
            port = free_port()
            argv = [sys.executable, __file__, "--serve", kind, "--host", HOST,
                    "--port", str(port)]
            found[kind] = measure(fleet, kind, argv, "/health", "", port, args.requests)
            print(f"{kind:9} {found[kind]:6.0f} k instructions per request "
                  f"(x{found[kind] / found['response']:.3f} of response)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
