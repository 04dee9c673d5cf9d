"""Accepted bodies of a mebibyte or more are parsed and translated off the event loop, one
at a time on one thread, and the heap is trimmed once the last has ended: /healthz and the
small requests of other clients are answered meanwhile. (The stall itself, in
milliseconds, is measured by bench/big_bodies.py, not here: a busy machine would make a
tight bound flaky.)"""

from __future__ import annotations

import asyncio
import base64
import os
import time

import aiohttp
import orjson

from router.request.big_body import BIG_BODY
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    gateway_config,
    poll_until,
    sim_backend,
)


def messages_body(size: int) -> bytes:
    image = base64.b64encode(os.urandom(size * 3 // 4)).decode()
    return orjson.dumps({"model": "chat", "max_tokens": 8, "messages": [
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": image}},
            {"type": "text", "text": "What is in this picture?"}]}]})


async def test_big_bodies_are_parsed_off_the_loop(start: StartGateway, sdk: SdkClients) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=8)))
    big = gw.gateway.big_bodies
    small = messages_body(BIG_BODY // 2)
    async with aiohttp.ClientSession() as http:
        async def post(body: bytes) -> int:
            async with http.post(gw.url + "/v1/messages", data=body,
                                 headers={"Content-Type": "application/json"}) as resp:
                answer = await resp.json()
                assert answer["type"] == "message", answer
                return resp.status

        assert await post(small) == 200
        assert big.parsed == 0  # below the bound: parsed inline, as before
        bodies = [messages_body(3 * BIG_BODY) for _ in range(6)]
        flood = [asyncio.create_task(post(body)) for body in bodies]
        await poll_until(lambda: big.parsed >= 1)  # the first is on the thread now
        began = time.perf_counter()
        async with http.get(gw.url + "/healthz") as resp:
            assert resp.status == 200
        other = await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
        assert other.choices  # another client's small request, served meanwhile
        healthz_s = time.perf_counter() - began
        assert await asyncio.gather(*flood) == [200] * 6
    assert big.parsed == 6 and big.held == 0 and big.parsing == 0
    assert big.worked == 12  # each parse, and each dump for the engine, on the thread
    assert healthz_s < 5.0  # generous: the figure is the bench's
    if big.can_trim:  # glibc: the heap handed back once the last had ended
        await poll_until(lambda: big.trims >= 1)
    await assert_idle(gw)


async def test_count_tokens_of_a_big_body_off_the_loop(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    async with aiohttp.ClientSession() as http, http.post(
            gw.url + "/v1/messages/count_tokens", data=messages_body(2 * BIG_BODY),
            headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200
        assert (await resp.json())["input_tokens"] > 0
    assert gw.gateway.big_bodies.parsed == 1 and gw.gateway.big_bodies.held == 0
