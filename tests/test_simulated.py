"""The simulated engine over real HTTP on loopback: wire format, batching, holds, faults."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from policies.config import SimulatedSpec
from router.cli import simulate_main
from router.upstream.simulated.app import RunningSim, start_simulator
from router.upstream.simulated.engine import FaultMode, SimEngine

FAST = SimulatedSpec(max_num_seqs=2, ttft_s=0, tokens_per_s=0, output_tokens=5)
CHAT = {"model": "m-public", "messages": [{"role": "user", "content": "x" * 40}]}


@pytest.fixture
async def sim() -> AsyncIterator[RunningSim]:
    running = await start_simulator(FAST, "sim-model")
    yield running
    # every test ends with nothing in flight and no sequence held
    await running.engine.wait_until(lambda e: e.active == 0 and e.running == 0, timeout=2)
    assert running.engine.stats()["waiting"] == 0
    await running.close()


@pytest.fixture
async def http(sim: RunningSim) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(sim.url) as session:
        yield session


def events(raw: bytes) -> list[Any]:
    assert raw.endswith(b"data: [DONE]\n\n")
    frames = raw.split(b"\n\n")[:-2]
    assert all(f.startswith(b"data: ") for f in frames)
    return [orjson.loads(f[6:]) for f in frames]


async def stream(http: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> list[Any]:
    async with http.post(path, json={**body, "stream": True}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        return events(await resp.read())


def one(engine: SimEngine) -> Any:
    (record,) = engine.records.values()
    return record


async def test_stream_chat_without_usage(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    chunks = await stream(http, "/v1/chat/completions", CHAT)
    assert len(chunks) == 5
    assert all("usage" not in c and c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(c["model"] == "m-public" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "role" not in chunks[1]["choices"][0]["delta"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4 + ["stop"]
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    assert text == "the quick brown fox jumps "
    record = one(sim.engine)
    assert (record.completed, record.aborted, record.completion_tokens) == (True, False, 5)
    assert record.prompt_tokens == 10
    assert record.started_at <= record.first_token_at <= record.ended_at


async def test_stream_with_usage_ends_with_usage_chunk(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    body = {**CHAT, "stream_options": {"include_usage": True}}
    chunks = await stream(http, "/v1/chat/completions", body)
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


async def test_non_stream_chat_and_completions(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    async with http.post("/v1/chat/completions", json=CHAT) as resp:
        chat = await resp.json()
    assert chat["object"] == "chat.completion" and chat["model"] == "m-public"
    message = {"role": "assistant", "content": "the quick brown fox jumps "}
    assert chat["choices"][0]["message"] == message
    assert chat["choices"][0]["finish_reason"] == "stop"
    assert chat["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    prompt = {"prompt": ["y" * 20, "z" * 20], "max_tokens": 20}
    async with http.post("/v1/completions", json=prompt) as resp:
        done = await resp.json()
    assert done["object"] == "text_completion" and done["model"] == "sim-model"
    assert done["choices"][0]["text"] == "the quick brown fox jumps "
    assert done["usage"]["prompt_tokens"] == 10
    assert [r.completed for r in sim.engine.records.values()] == [True, True]


async def test_max_tokens_caps_with_finish_reason_length(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    async with http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3}) as resp:
        body = await resp.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3
    chunks = await stream(http, "/v1/completions", {"prompt": "hi", "max_completion_tokens": 2})
    assert [c["choices"][0]["text"] for c in chunks] == ["the ", "quick "]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, "length"]
    assert chunks[0]["object"] == "text_completion"


async def test_batching_caps_running_and_queued_join_fifo(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    engine = sim.engine
    engine.hold(after_tokens=1)

    async def call(i: int) -> list[Any]:
        body = {**CHAT, "stream": True}
        async with http.post("/v1/chat/completions", json=body,
                             headers={"x-request-id": f"r{i}"}) as resp:
            return events(await resp.read())

    calls = []
    for i in range(4):  # one at a time, so arrival order is known
        calls.append(asyncio.create_task(call(i)))
        await engine.wait_until(lambda e, n=i + 1: e.active == n)  # type: ignore[misc]
    await engine.wait_until(lambda e: e.held == 2)
    assert (engine.peak, engine.running, engine.stats()["waiting"]) == (4, 2, 2)
    started = {rid for rid, r in engine.records.items() if r.first_token_at is not None}
    assert started == {"r0", "r1"}
    engine.release()
    assert all(len(c) == 5 for c in await asyncio.gather(*calls))
    at = {rid: (r.first_token_at or 0.0, r.ended_at or 0.0) for rid, r in engine.records.items()}
    first_free = min(at["r0"][1], at["r1"][1])  # queued requests start only as a seq frees
    assert first_free <= at["r2"][0] <= at["r3"][0]
    assert engine.peak == 4


async def test_hold_before_first_token_sends_headers(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    engine = sim.engine
    engine.hold()
    async with http.post("/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
        assert resp.status == 200  # headers arrived although no token was generated
        await engine.wait_until(lambda e: e.held == 1)
        assert one(engine).first_token_at is None and one(engine).completion_tokens == 0
        engine.release()
        assert len(events(await resp.read())) == 5


async def test_hold_after_n_tokens_and_non_stream(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    engine = sim.engine
    engine.hold(after_tokens=2)
    async with http.post("/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
        await engine.wait_until(lambda e: e.held == 1)
        assert one(engine).completion_tokens == 2
        engine.release()
        assert len(events(await resp.read())) == 5
    engine.reset()
    engine.hold()
    answer = asyncio.create_task(http.post("/v1/completions", json={"prompt": "p"}))
    await engine.wait_until(lambda e: e.held == 1)
    assert not answer.done() and one(engine).completion_tokens == 0
    engine.release()
    async with await answer as resp:
        assert (await resp.json())["usage"]["completion_tokens"] == 5


async def test_client_disconnect_aborts_and_frees_the_seq(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    engine = sim.engine
    engine.hold(after_tokens=2)
    resps = [await http.post("/v1/chat/completions", json={**CHAT, "stream": True},
                             headers={"x-request-id": f"d{i}"}) for i in range(3)]
    await engine.wait_until(lambda e: e.held == 2 and e.active == 3)
    resps[2].close()  # waiting for a seq
    resps[0].close()  # mid-stream
    await engine.wait_until(lambda e: e.records["d0"].aborted and e.records["d2"].aborted)
    d0 = engine.records["d0"]
    assert not d0.completed and d0.completion_tokens == 2 and d0.ended_at is not None
    assert engine.stats()["waiting"] == 0 and engine.running == 1
    engine.release()
    assert len(events(await resps[1].read())) == 5
    resps[1].release()
    assert engine.stats()["aborted"] == 2 and engine.stats()["completed"] == 1


async def test_fault_refuse_and_error_500_count(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    sim.engine.inject_fault(FaultMode.REFUSE)
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await http.post("/v1/chat/completions", json=CHAT)
    sim.engine.inject_fault(FaultMode.ERROR_500, count=2)
    for _ in range(2):
        async with http.post("/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 500
            assert (await resp.json())["error"]["type"] == "server_error"
    async with http.post("/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200
    faults = [r.fault for r in sim.engine.records.values()]
    assert faults == [FaultMode.REFUSE, FaultMode.ERROR_500, FaultMode.ERROR_500, None]


async def test_fault_hang_until_client_leaves(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    sim.engine.inject_fault(FaultMode.HANG)
    call = asyncio.create_task(http.post("/v1/chat/completions", json=CHAT))
    await sim.engine.wait_until(lambda e: e.active == 1)
    assert not call.done() and sim.engine.running == 0
    call.cancel()
    await sim.engine.wait_until(lambda e: one(e).aborted)
    assert one(sim.engine).fault is FaultMode.HANG


async def test_fault_drop_stream_after_first_token(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    sim.engine.inject_fault(FaultMode.DROP, count=2)
    async with http.post("/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
        assert resp.status == 200
        first = await resp.content.readline()
        assert orjson.loads(first[6:])["choices"][0]["delta"]["content"] == "the "
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await http.post("/v1/chat/completions", json=CHAT)
    records = list(sim.engine.records.values())
    assert [r.completion_tokens for r in records] == [1, 0]
    assert not any(r.completed or r.aborted for r in records)


async def test_control_endpoints(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    async with http.post("/sim/hold", json={"after_tokens": 1}) as resp:
        assert (await resp.json())["hold_after_tokens"] == 1
    call = asyncio.create_task(stream(http, "/v1/chat/completions", CHAT))
    await sim.engine.wait_until(lambda e: e.held == 1)
    async with http.get("/sim/stats") as resp:
        stats = await resp.json()
    assert stats["held"] == 1 and stats["active"] == 1 and stats["model"] == "sim-model"
    async with http.get("/sim/requests") as resp:
        (record,) = await resp.json()
    assert record["completion_tokens"] == 1 and record["stream"] is True
    async with http.post("/sim/release") as resp:
        assert (await resp.json())["hold_after_tokens"] is None
    assert len(await call) == 5
    async with http.post("/sim/fault", json={"mode": "error_500"}) as resp:
        assert resp.status == 200
    async with http.post("/sim/fault", json={"mode": "melt"}) as resp:
        assert resp.status == 400
    async with http.post("/v1/completions", json={"prompt": "p"}) as resp:
        assert resp.status == 500
    async with http.post("/sim/reset") as resp:
        assert (await resp.json())["requests"] == 0
    async with http.get("/sim/requests") as resp:
        assert await resp.json() == []
    async with http.get("/v1/models") as resp:
        assert [m["id"] for m in (await resp.json())["data"]] == ["sim-model"]


@pytest.mark.parametrize(
    ("path", "data"),
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", b'{"model": "m"}'),
        ("/v1/chat/completions", b'{"messages": [{"content": "a"}], "max_tokens": 0}'),
        ("/v1/completions", b'{"model": "m"}'),
        ("/v1/completions", b"[1, 2]"),
    ],
)
async def test_bad_requests_get_400(
    sim: RunningSim, http: aiohttp.ClientSession, path: str, data: bytes
) -> None:
    async with http.post(path, data=data) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] is None and error["code"] is None
    assert sim.engine.records == {}


async def test_timing_follows_the_spec() -> None:
    spec = SimulatedSpec(ttft_s=0.05, prefill_s_per_token=0.001, tokens_per_s=200,
                         output_tokens=5)
    running = await start_simulator(spec, "slow")
    try:
        async with aiohttp.ClientSession(running.url) as http:
            await stream(http, "/v1/chat/completions", CHAT)  # 10 prompt tokens
        record = one(running.engine)
        assert record.first_token_at - record.started_at >= 0.06
        assert record.ended_at - record.first_token_at >= 4 / 200
    finally:
        await running.close()


async def test_output_length_spread_is_seeded() -> None:
    spec = SimulatedSpec(ttft_s=0, tokens_per_s=0, output_tokens=10, output_tokens_spread=0.5,
                         seed=7)
    lengths = []
    for _ in range(2):
        running = await start_simulator(spec, "m")
        try:
            async with aiohttp.ClientSession(running.url) as http:
                for _ in range(8):
                    async with http.post("/v1/chat/completions", json=CHAT) as resp:
                        await resp.read()
            lengths.append([r.completion_tokens for r in running.engine.records.values()])
        finally:
            await running.close()
    assert lengths[0] == lengths[1]
    assert all(5 <= n <= 15 for n in lengths[0]) and len(set(lengths[0])) > 1


def test_simulate_main_rejects_bad_settings() -> None:
    assert simulate_main(["--slots", "0"]) == 2


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
async def test_simulate_main_serves_until_stopped(stop: signal.Signals) -> None:
    code = "import sys; from router.cli import simulate_main; sys.exit(simulate_main())"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, "--port", "0", "--model", "cli-model", "--ttft-s", "0",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
        url = line.split(" on ")[-1].strip()
        async with aiohttp.ClientSession(url) as http, http.get("/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"] == "cli-model"
        proc.send_signal(stop)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
