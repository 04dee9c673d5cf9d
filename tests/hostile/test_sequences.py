"""One slot is one sequence at the engine: `n`, `best_of` and a list of prompts ask for
several, so a request asking for more than `server.max_sequences` is refused (400) before
it takes a slot; a list of token ids is one prompt, a list of such lists is several.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from router.app import RunningGateway
from tests.support import MESSAGES, StartGateway, assert_idle, engine, gateway_config, sim_backend


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def ask(http: aiohttp.ClientSession, gw: RunningGateway, path: str,
              **fields: Any) -> tuple[int, Any]:
    body = {"model": "chat", **fields}
    if path == "/v1/chat/completions":
        body.setdefault("messages", MESSAGES)
    async with http.post(gw.url + path, data=orjson.dumps(body),
                         headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.json()


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.mark.parametrize(("path", "fields", "param", "asked"), [
    (CHAT, {"n": 4}, "n", 4),
    (COMPLETIONS, {"prompt": "hi", "best_of": 3}, "best_of", 3),
    (COMPLETIONS, {"prompt": ["a", "b", "c"]}, "prompt", 3),
    (COMPLETIONS, {"prompt": [[1, 2], [3, 4], [5, 6]]}, "prompt", 3),
    (COMPLETIONS, {"prompt": ["a", "b"], "n": 2, "best_of": 3}, "best_of", 6),
])
async def test_more_sequences_than_the_cap_are_refused_before_a_slot(
        start: StartGateway, http: aiohttp.ClientSession, path: str, fields: dict[str, Any],
        param: str, asked: int) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    status, body = await ask(http, gw, path, **fields)
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == param
    message = body["error"]["message"]
    assert f"asks for {asked} sequences" in message and "allows 1" in message
    assert "server.max_sequences" in message
    assert engine(gw).records == {}
    await assert_idle(gw)


async def test_one_prompt_in_any_form_passes_the_default_cap(
        start: StartGateway, http: aiohttp.ClientSession) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    for fields in ({"prompt": "hi"}, {"prompt": ["hi"]}, {"prompt": list(range(5000))},
                   {"prompt": [[1, 2, 3]]}, {"prompt": "hi", "n": 1, "best_of": 1},
                   {"prompt": "hi", "n": None}):
        assert (await ask(http, gw, COMPLETIONS, **fields))[0] == 200, fields
    assert (await ask(http, gw, CHAT, n=1, vendor_field={"n": 9}))[0] == 200
    await assert_idle(gw)


@pytest.mark.parametrize("value", [0, -1, "4", 2.5, True])
async def test_a_malformed_n_is_400(start: StartGateway, http: aiohttp.ClientSession,
                                    value: Any) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    status, body = await ask(http, gw, CHAT, n=value)
    assert status == 400 and body["error"]["param"] == "n"
    await assert_idle(gw)


async def test_raising_the_cap_lets_them_through(start: StartGateway,
                                                 http: aiohttp.ClientSession) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1),
                                    server={"max_sequences": 16}))
    assert (await ask(http, gw, CHAT, n=4))[0] == 200
    assert (await ask(http, gw, COMPLETIONS, prompt="hi", best_of=3))[0] == 200
    assert (await ask(http, gw, COMPLETIONS, prompt=["a", "b", "c"], n=4))[0] == 200  # 12
    status, body = await ask(http, gw, COMPLETIONS, prompt=["a", "b", "c", "d", "e"], n=4)
    assert status == 400 and "asks for 20 sequences (n=4 x 5 prompts)" in body["error"]["message"]
    assert "allows 16" in body["error"]["message"]
    await assert_idle(gw)
