"""Capabilities end to end: a request that needs tools, images or a JSON schema is never
moved to a backend that lacks them (steering, a move offer, failover); one that needs
nothing moves as before."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from router.app import RunningGateway
from router.upstream.simulated.engine import FaultMode
from tests.support import (
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
    wait_pools,
)

GREETING = "hey there! good morning :)"
TOOL = {"type": "function", "function": {
    "name": "weather", "parameters": {"type": "object", "properties": {}}}}
SCHEMA = {"type": "json_schema", "json_schema": {
    "name": "answer", "schema": {"type": "object", "properties": {"text": {"type": "string"}}}}}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}

# What each capability adds to a simple greeting.
NEEDS: dict[str, dict[str, Any]] = {
    "tools": {"tools": [TOOL]},
    "vision": {"messages": [{"role": "user", "content": [
        {"type": "text", "text": GREETING}, IMAGE]}]},
    "json_schema": {"response_format": SCHEMA},
}


def config(small_capabilities: list[str], when: str = "saturated") -> dict[str, Any]:
    raw = gateway_config(
        sim_backend("big-70b", slots=2, queue_limit=10, context_window=32768),
        sim_backend("small-8b", slots=4, queue_limit=0, context_window=8192,
                    capabilities=small_capabilities),
        overflow="fallback",
    )
    raw["routes"]["chat"]["fallback"] = {"when": when}
    return raw


def greeting(request_id: str, **extra: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": GREETING}],
            "extra_headers": {"X-Request-Id": request_id}, **extra}


async def saturate(sdk: SdkClients, gw: RunningGateway) -> list[asyncio.Task[Any]]:
    """Both primary slots held by plain requests."""
    big = engine(gw, "big")
    big.hold()
    busy = [asyncio.create_task(sdk(gw).chat.completions.create(
        **greeting(f"busy-{i}"))) for i in range(2)]
    await big.wait_until(lambda e: len(e.records) == 2)
    return busy


@pytest.mark.parametrize("need", sorted(NEEDS))
async def test_a_request_needing_what_the_small_model_lacks_stays_on_the_primary(
    sdk: SdkClients, start: StartGateway, need: str,
) -> None:
    gw = await start(config([]))  # the small model serves plain chat only
    busy = await saturate(sdk, gw)
    client = sdk(gw).chat.completions.with_raw_response
    kept: asyncio.Future[Any] = asyncio.ensure_future(
        client.create(**greeting("needy", **NEEDS[need])))
    await wait_pools(gw, lambda s: s["big"] == (2, 1))  # it waits for the primary
    plain = await client.create(**greeting("plain"))  # the same intent, needing nothing
    assert plain.headers["x-slotgate-backend"] == "small"
    assert plain.headers["x-slotgate-route-reason"].startswith("fallback:simple:greeting:")
    engine(gw, "big").release()
    raw = await kept
    assert raw.headers["x-slotgate-backend"] == "big"
    assert raw.headers["x-slotgate-route-reason"] == f"primary:needs:{need}"
    assert set(engine(gw, "small").records) == {"plain"}
    await asyncio.gather(*busy)
    await assert_idle(gw)


async def test_a_small_model_with_the_capability_takes_it(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw = await start(config(["tools"]))
    busy = await saturate(sdk, gw)
    raw = await sdk(gw).chat.completions.with_raw_response.create(
        **greeting("tools", **NEEDS["tools"]))
    assert raw.headers["x-slotgate-backend"] == "small"
    engine(gw, "big").release()
    await asyncio.gather(*busy)
    await assert_idle(gw)


async def test_when_always_says_why_it_stayed_on_an_idle_primary(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw = await start(config(["tools", "vision"], when="always"))
    raw = await sdk(gw).chat.completions.with_raw_response.create(
        **greeting("schema", response_format=SCHEMA))
    assert raw.headers["x-slotgate-backend"] == "big"
    assert raw.headers["x-slotgate-route-reason"] == "primary:needs:json_schema"
    await assert_idle(gw)


async def test_a_queued_request_is_not_offered_a_freed_slot_it_cannot_use(
    sdk: SdkClients, start: StartGateway,
) -> None:
    """The small model full when a tools request queues: when its slot frees, the plain
    request waiting behind the primary moves; the tools request does not."""
    raw = config([])
    raw["backends"]["small"]["slots"] = 1
    raw["backends"]["small"]["simulated"]["max_num_seqs"] = 1
    gw = await start(raw)
    busy = await saturate(sdk, gw)
    small = engine(gw, "small")
    small.hold()
    client = sdk(gw).chat.completions.with_raw_response
    first: asyncio.Future[Any] = asyncio.ensure_future(  # takes the small model's slot
        client.create(**greeting("first")))
    await small.wait_until(lambda e: "first" in e.records)
    needy: asyncio.Future[Any] = asyncio.ensure_future(
        client.create(**greeting("needy", **NEEDS["tools"])))
    await wait_pools(gw, lambda s: s["big"] == (2, 1))
    plain: asyncio.Future[Any] = asyncio.ensure_future(client.create(**greeting("plain")))
    await wait_pools(gw, lambda s: s["big"] == (2, 2))
    small.release()  # its slot frees: only the plain request may take it
    moved = await plain
    assert moved.headers["x-slotgate-backend"] == "small"
    await first
    assert set(small.records) == {"first", "plain"}
    assert gw.gateway.backends["big"].pool.snapshot().queued == 1  # the tools one still waits
    engine(gw, "big").release()
    assert (await needy).headers["x-slotgate-backend"] == "big"
    await asyncio.gather(*busy)
    await assert_idle(gw)


async def test_a_sick_primary_does_not_send_a_request_where_it_cannot_be_served(
    sdk: SdkClients, start: StartGateway,
) -> None:
    raw = config([], when="never")
    raw["backends"]["big"].update(breaker_failures=1, breaker_open_s=60)
    gw = await start(raw)
    client = sdk(gw).chat.completions.with_raw_response
    engine(gw, "big").inject_fault(FaultMode.ERROR_500)
    with pytest.raises(openai.InternalServerError):  # no retry on the small model: the
        await client.create(**greeting("failed", **NEEDS["tools"]))  # primary's own 500
    for need in sorted(NEEDS):  # the breaker is open: the 503 it would get alone
        with pytest.raises(openai.InternalServerError) as refused:
            await client.create(**greeting(need, **NEEDS[need]))
        assert refused.value.body["code"] == "backend_unavailable"  # type: ignore[index]
    plain = await client.create(**greeting("plain"))  # needing nothing: fails over
    assert plain.headers["x-slotgate-backend"] == "small"
    assert set(engine(gw, "small").records) == {"plain"}
    await assert_idle(gw)


async def test_a_prompt_too_long_for_the_small_model_fails_over_nowhere(
    sdk: SdkClients, start: StartGateway,
) -> None:
    raw = config(["tools", "vision", "json_schema"], when="never")
    raw["backends"]["big"].update(breaker_failures=1, breaker_open_s=60)
    gw = await start(raw)
    engine(gw, "big").inject_fault(FaultMode.ERROR_500)
    client = sdk(gw).chat.completions.with_raw_response
    long_text = "Summarize: " + "Revenue grew. " * 3000  # ~10k tokens: over 8,192
    for _ in range(2):  # the primary's own 500 (no retry), then its open breaker's 503
        with pytest.raises(openai.InternalServerError) as refused:
            await client.create(model="chat", max_tokens=100,
                                messages=[{"role": "user", "content": long_text}])
    assert refused.value.body["code"] == "backend_unavailable"  # type: ignore[index]
    assert not engine(gw, "small").records
    await assert_idle(gw)


async def test_overflow_skips_a_fallback_that_cannot_serve(
    sdk: SdkClients, start: StartGateway,
) -> None:
    raw = config([], when="never")
    raw["backends"]["big"]["queue_limit"] = 0  # the primary full: overflow at once
    gw = await start(raw)
    busy = await saturate(sdk, gw)
    client = sdk(gw).chat.completions.with_raw_response
    with pytest.raises(openai.RateLimitError) as refused:
        await client.create(**greeting("images", **NEEDS["vision"]))
    assert refused.value.body["code"] == "queue_full"  # type: ignore[index]
    plain = await client.create(**greeting("plain"))
    assert plain.headers["x-slotgate-backend"] == "small"
    assert plain.headers["x-slotgate-route-reason"] == "fallback:overflow"
    assert set(engine(gw, "small").records) == {"plain"}
    engine(gw, "big").release()
    await asyncio.gather(*busy)
    await assert_idle(gw)


async def test_an_experiment_arm_that_steers_honours_capabilities(
    sdk: SdkClients, start: StartGateway,
) -> None:
    raw = config([], when="never")
    raw["experiments"] = {"steer": {"route": "chat", "arms": {
        "a": {"fallback": {"when": "always"}}, "b": {"fallback": {"when": "always"}}}}}
    gw = await start(raw)
    client = sdk(gw).chat.completions.with_raw_response
    needy = await client.create(**greeting("needy", **NEEDS["tools"]))
    assert needy.headers["x-slotgate-arm"] in ("a", "b")
    assert needy.headers["x-slotgate-backend"] == "big"
    assert needy.headers["x-slotgate-route-reason"] == "primary:needs:tools"
    plain = await client.create(**greeting("plain"))
    assert plain.headers["x-slotgate-backend"] == "small"
    await assert_idle(gw)
