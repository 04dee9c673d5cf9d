"""HTTP leniencies refused on a real gateway over raw loopback sockets: `Expect:
100-continue` answered only after the key, size and Content-Type checks; HTTP/0.9 request
lines refused; a client that half-closes after its request still gets the answer."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from router.app import RunningGateway
from tests.hostile.conftest import answered
from tests.hostile.loops import (  # noqa: F401 - the fixture, for both loops
    BOTH_LOOPS,
    connect,
    event_loop_policy,
)
from tests.support import (
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
    wait_pools,
)

pytestmark = BOTH_LOOPS

KEY = "sk-team-a-0123456789"
BODY = b'{"model":"chat","messages":[{"role":"user","content":"hi"}]}'


def config(**server: Any) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=2), server=server)
    raw["auth"] = {"enabled": True, "keys": [
        {"id": "team-a", "tenant": "t", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}]}
    return raw


def expecting(key: str | None, length: int = len(BODY),
              content_type: str = "application/json", encoding: str | None = None) -> bytes:
    lines = [b"POST /v1/chat/completions HTTP/1.1", b"Host: x", b"Expect: 100-continue",
             b"Content-Length: %d" % length, b"Content-Type: " + content_type.encode()]
    if encoding is not None:
        lines.append(b"Content-Encoding: " + encoding.encode())
    if key is not None:
        lines.append(b"Authorization: Bearer " + key.encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def refused_before_continue(gw: RunningGateway, head: bytes) -> bytes:
    reader, writer = await connect(gw)
    writer.write(head)  # and the body is held back, as the client waits for 100
    answer = await answered(reader)
    writer.close()
    assert b" 100 " not in answer.split(b"\r\n")[0], answer[:100]
    return answer


async def test_expect_continue_comes_after_the_checks(start: StartGateway) -> None:
    gw = await start(config(max_body_bytes=4096))
    for head, status, code in [
        (expecting(None), b"401", b"invalid_api_key"),
        (expecting("sk-wrong"), b"401", b"invalid_api_key"),
        (expecting(KEY, length=10_000), b"413", b"request_too_large"),
        (expecting(KEY, content_type="text/plain"), b"415", b"unsupported_media_type"),
        (expecting(KEY, encoding="compress"), b"415", b"unsupported_media_type"),
    ]:
        answer = await refused_before_continue(gw, head)
        assert answer.startswith(b"HTTP/1.1 " + status + b" "), answer[:100]
        assert b'"code":"' + code + b'"' in answer
    exposition = gw.gateway.metrics.exposition().decode()
    assert 'slotgate_auth_failures_total{code="invalid_api_key"} 2.0' in exposition
    reader, writer = await connect(gw)
    writer.write(expecting(KEY))
    async with asyncio.timeout(30):
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(BODY)
        head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    writer.close()
    await assert_idle(gw)


async def test_an_http_0_9_request_line_is_refused(start: StartGateway) -> None:
    gw = await start(config(head_timeout_s=1))
    reader, writer = await connect(gw)
    writer.write(b"GET /healthz\r\n\r\n")
    answer = await answered(reader)
    assert answer.startswith(b"HTTP/1.0 400 "), answer[:100]
    assert b'"code":"bad_http_request"' in answer and b'"status"' not in answer
    writer.close()
    reader, writer = await connect(gw)
    writer.write(b"GET /healthz\r\n")  # the bare HTTP/0.9 form: never served either
    answer = await answered(reader)
    assert answer.startswith(b"HTTP/1.1 408 ") and b'"status"' not in answer, answer[:100]
    writer.close()
    await assert_idle(gw)


def request(request_id: str, stream: bool = False) -> bytes:
    body = (b'{"model":"chat","stream":%s,"messages":[{"role":"user","content":"hi"}]}'
            % (b"true" if stream else b"false"))
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
            b"Content-Type: application/json\r\nX-Request-Id: %s\r\nContent-Length: %d\r\n"
            b"\r\n" % (KEY.encode(), request_id.encode(), len(body))) + body


def final(answer: bytes) -> bytes:
    """The answer without the interim `102 Processing` responses before it."""
    while answer.startswith(b"HTTP/1.1 102 Processing\r\n\r\n"):
        answer = answer.removeprefix(b"HTTP/1.1 102 Processing\r\n\r\n")
    return answer


@pytest.mark.parametrize("stream", [False, True])
async def test_a_half_closed_client_still_gets_its_answer(
    start: StartGateway, stream: bool
) -> None:
    gw = await start(config())
    sim = engine(gw)
    sim.hold()  # the answer comes well after the client has shut its side
    reader, writer = await connect(gw)
    writer.write(request("half", stream))
    writer.write_eof()
    await sim.wait_until(lambda e: "half" in e.records and e.held == 1)
    sim.release()
    answer = final(await answered(reader))
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert (b"[DONE]" if stream else b'"finish_reason":"stop"') in answer
    writer.close()
    await assert_idle(gw)


async def test_a_queued_client_that_closes_frees_its_place(start: StartGateway) -> None:
    raw = config(keepalive_timeout_s=1)  # the first's connection closes soon after its answer
    raw["backends"]["big"] = sim_backend("m", slots=1, queue_limit=4, queue_timeout_s=300)
    gw = await start(raw)
    sim = engine(gw)
    sim.hold()
    first = await connect(gw)
    first[1].write(request("first"))
    await sim.wait_until(lambda e: "first" in e.records and e.held == 1)
    _, writer = await connect(gw)
    writer.write(request("leaver"))
    await wait_pools(gw, lambda s: s["big"] == (1, 1))
    writer.close()  # a full close: also a FIN, but the probes meet a reset
    await wait_pools(gw, lambda s: s["big"] == (1, 0))  # the place is freed
    sim.release()
    assert final(await answered(first[0])).startswith(b"HTTP/1.1 200 ")
    first[1].close()
    assert "leaver" not in sim.records  # the engine never saw it
    await assert_idle(gw)


async def test_a_client_that_closes_at_the_engine_aborts_it(start: StartGateway) -> None:
    gw = await start(config())
    sim = engine(gw)
    sim.hold(after_tokens=2)
    _, writer = await connect(gw)
    writer.write(request("leaver"))
    await sim.wait_until(lambda e: "leaver" in e.records and e.held == 1)
    writer.close()
    await sim.wait_until(lambda e: e.records["leaver"].aborted)
    await assert_idle(gw)  # while the engine would still be generating
    sim.release()
