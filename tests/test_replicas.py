"""A backend served by a group of engine replicas: one line, each replica within its own
slots, every replica used, the replica named on the answer, conversations kept where
their prefix is, and replicas added and removed by a reload under load."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from router.app import RunningGateway, start_gateway
from router.common.config_error import ConfigError
from router.config import config_from_dict, load_config
from router.reload import reload_file
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    send_in_order,
)

FAST = {"ttft_s": 0, "tokens_per_s": 0, "output_tokens": 8, "max_num_seqs": 8}


def group(*slots: int, pick: str = "affinity", queue_limit: int = 30) -> dict[str, Any]:
    """A config whose `big` backend is a group of simulated replicas big-0, big-1, ...
    Each engine could run 8 sequences: the gateway alone keeps it within its slots."""
    endpoints = [{"simulated": FAST, "slots": n} for n in slots]
    return {"backends": {"big": {"model": "m", "endpoints": endpoints, "pick": pick,
                                 "queue_limit": queue_limit}},
            "routes": {"chat": {"primary": "big", "overflow": "reject"}}}


def replicas(gw: RunningGateway) -> list[str]:
    return list(gw.gateway.backends["big"].replicas)


async def test_twenty_streams_on_three_replicas_of_two_slots(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(group(2, 2, 2))
    names = replicas(gw)
    assert names == ["big-0", "big-1", "big-2"]
    engines = [engine(gw, "big", name) for name in names]
    for sim in engines:
        sim.hold()
    tasks, rejected = await send_in_order(sdk(gw), gw, 20)
    assert rejected == []
    pool = gw.gateway.backends["big"].pool
    assert (pool.active, pool.queued) == (6, 14)
    assert [s.active for s in pool.seats()] == [2, 2, 2]  # all six slots used
    for sim in engines:
        sim.release()
    assert all(await asyncio.gather(*tasks))
    assert [sim.peak for sim in engines] == [2, 2, 2]  # no engine ever above its slots
    served = sorted((r for r in gw.gateway.recent if r.slot_at), key=lambda r: r.slot_at or 0)
    assert [r.request_id for r in served] == [f"req-{i}" for i in range(20)]  # one FIFO line
    assert {r.replica for r in served} == set(names)
    await assert_idle(gw)


async def test_the_answer_names_its_replica(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(group(1, 1))
    raw = await sdk(gw).chat.completions.with_raw_response.create(model="chat",
                                                                  messages=MESSAGES)
    assert raw.headers["x-slotgate-backend"] == "big"
    assert raw.headers["x-slotgate-endpoint"] in replicas(gw)
    single = await start({"backends": {"one": {"model": "m", "slots": 1,
                                                "simulated": FAST}},
                          "routes": {"chat": {"primary": "one"}}})
    raw = await sdk(single).chat.completions.with_raw_response.create(model="chat",
                                                                      messages=MESSAGES)
    assert raw.headers["x-slotgate-endpoint"] == "one"  # a group of one, named for it


async def test_a_conversation_stays_on_the_replica_that_holds_its_prefix(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(group(2, 2, 2))
    client = sdk(gw)
    busy = [engine(gw, "big", name) for name in ("big-0", "big-1")]
    for sim in busy:
        sim.hold()
    fillers, _ = await send_in_order(client, gw, 2)  # one on big-0, one on big-1
    system = {"role": "system", "content": "You are a careful assistant. " * 40}
    turns: list[dict[str, str]] = [system]
    where = []
    for turn in range(5):
        turns = [*turns, {"role": "user", "content": f"question {turn} " * 20}]
        raw = await client.chat.completions.with_raw_response.create(
            model="chat", messages=turns,  # type: ignore[arg-type]
            extra_headers={"X-Request-Id": f"turn-{turn}"})
        where.append(raw.headers["x-slotgate-endpoint"])
        turns.append({"role": "assistant", "content": raw.parse().choices[0].message.content
                      or ""})
        if turn == 0:  # the others idle again: only the prefix keeps it where it began
            for sim in busy:
                sim.release()
            await asyncio.gather(*fillers)
    assert where == ["big-2"] * 5  # least loaded would have gone back to big-0
    picks = {r.request_id: r.pick for r in gw.gateway.recent}
    assert [picks[f"turn-{turn}"] for turn in range(1, 5)] == ["prefix"] * 4
    # The fillers' prompt fills no block, the first turn's is new: three misses, four hits.
    lookups = gw.gateway.metrics.prefix_lookups.values
    assert (lookups[("big", "hit")], lookups[("big", "miss")]) == (4, 3)
    await assert_idle(gw)


async def test_the_bound_moves_a_conversation_off_a_hot_replica(
    sdk: SdkClients, start: StartGateway
) -> None:
    config = group(4, 4)
    config["backends"]["big"]["affinity"] = {"load_bound": 0.25}
    gw = await start(config)
    client = sdk(gw)
    turns: Any = [{"role": "system", "content": "You are a careful assistant. " * 40},
                  {"role": "user", "content": "first question " * 20}]
    first = await client.chat.completions.with_raw_response.create(model="chat",
                                                                   messages=turns)
    home = first.headers["x-slotgate-endpoint"]
    engine(gw, "big", home).hold()
    # A long answer of the same conversation: it goes home (its prefix), and makes it hot.
    hot = asyncio.create_task(client.chat.completions.create(
        model="chat", messages=turns, max_tokens=4000))
    await engine(gw, "big", home).wait_until(lambda sim: sim.held == 1)
    turns = [*turns, {"role": "assistant", "content": "an answer"},
             {"role": "user", "content": "second question " * 20}]
    moved = await client.chat.completions.with_raw_response.create(
        model="chat", messages=turns, extra_headers={"X-Request-Id": "moved"})
    assert moved.headers["x-slotgate-endpoint"] != home
    assert {r.request_id: r.pick for r in gw.gateway.recent}["moved"] == "bound"
    engine(gw, "big", home).release()
    await hot
    await assert_idle(gw)


async def test_a_replica_counts_only_the_work_its_cache_does_not_spare(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(group(4, 4))
    client = sdk(gw)
    messages: Any = [{"role": "system", "content": "You are a careful assistant. " * 150},
                     {"role": "user", "content": "a question"}]
    backend = gw.gateway.backends["big"]
    home, loads = engine(gw, "big", "big-0"), {}  # ties go to the first name
    for rid in ("cold", "warm"):  # the second once the first has been prefilled
        for sim in (engine(gw, "big", name) for name in backend.replicas):
            sim.hold()
        call = asyncio.create_task(client.chat.completions.create(
            model="chat", messages=messages, max_tokens=1, extra_headers={"X-Request-Id": rid}))
        await home.wait_until(lambda sim: sim.held == 1)
        loads[rid] = sum(r.load_tokens for r in backend.replicas.values())
        home.release()
        await call
    records = {r.request_id: r for r in gw.gateway.recent}
    known = records["warm"].prefix_blocks or 0
    assert known > 0 and records["warm"].replica == records["cold"].replica == "big-0"
    assert loads["warm"] == loads["cold"] - known * 256 // 4  # its known blocks are not
    assert sum(r.load_tokens for r in backend.replicas.values()) == 0  # prefilled again
    await assert_idle(gw)


async def test_a_replica_holds_a_prompt_once_its_engine_has_prefilled_it(
    sdk: SdkClients, start: StartGateway
) -> None:
    """A prompt's blocks are the replica's from its first byte, not from its slot: a
    second request of the same prefix sent meanwhile would prefill it there again."""
    gw = await start(group(4, 4))
    client = sdk(gw)
    messages: Any = [{"role": "system", "content": "You are a careful assistant. " * 150},
                     {"role": "user", "content": "a question"}]
    sims = [engine(gw, "big", name) for name in ("big-0", "big-1")]
    for sim in sims:
        sim.hold()  # every generation paused before its first token
    calls = []
    for rid, sim in (("first", sims[0]), ("meanwhile", sims[1])):
        calls.append(asyncio.create_task(client.chat.completions.create(
            model="chat", messages=messages, stream=True,
            extra_headers={"X-Request-Id": rid})))
        await sim.wait_until(lambda sim: sim.held == 1)
    for sim in sims:
        sim.release()
    for call in calls:
        async for _ in await call:
            pass
    later = await client.chat.completions.with_raw_response.create(
        model="chat", messages=messages, extra_headers={"X-Request-Id": "later"})
    picks = {r.request_id: (r.replica, r.pick) for r in gw.gateway.recent}
    assert picks["first"] == ("big-0", "least_loaded")
    assert picks["meanwhile"] == ("big-1", "least_loaded")  # big-0 had not prefilled it yet
    assert picks["later"][1] == "prefix"  # both hold it now
    assert later.headers["x-slotgate-endpoint"] in ("big-0", "big-1")
    await assert_idle(gw)


async def test_round_robin_takes_turns(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(group(1, 1, 1, pick="round_robin"))
    where = []
    for _ in range(6):
        raw = await sdk(gw).chat.completions.with_raw_response.create(model="chat",
                                                                      messages=MESSAGES)
        where.append(raw.headers["x-slotgate-endpoint"])
    assert where == ["big-0", "big-1", "big-2"] * 2


async def test_power_of_two_runs_on_the_lighter_of_two_free_replicas(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(group(1, 1, 1, pick="power_of_two"))
    engine(gw, "big", "big-0").hold()
    held = asyncio.create_task(sdk(gw).chat.completions.create(model="chat", messages=MESSAGES))
    await engine(gw, "big", "big-0").wait_until(lambda sim: sim.held == 1)
    where = []
    for _ in range(8):  # big-0 busy: only the other two are drawn, whatever the draw
        raw = await sdk(gw).chat.completions.with_raw_response.create(model="chat",
                                                                      messages=MESSAGES)
        where.append(raw.headers["x-slotgate-endpoint"])
    assert set(where) <= {"big-1", "big-2"}
    engine(gw, "big", "big-0").release()
    await held
    assert gw.gateway.metrics.picks.values[("big", "power_of_two")] == 9
    await assert_idle(gw)


async def test_a_reload_adds_and_removes_replicas_under_load_failing_nothing(
    sdk: SdkClients, tmp_path: Path
) -> None:
    path = tmp_path / "gateway.yaml"
    raw = group(2, 2)
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    gw = await start_gateway(load_config(path), "127.0.0.1", 0, config_path=str(path))
    try:
        first, second = engine(gw, "big", "big-0"), engine(gw, "big", "big-1")
        first.hold()
        second.hold()
        tasks, rejected = await send_in_order(sdk(gw), gw, 6)  # 4 running, 2 queued
        assert rejected == []
        # big-0 goes, a new big-2 comes: the queued two start there at once.
        raw["backends"]["big"]["endpoints"] = [
            {"simulated": FAST, "slots": 2, "name": "big-1"},
            {"simulated": FAST, "slots": 2, "name": "big-2"}]
        path.write_text(yaml.safe_dump(raw), encoding="utf-8")
        assert await reload_file(gw.gateway, path) == ["backend big changed"]
        third = engine(gw, "big", "big-2")
        await third.wait_until(lambda sim: len(sim.records) == 2)
        more = [asyncio.create_task(sdk(gw).chat.completions.create(
            model="chat", messages=MESSAGES)) for _ in range(2)]
        first.release()  # big-0 runs out what it held and takes nothing new
        second.release()
        await asyncio.gather(*tasks, *more)
        assert len(first.records) == 2 and len(second.records) + len(third.records) == 6
        pool = gw.gateway.backends["big"].pool
        assert [s.name for s in pool.seats()] == ["big-1", "big-2"]
        await assert_idle(gw)
    finally:
        await gw.close()


def test_config_check_names_each_group_problem() -> None:
    twice = {"model": "m", "endpoints": [{"simulated": {}, "slots": 1, "name": "a-1"},
                                         {"simulated": {}, "slots": 1}]}  # a-1 twice
    bad = {"backends": {
        "a": twice,
        "b": {"model": "m", "endpoints": [{"slots": 1}], "pick": "random"},
        "c": {"model": "m", "slots": 2, "endpoints": [{"simulated": {}, "slots": 2}]},
    }, "routes": {"chat": {"primary": "a"}}}
    try:
        config_from_dict(bad)
    except ConfigError as exc:
        problems = sorted(str(p) for p in exc.problems)
    else:
        raise AssertionError("the config was accepted")
    assert any(p.startswith("backends.b.endpoints[0]: give exactly one of") for p in problems)
    assert any(p.startswith("backends.b.pick: Input should be") for p in problems)
    assert any(p.startswith("backends.c: with 'endpoints', give 'slots' per endpoint")
               for p in problems)
    redis = {**group(1, 1), "coordination": {"mode": "redis", "url": "redis://127.0.0.1:1"}}
    assert config_from_dict(redis).backends["big"].slots == 2  # a group on a shared pool
    dup = {"backends": {"a": twice}, "routes": {"chat": {"primary": "a"}}}
    try:
        config_from_dict(dup)
    except ConfigError as exc:
        assert "endpoint names must be unique" in str(exc)
    else:
        raise AssertionError("two endpoints named a-1 were accepted")
