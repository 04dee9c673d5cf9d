"""Deploys under load: 20 config reloads (times the scale).

An in-process gateway under a steady mix of streams and whole answers has its config
file rewritten and reloaded 20 times (times the scale): slots, queue limits and the
route's fallbacks change under the load. No request fails, every answer is complete,
and afterwards no slot is held and no ticket queued.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import yaml
from openai import AsyncOpenAI

from router.app import RunningGateway, start_gateway
from router.config import load_config
from router.reload import reload_file
from tests.support import (
    MESSAGES,
    Changes,
    SdkClients,
    assert_idle,
    engine,
    sim_backend,
)

SEED = 20240612
STREAM_SHARE = 0.75  # of the requests; the rest ask for a whole answer


class Tally(Changes):
    """What the clients saw, and a way to wait (without polling) until it says something."""


OUTPUT_TOKENS = 8
RELOAD_SIM = {"ttft_s": 0.002, "tokens_per_s": 400, "output_tokens": OUTPUT_TOKENS}


def reload_size(scale: int) -> int:
    """Clients and slots grow with the scale, the reloads (20 x scale) faster: one event loop
    carries the clients, the gateway and both engines."""
    return 1 + (scale - 1) // 2


def reload_variant(i: int, size: int, clients: int) -> dict[str, Any]:
    """The i-th config: slots, queue limits and the route's fallbacks move, but every request
    in flight always finds room (a queue of `clients` where nothing else takes the excess)."""
    big_seqs, small_seqs = 6 * size, 4 * size
    kind = i % 3
    if kind == 0:  # the primary alone, mid-sized, with a queue for everyone
        big = {"slots": 4 * size, "queue_limit": clients + i}
        route: dict[str, Any] = {"primary": "big", "overflow": "reject"}
    elif kind == 1:  # a small primary with a short queue; the rest overflows to `small`
        big = {"slots": 2 * size, "queue_limit": 2 * size}
        route = {"primary": "big", "fallbacks": ["small"], "overflow": "fallback"}
    else:  # the primary at the engine's size, half a queue; overflow to `small`
        big = {"slots": big_seqs, "queue_limit": clients // 2 + i}
        route = {"primary": "big", "fallbacks": ["small"], "overflow": "fallback"}
    raw = {
        "backends": {
            "big": sim_backend("big-m", queue_timeout_s=60,
                               sim={**RELOAD_SIM, "max_num_seqs": big_seqs}, **big),
            "small": sim_backend("small-m", slots=small_seqs, queue_limit=clients + i,
                                 queue_timeout_s=60, sim={**RELOAD_SIM,
                                                          "max_num_seqs": small_seqs}),
        },
        "routes": {"chat": route},
        "logging": {"access": False},
    }
    return raw


async def post_reload(http: aiohttp.ClientSession, gw: RunningGateway) -> list[str]:
    async with http.post(gw.url + "/admin/reload") as resp:
        body = await resp.json()
        assert resp.status == 200, body
        changes: list[str] = body["changes"]
        return changes


async def test_reloads_under_load_fail_no_request(
    sdk: SdkClients, tmp_path: Path, scale: int
) -> None:
    size = reload_size(scale)
    clients = 16 * size  # against 4 to 10 slots (x size), always with room in a queue
    reloads = 20 * scale
    path = tmp_path / "gateway.yaml"

    def write(i: int) -> dict[str, Any]:
        raw = reload_variant(i, size, clients)
        path.write_text(yaml.safe_dump(raw), encoding="utf-8")
        return raw

    write(0)
    gw = await start_gateway(load_config(path), "127.0.0.1", 0, config_path=str(path))
    rng = random.Random(SEED)
    outcomes: Counter[str] = Counter()
    failures: list[tuple[str, object]] = []
    tally = Tally()
    stop = asyncio.Event()
    client = sdk(gw, timeout=30.0 * scale)

    async def one_client(index: int, seed: int) -> None:
        own = random.Random(seed)
        n = 0
        while not stop.is_set():
            n += 1
            rid, stream = f"reload-{index}-{n}", own.random() < STREAM_SHARE
            try:
                tokens, finish = await complete(client, rid, stream)
                if (tokens, finish) != (OUTPUT_TOKENS, "stop"):
                    failures.append((rid, f"incomplete: {tokens} tokens, {finish}"))
                outcomes["stream" if stream else "whole"] += 1
            except openai.APIError as exc:  # any failure is what this test counts
                failures.append((rid, exc))
            tally.changed()

    def done() -> int:
        return sum(outcomes.values()) + len(failures)

    def answered(count: int) -> Callable[[], bool]:
        return lambda: done() >= count

    began = time.monotonic()
    workers = [asyncio.create_task(one_client(i, rng.getrandbits(32))) for i in range(clients)]
    changes_seen: Counter[str] = Counter()
    try:
        async with asyncio.timeout(60 * scale), aiohttp.ClientSession() as http:
            for i in range(1, reloads + 1):
                # Some answers complete between two reloads: a random number of them (few, so
                # that most reloads land while the same requests are still in flight).
                target = done() + rng.randint(2, 12)
                await tally.wait_until(answered(target), within_s=20 * scale)
                raw = write(i)
                if i % 2:
                    changes = await post_reload(http, gw)  # the operator's way
                else:
                    changes = await reload_file(gw.gateway, path)  # what SIGHUP runs
                assert changes, f"reload {i} changed nothing"
                changes_seen.update(changes)
                config = gw.gateway.config
                assert config.backends["big"].slots == raw["backends"]["big"]["slots"]
                assert config.routes["chat"].fallbacks == tuple(raw["routes"]["chat"]
                                                                .get("fallbacks", ()))
            # the load goes on past the last reload
            await tally.wait_until(answered(done() + clients), within_s=20 * scale)
            stop.set()
            await asyncio.gather(*workers)
        load_s = time.monotonic() - began
        await client.close()

        assert not failures, (len(failures), failures[:5])
        big, small = engine(gw, "big"), engine(gw, "small")
        records = [*big.records.values(), *small.records.values()]
        assert len(records) == done()  # each request reached an engine once (no retries)
        assert all(r.completed and not r.aborted for r in records)
        # The engines never ran more than the most slots any config gave them.
        assert big.peak <= 6 * size and small.peak <= 4 * size, (big.peak, small.peak)
        assert small.records  # the fallback the reloads switched on took some of the load
        assert {"backend big changed", "routes changed"} <= set(changes_seen)
        await assert_idle(gw)
        print(f"\n{reloads} reloads ({dict(changes_seen)}) during {done()} requests from "
              f"{clients} clients ({dict(outcomes)}); failed {len(failures)}; big served "
              f"{len(big.records)} (peak {big.peak}), small {len(small.records)} (peak "
              f"{small.peak}); {load_s:.1f} s")
    finally:
        stop.set()
        for task in workers:
            task.cancel()
        await client.close()
        await gw.close()


async def complete(client: AsyncOpenAI, rid: str, stream: bool) -> tuple[int, str | None]:
    """(content tokens, finish_reason) of one answer, whole or streamed."""
    headers = {"X-Request-Id": rid}
    if not stream:
        reply = await client.chat.completions.create(model="chat", messages=MESSAGES,
                                                     extra_headers=headers)
        tokens = reply.usage.completion_tokens if reply.usage else 0
        return tokens, reply.choices[0].finish_reason
    tokens, finish = 0, None
    response = await client.chat.completions.create(model="chat", messages=MESSAGES,
                                                    stream=True, extra_headers=headers)
    async with response as chunks:
        async for chunk in chunks:
            if chunk.choices:
                tokens += bool(chunk.choices[0].delta.content)
                finish = chunk.choices[0].finish_reason or finish
    return tokens, finish
