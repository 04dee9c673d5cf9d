"""A lean OpenAI-compatible mock engine for the benchmark suite: zero think time.

    .venv/bin/python bench/mock_backend.py --port 9000 [--host 127.0.0.1]

HTTP/1.1 straight on asyncio.Protocol (uvloop when installed), keep-alive, no framework,
so that it is never what limits a measurement. It answers:

- `POST /v1/chat/completions`: `max_tokens` (default 16) words of content. Non-streaming:
  one `chat.completion` with usage. Streaming: one SSE event per token, each written to
  the socket on its own, streams interleaved one event each per loop turn (as an engine's
  decode steps), then a chunk with `finish_reason`,
  a usage chunk when `stream_options.include_usage` is true, and `data: [DONE]`. The
  stream is sent with chunked transfer encoding, one HTTP chunk per event.
- `GET /v1/models`: one model.
- `GET /health`: `{"ok": true}`.

Request bodies need a Content-Length (every client and proxy in the suite sends one);
a chunked request body gets 411. It prints `mock listening on http://HOST:PORT` once bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import cast

import orjson

_WORDS = (b"alpha", b"bravo", b"charlie", b"delta", b"echo", b"foxtrot", b"golf", b"hotel")
_DEFAULT_TOKENS = 16
_MAX_TOKENS = 100_000
_MAX_HEAD = 64 * 1024
_MAX_BODY = 16 * 1024 * 1024
_CRLF2 = b"\r\n\r\n"


def _status(code: int, reason: str, content_type: bytes, body: bytes, close: bool) -> bytes:
    return (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
            % (code, reason.encode(), content_type, len(body),
               b"Connection: close\r\n" if close else b"") + body)


def _json(code: int, obj: object, close: bool = False) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 411: "Length Required",
              413: "Payload Too Large"}.get(code, "Error")
    return _status(code, reason, b"application/json", orjson.dumps(obj), close)


def _error(code: int, message: str, close: bool = False) -> bytes:
    return _json(code, {"error": {"message": message, "type": "invalid_request_error",
                                  "param": None, "code": None}}, close)


def _text(n: int) -> str:
    return " ".join(_WORDS[i % len(_WORDS)].decode() for i in range(n))


class Answers:
    """Pre-built bytes for the answers, cached per (model, tokens): a request is a lookup."""

    def __init__(self) -> None:
        self._ids = 0
        self._plain: dict[tuple[bytes, int], bytes] = {}

    def next_id(self) -> bytes:
        self._ids += 1
        return b"chatcmpl-mock-%d" % self._ids

    def completion(self, model: bytes, n: int, close: bool) -> bytes:
        key = (model, n)
        body = self._plain.get(key)
        if body is None:
            body = orjson.dumps({
                "id": "chatcmpl-mock", "object": "chat.completion", "created": int(time.time()),
                "model": model.decode(errors="replace"),
                "choices": [{"index": 0, "finish_reason": "stop" if n < _MAX_TOKENS else "length",
                             "logprobs": None,
                             "message": {"role": "assistant", "content": _text(n)}}],
                "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n},
            })
            if len(self._plain) < 1024:
                self._plain[key] = body
        return _status(200, "OK", b"application/json", body, close)

    def stream_events(self, model: bytes, n: int, usage: bool) -> list[bytes]:
        """The SSE events of one stream, each already framed as one HTTP/1.1 chunk."""
        head = b'data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,' % (
            self.next_id(), int(time.time()), orjson.dumps(model.decode(errors="replace")))
        events = []
        for i in range(n):
            delta = (b'{"role":"assistant","content":' if i == 0 else b'{"content":')
            word = orjson.dumps(_WORDS[i % len(_WORDS)].decode() + " ")
            events.append(head + b'"choices":[{"index":0,"delta":' + delta + word
                          + b'},"logprobs":null,"finish_reason":null}]}\n\n')
        events.append(head + b'"choices":[{"index":0,"delta":{},"logprobs":null,'
                      b'"finish_reason":"stop"}]}\n\n')
        if usage:
            events.append(head + b'"choices":[],"usage":{"prompt_tokens":8,'
                          b'"completion_tokens":%d,"total_tokens":%d}}\n\n' % (n, n + 8))
        events.append(b"data: [DONE]\n\n")
        return [b"%x\r\n%s\r\n" % (len(e), e) for e in events]


class MockProtocol(asyncio.Protocol):
    """One client connection: requests parsed from the byte stream, answered in order."""

    def __init__(self, answers: Answers, model: bytes) -> None:
        self.answers = answers
        self.model = model
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.streaming = False  # a stream is being written: the next request waits

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._serve_buffer()

    def _serve_buffer(self) -> None:
        while (self.transport is not None and not self.transport.is_closing()
               and not self.streaming):
            if not self._one():
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def _one(self) -> bool:
        """Answer the request at the start of the buffer, if it is complete."""
        end = self.buf.find(_CRLF2)
        if end < 0:
            if len(self.buf) > _MAX_HEAD:
                self._send(_error(400, "headers too large", close=True))
            return False
        lines = bytes(self.buf[:end]).split(b"\r\n")
        try:
            method, path, version = lines[0].split(b" ", 2)
        except ValueError:
            self._send(_error(400, "bad request line", close=True))
            return False
        length = 0
        close = version == b"HTTP/1.0"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip() or b"0")
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                self._send(_error(411, "send a Content-Length", close=True))
                return False
            elif name == b"connection":
                token = value.strip().lower()
                close = token == b"close" or (close and token != b"keep-alive")
        if length > _MAX_BODY:
            self._send(_error(413, "body too large", close=True))
            return False
        start = end + 4
        if len(self.buf) < start + length:
            return False
        body = bytes(self.buf[start:start + length])
        del self.buf[:start + length]
        self._route(method, path.split(b"?", 1)[0], body, close)
        return not close

    def _route(self, method: bytes, path: bytes, body: bytes, close: bool) -> None:
        if method == b"POST" and path == b"/v1/chat/completions":
            self._chat(body, close)
        elif method == b"GET" and path == b"/v1/models":
            self._send(_json(200, {"object": "list", "data": [
                {"id": self.model.decode(), "object": "model", "created": 0,
                 "owned_by": "slotgate-bench-mock"}]}, close), close)
        elif method == b"GET" and path == b"/health":
            self._send(_json(200, {"ok": True}, close), close)
        else:
            self._send(_error(404, f"no route {method.decode()} {path.decode()}", close), close)

    def _chat(self, raw: bytes, close: bool) -> None:
        try:
            req = orjson.loads(raw)
            n = req.get("max_completion_tokens") or req.get("max_tokens") or _DEFAULT_TOKENS
            if type(n) is not int or not 0 < n <= _MAX_TOKENS:
                raise ValueError("max_tokens must be an integer in 1..100000")
            model = str(req.get("model") or self.model.decode()).encode()
            stream = req.get("stream") is True
            options = req.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage") is True
        except (orjson.JSONDecodeError, ValueError, AttributeError) as exc:
            self._send(_error(400, str(exc), close), close)
            return
        if not stream:
            self._send(self.answers.completion(model, n, close), close)
            return
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n%s\r\n"
                             % (b"Connection: close\r\n" if close else b""))
        self.streaming = True
        self._step(iter(self.answers.stream_events(model, n, usage)), close)

    def _step(self, events: Iterator[bytes], close: bool) -> None:
        """Write one event, then let every other stream write one (as an engine's decode
        step gives each running sequence one token): streams interleave, and a new stream's
        first event goes out at once instead of after every earlier stream's last."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        event = next(events, None)
        if event is not None:
            transport.write(event)  # one send per event
            asyncio.get_running_loop().call_soon(self._step, events, close)
            return
        self.streaming = False
        self._send(b"0\r\n\r\n", close)
        if not close:
            self._serve_buffer()

    def _send(self, data: bytes, close: bool = True) -> None:
        if self.transport is None:
            return
        self.transport.write(data)
        if close:
            self.transport.close()


async def serve(host: str, port: int, model: str, ready: Callable[[str], None]) -> None:
    loop = asyncio.get_running_loop()
    answers = Answers()
    server = await loop.create_server(lambda: MockProtocol(answers, model.encode()), host, port,
                                      backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bound = server.sockets[0].getsockname()
    ready(f"http://{bound[0]}:{bound[1]}")
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--model", default="mock")
    args = parser.parse_args(argv)

    def ready(url: str) -> None:
        print(f"mock listening on {url}", flush=True)

    runner: Callable[..., object] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    runner(serve(args.host, args.port, args.model, ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
