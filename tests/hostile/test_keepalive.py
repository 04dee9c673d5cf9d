"""A connection that has been answered idles until `keepalive_timeout_s`, whatever the
method of its last request: the head deadline (`head_timeout_s`) runs only from the first
byte of a new request. Before this, an answered POST's connection got an unsolicited 408
at the head deadline, which a client reusing the connection read as its next answer.

Waiting 80 s is not a test: the guard's clock (which every head deadline reads) is moved
on instead, and its expiry pass run, before each reuse. aiohttp's own keep-alive timer
reads the loop's clock; its close is tested with a short `keepalive_timeout_s`.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from router.app import RunningGateway
from router.server.connections import ConnectionGuard
from router.server.runner import GatewayRunner
from tests.hostile.conftest import answered
from tests.hostile.keys import KEY, with_auth
from tests.hostile.loops import (  # noqa: F401 - the fixture, for both loops
    BOTH_LOOPS,
    connect,
    event_loop_policy,
)
from tests.support import MESSAGES, StartGateway, assert_idle, gateway_config, sim_backend

pytestmark = BOTH_LOOPS


def _post(path: bytes, body: dict[str, object], key: bytes = b"") -> bytes:
    data = orjson.dumps(body)
    auth = b"Authorization: Bearer %s\r\n" % key if key else b""
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s"
            b"anthropic-version: 2023-06-01\r\nContent-Length: %d\r\n\r\n"
            % (path, auth, len(data)) + data)


REQUESTS = {
    "GET": b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    "POST chat": _post(b"/v1/chat/completions", {"model": "chat", "messages": MESSAGES}),
    "POST chat streamed": _post(b"/v1/chat/completions",
                                {"model": "chat", "messages": MESSAGES, "stream": True}),
    "POST messages": _post(b"/v1/messages",
                           {"model": "chat", "messages": MESSAGES, "max_tokens": 16}),
    "POST messages streamed": _post(b"/v1/messages", {"model": "chat", "messages": MESSAGES,
                                                      "max_tokens": 16, "stream": True}),
}


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """One whole answer (by Content-Length or chunked) on a kept-alive connection: its
    status line."""
    async with asyncio.timeout(30):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = next((int(line.split(b":")[1]) for line in lines
                       if line.startswith(b"content-length:")), None)
        if length is not None:
            await reader.readexactly(length)
        else:
            assert b"transfer-encoding: chunked" in lines, head
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                await reader.readexactly(size + 2)
                if size == 0:
                    break
        return head.split(b"\r\n", 1)[0]


def _guard(gw: RunningGateway) -> ConnectionGuard:
    assert isinstance(gw.runner, GatewayRunner) and gw.runner.guard is not None
    return gw.runner.guard


async def _reused_every_second_to_80(gw: RunningGateway, request: bytes) -> None:
    guard = _guard(gw)
    real = guard.clock
    reader, writer = await connect(gw)
    for second in range(1, 81):
        writer.write(request)
        assert await _answer(reader) == b"HTTP/1.1 200 OK", second
        # `second` seconds pass on the guard's clock before the client comes back, and
        # every deadline due by then is handled: none may be this connection's.
        guard.clock = lambda ahead=second: real() + ahead  # type: ignore[misc]
        guard._expire()
        assert guard.heads_awaited == 0, second
        guard.clock = real
    writer.write(request)  # and the 81st request is still answered as its own
    assert await _answer(reader) == b"HTTP/1.1 200 OK"
    writer.close()
    await assert_idle(gw)


@pytest.mark.parametrize("kind", list(REQUESTS))
async def test_an_answered_connection_is_reused_at_every_second_to_80(
    kind: str, start: StartGateway,
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=2),
                                    server={"head_timeout_s": 10, "keepalive_timeout_s": 600}))
    await _reused_every_second_to_80(gw, REQUESTS[kind])


@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/v1/messages"])
async def test_with_auth_on_an_answered_post_is_reused_at_every_second_to_80(
    path: bytes, start: StartGateway,
) -> None:
    gw = await start(with_auth(gateway_config(
        sim_backend("m", slots=2), server={"head_timeout_s": 10, "keepalive_timeout_s": 600})))
    body = {"model": "chat", "messages": MESSAGES, "max_tokens": 16, "stream": True}
    await _reused_every_second_to_80(gw, _post(path, body, KEY.encode()))


@pytest.mark.parametrize("kind", list(REQUESTS))
async def test_an_answered_connection_closes_at_the_keepalive_timeout_without_a_word(
    kind: str, start: StartGateway,
) -> None:
    # The head deadline is shorter than the keep-alive: an answered connection still
    # idles to the keep-alive's end, and then closes with no 408.
    gw = await start(gateway_config(sim_backend("m", slots=2),
                                    server={"head_timeout_s": 0.3, "keepalive_timeout_s": 1.2}))
    loop = asyncio.get_running_loop()
    reader, writer = await connect(gw)
    writer.write(REQUESTS[kind])
    assert await _answer(reader) == b"HTTP/1.1 200 OK"
    idle_since = loop.time()
    assert await answered(reader) == b""  # closed without a word: no 408
    assert loop.time() - idle_since >= 1.1  # not at the head deadline (0.3 s)
    writer.close()
    await assert_idle(gw)


async def test_a_new_request_begun_after_an_answer_still_has_its_head_deadline(
    start: StartGateway,
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=2),
                                    server={"head_timeout_s": 0.5, "keepalive_timeout_s": 60}))
    reader, writer = await connect(gw)
    writer.write(REQUESTS["POST chat"])
    assert await _answer(reader) == b"HTTP/1.1 200 OK"
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # and no more
    answer = await answered(reader)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
    writer.close()
    await assert_idle(gw)
