"""Engine signals as a soft hint: each replica's KV-cache pressure read from its metrics
page in the background; a stale, failing or silent page counts as no hint and never stalls
a request."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from router.upstream.signals import Reading, kv_pressure
from tests.support import MESSAGES, SdkClients, StartGateway, assert_idle, engine, poll_until

FAST = {"ttft_s": 0, "tokens_per_s": 0, "output_tokens": 8, "max_num_seqs": 4}


def group(**signals: Any) -> dict[str, Any]:
    endpoints = [{"simulated": FAST, "slots": 4}, {"simulated": FAST, "slots": 4}]
    return {"backends": {"big": {"model": "m", "endpoints": endpoints, "pick": "least_loaded",
                                 "signals": {"scrape": True, "every_s": 0.05, **signals}}},
            "routes": {"chat": {"primary": "big"}}}


def test_the_pressure_comes_from_vllm_or_llama_cpp_names_and_is_bounded() -> None:
    assert kv_pressure('vllm:kv_cache_usage_perc{model_name="m"} 0.42\n') == 0.42
    assert kv_pressure("vllm:gpu_cache_usage_perc 0.7\nvllm:kv_cache_usage_perc 0.2\n") == 0.7
    assert kv_pressure("llamacpp:kv_cache_usage_ratio 1.5\n") == 1.0  # clipped
    assert kv_pressure("vllm:num_requests_running 3\n") is None  # nothing to go by
    assert kv_pressure("vllm:kv_cache_usage_perc NaN\n") is None


def test_a_stale_reading_is_no_hint() -> None:
    reading = Reading()
    assert reading.penalty(15.0, now=100.0) == 0.0  # never read
    reading.pressure, reading.at = 0.8, 100.0
    assert reading.penalty(15.0, now=110.0) == 0.8
    assert reading.penalty(15.0, now=116.0) == 0.0
    assert math.isinf(Reading().at)


async def test_each_replica_is_read_in_the_background(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(group())
    busy = engine(gw, "big", "big-0")
    busy.hold()
    task = asyncio.ensure_future(sdk(gw).chat.completions.create(model="chat",
                                                                 messages=MESSAGES))
    await busy.wait_until(lambda sim: sim.held == 1)
    readings = gw.gateway.backends["big"].readings
    # one of four sequences running on big-0: its engine says 0.25; big-1 idles at 0
    await poll_until(lambda: readings.get("big-0") is not None
                     and readings["big-0"].pressure == 0.25)
    await poll_until(lambda: "big-1" in readings)
    assert readings["big-1"].pressure == 0.0
    busy.release()
    await task
    await assert_idle(gw)


async def test_a_failing_page_never_stalls_a_request(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(group(path="/no-such-page"))
    for _ in range(3):
        reply = await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
        assert reply.choices[0].message.content
    assert gw.gateway.backends["big"].readings == {}  # 404s: no hint, and no harm
    await assert_idle(gw)
