"""Every method the gateway does not serve is answered in OpenAI's JSON error shape and
written to the access log: 405 with `Allow` on a known path, 501 for a method served
nowhere or a target no path can match (CONNECT's `host:port`, `OPTIONS *`: aiohttp's
router answered those `404: Not Found` in plain text), 501 for a method the parser does
not know. And an in-process simulated backend takes the bodies `max_body_bytes` lets
through (aiohttp's default of 1 MiB made it answer 413)."""

from __future__ import annotations

import logging

import orjson
import pytest

from tests.hostile.conftest import answered
from tests.hostile.keys import access_lines
from tests.hostile.loops import (  # noqa: F401 - the fixture, for both loops
    BOTH_LOOPS,
    connect,
    event_loop_policy,
)
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    gateway_config,
    sim_backend,
)

pytestmark = BOTH_LOOPS

CASES = [
    (b"CONNECT example.com:443", 501, None, "method_not_implemented"),
    (b"CONNECT /v1/chat/completions", 501, None, "method_not_implemented"),
    (b"DELETE /v1/chat/completions", 405, b"POST", "method_not_allowed"),
    (b"OPTIONS *", 501, None, "method_not_implemented"),
    (b"TRACE /v1/models", 405, b"GET, HEAD", "method_not_allowed"),
    (b"PROPFIND /nowhere", 501, None, "method_not_implemented"),
    (b"GET /nowhere?key=secret", 404, None, "not_found"),
    (b"TRACE /v1/models?key=secret", 405, b"GET, HEAD", "method_not_allowed"),
    (b"FOO /v1/models", 501, None, "method_not_implemented"),  # the parser's refusal
]


@pytest.mark.parametrize(("line", "status", "allow", "code"), CASES,
                         ids=[c[0].decode() for c in CASES])
async def test_an_unknown_method_is_answered_in_json_and_logged(
    start: StartGateway, caplog: pytest.LogCaptureFixture,
    line: bytes, status: int, allow: bytes | None, code: str,
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    with caplog.at_level(logging.INFO, logger="slotgate.access"):
        reader, writer = await connect(gw)
        writer.write(line + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await answered(reader)
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"%d" % status, head
    assert b"\r\nContent-Type: application/json" in head, head
    error = orjson.loads(body)["error"]
    assert error["code"] == code and error["message"], error
    assert (b"\r\nAllow: " + allow + b"\r\n" in head) if allow else b"Allow:" not in head
    lines = [entry for entry in access_lines(caplog) if entry.get("status") == status]
    assert len(lines) == (status != 404), access_lines(caplog)  # a method's refusal is logged
    assert all("?" not in line.get("path", "") for line in lines)  # never a query
    await assert_idle(gw)


async def test_a_simulated_backend_takes_what_max_body_bytes_allows(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1),
                                    server={"max_body_bytes": 8 * 1024 * 1024}))
    prompt = "a" * (7 * 1024 * 1024)  # over aiohttp's 1 MiB default, under max_body_bytes
    async with sdk(gw) as client:
        answer = await client.chat.completions.create(
            model="chat", messages=[*MESSAGES, {"role": "user", "content": prompt}])
    assert answer.choices[0].message.content
    await assert_idle(gw)
