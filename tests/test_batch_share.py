"""Batch lines stay below interactive work on a backend: within `batch.max_share` of its
slots, and never in its interactive line (a line that finds no free slot is refused and
waits in its job)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from policies.config import Config
from policies.config.batch import BatchConfig
from router.app import RunningGateway
from router.batch.runner import SECRET_HEADER
from tests.support import SdkClients, StartGateway, assert_idle, engine, sim_backend
from tests.support.batch_jobs import KEYS, config, ended, jsonl, line, submit

ASK: dict[str, Any] = {"model": "chat", "messages": [{"role": "user", "content": "now"}],
                       "max_tokens": 4}


async def test_batch_lines_hold_at_most_their_share(sdk: SdkClients, start: StartGateway,
                                                    tmp_path: Path) -> None:
    raw = config(tmp_path, slots=4)
    raw["batch"] = {"max_share": 0.25, "backend_max_share": {"big": 0.5}}
    gw: RunningGateway = await start(raw)
    alice = sdk(gw, api_key=KEYS["alice"])
    sim = engine(gw)
    sim.hold()
    job = await submit(alice, jsonl(*(line(f"q{i}") for i in range(6))))
    await sim.wait_until(lambda e: e.active == 2)  # half of the four slots
    # the other two are free: two interactive requests start at once, cutting no line
    asked = [asyncio.create_task(alice.chat.completions.create(**ASK)) for _ in range(2)]
    await sim.wait_until(lambda e: e.active == 4)
    assert gw.gateway.batch_lines.preempted == 0
    assert gw.gateway.backends["big"].pool.queued == 0
    sim.release()
    await asyncio.gather(*asked)
    done = await ended(alice, job.id)
    assert (done.status, done.request_counts.completed) == ("completed", 6)
    assert sim.peak == 4
    await assert_idle(gw)


@pytest.mark.parametrize(("share", "slots", "lines"), [
    (1.0, 4, 4), (0.5, 4, 2), (0.5, 3, 1), (0.1, 4, 1), (0.0, 4, 0), (0.999, 3, 2)])
def test_a_share_is_whole_slots_and_at_least_one(share: float, slots: int,
                                                 lines: int) -> None:
    assert BatchConfig(max_share=share).share_of("m", slots) == lines


def test_a_share_names_a_backend(tmp_path: Path) -> None:
    raw = config(tmp_path)
    raw["batch"] = {"backend_max_share": {"nope": 0.5}}
    with pytest.raises(ValidationError, match="no backend is named 'nope'"):
        Config.model_validate(raw)


async def test_a_batch_line_never_waits_in_the_interactive_line(
        sdk: SdkClients, start: StartGateway, tmp_path: Path,
        http: aiohttp.ClientSession) -> None:
    gw: RunningGateway = await start(config(tmp_path, slots=1))
    alice = sdk(gw, api_key=KEYS["alice"])
    sim = engine(gw)
    sim.hold()
    asked = asyncio.create_task(alice.chat.completions.create(**ASK))
    await sim.wait_until(lambda e: e.active == 1)  # an interactive request holds the slot
    # a line as the runner sends it, when a slot it saw free was taken meanwhile
    headers = {"Authorization": f"Bearer {gw.gateway.keyring.batch_secret}",
               SECRET_HEADER: "alice", "x-slotgate-priority": "sheddable"}
    async with http.post(gw.url + "/v1/chat/completions", json=ASK,
                         headers=headers) as resp:
        assert resp.status == 429 and "Retry-After" in resp.headers
    assert gw.gateway.backends["big"].pool.queued == 0
    sim.release()
    await asked
    await assert_idle(gw)


async def test_slots_batch_lines_hold_are_free_to_the_scheduler(
        sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    """A route that sends simple prompts to a small model only when the primary is
    saturated: batch lines holding every primary slot do not saturate it, so a simple
    prompt takes one of their slots back instead of moving."""
    raw = config(tmp_path, slots=1)
    raw["backends"]["small"] = sim_backend("small", slots=2, queue_limit=4)
    raw["routes"]["chat"] |= {"fallbacks": ["small"], "overflow": "fallback",
                              "fallback": {"when": "saturated", "min_confidence": 0.0}}
    gw: RunningGateway = await start(raw)
    alice = sdk(gw, api_key=KEYS["alice"])
    sim = engine(gw)
    sim.hold()
    job = await submit(alice, jsonl(*(line(f"q{i}") for i in range(2))))
    await sim.wait_until(lambda e: e.active == 1)  # a line holds the only primary slot
    asked: asyncio.Task[Any] = asyncio.ensure_future(
        alice.chat.completions.with_raw_response.create(**ASK))
    await sim.wait_until(lambda e: e.stats()["aborted"] == 1 and e.active == 1)
    sim.release()
    answer = await asked
    assert answer.headers["x-slotgate-backend"] == "big"
    assert gw.gateway.batch_lines.preempted == 1
    assert engine(gw, "small").stats()["requests"] == 0
    assert (await ended(alice, job.id)).request_counts.completed == 2
    await assert_idle(gw)


async def test_a_backend_with_no_line_still_takes_a_batch_lines_slot_back(
        sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    raw = config(tmp_path, slots=1)
    raw["backends"]["big"]["queue_limit"] = 0  # no line: refused when no slot is free
    gw: RunningGateway = await start(raw)
    alice = sdk(gw, api_key=KEYS["alice"])
    sim = engine(gw)
    sim.hold()
    job = await submit(alice, jsonl(*(line(f"q{i}") for i in range(2))))
    await sim.wait_until(lambda e: e.active == 1)
    asked = asyncio.create_task(alice.chat.completions.create(**ASK))
    await sim.wait_until(lambda e: e.stats()["aborted"] == 1 and e.active == 1)
    assert gw.gateway.backends["big"].pool.queued == 0  # it holds the slot given back
    sim.release()
    assert (await asked).choices[0].message.content
    assert (await ended(alice, job.id)).request_counts.completed == 2
    await assert_idle(gw)


async def test_batch_lines_teach_the_wait_forecasts_nothing(
        sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    """A batch line is cut whenever an interactive request would wait, so no interactive
    request ever waits for one: its hold (short, cut, or a judge's one word) is not a
    sample of how long a slot is held."""
    raw = config(tmp_path)
    raw["backends"]["big"]["initial_hold_s"] = 7.0
    gw: RunningGateway = await start(raw)
    alice = sdk(gw, api_key=KEYS["alice"])
    clock = gw.gateway.backends["big"].clock
    job = await submit(alice, jsonl(*(line(f"q{i}") for i in range(3))))
    assert (await ended(alice, job.id)).request_counts.completed == 3
    assert clock.holds.mean_s == 7.0  # as configured: nothing learned
    await alice.chat.completions.create(**ASK)
    assert clock.holds.mean_s < 7.0  # an interactive request's hold is learned
    await assert_idle(gw)
