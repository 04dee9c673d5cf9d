"""`x-should-retry` tells the official SDKs (and the agents built on them) whether to
retry: false on what no retry can fix (a wrong key, a bad request, an unknown model), true
on a full line (429) with its Retry-After. Without it both SDKs retry a 401 with back-off,
so a wrong key kept an agent retrying for minutes before it said so."""

from __future__ import annotations

import asyncio

import anthropic
import openai
import pytest

from router.app import RunningGateway
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
)
from tests.support.anthropic import AnthropicClients

KEY = "sk-should-retry-0123456789"


def _config(**auth: object) -> dict[str, object]:
    raw = gateway_config(sim_backend("m", slots=1, queue_limit=0))
    if auth:
        raw["auth"] = auth
    return raw


def _statuses(gw: RunningGateway) -> list[int | None]:
    return [rec.status for rec in gw.gateway.recent]


async def test_a_wrong_key_is_asked_once_by_both_sdks(
    sdk: SdkClients, claude: AnthropicClients, start: StartGateway,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RETRY_KEY", KEY)
    gw = await start(_config(enabled=True, keys=[
        {"id": "k", "tenant": "t", "key_env": "RETRY_KEY"}]))
    with pytest.raises(anthropic.AuthenticationError) as refused:
        await claude(gw, api_key="sk-wrong", max_retries=3).messages.create(
            model="chat", max_tokens=5, messages=MESSAGES)
    assert refused.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.AuthenticationError):
        await sdk(gw, api_key="sk-wrong", max_retries=3).chat.completions.create(
            model="chat", messages=MESSAGES)
    # one request each, not four
    assert gw.gateway.metrics.auth_failures.values[("invalid_api_key",)] == 2
    await assert_idle(gw)


async def test_a_bad_request_and_an_unknown_model_are_not_retried(
    claude: AnthropicClients, start: StartGateway,
) -> None:
    gw = await start(_config())
    client = claude(gw, max_retries=3)
    with pytest.raises(anthropic.NotFoundError) as missing:
        await client.messages.create(model="nope", max_tokens=5,
                                     messages=MESSAGES)
    assert missing.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(anthropic.BadRequestError):
        await client.messages.create(model="chat", max_tokens=-1,
                                     messages=MESSAGES)
    assert _statuses(gw) == [404, 400]
    await assert_idle(gw)


async def test_a_full_line_is_retried_after_its_retry_after(
    claude: AnthropicClients, start: StartGateway,
) -> None:
    gw = await start(_config())
    sim = engine(gw)
    sim.hold()
    client = claude(gw, max_retries=1)
    holder = client.messages.create(model="chat", max_tokens=5,
                                    messages=MESSAGES)

    held = asyncio.ensure_future(holder)
    await sim.wait_until(lambda e: e.held == 1)
    with pytest.raises(anthropic.RateLimitError) as full:
        await client.messages.create(model="chat", max_tokens=5,
                                     messages=MESSAGES)
    headers = full.value.response.headers
    assert headers["x-should-retry"] == "true" and int(headers["retry-after"]) >= 1
    assert _statuses(gw).count(429) == 2  # asked again once, as max_retries=1 allows
    sim.release()
    assert (await held).content
    await assert_idle(gw)
