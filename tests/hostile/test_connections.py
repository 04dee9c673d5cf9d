"""Connection-level attacks on a real gateway over raw loopback sockets: slow and idle
connections, connection floods (in all and from one address), unfinished heads that
hold memory. Each one is closed or refused while a normal client is served meanwhile.

Attack connections come from 127.0.0.2 and up (all of 127/8 is loopback on Linux), so
that the per-address cap sees them apart from the normal client on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router.app import RunningGateway
from router.common.config_error import ConfigError
from router.config import config_from_dict
from router.server.runner import GatewayRunner
from tests.hostile.conftest import answered
from tests.hostile.loops import (  # noqa: F401 - the fixture, for both loops
    BOTH_LOOPS,
    address,
    connect,
    event_loop_policy,
)
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    gateway_config,
    poll_until,
    sim_backend,
)

pytestmark = BOTH_LOOPS


def config(**server: Any) -> dict[str, Any]:
    return gateway_config(sim_backend("m", slots=2), server=server)


async def one_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The head and body of one response on a kept-alive connection."""
    async with asyncio.timeout(30):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        return head, await reader.readexactly(length)


async def served(sdk: SdkClients, gw: RunningGateway) -> None:
    """A normal client (the official SDK, from 127.0.0.1) gets its answer."""
    async with sdk(gw) as client:
        answer = await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert answer.choices[0].message.content


async def test_a_dribbling_head_is_cut_at_the_deadline_while_others_are_served(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw = await start(config(head_timeout_s=1))
    loop = asyncio.get_running_loop()
    reader, writer = await connect(gw, "127.0.0.2")
    began = loop.time()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 10_000
    read = asyncio.ensure_future(reader.read())
    sent = 0
    while not read.done() and sent < len(head):  # one byte every 50 ms: 500 s for it all
        writer.write(head[sent:sent + 1])
        sent += 1
        await asyncio.wait([read], timeout=0.05)
        if sent == 5:
            await served(sdk, gw)  # served meanwhile
    async with asyncio.timeout(30):
        answer = await read + await reader.read()
    elapsed = loop.time() - began
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]
    assert b'"code":"request_timeout"' in answer
    assert elapsed < 10, elapsed  # closed within 10x the deadline
    writer.close()
    await assert_idle(gw)


async def test_a_connection_that_never_sends_is_closed(start: StartGateway) -> None:
    gw = await start(config(head_timeout_s=1))
    reader, writer = await connect(gw, "127.0.0.2")
    assert (await answered(reader)).startswith(b"HTTP/1.1 408 ")
    writer.close()
    await assert_idle(gw)


async def test_an_idle_kept_alive_connection_is_closed_after_the_timeout(
    start: StartGateway,
) -> None:
    gw = await start(config(keepalive_timeout_s=1, head_timeout_s=30))
    loop = asyncio.get_running_loop()
    reader, writer = await connect(gw)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _ = await one_response(reader)
    assert head.startswith(b"HTTP/1.1 200 ")
    idle_since = loop.time()
    assert await answered(reader) == b""  # closed without a word
    assert 0.9 <= loop.time() - idle_since < 10
    writer.close()
    await assert_idle(gw)


async def test_one_address_cannot_take_every_connection(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(config(max_connections_per_client=5, head_timeout_s=60))
    held = [await connect(gw, "127.0.0.2") for _ in range(5)]
    for reader, writer in held:  # each one admitted and answered, then kept alive
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await one_response(reader))[0].startswith(b"HTTP/1.1 200 ")
    reader, writer = await connect(gw, "127.0.0.2")
    answer = await answered(reader)
    assert answer.startswith(b"HTTP/1.1 503 "), answer[:100]
    assert b"Retry-After: " in answer and b'"code":"too_many_connections"' in answer
    writer.close()
    await served(sdk, gw)  # another address still gets through
    for _, writer in held:
        writer.close()
    await assert_idle(gw)


