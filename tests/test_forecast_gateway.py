"""The queue forecast end to end: what ten streams at three slots are told against how long
they then wait, on a simulated engine with real timing, cold and then warm.

A busy machine stretches every real duration alike (the engine's included), which is no
fault of the forecast: the announced ETAs are judged after one scale common to the burst
(the median of waited / announced, which must itself stay within a factor of three), so
what is checked is each waiter's share of the wait, not the box's speed."""

from __future__ import annotations

import asyncio
import statistics

import aiohttp
import orjson

from router.app import RunningGateway
from tests.support import MESSAGES, StartGateway, assert_idle, gateway_config, sim_backend

EVENTS = {"X-Slotgate-Queue-Events": "true"}
# ~0.1 s to the first token, 100 tokens/s, answers of 30..90 tokens cut at their max_tokens
ENGINE = {"ttft_s": 0.1, "tokens_per_s": 100, "output_tokens": 60,
          "output_tokens_spread": 0.5, "seed": 7}
MAX_TOKENS = [20, 40, 60, 30, 50, 20, 40, 60, 30, 50]
BOUND = 0.35  # median |announced - waited| / waited, loose: a shared 2-core box


async def one(http: aiohttp.ClientSession, gw: RunningGateway, max_tokens: int
              ) -> tuple[float, float] | None:
    """(first eta_s announced, queue wait) of one stream, read to its end; None if it did
    not queue."""
    body = {"model": "chat", "messages": MESSAGES, "stream": True, "max_tokens": max_tokens}
    announced: float | None = None
    waited: float | None = None
    name = None
    async with http.post(gw.url + "/v1/chat/completions", json=body, headers=EVENTS) as resp:
        assert resp.status == 200
        async for raw in resp.content:
            line = raw.strip()
            if line.startswith(b"event:"):
                name = line[6:].strip()
            elif line.startswith(b"data:") and name == b"queue_status":
                if announced is None:
                    announced = orjson.loads(line[5:])["eta_s"]
                name = None
            elif line.startswith(b"data:") and name == b"start":
                waited = orjson.loads(line[5:])["queue_wait_ms"] / 1000
                name = None
    assert waited is not None
    return None if announced is None else (announced, waited)


async def burst(http: aiohttp.ClientSession, gw: RunningGateway) -> list[float]:
    """The relative errors of the ETAs the waiters of one burst were told, after the
    burst's common scale."""
    got = await asyncio.gather(*(one(http, gw, m) for m in MAX_TOKENS))
    pairs = [g for g in got if g is not None]
    assert len(pairs) == len(MAX_TOKENS) - 3  # three started at once, seven waited
    timed = [(eta, waited) for eta, waited in pairs if waited >= 0.05 and eta > 0]
    scale = statistics.median(waited / eta for eta, waited in timed)
    assert 1 / 3 <= scale <= 3, scale  # the forecast is of the right size
    # and of the right order: told later, started later (a flat forecast has no such pair)
    both = [(a, b) for i, a in enumerate(timed) for b in timed[i + 1:]]
    agree = sum((a[0] - b[0]) * (a[1] - b[1]) > 0 for a, b in both)
    assert agree >= 0.8 * len(both), timed
    return [abs(eta * scale - waited) / waited for eta, waited in timed]


async def test_ten_streams_at_three_slots_are_told_when_they_start(
        start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=3, queue_limit=10, sim=ENGINE)))
    answers = gw.gateway.backends["big"].clock.answers
    async with aiohttp.ClientSession() as http:
        cold = await burst(http, gw)  # from the engine's own parameters
        assert answers.rate_samples == len(MAX_TOKENS)  # every answer taught its rates
        warm = await burst(http, gw)  # from what the first burst measured
    assert statistics.median(cold) <= BOUND, cold
    assert statistics.median(warm) <= BOUND, warm
    assert 0.05 < answers.ttft_s < 0.5 if answers.ttft_s is not None else False
    await assert_idle(gw)
