"""One response per request on engine connections: bytes an engine sends after a complete
answer (after its Content-Length, after the chunked terminator) never reach a client, and
an answer nobody asked for, sent on an idle pooled connection, is never served to the next
request. The engine here is a raw asyncio server that misbehaves on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from router.upstream.client import HttpPool
from router.upstream.wire import Target
from tests.hostile.loops import (  # noqa: F401 - the fixture, for both loops
    BOTH_LOOPS,
    event_loop_policy,
)
from tests.support import MESSAGES, SdkClients, StartGateway, assert_idle

pytestmark = BOTH_LOOPS

BODY = orjson.dumps({"id": "c1", "object": "chat.completion", "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "fine"},
     "finish_reason": "stop"}]})
EVIL_BODY = orjson.dumps({"id": "evil", "choices": [{"index": 0, "message": {
    "role": "assistant", "content": "EVIL"}, "finish_reason": "stop"}]})
EVIL = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % len(EVIL_BODY) + EVIL_BODY)


def json_answer(body: bytes = BODY) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(body) + body)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse_answer() -> bytes:
    event = orjson.dumps({"id": "s1", "object": "chat.completion.chunk", "model": "m",
                          "choices": [{"index": 0, "delta": {"content": "fine"}}]})
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunk(b"data: " + event + b"\n\n")
            + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


class Engine:
    """Answers each request of a connection with the next of `answers`; counts connections
    and requests; keeps the writers so a test can send what nobody asked for."""

    def __init__(self, *answers: bytes) -> None:
        self.answers = answers
        self.connections = 0
        self.requests: asyncio.Queue[bytes] = asyncio.Queue()
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._run, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        self.tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            for answer in self.answers:
                request = await _read_request(reader)
                if not request:
                    return
                self.requests.put_nowait(request)
                writer.write(answer)
            await reader.read()  # until the client leaves
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return b""
    length = 0
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


@pytest.fixture
async def engines() -> AsyncIterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for e in made:
        await e.close()


async def gateway_over(start: StartGateway, engines: list[Engine], *answers: bytes) -> Any:
    eng = Engine(*answers)
    engines.append(eng)
    port = await eng.start()
    backend = {"url": f"http://127.0.0.1:{port}/v1", "model": "m", "slots": 1,
               "breaker_failures": 100}
    gw = await start({"backends": {"big": backend},
                      "routes": {"chat": {"primary": "big"}}})
    return gw, eng


SURPLUS = [
    pytest.param(EVIL, id="a-whole-second-response"),
    pytest.param(b"data: EVIL\n\n", id="sse-bytes"),
    pytest.param(b"EVIL" * 1000, id="junk"),
]


@pytest.mark.parametrize("surplus", SURPLUS)
async def test_surplus_after_a_json_answer_never_reaches_the_client(
    start: StartGateway, engines: list[Engine], surplus: bytes
) -> None:
    gw, eng = await gateway_over(start, engines, json_answer() + surplus, json_answer())
    async with aiohttp.ClientSession(gw.url, timeout=aiohttp.ClientTimeout(10)) as http:
        for _ in range(2):
            async with http.post("/v1/chat/completions",
                                 json={"model": "chat", "messages": MESSAGES}) as reply:
                assert reply.status == 200
                content = await reply.read()
            assert content == BODY  # exactly the answer, not a byte more
    # The connection that carried surplus bytes was discarded, not reused.
    assert eng.connections == 2
    await assert_idle(gw)


@pytest.mark.parametrize("surplus", SURPLUS)
async def test_surplus_after_done_in_a_stream_never_reaches_the_client(
    sdk: SdkClients, start: StartGateway, engines: list[Engine], surplus: bytes
) -> None:
    gw, eng = await gateway_over(start, engines, sse_answer() + surplus, sse_answer())
    client = sdk(gw)
    for _ in range(2):
        async with client.chat.completions.with_streaming_response.create(
                model="chat", messages=MESSAGES, stream=True) as reply:
            raw = b"".join([part async for part in reply.iter_bytes()])
        assert b"EVIL" not in raw
        assert raw.rstrip().endswith(b"data: [DONE]")
        assert raw.count(b"data: [DONE]") == 1
    assert eng.connections == 2
    await assert_idle(gw)


async def test_an_unsolicited_answer_on_an_idle_connection_is_never_served(
    sdk: SdkClients, start: StartGateway, engines: list[Engine]
) -> None:
    gw, eng = await gateway_over(start, engines, json_answer(), json_answer())
    client = sdk(gw)
    first = await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert first.choices[0].message.content == "fine"
    eng.writers[0].write(EVIL)  # on the now idle pooled connection, unasked
    await eng.writers[0].drain()
    second = await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert second.choices[0].message.content == "fine" and second.id == "c1"
    assert eng.connections == 2
    await assert_idle(gw)


async def test_an_answer_already_waiting_in_the_socket_is_caught_at_checkout() -> None:
    """The race the loop cannot see: the unsolicited bytes are in the socket, not yet read
    by the event loop, when the idle connection is taken for the next request."""
    eng = Engine(json_answer(), json_answer())
    port = await eng.start()
    target = Target.parse(f"http://127.0.0.1:{port}/v1/chat/completions")
    pool = HttpPool()
    try:
        resp = await pool.request("POST", target, [], b"{}", connect_timeout_s=5)
        assert await asyncio.wait_for(resp.read(1 << 20), 5) == BODY
        resp.release()
        assert pool.idle_count(target) == 1
        eng.writers[0].transport.write(EVIL)  # sent now, synchronously, on loopback
        # No await between the write and the checkout: the loop has not polled since.
        resp = await asyncio.wait_for(
            pool.request("POST", target, [], b"{}", connect_timeout_s=5), 5)
        assert await asyncio.wait_for(resp.read(1 << 20), 5) == BODY
        resp.release()
        assert pool.connections_opened == 2 and eng.connections == 2
    finally:
        await pool.close()
        await eng.close()


class Scripted(Engine):
    """An engine whose connection number i (from 0) is served by `scripts[i]` (the last
    script for any later one): each gets the reader and writer and plays its part."""

    def __init__(self, *scripts: Any) -> None:
        super().__init__()
        self.scripts = scripts

    async def _run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = min(self.connections, len(self.scripts) - 1)
        self.connections += 1
        self.writers.append(writer)
        self.tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await self.scripts[index](self, reader, writer)
            await reader.read()  # until the client leaves
        except ConnectionError:
            pass
        finally:
            writer.close()


async def _answers(eng: Scripted, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> None:
    """A correct engine: each request read whole, then answered."""
    while request := await _read_request(reader):
        eng.requests.put_nowait(request)
        writer.write(json_answer())


async def _scripted_gateway(start: StartGateway, engines: list[Engine], eng: Scripted,
                            **server: Any) -> Any:
    engines.append(eng)
    port = await eng.start()
    backend = {"url": f"http://127.0.0.1:{port}/v1", "model": "m", "slots": 1,
               "breaker_failures": 100}
    return await start({"backends": {"big": backend}, "routes": {"chat": {"primary": "big"}},
                        "server": server})


@pytest.mark.parametrize("gap_s", [0.0, 0.001, 0.05])
async def test_a_second_response_after_a_short_gap_is_never_served(
    sdk: SdkClients, start: StartGateway, engines: list[Engine], gap_s: float
) -> None:
    """The engine answers, then `gap_s` later (zero: in a write of its own right after)
    sends an answer nobody asked for; the next request, sent once that is on the wire
    (while no request is outstanding), gets its own answer on another connection. (One
    that arrives after the next request was written is that request's answer as far as
    HTTP/1.1 can tell: docs/security.md, Round three.)"""
    sent = asyncio.Event()

    async def answer_then_evil(eng: Scripted, reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
        eng.requests.put_nowait(await _read_request(reader))
        writer.write(json_answer())
        await writer.drain()
        if gap_s:
            await asyncio.sleep(gap_s)  # the engine's own timing: part of the attack
        writer.write(EVIL)
        await writer.drain()
        sent.set()
        await _answers(eng, reader, writer)

    eng = Scripted(answer_then_evil, _answers)
    gw = await _scripted_gateway(start, engines, eng)
    client = sdk(gw)
    first = await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert first.choices[0].message.content == "fine"
    await sent.wait()
    for _ in range(3):  # the next tenants: each its own answer
        reply = await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert reply.id == "c1" and reply.choices[0].message.content == "fine"
    assert eng.connections == 2  # the first connection was dropped, the second kept
    await assert_idle(gw)


BIG = 24 * 1024 * 1024  # more than loopback's socket buffers hold: the write waits


def _big_chat() -> list[Any]:
    return [*MESSAGES, {"role": "user", "content": "a" * BIG}]


async def test_bytes_before_a_reused_request_was_written_are_never_its_answer(
    sdk: SdkClients, start: StartGateway, engines: list[Engine]
) -> None:
    """On a reused connection, the engine sends a whole answer as soon as the next
    request's head arrives, before reading its body (which the gateway is still writing):
    they are not that request's answer. The request is sent again on a new connection."""
    async def evil_before_the_body(eng: Scripted, reader: asyncio.StreamReader,
                                   writer: asyncio.StreamWriter) -> None:
        eng.requests.put_nowait(await _read_request(reader))
        writer.write(json_answer())
        await reader.readuntil(b"\r\n\r\n")  # the second request's head, not its body
        writer.write(EVIL)
        await writer.drain()

    eng = Scripted(evil_before_the_body, _answers)
    gw = await _scripted_gateway(start, engines, eng, max_body_bytes=2 * BIG)
    client = sdk(gw)
    first = await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert first.choices[0].message.content == "fine"
    second = await client.chat.completions.create(model="chat", messages=_big_chat())
    assert second.id == "c1" and second.choices[0].message.content == "fine"
    assert eng.connections == 2
    assert eng.requests.qsize() == 2  # the first request, and the second once, whole
    await assert_idle(gw)


async def test_an_early_answer_on_a_new_connection_stands_but_the_connection_goes(
    sdk: SdkClients, start: StartGateway, engines: list[Engine]
) -> None:
    """An engine may refuse a request before reading its body (a 413): on a connection
    that carried nothing before, that is its answer; the connection is not kept."""
    refusal = orjson.dumps({"error": {"message": "too big", "type": "invalid_request_error"}})

    async def refuses_early(eng: Scripted, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(refusal) + refusal)
        await writer.drain()

    eng = Scripted(refuses_early, _answers)
    gw = await _scripted_gateway(start, engines, eng, max_body_bytes=2 * BIG)
    client = sdk(gw).with_options(max_retries=0)
    with pytest.raises(openai.APIStatusError) as refused:
        await client.chat.completions.create(model="chat", messages=_big_chat())
    assert refused.value.status_code == 413
    reply = await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert reply.choices[0].message.content == "fine"
    assert eng.connections == 2  # the refusing connection was not reused
    await assert_idle(gw)
