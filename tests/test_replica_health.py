"""Health per replica: a replica that refuses costs its request nothing before the first
byte (retried on a sibling), leaves the group's capacity, and comes back when its health
check passes; a group with no replica left sends its line to the route's fallback."""

from __future__ import annotations

import asyncio
from typing import Any

from router.app import RunningGateway
from router.upstream.simulated.engine import FaultMode
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    serve_app,
)
from tests.support.engines import rate_limited

FAST = {"ttft_s": 0, "tokens_per_s": 0, "output_tokens": 8, "max_num_seqs": 8}


def group(fallback: bool = False) -> dict[str, Any]:
    endpoints = [{"simulated": FAST, "slots": 2}, {"simulated": FAST, "slots": 2}]
    raw: dict[str, Any] = {
        "backends": {"big": {"model": "m", "endpoints": endpoints, "pick": "round_robin",
                             "queue_limit": 8, "breaker_open_s": 0.2}},
        "routes": {"chat": {"primary": "big", "overflow": "reject"}}}
    if fallback:
        raw["backends"]["small"] = {"model": "s", "slots": 2, "simulated": FAST}
        raw["routes"]["chat"]["fallbacks"] = ["small"]
    return raw


async def healthy(gw: RunningGateway, want: dict[str, bool]) -> None:
    """Wait (on the pool's changes, within a deadline) until the replicas' health is `want`."""
    pool = gw.gateway.backends["big"].pool
    async with asyncio.timeout(10):
        while {s.name: s.healthy for s in pool.seats()} != want:
            await pool.next_change()


async def test_a_refusing_replica_costs_nothing_and_comes_back_when_it_answers(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(group())
    engine(gw, "big", "big-1").inject_fault(FaultMode.REFUSE)
    pool = gw.gateway.backends["big"].pool
    seen: list[dict[str, bool]] = []
    pool.watch(lambda _: seen.append({s.name: s.healthy for s in pool.seats()}))
    client = sdk(gw)
    first = await client.chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES, extra_headers={"X-Request-Id": "one"})
    second = await client.chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES, extra_headers={"X-Request-Id": "two"})
    assert first.headers["x-slotgate-endpoint"] == "big-0"
    assert second.headers["x-slotgate-endpoint"] == "big-0"  # big-1's turn, refused: retried
    assert second.parse().choices[0].message.content  # a whole answer all the same
    records = {r.request_id: r for r in gw.gateway.recent}
    assert records["two"].reason == "retry:big" and records["two"].status == 200
    # big-1's breaker opened at once (a refused connection is proof enough); its health
    # check, at the next probe time, puts it back.
    await healthy(gw, {"big-0": True, "big-1": True})
    assert {"big-0": True, "big-1": False} in seen  # out of the capacity meanwhile
    where = set()
    for _ in range(4):
        raw = await client.chat.completions.with_raw_response.create(model="chat",
                                                                     messages=MESSAGES)
        where.add(raw.headers["x-slotgate-endpoint"])
    assert where == {"big-0", "big-1"}
    await assert_idle(gw)


async def test_a_group_with_no_replica_left_sends_its_line_to_the_fallback(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(group(fallback=True))
    for name in ("big-0", "big-1"):
        engine(gw, "big", name).inject_fault(FaultMode.REFUSE, count=1000)
    raw = await sdk(gw).chat.completions.with_raw_response.create(model="chat",
                                                                  messages=MESSAGES)
    assert raw.headers["x-slotgate-backend"] == "small"
    assert gw.gateway.health.is_open("big")  # the group's own breaker: nothing left
    assert [s.healthy for s in gw.gateway.backends["big"].pool.seats()] == [False, False]
    for name in ("big-0", "big-1"):
        engine(gw, "big", name).reset()
    await healthy(gw, {"big-0": True, "big-1": True})
    await assert_idle(gw)


async def test_a_replicas_429_cools_that_replica_alone(
    sdk: SdkClients, start: StartGateway
) -> None:
    hits: list[int] = []
    runner, url = await serve_app(rate_limited(hits))
    try:
        raw = group()
        raw["backends"]["big"]["endpoints"] = [
            {"url": url + "/v1", "slots": 2, "name": "busy"},
            {"simulated": FAST, "slots": 2, "name": "calm"}]
        gw = await start(raw)
        where = []
        for _ in range(4):  # round robin: busy's turn comes twice
            reply = await sdk(gw).chat.completions.with_raw_response.create(
                model="chat", messages=MESSAGES)
            where.append(reply.headers["x-slotgate-endpoint"])
        assert where == ["calm"] * 4  # the first retried on its sibling, then busy waits
        assert len(hits) == 1  # busy asked for 30 s and was asked nothing more
        assert [s.healthy for s in gw.gateway.backends["big"].pool.seats()] == [False, True]
        assert not gw.gateway.health.is_open("big")  # the group serves on
        assert gw.gateway.replica_health.healthy("big", "busy")  # backpressure, no fault
        await assert_idle(gw)
    finally:
        await runner.cleanup()

