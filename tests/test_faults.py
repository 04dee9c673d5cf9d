"""Backend faults: retries on the route's next backend before the first byte, never after;
a breaker per backend that stops sending work to a failing one."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from router.faults import BackendHealth
from router.openai_api import ApiError
from router.simulated import FaultMode
from tests.conftest import (
    StartGateway,
    assert_idle,
    closed_port,
    engine,
    gateway_config,
    sdk,
    sim_backend,
)

MESSAGES: Any = [{"role": "user", "content": "tell me something"}]


async def ask(gw: Any, **kwargs: Any) -> Any:
    return await sdk(gw).chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES, **kwargs)


async def test_a_refused_connection_is_retried_on_the_fallback(start: StartGateway) -> None:
    dead = {"url": f"http://127.0.0.1:{closed_port()}/v1", "model": "m", "slots": 2,
            "connect_timeout_s": 1}
    gw = await start(gateway_config(dead, sim_backend("m-small", slots=2)))
    reply = await ask(gw)
    assert reply.headers["x-slotgate-backend"] == "small"
    assert reply.headers["x-slotgate-route-reason"] == "retry:big"
    assert reply.parse().choices
    await assert_idle(gw)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_500_before_the_first_byte_is_retried(start: StartGateway, stream: bool) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1), sim_backend("m-small", slots=1)))
    engine(gw).inject_fault(FaultMode.ERROR_500)
    reply = await ask(gw, stream=stream)
    assert reply.headers["x-slotgate-backend"] == "small"
    if stream:
        assert [chunk async for chunk in reply.parse()]
    assert engine(gw, "small").records
    await assert_idle(gw)


async def test_a_drop_after_the_first_byte_is_not_retried(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1), sim_backend("m-small", slots=1)))
    engine(gw).inject_fault(FaultMode.DROP)
    stream = await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES,
                                                   stream=True)
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    assert not engine(gw, "small").records  # the client had part of an answer: no retry
    await assert_idle(gw)


async def test_a_failing_backend_is_skipped_until_its_breaker_probes(
    start: StartGateway
) -> None:
    big = sim_backend("m", slots=2, breaker_failures=2, breaker_open_s=60)
    gw = await start(gateway_config(big, sim_backend("m-small", slots=2)))
    engine(gw).inject_fault(FaultMode.ERROR_500, count=2)
    for _ in range(2):  # each fails on big and is served by small
        assert (await ask(gw)).headers["x-slotgate-backend"] == "small"
    seen = len(engine(gw).records)
    for _ in range(3):  # the breaker is open: big is not even tried
        assert (await ask(gw)).headers["x-slotgate-backend"] == "small"
    assert len(engine(gw).records) == seen
    await assert_idle(gw)


async def test_an_open_breaker_without_a_fallback_is_503_with_retry_after(
    start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=2, breaker_failures=1,
                                                breaker_open_s=60)))
    engine(gw).inject_fault(FaultMode.ERROR_500)
    with pytest.raises(openai.InternalServerError):
        await ask(gw)  # the backend's own 500, relayed
    with pytest.raises(openai.InternalServerError) as refused:
        await ask(gw)
    assert refused.value.body["code"] == "backend_unavailable"  # type: ignore[index]
    assert int(refused.value.response.headers["Retry-After"]) >= 55
    await assert_idle(gw)


def test_what_counts_as_a_backend_failure_and_the_retry_budget() -> None:
    from router.faults import backend_failed

    assert backend_failed(ApiError(502, "x", code="upstream_unreachable"))
    assert backend_failed(ApiError(500, "x", code="upstream_error"))
    assert not backend_failed(ApiError(400, "x", code="upstream_error"))  # a bad request
    assert not backend_failed(ApiError(429, "x", code="queue_full"))  # our own refusal
    health = BackendHealth()
    assert health.may_retry(0)  # at least 3 in flight, whatever the load
    health.retrying = 3
    assert not health.may_retry(10) and health.may_retry(20)  # then a fifth of the running


async def test_health_checks_put_a_recovered_backend_back_without_risking_a_request(
    start: StartGateway
) -> None:
    big = sim_backend("m", slots=2, breaker_failures=1, breaker_open_s=0.2)
    gw = await start(gateway_config(big, sim_backend("m-small", slots=2)))
    engine(gw).inject_fault(FaultMode.ERROR_500)  # one failure, then healthy again
    assert (await ask(gw)).headers["x-slotgate-backend"] == "small"
    health = gw.gateway.health
    assert health.is_open("big")
    async with asyncio.timeout(10):
        await health.recovered("big")  # GET /v1/models answered: no request was the probe
    assert not health.is_open("big")
    assert (await ask(gw)).headers["x-slotgate-backend"] == "big"
    await assert_idle(gw)
