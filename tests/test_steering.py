"""Saturation-aware fallback end to end: simple requests leave the primary's queue."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from openai import APIConnectionError

from router.app import RunningGateway
from tests.support import (
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
    wait_pools,
)

PROMPTS = {
    "greeting": "hey there! good morning :)",
    "translate": "Translate into French: 'The meeting is moved to Thursday afternoon.'",
    "code": "Write a Python function that parses an ISO 8601 duration like PT1H30M "
            "into seconds, with unit tests.",
    "math": "Prove that the square root of 2 is irrational.",
}


def steering_config(when: str = "saturated", **fallback: Any) -> dict[str, Any]:
    raw = gateway_config(
        sim_backend("big-70b", slots=3, queue_limit=10, context_window=32768),
        sim_backend("small-8b", slots=4, queue_limit=0, context_window=8192),
        overflow="fallback",
    )
    raw["routes"]["chat"]["fallback"] = {"when": when, **fallback}
    return raw


async def hold_primary(sdk: SdkClients, gw: RunningGateway) -> list[asyncio.Task[Any]]:
    big = engine(gw, "big")
    big.hold()
    client = sdk(gw)
    busy = [asyncio.create_task(client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": PROMPTS["code"]}],
        extra_headers={"X-Request-Id": f"busy-{i}"})) for i in range(3)]
    await big.wait_until(lambda e: len(e.records) == 3)
    return busy


async def ask(sdk: SdkClients, gw: RunningGateway, kind: str) -> Any:
    return await sdk(gw).chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": PROMPTS[kind]}],
        extra_headers={"X-Request-Id": kind})


async def test_simple_requests_go_to_the_small_model_hard_ones_wait(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(steering_config())
    busy = await hold_primary(sdk, gw)
    simple = {kind: await ask(sdk, gw, kind) for kind in ("greeting", "translate")}
    for kind, raw in simple.items():
        assert raw.headers["x-slotgate-backend"] == "small"
        reason = raw.headers["x-slotgate-route-reason"]
        assert reason.startswith(f"fallback:simple:{kind}:"), reason
        assert float(reason.rsplit(":", 1)[1]) >= 0.8
    hard = [asyncio.create_task(ask(sdk, gw, kind)) for kind in ("code", "math")]
    await wait_pools(gw, lambda s: s["big"] == (3, 2))  # both wait for the primary
    assert set(engine(gw, "small").records) == {"greeting", "translate"}
    engine(gw, "big").release()
    for raw in await asyncio.gather(*hard):
        assert raw.headers["x-slotgate-backend"] == "big"
        assert raw.headers["x-slotgate-route-reason"] == "primary"
    await asyncio.gather(*busy)
    intents = {r.request_id: r.intent for r in gw.gateway.recent}
    assert intents["code"] == "code" and intents["greeting"] == "greeting"
    assert intents["busy-0"] is None  # got a primary slot at once: never classified
    await assert_idle(gw)


async def queued_behind_a_full_fallback(
    sdk: SdkClients, start: StartGateway,
) -> tuple[RunningGateway, list[asyncio.Task[Any]], asyncio.Task[Any], asyncio.Task[Any],
           asyncio.Task[Any]]:
    """The primary full, the fallback's only slot held by a greeting (`first`), and a
    translation (`second`, handled by `handler`) queued for the primary, classified simple."""
    raw = steering_config()
    raw["backends"]["small"]["slots"] = 1
    raw["backends"]["small"]["simulated"]["max_num_seqs"] = 1
    gw = await start(raw)
    busy = await hold_primary(sdk, gw)
    small = engine(gw, "small")
    small.hold()
    first = asyncio.create_task(ask(sdk, gw, "greeting"))  # takes the only fallback slot
    await small.wait_until(lambda e: "greeting" in e.records)
    before = set(gw.gateway.handlers)
    second = asyncio.create_task(ask(sdk, gw, "translate"))  # must queue for the primary
    await wait_pools(gw, lambda s: s["big"] == (3, 1))
    (handler,) = set(gw.gateway.handlers) - before
    return gw, busy, first, second, handler


async def test_queued_simple_request_moves_when_a_fallback_slot_frees(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw, busy, first, second, _ = await queued_behind_a_full_fallback(sdk, start)
    small = engine(gw, "small")
    small.release()  # the fallback slot frees: the queued translation takes it
    moved = await second
    assert moved.headers["x-slotgate-backend"] == "small"
    assert moved.headers["x-slotgate-route-reason"].startswith("fallback:simple:translate:")
    await first
    assert "translate" not in engine(gw, "big").records
    engine(gw, "big").release()
    await asyncio.gather(*busy)
    await assert_idle(gw)


@pytest.mark.parametrize(("when", "expected"), [("never", "big"), ("always", "small")])
async def test_when_never_and_always(
    sdk: SdkClients, start: StartGateway, when: str, expected: str
) -> None:
    gw = await start(steering_config(when))
    raw = await ask(sdk, gw, "greeting")  # the primary is idle
    assert raw.headers["x-slotgate-backend"] == expected
    await assert_idle(gw)


async def test_too_long_for_the_fallback_context_stays_on_the_primary(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw = await start(steering_config())
    busy = await hold_primary(sdk, gw)
    long_text = "Please summarize this report in two sentences.\n" + "Revenue grew. " * 3000
    task = asyncio.ensure_future(sdk(gw).chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": long_text}], max_tokens=100))
    await wait_pools(gw, lambda s: s["big"] == (3, 1))
    engine(gw, "big").release()
    raw = await task
    assert raw.headers["x-slotgate-backend"] == "big"
    await asyncio.gather(*busy)
    await assert_idle(gw)


async def test_a_client_that_leaves_during_a_move_never_reaches_the_fallback(
    start: StartGateway, sdk: SdkClients,
) -> None:
    """The client leaves at the instant its request leaves the primary's queue for a freed
    fallback slot: the request ends there (the fallback's slot goes back, unused)."""
    gw, busy, first, second, handler = await queued_behind_a_full_fallback(sdk, start)
    small = engine(gw, "small")

    def leave(pool: Any) -> None:  # the translation leaves the primary's queue: the move
        if pool.queued == 0 and not handler.done():
            handler.cancel()  # its client leaves at this very instant

    unwatch = gw.gateway.backends["big"].pool.watch(leave)
    try:
        small.release()  # the fallback slot frees: the queued translation is offered it
        with pytest.raises(APIConnectionError):
            await second
    finally:
        unwatch()
    await first
    assert "translate" not in engine(gw, "small").records
    assert "translate" not in engine(gw, "big").records
    engine(gw, "big").release()
    await asyncio.gather(*busy)
    await assert_idle(gw)
