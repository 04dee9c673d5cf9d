"""Request Content-Encoding: gzip and deflate bodies are inflated by the gateway, with
`max_body_bytes` bounding the inflated size (a decompression bomb is refused with 413
before much of it is inflated), and forwarded decoded with no Content-Encoding; any other
coding gets 415 before the body is read."""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
import zlib
from typing import Any

import aiohttp
import orjson
import pytest

from tests.hostile.conftest import Recorder
from tests.support import StartGateway, assert_idle, engine, gateway_config, sim_backend

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello " * 200}]}


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-15)
    return c.compress(data) + c.flush()


@pytest.mark.parametrize(("coding", "encode"), [
    ("gzip", gzip.compress), ("GZIP", gzip.compress), ("deflate", zlib.compress),
    ("deflate", raw_deflate), ("identity", lambda b: b),
])
async def test_a_compressed_body_is_forwarded_decoded(
    start: StartGateway, recorder: tuple[Recorder, str], coding: str, encode: Any
) -> None:
    rec, url = recorder
    gw = await start(gateway_config({"url": url + "/v1", "model": "m", "slots": 1}))
    plain = orjson.dumps(CHAT)
    async with aiohttp.ClientSession() as http, http.post(
            gw.url + "/v1/chat/completions", data=encode(plain),
            headers={"Content-Encoding": coding, "Content-Type": "application/json"}) as reply:
        assert reply.status == 200, await reply.text()
    headers, body = rec.seen[-1]
    assert "Content-Encoding" not in headers  # the body it gets is the decoded one
    assert orjson.loads(body)["messages"] == CHAT["messages"]
    assert int(headers["Content-Length"]) == len(body)
    await assert_idle(gw)


async def raw_exchange(gw: Any, head: bytes) -> bytes:
    """Send a request head (and no body) on a raw socket; the whole answer, to EOF."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head)
        async with asyncio.timeout(20):  # generous; the body timeout (60 s) is far beyond
            answer = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in answer.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            return answer + await reader.readexactly(length)
    finally:
        writer.close()


@pytest.mark.parametrize("coding", [
    "br", "zstd", "compress", "x-gzip", "gzip, gzip", "gzip, identity", "deflate, gzip",
    "snappy", "gzip;q=1",
])
async def test_other_codings_get_415_before_the_body_is_read(
    start: StartGateway, coding: str
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1),
                                    server={"body_read_timeout_s": 60}))
    # The body is announced but never sent: only a check made before reading can answer.
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: "
            b"application/json\r\nContent-Encoding: " + coding.encode()
            + b"\r\nContent-Length: 100000\r\n\r\n")
    answer = await raw_exchange(gw, head)
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.") and b" 415 " in status, answer[:200]
    error = orjson.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "unsupported_media_type" and error["type"]
    assert b"accept-encoding: gzip, deflate, identity" in answer.lower()
    assert not engine(gw).records
    await assert_idle(gw)


async def test_two_content_encoding_fields_are_refused(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Encoding: gzip\r\n"
            b"Content-Encoding: gzip\r\nContent-Length: 10\r\n\r\n")
    assert b" 415 " in (await raw_exchange(gw, head)).split(b"\r\n", 1)[0]
    await assert_idle(gw)


def bomb(inflated_mib: int) -> bytes:
    """A gzip member of `inflated_mib` MiB of zeros (about 1,000:1)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join([c.compress(zeros) for _ in range(inflated_mib)] + [c.flush()])


async def test_a_decompression_bomb_is_refused_by_its_inflated_size(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1),
                                    server={"max_body_bytes": 1 << 20}))
    payload = bomb(128)  # ~128 KiB on the wire, 128 MiB inflated
    assert len(payload) < 1 << 20  # under the limit as sent: only the inflated size is over
    tracemalloc.start()
    try:
        async with aiohttp.ClientSession() as http, http.post(
                gw.url + "/v1/chat/completions", data=payload,
                headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        ) as reply:
            assert reply.status == 413
            assert (await reply.json())["error"]["code"] == "request_too_large"
        peak_mib = tracemalloc.get_traced_memory()[1] / (1 << 20)
    finally:
        tracemalloc.stop()
    assert peak_mib < 16, peak_mib  # the limit and a few buffers, not the 128 MiB
    assert not engine(gw).records
    # A plain request is served as usual afterwards.
    async with aiohttp.ClientSession() as http, http.post(
            gw.url + "/v1/chat/completions", json=CHAT) as reply:
        assert reply.status == 200
    await assert_idle(gw)


async def test_a_corrupt_gzip_body_is_a_400(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    broken = gzip.compress(orjson.dumps(CHAT))[:-12] + b"\xff" * 40
    async with aiohttp.ClientSession() as http, http.post(
            gw.url + "/v1/chat/completions", data=broken,
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}) as reply:
        assert reply.status == 400, await reply.text()
        assert (await reply.json())["error"]["type"] == "invalid_request_error"
    assert not engine(gw).records
    await assert_idle(gw)
