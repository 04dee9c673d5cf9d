"""HTTP leniencies refused on a real gateway over raw loopback sockets: `Expect:
100-continue` answered only after the key, size and Content-Type checks; HTTP/0.9 request
lines refused; a client that half-closes after its request still gets the answer."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from router.app import RunningGateway
from tests.conftest import StartGateway, assert_idle, gateway_config, sim_backend
from tests.hostile.test_connections import answered, connect

KEY = "sk-team-a-0123456789"
BODY = b'{"model":"chat","messages":[{"role":"user","content":"hi"}]}'


def config(**server: Any) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=2), server=server)
    raw["auth"] = {"enabled": True, "keys": [
        {"id": "team-a", "tenant": "t", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}]}
    return raw


def expecting(key: str | None, length: int = len(BODY),
              content_type: str = "application/json") -> bytes:
    lines = [b"POST /v1/chat/completions HTTP/1.1", b"Host: x", b"Expect: 100-continue",
             b"Content-Length: %d" % length, b"Content-Type: " + content_type.encode()]
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
    ]:
        answer = await refused_before_continue(gw, head)
        assert answer.startswith(b"HTTP/1.1 " + status + b" "), answer[:100]
        assert b'"code":"' + code + b'"' in answer
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
