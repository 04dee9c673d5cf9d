"""Backend faults: retries on the route's next backend before the first byte, never after;
a breaker per backend that stops sending work to a failing one."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from aiohttp import web

from router.upstream.simulated.engine import FaultMode
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    closed_port,
    engine,
    gateway_config,
    serve_app,
    sim_backend,
    wait_pools,
)
from tests.support.engines import rate_limited


async def ask(sdk: SdkClients, gw: Any, **kwargs: Any) -> Any:
    return await sdk(gw).chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES, **kwargs)


async def test_a_refused_connection_is_retried_on_the_fallback(
    sdk: SdkClients, start: StartGateway
) -> None:
    dead = {"url": f"http://127.0.0.1:{closed_port()}/v1", "model": "m", "slots": 2,
            "connect_timeout_s": 1}
    gw = await start(gateway_config(dead, sim_backend("m-small", slots=2)))
    reply = await ask(sdk, gw)
    assert reply.headers["x-slotgate-backend"] == "small"
    assert reply.headers["x-slotgate-route-reason"] == "retry:big"
    assert reply.parse().choices
    await assert_idle(gw)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_500_before_the_first_byte_is_retried(
    sdk: SdkClients, start: StartGateway, stream: bool
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1), sim_backend("m-small", slots=1)))
    engine(gw).inject_fault(FaultMode.ERROR_500)
    reply = await ask(sdk, gw, stream=stream)
    assert reply.headers["x-slotgate-backend"] == "small"
    if stream:
        assert [chunk async for chunk in reply.parse()]
    assert engine(gw, "small").records
    await assert_idle(gw)


async def test_a_drop_after_the_first_byte_is_not_retried(
    sdk: SdkClients, start: StartGateway
) -> None:
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
    sdk: SdkClients, start: StartGateway
) -> None:
    big = sim_backend("m", slots=2, breaker_failures=2, breaker_open_s=60)
    gw = await start(gateway_config(big, sim_backend("m-small", slots=2)))
    engine(gw).inject_fault(FaultMode.ERROR_500, count=2)
    for _ in range(2):  # each fails on big and is served by small
        assert (await ask(sdk, gw)).headers["x-slotgate-backend"] == "small"
    seen = len(engine(gw).records)
    for _ in range(3):  # the breaker is open: big is not even tried
        assert (await ask(sdk, gw)).headers["x-slotgate-backend"] == "small"
    assert len(engine(gw).records) == seen
    await assert_idle(gw)


async def test_an_open_breaker_without_a_fallback_is_503_with_retry_after(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=2, breaker_failures=1,
                                                breaker_open_s=60)))
    engine(gw).inject_fault(FaultMode.ERROR_500)
    with pytest.raises(openai.InternalServerError):
        await ask(sdk, gw)  # the backend's own 500, relayed
    with pytest.raises(openai.InternalServerError) as refused:
        await ask(sdk, gw)
    assert refused.value.body["code"] == "backend_unavailable"  # type: ignore[index]
    assert int(refused.value.response.headers["Retry-After"]) >= 55
    await assert_idle(gw)


def test_what_counts_as_a_backend_failure_and_the_retry_budget() -> None:
    from policies.health.breaker import Blame
    from policies.health.failures import FailureKind, answered, blame, retryable

    def engine_blame(status: int) -> Blame:
        return blame(answered(status), status)

    for kind in (FailureKind.REFUSED, FailureKind.CONNECT_TIMEOUT, FailureKind.DROPPED,
                 FailureKind.FIRST_BYTE_TIMEOUT, FailureKind.IDLE_TIMEOUT,
                 FailureKind.BAD_RESPONSE, FailureKind.BAD_ANSWER):
        assert blame(kind) is Blame.ENGINE and retryable(kind)
    assert all(engine_blame(status) is Blame.ENGINE for status in (502, 503, 504))
    assert engine_blame(500) is Blame.UNSURE  # the health check decides
    assert retryable(FailureKind.UPSTREAM_5XX, 500, healthy=False)
    assert not retryable(FailureKind.UPSTREAM_5XX, 500, healthy=True)  # the request's fault
    for status in (400, 404, 413, 422):  # a bad request
        assert engine_blame(status) is Blame.REQUEST and not retryable(answered(status), status)
    assert answered(429) is FailureKind.UPSTREAM_429 and retryable(FailureKind.UPSTREAM_429, 429)
    assert engine_blame(429) is Blame.REQUEST  # backpressure, not a fault
    for status in (401, 403, 407):  # the gateway's credentials: neither counted nor retried
        assert answered(status) is FailureKind.UPSTREAM_AUTH
        assert blame(FailureKind.UPSTREAM_AUTH) is Blame.REQUEST
        assert not retryable(FailureKind.UPSTREAM_AUTH)
    assert blame(FailureKind.TOO_LARGE) is Blame.REQUEST


async def test_health_checks_put_a_recovered_backend_back_without_risking_a_request(
    sdk: SdkClients, start: StartGateway
) -> None:
    big = sim_backend("m", slots=2, breaker_failures=1, breaker_open_s=0.2)
    gw = await start(gateway_config(big, sim_backend("m-small", slots=2)))
    engine(gw).inject_fault(FaultMode.ERROR_500)  # one failure, then healthy again
    assert (await ask(sdk, gw)).headers["x-slotgate-backend"] == "small"
    health = gw.gateway.health
    assert health.is_open("big")
    async with asyncio.timeout(10):
        await health.recovered("big")  # GET /v1/models answered: no request was the probe
    assert not health.is_open("big")
    assert (await ask(sdk, gw)).headers["x-slotgate-backend"] == "big"
    await assert_idle(gw)


class ParkingBackend:
    """A real HTTP backend that holds every request until the test answers it."""

    def __init__(self) -> None:
        self.parked: list[asyncio.Future[web.Response]] = []
        self.arrived = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.handle)
        self.app.router.add_get("/v1/models", self.models)

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        answer: asyncio.Future[web.Response] = asyncio.get_running_loop().create_future()
        self.parked.append(answer)
        self.arrived.set()
        return await answer

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []}, status=503)  # stays sick

    async def until_parked(self, n: int) -> None:
        async with asyncio.timeout(10):
            while len(self.parked) < n:
                self.arrived.clear()
                await self.arrived.wait()


def completion() -> web.Response:
    return web.json_response({
        "id": "c1", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


@pytest.mark.parametrize("with_fallback", [True, False])
async def test_an_opening_breaker_moves_its_queue_to_the_fallback_or_answers_503(
    sdk: SdkClients, start: StartGateway, with_fallback: bool
) -> None:
    backend = ParkingBackend()
    runner, url = await serve_app(backend.app)
    try:
        big = {"url": url + "/v1", "model": "m", "slots": 2, "queue_limit": 3,
               "breaker_failures": 1, "breaker_open_s": 60}
        gw = await start(gateway_config(
            big, sim_backend("m-small", slots=4) if with_fallback else None))
        running = asyncio.create_task(ask(sdk, gw))
        await backend.until_parked(1)
        failing = asyncio.create_task(ask(sdk, gw))
        await backend.until_parked(2)
        waiting = [asyncio.create_task(ask(sdk, gw)),
                   asyncio.create_task(ask(sdk, gw, stream=True))]
        await wait_pools(gw, lambda s: s["big"] == (2, 2))
        backend.parked[1].set_result(web.json_response(
            {"error": {"message": "engine crashed", "type": "server_error"}}, status=500))
        if with_fallback:
            plain, stream = await asyncio.gather(*waiting)
            assert plain.headers["x-slotgate-backend"] == "small"  # out of big's line
            assert [chunk async for chunk in stream.parse()]  # its headers left while queued
            assert (await failing).headers["x-slotgate-backend"] == "small"  # retried
            assert len(engine(gw, "small").records) == 3
        else:
            with pytest.raises(openai.InternalServerError) as refused:  # at once, not
                await waiting[0]  # after its queue timeout (60 s)
            assert refused.value.body["code"] == "backend_unavailable"  # type: ignore[index]
            assert int(refused.value.response.headers["Retry-After"]) >= 55
            stream = await waiting[1]  # its 200 went out while it queued: told in-band
            with pytest.raises(openai.APIError) as in_band:
                _ = [chunk async for chunk in stream.parse()]
            assert in_band.value.body["code"] == "backend_unavailable"  # type: ignore[index]
            with pytest.raises(openai.InternalServerError):
                await failing
        assert len(backend.parked) == 2  # the queued requests never reached it
        backend.parked[0].set_result(completion())  # the running one finishes where it is
        assert (await running).headers["x-slotgate-backend"] == "big"
        await assert_idle(gw)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("with_fallback", [True, False])
async def test_an_upstream_429_is_honoured(
    sdk: SdkClients, start: StartGateway, with_fallback: bool
) -> None:
    hits: list[int] = []
    runner, url = await serve_app(rate_limited(hits))
    try:
        big = {"url": url + "/v1", "model": "m", "slots": 2}
        gw = await start(gateway_config(
            big, sim_backend("m-small", slots=2) if with_fallback else None))
        if with_fallback:
            first = await ask(sdk, gw)
            assert first.headers["x-slotgate-backend"] == "small"  # retried: nothing was made
            assert first.headers["x-slotgate-route-reason"] == "retry:big"
            again = await ask(sdk, gw, stream=True)  # big waits out its Retry-After
            assert again.headers["x-slotgate-backend"] == "small"
            assert [chunk async for chunk in again.parse()]
        else:
            with pytest.raises(openai.RateLimitError) as relayed:
                await ask(sdk, gw)
            assert relayed.value.response.headers["Retry-After"] == "30"
            with pytest.raises(openai.InternalServerError) as cooling:
                await ask(sdk, gw)  # not sent: the backend asked for 30 s
            assert cooling.value.body["code"] == "backend_unavailable"  # type: ignore[index]
            assert int(cooling.value.response.headers["Retry-After"]) >= 25
        assert len(hits) == 1
        assert gw.gateway.health.breakers["big"].consecutive == 0  # not a failure
        await assert_idle(gw)
    finally:
        await runner.cleanup()


def test_failure_kinds_keep_the_error_codes_and_metric_labels_of_old() -> None:
    """The ledger's error codes and the metric's `kind` labels are what they always were."""
    from policies.health.failures import FailureKind, code, metric_kind

    assert {kind: (code(kind), metric_kind(kind)) for kind in FailureKind} == {
        FailureKind.REFUSED: ("upstream_unreachable", "connect"),
        FailureKind.CONNECT_TIMEOUT: ("upstream_unreachable", "connect"),
        FailureKind.BAD_RESPONSE: ("upstream_unreachable", "connect"),
        FailureKind.FIRST_BYTE_TIMEOUT: ("upstream_timeout", "timeout"),
        FailureKind.IDLE_TIMEOUT: ("upstream_timeout", "timeout"),
        FailureKind.DROPPED: ("upstream_dropped", "dropped"),
        FailureKind.TOO_LARGE: ("upstream_too_large", "dropped"),
        FailureKind.BAD_ANSWER: ("upstream_bad_answer", "invalid"),
        FailureKind.UPSTREAM_5XX: ("upstream_error", "status"),
        FailureKind.UPSTREAM_429: ("upstream_error", "status"),
        FailureKind.UPSTREAM_4XX: ("upstream_error", "status"),
        FailureKind.UPSTREAM_AUTH: ("upstream_auth_failed", None),
    }


async def test_each_failure_is_counted_under_its_kind_and_logged_with_its_code(
    start: StartGateway, sdk: SdkClients,
) -> None:
    gw = await start(gateway_config(sim_backend("m", 1, first_byte_timeout_s=0.2)))
    sim = engine(gw)
    for fault in (FaultMode.ERROR_500, FaultMode.HANG, FaultMode.REFUSE):
        sim.inject_fault(fault)
        with pytest.raises(openai.APIStatusError):
            await sdk(gw).chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Request-Id": fault.value})
    assert {r.request_id: (r.status, r.error) for r in gw.gateway.recent} == {
        FaultMode.ERROR_500.value: (500, "upstream_error"),
        FaultMode.HANG.value: (504, "upstream_timeout"),
        FaultMode.REFUSE.value: (502, "upstream_unreachable"),
    }
    registry = gw.gateway.metrics.registry
    for kind in ("status", "timeout", "connect"):
        assert registry.get_sample_value(
            "slotgate_upstream_errors_total", {"backend": "big", "kind": kind}) == 1
    await assert_idle(gw)
