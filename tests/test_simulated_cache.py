"""The simulated engine's prefix cache and its vLLM-named /metrics: a shared prefix shortens
the planned TTFT (asserted on the engine's records, never on the clock), the LRU is bounded
in tokens, and without a cache the plans are today's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from policies.config import BackendConfig, SimulatedSpec
from policies.scheduler.prefix import block_hashes, request_text
from router.cli import simulate_main
from router.upstream.simulated.app import RunningSim, _plan, start_simulator
from router.upstream.simulated.cache import PrefixCache

PREFILL = 1e-5  # s per prompt token: planned TTFTs differ; the sleeps stay short
CACHED = SimulatedSpec(max_num_seqs=2, ttft_s=0.001, prefill_s_per_token=PREFILL,
                       tokens_per_s=0, output_tokens=3, prefix_cache_tokens=10_000)
UNCACHED = CACHED.model_copy(update={"prefix_cache_tokens": 0})
SYSTEM = "You are a careful assistant. " * 69 + "Go."  # 2004 characters


def chat(question: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": SYSTEM},
                                       {"role": "user", "content": question}]}


@pytest.fixture(params=[CACHED], ids=["cached"])
async def sim(request: pytest.FixtureRequest) -> AsyncIterator[RunningSim]:
    running = await start_simulator(request.param, "sim-model")
    yield running
    await running.close()


async def ask(sim: RunningSim, *questions: str) -> None:
    async with aiohttp.ClientSession(sim.url) as http:
        for question in questions:
            async with http.post("/v1/chat/completions", json=chat(question)) as resp:
                assert resp.status == 200
                await resp.read()


async def metrics(sim: RunningSim) -> dict[str, float]:
    """Each sample's value by its name, checking every sample's model_name label."""
    async with aiohttp.ClientSession(sim.url) as http, http.get("/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await resp.text()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert all(s.labels == {"model_name": "sim-model"} for s in samples)
    return {s.name: s.value for s in samples}


async def test_a_shared_prefix_lowers_the_planned_ttft(sim: RunningSim) -> None:
    await ask(sim, "first question", "other question")
    first, second = sim.engine.records.values()
    assert first.prompt_tokens == second.prompt_tokens == (2004 + 14) // 4
    assert first.cached_tokens == 0
    # The rendered prompt shares "system\x1f" + SYSTEM + "\x1euser\x1f" (2017 bytes) with
    # the first: 31 whole 64-byte blocks of 16 tokens.
    assert second.cached_tokens == 31 * 16
    assert first.planned_ttft_s == CACHED.ttft_s + 504 * PREFILL
    assert second.planned_ttft_s == CACHED.ttft_s + (504 - 496) * PREFILL
    assert second.planned_ttft_s < first.planned_ttft_s


async def test_a_repeated_prompt_prefills_at_least_its_last_token(sim: RunningSim) -> None:
    short = {"model": "m", "prompt": "y" * 128}  # two whole blocks, 32 tokens
    async with aiohttp.ClientSession(sim.url) as http:
        for _ in range(2):
            async with http.post("/v1/completions", json=short) as resp:
                await resp.read()
    assert [r.cached_tokens for r in sim.engine.records.values()] == [0, 31]


@pytest.mark.parametrize("sim", [UNCACHED], ids=["uncached"], indirect=True)
async def test_without_a_cache_the_plans_are_unchanged(sim: RunningSim) -> None:
    await ask(sim, "first question", "first question", "other question")
    assert sim.engine.cache is None
    for record in sim.engine.records.values():
        assert record.cached_tokens == 0
        assert record.planned_ttft_s == UNCACHED.ttft_s + record.prompt_tokens * PREFILL
    assert await metrics(sim) == {
        "vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0,
        "vllm:kv_cache_usage_perc": 0, "vllm:prefix_cache_queries_total": 0,
        "vllm:prefix_cache_hits_total": 0}


def test_the_engine_hashes_blocks_as_the_gateway_does() -> None:
    body = chat("a question")
    assert _plan(body, True, "m").blocks == ()  # no cache: no hashing either
    plan = _plan(body, True, "m", block_bytes=64)
    assert plan.blocks == tuple(block_hashes(request_text(body), 64)) and len(plan.blocks) == 31
    plain = _plan(body, True, "m")
    assert plan.prompt_tokens == plain.prompt_tokens and plan.model == plain.model


def test_the_lru_is_bounded_in_tokens() -> None:
    cache = PrefixCache(capacity_tokens=70, block_tokens=16)  # room for 4 blocks
    a, b = [11, 12, 13], [21, 22, 23]
    cache.insert(a)
    assert cache.lookup(a, 100) == 48 and cache.tokens == 48
    cache.insert(b)  # evicts a's longest prefixes first: a3, then a2
    assert cache.tokens == 64
    assert [block in cache for block in a + b] == [True, False, False, True, True, True]
    assert cache.lookup(a, 100) == 16 and cache.lookup(b, 100) == 48
    cache.insert(a[:1])  # a1 refreshed: b3 is now the least recent
    cache.insert([31])
    assert 23 not in cache and 11 in cache and cache.tokens == 64
    assert (cache.queries, cache.hits) == (300, 112)


def test_a_cache_smaller_than_a_block_holds_nothing() -> None:
    cache = PrefixCache(capacity_tokens=15, block_tokens=16)
    cache.insert([1])
    assert cache.tokens == 0 and cache.lookup([1], 50) == 0


async def test_metrics_count_hits_in_tokens(sim: RunningSim) -> None:
    await ask(sim, "first question", "other question")
    assert await metrics(sim) == {
        "vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0,
        "vllm:kv_cache_usage_perc": 0, "vllm:prefix_cache_queries_total": 2 * 504,
        "vllm:prefix_cache_hits_total": 496}


async def test_metrics_show_running_and_waiting(sim: RunningSim) -> None:
    sim.engine.hold()
    calls = [asyncio.create_task(ask(sim, f"question {i}")) for i in range(3)]
    try:
        await sim.engine.wait_until(lambda e: e.held == 2 and e.active == 3)
        seen = await metrics(sim)
        assert seen["vllm:num_requests_running"] == 2
        assert seen["vllm:num_requests_waiting"] == 1
        assert seen["vllm:kv_cache_usage_perc"] == 1.0
    finally:
        sim.engine.release()
        await asyncio.gather(*calls)


def test_the_spec_defaults_keep_the_cache_off() -> None:
    spec = SimulatedSpec()
    assert (spec.prefix_cache_tokens, spec.cache_block_tokens) == (0, 16)
    backend = BackendConfig.model_validate(
        {"model": "m", "slots": 2,
         "simulated": {"prefix_cache_tokens": 4096, "cache_block_tokens": 32}})
    assert backend.simulated is not None and backend.simulated.prefix_cache_tokens == 4096
    with pytest.raises(ValueError, match="cache_block_tokens"):
        SimulatedSpec.model_validate({"cache_block_tokens": 0})


@pytest.mark.parametrize("flag", ["--prefix-cache-tokens", "--cache-block-tokens"])
def test_simulate_refuses_bad_cache_flags(flag: str) -> None:
    assert simulate_main([flag, "-1"]) == 2
