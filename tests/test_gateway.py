"""End to end through the official `openai` SDK: chat, completions, streams, models, 429."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.support import SdkClients, StartGateway, assert_idle, engine, gateway_config, sim_backend

UPSTREAM_ID = "org/big-model-70b"


def one_backend(**extra: object) -> dict[str, object]:
    return gateway_config(sim_backend(UPSTREAM_ID, slots=2, queue_limit=2, **extra))


async def test_chat_non_streaming(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(one_backend())
    client = sdk(gw)
    raw = await client.chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": "hello there"}], max_tokens=5,
        extra_headers={"X-Request-Id": "req-plain-1"},
    )
    reply = raw.parse()
    assert reply.choices[0].message.content
    assert reply.model == UPSTREAM_ID  # the backend saw the rewritten model id
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    assert raw.headers["x-slotgate-backend"] == "big"
    assert raw.headers["x-slotgate-route-reason"] == "primary"
    assert raw.headers["x-slotgate-queue-wait-ms"] == "0"
    assert raw.headers["x-request-id"] == "req-plain-1"
    record = gw.gateway.recent[-1]
    assert (record.request_id, record.status) == ("req-plain-1", 200)
    assert (record.prompt_tokens, record.completion_tokens) == (reply.usage.prompt_tokens, 5)
    assert engine(gw).records["req-plain-1"].completed
    await assert_idle(gw)


async def test_chat_streaming_strips_usage_chunk_client_did_not_ask_for(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw = await start(one_backend())
    stream = await sdk(gw).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "stream please"}], stream=True,
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert all(c.choices for c in chunks), "the usage-only chunk must not reach this client"
    assert chunks[-1].choices[0].finish_reason in {"stop", "length"}
    record = gw.gateway.recent[-1]
    # ... but the gateway asked for it upstream and kept the counts.
    assert record.completion_tokens == 8 and record.prompt_tokens
    assert record.ttft_ms is not None
    await assert_idle(gw)


async def test_chat_streaming_keeps_usage_chunk_when_asked(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(one_backend())
    stream = await sdk(gw).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "count me"}], stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert gw.gateway.recent[-1].completion_tokens == 8
    await assert_idle(gw)


async def test_completions_streaming_and_not(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(one_backend())
    client = sdk(gw)
    plain = await client.completions.create(model="chat", prompt="Once upon", max_tokens=3)
    assert plain.choices[0].text and plain.usage and plain.usage.completion_tokens == 3
    stream = await client.completions.create(model="chat", prompt="Once upon", stream=True)
    texts = [c.choices[0].text async for c in stream if c.choices]
    assert "".join(texts).strip()
    assert gw.gateway.recent[-1].completion_tokens == 8
    await assert_idle(gw)


async def test_models_lists_public_route_names(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("x", 1), sim_backend("y", 1), "fallback"))
    models = await sdk(gw).models.list()
    assert [m.id for m in models.data] == ["chat"]
    await assert_idle(gw)


async def test_rate_limit_error_surfaces_with_retry_after(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend(UPSTREAM_ID, slots=1, queue_limit=0)))
    sim = engine(gw)
    sim.hold()
    client = sdk(gw)
    running = asyncio.create_task(client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "long job"}]))
    await sim.wait_until(lambda e: e.active == 1)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "me too"}])
    response = caught.value.response
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) >= 1
    assert response.headers["x-slotgate-reject-reason"] == "queue_full"
    assert caught.value.body == {"message": caught.value.body["message"],  # type: ignore[index]
                                 "type": "rate_limit_error", "param": None, "code": "queue_full"}
    sim.release()
    await running
    await assert_idle(gw)