async def test_a_trusted_proxy_is_not_held_to_the_per_address_cap(
    start: StartGateway,
) -> None:
    """A proxy in `server.trusted_proxies` speaks for many clients: it may open more
    connections than one address may; any other address is still capped."""
    gw = await start(config(max_connections_per_client=3, head_timeout_s=60,
                            trusted_proxies=["127.0.0.3/32"]))
    held = [await connect(gw, "127.0.0.3") for _ in range(6)]
    for reader, writer in held:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await one_response(reader))[0].startswith(b"HTTP/1.1 200 ")
    others = [await connect(gw, "127.0.0.4") for _ in range(3)]
    reader, writer = await connect(gw, "127.0.0.4")
    assert (await answered(reader)).startswith(b"HTTP/1.1 503 ")
    writer.close()
    for _, writer in [*held, *others]:
        writer.close()
    await assert_idle(gw)


async def test_the_total_cap_holds(start: StartGateway) -> None:
    gw = await start(config(max_connections=20, max_connections_per_client=5))
    held = []
    for i in range(20):  # four addresses, five each, kept alive: the total cap is full
        reader, writer = await connect(gw, f"127.0.0.{2 + i // 5}")
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await one_response(reader))[0].startswith(b"HTTP/1.1 200 ")
        held.append(writer)
    reader, writer = await connect(gw, "127.0.0.9")
    answer = await answered(reader)
    assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: " in answer, answer[:100]
    writer.close()
    for writer in held:
        writer.close()
    await assert_idle(gw)


async def test_when_slow_heads_fill_every_place_a_newcomer_still_gets_in(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw = await start(config(max_connections=20, max_connections_per_client=5,
                            head_timeout_s=60))
    assert isinstance(gw.runner, GatewayRunner) and gw.runner.guard is not None
    guard = gw.runner.guard
    stalled = []
    for i in range(20):  # from four addresses: the per-address cap does not stop them
        reader, writer = await connect(gw, f"127.0.0.{2 + i // 5}")
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # no more
        stalled.append((reader, writer))
    await poll_until(lambda: guard.heads_awaited == 20)  # every place taken by a slow head
    # A head is evicted once it has waited more than a tick (1 s): the guard's clock moves
    # on 30 s (their deadline is 60 s away), and no newcomer need wait for the real one.
    clock = guard.clock
    guard.clock = lambda: clock() + 30
    await served(sdk, gw)  # the oldest stalled head made room
    reader, writer = stalled[0]
    assert await answered(reader) == b""  # closed without a word
    for _, writer in stalled:
        writer.close()
    await assert_idle(gw)


async def test_a_head_over_max_head_bytes_gets_431(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(config(max_header_bytes=4096, max_head_bytes=8192))
    reader, writer = await connect(gw, "127.0.0.2")
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    for i in range(64):  # each header under its own limit, the head over the total
        writer.write(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000))
    answer = await answered(reader)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
    assert b'"code":"request_header_fields_too_large"' in answer
    writer.close()
    await served(sdk, gw)
    await assert_idle(gw)


async def test_a_body_sent_with_its_head_does_not_count_as_head(start: StartGateway) -> None:
    gw = await start(config(max_header_bytes=4096, max_head_bytes=8192))
    pad = "a" * 200_000  # far over max_head_bytes, in the same writes as the head
    body = b'{"model":"chat","messages":[{"role":"user","content":"%s"}]}' % pad.encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
               b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    reader, writer = await connect(gw)
    for _ in range(2):  # and on a kept-alive connection, the next one too
        writer.write(request + body)
        head, _ = await one_response(reader)
        assert head.startswith(b"HTTP/1.1 200 "), head
    writer.write((request + body) * 3)  # pipelined: heads and bodies in the same reads
    for _ in range(3):
        head, _ = await one_response(reader)
        assert head.startswith(b"HTTP/1.1 200 "), head
    writer.close()
    await assert_idle(gw)


def test_the_head_bound_holds_at_least_one_header() -> None:
    with pytest.raises(ConfigError, match="max_head_bytes"):
        config_from_dict(config(max_header_bytes=32 * 1024, max_head_bytes=16 * 1024))
    assert config_from_dict(config()).server.max_head_bytes == 64 * 1024
