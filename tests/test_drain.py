"""Graceful drain: readiness fails first, new and queued requests get 503 + Retry-After,
running answers finish, then the process exits with its ledger written."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path

import aiohttp
import openai
import pytest

from policies.config import SimulatedSpec
from router.upstream.simulated.app import start_simulator
from tests.support import (
    MESSAGES,
    GatewayProcess,
    SdkClients,
    StartGateway,
    engine,
    gateway_config,
    sim_backend,
)


async def drain_refusal(url: str) -> tuple[int, str | None, str]:
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/chat/completions",
                             json={"model": "chat", "messages": MESSAGES}) as resp:
            body = await resp.json()
            return resp.status, resp.headers.get("Retry-After"), body["error"]["code"]


async def test_drain_finishes_running_answers_and_turns_the_rest_away(
    sdk: SdkClients, start: StartGateway, tmp_path: Path
) -> None:
    raw = gateway_config(sim_backend("m", slots=2, queue_limit=2))
    raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite3")}
    gw = await start(raw)
    sim = engine(gw)
    sim.hold(after_tokens=1)
    streams = []
    for _ in range(2):
        stream = await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES,
                                                       stream=True)
        await stream.__anext__()  # mid-answer
        streams.append(stream)
    queued = asyncio.create_task(sdk(gw).chat.completions.create(model="chat",
                                                                 messages=MESSAGES))
    await sim.wait_until(lambda e: e.active == 2)
    closing = asyncio.create_task(gw.close())
    await gw.gateway.drain_signal()

    with pytest.raises(openai.InternalServerError) as turned:
        await queued  # it was in line: answered, not dropped
    assert turned.value.body["code"] == "draining"  # type: ignore[index]
    assert turned.value.response.headers["Retry-After"] == "1"
    status, retry, code = await drain_refusal(gw.url)  # a newcomer
    assert (status, retry, code) == (503, "1", "draining")
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/readyz") as ready:
        assert ready.status == 503

    sim.release()
    for stream in streams:  # the running answers are not cut
        chunks = [chunk async for chunk in stream]
        assert chunks[-1].choices[0].finish_reason is not None
    await closing
    assert not any(r.aborted for r in sim.records.values())
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        statuses = sorted(s for (s,) in db.execute("SELECT status FROM requests"))
    assert statuses == [200, 200, 503, 503]  # every request, flushed on the way out


async def test_sigterm_drains_a_serving_process(tmp_path: Path) -> None:
    sim = await start_simulator(SimulatedSpec(max_num_seqs=8, ttft_s=0, tokens_per_s=0,
                                              output_tokens=6), "m")
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "backends:\n"
        f"  big: {{url: '{sim.url}/v1', model: m, slots: 2, queue_limit: 2}}\n"
        "routes:\n  chat: {primary: big}\n"
        "ledger: {path: ledger.sqlite3}\n", encoding="utf-8")
    gateway = await GatewayProcess.start(config)
    try:
        sim.engine.hold(after_tokens=2)
        client = gateway.client()
        streams = []
        for _ in range(2):
            stream = await client.chat.completions.create(model="chat", messages=MESSAGES,
                                                          stream=True)
            await stream.__anext__()
            streams.append(stream)
        gateway.proc.send_signal(signal.SIGTERM)
        await gateway.said(b"draining")
        assert (await drain_refusal(gateway.url))[::2] == (503, "draining")  # still listening
        sim.engine.release()
        for stream in streams:
            assert [chunk async for chunk in stream][-1].choices[0].finish_reason
        async with asyncio.timeout(30):  # the one SIGTERM ends it: no second signal sent
            assert await gateway.proc.wait() == 0
        assert not any(r.aborted for r in sim.engine.records.values())
        with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
            ok = db.execute("SELECT count(*) FROM requests WHERE status = 200").fetchone()[0]
        assert ok == 2
    finally:
        await gateway.stop(signal.SIGKILL)
        await sim.close()


async def test_a_stream_cut_by_the_drain_limit_is_told_and_recorded_as_such(
    sdk: SdkClients, start: StartGateway, tmp_path: Path
) -> None:
    raw = gateway_config(sim_backend("m", slots=1), server={"shutdown_timeout_s": 0.1})
    raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite3")}
    gw = await start(raw)
    sim = engine(gw)
    sim.hold(after_tokens=1)  # the answer never finishes by itself
    stream = await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES,
                                                   stream=True)
    await stream.__anext__()
    closing = asyncio.create_task(gw.close())
    with pytest.raises(openai.APIError) as told:  # not a silent end of the stream
        _ = [chunk async for chunk in stream]
    assert told.value.body["code"] == "shutdown"  # type: ignore[index]
    await closing
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        rows = db.execute("SELECT status, error, disconnect FROM requests").fetchall()
    assert rows == [(503, "shutdown", None)]  # the gateway cut it, not its client
