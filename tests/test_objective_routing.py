"""`fallback.when: objective` end to end: a request that would wait for the primary goes
where it is cheapest to meet its class's TTFT objective (the small model only when it is
simple, an overflow backend of the same model otherwise), takes the soonest option when
none meets it, and a sheddable one is refused early with a Retry-After.

The primary's engine is held with one answer running: the forecast, from the `rates`
hint (2 s to the first token, 10 tokens/s, 100-token answers), expects its slot to free
in about 12 s, past the standard objective (5 s)."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import openai
import pytest

from router.app import RunningGateway
from tests.support import SdkClients, StartGateway, assert_idle, engine, sim_backend, wait_pools

GREETING = "hey there! good morning :)"
CODE = ("Write a Python function that parses an ISO 8601 timestamp with a timezone offset "
        "and returns a UTC datetime, with unit tests for the edge cases.")
CRITICAL_KEY = "sk-critical-caller"
GPU = {"gpu_hour": 10.0, "gpus": 1}  # a slot-second of the primary: ~0.0028
CHEAP = {"input_per_mtok": 0.2, "output_per_mtok": 0.2}
DEAR = {"input_per_mtok": 900_000.0, "output_per_mtok": 900_000.0}


def config(small_price: dict[str, float] = CHEAP, cloud: bool = False,
           slo: dict[str, Any] | None = None, keys: bool = False) -> dict[str, Any]:
    big = sim_backend("big-70b", slots=1, queue_limit=10, price=GPU,
                      rates={"ttft_s": 2.0, "tokens_per_s": 10, "output_tokens": 100})
    backends: dict[str, Any] = {
        "big": big, "small": sim_backend("small-8b", slots=2, queue_limit=4, price=small_price)}
    fallbacks = ["small"]
    if cloud:  # the primary's own model, hosted elsewhere at a per-token price
        backends["cloud"] = sim_backend("big-70b", slots=2, queue_limit=4,
                                        price={"input_per_mtok": 5, "output_per_mtok": 5})
        fallbacks.append("cloud")
    route: dict[str, Any] = {"primary": "big", "fallbacks": fallbacks, "overflow": "reject",
                             "fallback": {"when": "objective"}}
    if slo is not None:
        route["slo"] = slo
    raw: dict[str, Any] = {"backends": backends, "routes": {"chat": route}}
    if keys:
        raw["auth"] = {"enabled": True, "keys": [
            {"id": "pager", "tenant": "ops", "priority": "critical",
             "sha256": hashlib.sha256(CRITICAL_KEY.encode()).hexdigest()},
            {"id": "batch", "tenant": "ops",
             "sha256": hashlib.sha256(b"sk-client-secret").hexdigest()}]}
    return raw


def ask(request_id: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": text}],
            "extra_headers": {"X-Request-Id": request_id, **extra.pop("headers", {})}, **extra}


async def occupy(sdk: SdkClients, gw: RunningGateway) -> asyncio.Task[Any]:
    """The primary's one slot held by an answer that has not begun."""
    engine(gw, "big").hold()
    busy = asyncio.create_task(sdk(gw).chat.completions.create(**ask("busy", CODE)))
    await engine(gw, "big").wait_until(lambda e: len(e.records) == 1)
    return busy


async def routed(sdk: SdkClients, gw: RunningGateway, request_id: str, text: str,
                 **kwargs: Any) -> tuple[str, str]:
    raw = await sdk(gw, **kwargs).chat.completions.with_raw_response.create(
        **ask(request_id, text))
    return raw.headers["x-slotgate-backend"], raw.headers["x-slotgate-route-reason"]


async def test_a_simple_request_goes_to_the_small_model_that_meets_the_objective(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw = await start(config())
    busy = await occupy(sdk, gw)
    assert await routed(sdk, gw, "hello", GREETING) == ("small", "objective:met:small")
    engine(gw, "big").release()
    await busy
    await assert_idle(gw)


async def test_a_complex_request_is_never_downgraded_it_waits_as_best_effort(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw = await start(config())
    busy = await occupy(sdk, gw)
    waiting = asyncio.ensure_future(routed(sdk, gw, "code", CODE))
    await wait_pools(gw, lambda s: s["big"] == (1, 1))  # in the primary's line, not moved
    engine(gw, "big").release()
    assert await waiting == ("big", "objective:best_effort:primary")
    assert set(engine(gw, "small").records) == set()
    await busy
    await assert_idle(gw)


async def test_a_complex_request_takes_the_same_model_hosted_elsewhere(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw = await start(config(cloud=True))
    busy = await occupy(sdk, gw)
    assert await routed(sdk, gw, "code", CODE) == ("cloud", "objective:met:overflow")
    engine(gw, "big").release()
    await busy
    await assert_idle(gw)


async def test_with_time_to_spare_the_cheapest_option_wins_even_the_wait(
    sdk: SdkClients, start: StartGateway,
) -> None:
    """A generous objective (60 s) met by every option: the small model while it is the
    cheaper, the primary's line once the small model costs more."""
    gw = await start(config(slo={"standard": {"ttft_s": 60}}))
    busy = await occupy(sdk, gw)
    assert await routed(sdk, gw, "cheap", GREETING) == ("small", "objective:met:small")
    engine(gw, "big").release()
    await busy
    await gw.close()

    gw = await start(config(small_price=DEAR, slo={"standard": {"ttft_s": 60}}))
    busy = await occupy(sdk, gw)
    waiting = asyncio.ensure_future(routed(sdk, gw, "wait", GREETING))
    await wait_pools(gw, lambda s: s["big"] == (1, 1))
    engine(gw, "big").release()
    assert await waiting == ("big", "objective:met:primary")
    await busy
    await assert_idle(gw)


async def test_a_sheddable_request_is_refused_early_a_critical_one_never(
    sdk: SdkClients, start: StartGateway,
) -> None:
    """No option meets a complex request's objective (no overflow backend): a sheddable
    one gets 429 at once with a Retry-After, not a place in a line it would time out in;
    a critical one waits (best effort)."""
    gw = await start(config(slo={"sheddable": {"ttft_s": 3}}, keys=True))
    busy = await occupy(sdk, gw)
    with pytest.raises(openai.RateLimitError) as refused:
        await sdk(gw).chat.completions.create(**ask(
            "batch", CODE, headers={"x-slotgate-priority": "sheddable"}))
    assert refused.value.body["code"] == "objective_shed"  # type: ignore[index]
    headers = refused.value.response.headers
    assert headers["x-slotgate-reject-reason"] == "objective_shed"
    assert 1 <= int(headers["Retry-After"]) <= 60
    waiting = asyncio.ensure_future(routed(sdk, gw, "pager", CODE, api_key=CRITICAL_KEY))
    await wait_pools(gw, lambda s: s["big"] == (1, 1))
    engine(gw, "big").release()
    assert await waiting == ("big", "objective:best_effort:primary")
    await busy
    await assert_idle(gw)
