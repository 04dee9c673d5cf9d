"""Every status is counted: the gateway's own 500s (a bug inside the request handler)
reach the client in OpenAI's shape and appear with their status in the metrics, the
access log, the ledger and the cost report, with the traceback logged once; a client
that leaves is counted as 499 everywhere."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from router import attempt
from router.common.parsed import ParsedRequest
from router.upstream.request_body import upstream_body
from tests.hostile.keys import access_lines, scrape, value
from tests.support import (
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    rows_of,
    sim_backend,
    wait_pools,
)

BREAK = "break-me"  # the `user` of the requests the broken leaf fails on


def break_upstream_body(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one stand-in of these tests: `upstream_body`, a leaf function (no I/O, no
    state) that turns the parsed request into the engine's body, raises for requests
    whose `user` is BREAK, as a bug in it would. It runs after the slot is taken, so the
    failure also exercises the slot's release. (The gateway has no known bug left to
    trigger for real: the JSON depth one is fixed elsewhere.)"""

    def broken(parsed: ParsedRequest, model: str, fold_system: bool = False) -> bytes:
        if parsed.body.get("user") == BREAK:
            raise RuntimeError("a bug in building the upstream body")
        return upstream_body(parsed, model, fold_system)

    monkeypatch.setattr(attempt, "upstream_body", broken)


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": "hi"}], **extra}


async def test_an_internal_error_is_a_500_counted_everywhere(
    start: StartGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    break_upstream_body(monkeypatch)
    ledger = str(tmp_path / "ledger.sqlite3")
    raw = gateway_config(sim_backend("m", slots=1, queue_limit=2))
    raw["ledger"] = {"path": ledger}
    gw = await start(raw)
    sim = engine(gw)
    with caplog.at_level(logging.INFO):
        async with aiohttp.ClientSession() as http:
            async with http.post(gw.url + "/v1/chat/completions", json=body(user=BREAK)) as r:
                assert r.status == 500
                error = (await r.json())["error"]
            assert (error["type"], error["code"]) == ("server_error", "internal_error")
            assert set(error) == {"message", "type", "param", "code"}
            assert "a bug in building" not in error["message"]  # the details stay in the log

            # a stream that queued got its 200 first: the 500 is said in-band
            sim.hold()
            holder = asyncio.create_task(http.post(gw.url + "/v1/chat/completions",
                                                   json=body()))
            await wait_pools(gw, lambda s: s["big"] == (1, 0))
            async with http.post(gw.url + "/v1/chat/completions",
                                 json=body(user=BREAK, stream=True)) as r:
                assert r.status == 200
                await wait_pools(gw, lambda s: s["big"] == (1, 1))
                sim.release()
                async with asyncio.timeout(10):
                    text = (await r.read()).decode()
            assert '"code":"internal_error"' in text and "[DONE]" not in text
            async with await holder as r:
                assert r.status == 200
        await assert_idle(gw)
        samples = await scrape(gw, None)
    assert value(samples, "slotgate_requests_total", route="chat", backend="big",
                 status_class="5xx", api="chat") == 2
    assert value(samples, "slotgate_requests_total", route="chat", backend="big",
                 status_class="2xx", api="chat") == 1
    lines = access_lines(caplog)
    assert sorted((line["status"], line["error"]) for line in lines) == [
        (200, None), (500, "internal_error"), (500, "internal_error")]
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert [r.name for r in tracebacks] == ["slotgate.error", "slotgate.error"]  # once each
    assert all("a bug in building" in r.getMessage() + str(r.exc_info[1])
               for r in tracebacks if r.exc_info)
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/admin/report") as r:
        assert r.status == 200
        report = await r.json()
    arm = report["arms"][0]
    assert (arm["requests"], arm["errors"]) == (3, 2)
    assert arm["error_rate"] == pytest.approx(2 / 3)
    rows = await rows_of(gw, ledger)
    assert sorted((r.status, r.error) for r in rows) == [
        (200, None), (500, "internal_error"), (500, "internal_error")]


async def test_a_client_that_leaves_is_counted_as_499(
    start: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=1)))
    sim = engine(gw)
    sim.hold()
    with caplog.at_level(logging.INFO, logger="slotgate.access"):
        async with aiohttp.ClientSession() as http:
            holder = asyncio.create_task(http.post(gw.url + "/v1/chat/completions",
                                                   json=body()))
            await wait_pools(gw, lambda s: s["big"] == (1, 0))
            port = int(gw.url.rsplit(":", 1)[1])
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            payload = orjson.dumps(body())
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: "
                         + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            await writer.drain()
            await wait_pools(gw, lambda s: s["big"] == (1, 1))
            writer.close()  # it leaves while queued
            await wait_pools(gw, lambda s: s["big"] == (1, 0))
            sim.release()
            async with await holder as r:
                assert r.status == 200
    await assert_idle(gw)
    samples = await scrape(gw, None)
    assert value(samples, "slotgate_requests_total", route="chat", backend="big",
                 status_class="4xx", api="chat") == 1
    assert sorted(line["status"] for line in access_lines(caplog)) == [200, 499]
