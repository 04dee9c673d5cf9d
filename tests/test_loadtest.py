"""`slotgate loadtest` against real gateways over fast simulated engines.

Counts are exact because the arrival schedule is seeded: however slow the machine, every
arrival scheduled before the end is sent. Nothing here sleeps or measures speed.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import itertools
import math
import random
import re
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from policies.config import SimulatedSpec
from router.config import config_from_dict, load_config
from router.tools.loadtest import capacity, default_route, loadtest_main, mean_output_tokens
from router.tools.workload import (
    Caller,
    LoadPlan,
    Outcome,
    Stats,
    arrival_times,
    load_prompts,
    run_load,
)
from router.upstream.simulated.app import create_sim_app
from router.upstream.simulated.engine import SimEngine
from tests.support import StartGateway, assert_idle, engine, gateway_config, serve_app, sim_backend

PROMPTS = load_prompts()


def scheduled(rate: float, seconds: float, seed: int) -> int:
    """How many arrivals the seeded schedule puts before the end."""
    times = arrival_times(rate, random.Random(seed))
    return sum(1 for _ in itertools.takewhile(lambda t: t < seconds, times))


def settled(stats: Stats) -> int:
    """Every request sent has exactly one outcome once run_load returns."""
    assert stats.in_flight == 0
    return sum(stats.outcomes.values())


def test_arrivals_are_poisson_at_absolute_times() -> None:
    rate, n = 4.0, 20_000
    times = list(itertools.islice(arrival_times(rate, random.Random(7)), n))
    draws = random.Random(7)
    # Each time is an offset from the start: the running sum of the exponential gaps.
    assert times == list(itertools.accumulate(draws.expovariate(rate) for _ in range(n)))
    gaps = [b - a for a, b in itertools.pairwise([0.0, *times])]
    mean = sum(gaps) / n
    assert mean == pytest.approx(1 / rate, rel=0.03)
    spread = math.sqrt(sum((g - mean) ** 2 for g in gaps) / n)
    assert spread == pytest.approx(mean, rel=0.05)  # exponential: the sd equals the mean
    assert all(g > 0 for g in gaps)


def test_capacity_of_the_embedded_primary() -> None:
    config = load_config(None)
    big = config.backends["llama-70b"]
    # 3 slots / (0.4 s TTFT + 120 tokens at 30 tokens/s)
    assert capacity(big) == pytest.approx(3 / (0.4 + 120 / 30))
    # Lengths are uniform on 60..180: max_tokens 60 cuts every one to 60.
    assert capacity(big, max_tokens=60) == pytest.approx(3 / (0.4 + 60 / 30))
    # Cut at 120: half run 60..120 (mean 90), half are cut to 120 -> mean 105.
    assert mean_output_tokens(big.simulated or SimulatedSpec(), 120) == pytest.approx(105)
    assert capacity(big, max_tokens=120) == pytest.approx(3 / (0.4 + 105 / 30))
    assert capacity(big, max_tokens=1000) == capacity(big)


def test_capacity_counts_usable_slots_batch_slowdown_and_real_backends() -> None:
    sim = {"max_num_seqs": 4, "ttft_s": 0.5, "tokens_per_s": 10, "output_tokens": 20,
           "batch_slowdown": 0.1}
    raw = gateway_config(sim_backend("m", slots=8, sim=sim),
                         {"url": "http://127.0.0.1:9/v1", "model": "r", "slots": 2})
    config = config_from_dict(raw)
    # min(8 gateway slots, 4 engine sequences); decode 30% slower with 4 in the batch.
    assert capacity(config.backends["big"]) == pytest.approx(4 / (0.5 + 20 * 1.3 / 10))
    assert capacity(config.backends["small"]) is None
    instant = config_from_dict(gateway_config(sim_backend("m", slots=2)))
    assert capacity(instant.backends["big"]) == math.inf


def test_default_route_is_the_first_that_can_fall_back() -> None:
    assert default_route(load_config(None)) == "llama-70b"
    raw = gateway_config(sim_backend("a", 1), sim_backend("b", 1))
    raw["routes"] = {"plain": {"primary": "small"}, **raw["routes"]}
    assert default_route(config_from_dict(raw)) == "chat"
    assert default_route(config_from_dict(gateway_config(sim_backend("a", 1)))) == "chat"


async def test_every_scheduled_request_is_sent_and_answered(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("big-70b", slots=4, queue_limit=100)))
    plan = LoadPlan("chat", rate=40, seconds=2, prompts=PROMPTS, seed=1)
    stats = await run_load(gw.url, plan)
    assert stats.sent == scheduled(40, 2, seed=1) > 40
    assert settled(stats) == stats.sent == stats[Outcome.OK]
    assert len(stats.latencies) == stats.sent and stats.skipped == 0
    records = list(engine(gw).records.values())
    assert len(records) == stats.sent and all(r.completed for r in records)
    assert sum(r.stream for r in records) == stats.streams
    assert 0 < stats.streams < stats.sent
    assert len(gw.gateway.recent) == stats.sent
    assert {r.status for r in gw.gateway.recent} == {200}
    await assert_idle(gw)


def abort_when(left: int) -> tuple[Callable[[Stats], None], asyncio.Event]:
    """A progress callback that ends the drain once only `left` requests are in flight."""
    abort = asyncio.Event()

    def progress(stats: Stats) -> None:
        if stats.phase == "draining" and stats.in_flight <= left:
            abort.set()

    return progress, abort


@pytest.mark.parametrize(("queue", "outcome"), [
    ({"queue_limit": 0}, Outcome.REJECTED),
    ({"queue_limit": 100, "queue_timeout_s": 0.05}, Outcome.TIMED_OUT),
])
async def test_a_stuck_slot_turns_the_rest_away(start: StartGateway, queue: dict[str, Any],
                                                outcome: Outcome) -> None:
    gw = await start(gateway_config(sim_backend("big-70b", slots=1, **queue)))
    engine(gw).hold()  # the first request takes the only slot and never finishes
    progress, abort = abort_when(1)
    plan = LoadPlan("chat", rate=20, seconds=1, prompts=PROMPTS, seed=2, drain_s=60)
    stats = await run_load(gw.url, plan, progress, abort=abort)
    assert stats.sent == scheduled(20, 1, seed=2) > 2
    assert settled(stats) == stats.sent
    assert stats[Outcome.CANCELLED] == 1  # still held when the drain was ended
    assert stats[outcome] == stats.sent - 1
    assert stats.streams > 0  # streams hear a queue timeout in-band, after their 200
    assert stats.phase == "done" and not stats.interrupted
    engine(gw).release()
    await assert_idle(gw)


async def test_stop_ends_the_arrivals(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("big-70b", slots=4, queue_limit=100)))
    stop = asyncio.Event()

    def progress(stats: Stats) -> None:
        if stats.sent >= 5:
            stop.set()

    plan = LoadPlan("chat", rate=50, seconds=600, prompts=PROMPTS)
    stats = await run_load(gw.url, plan, progress, stop=stop)
    assert stats.interrupted and 5 <= stats.sent < scheduled(50, 600, seed=0)
    assert settled(stats) == stats.sent
    await assert_idle(gw)


@pytest.fixture
async def recording_engine() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A simulated engine behind a real URL that keeps every request body it is sent."""
    bodies: list[dict[str, Any]] = []
    app = create_sim_app(SimEngine(SimulatedSpec(ttft_s=0, tokens_per_s=0, output_tokens=4),
                                   "recorded"))

    @web.middleware
    async def keep(request: web.Request,
                   handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                   ) -> web.StreamResponse:
        bodies.append(orjson.loads(await request.read()))
        return await handler(request)

    app.middlewares.append(keep)
    runner, url = await serve_app(app)
    yield url + "/v1", bodies
    await runner.cleanup()


async def test_users_streams_and_max_tokens_reach_the_engine(
        start: StartGateway, recording_engine: tuple[str, list[dict[str, Any]]]) -> None:
    url, bodies = recording_engine
    gw = await start(gateway_config({"url": url, "model": "recorded", "slots": 4,
                                     "queue_limit": 100}))
    plan = LoadPlan("chat", rate=50, seconds=2, prompts=PROMPTS, users=7, stream_share=0.3,
                    max_tokens=5, seed=3)
    stats = await run_load(gw.url, plan)
    assert settled(stats) == stats[Outcome.OK] == stats.sent == len(bodies)
    users = {body["user"] for body in bodies}
    assert users == stats.users and 1 < len(users) <= 7
    assert users <= {f"loadtest-user-{i:04d}" for i in range(7)}
    streams = [body for body in bodies if body.get("stream")]
    assert len(streams) == stats.streams
    assert all(body["stream_options"]["include_usage"] for body in streams)
    assert len(streams) / len(bodies) == pytest.approx(0.3, abs=0.15)
    assert all(body["max_tokens"] == 5 for body in bodies)
    assert all(body["messages"][0]["content"] in PROMPTS for body in bodies)
    await assert_idle(gw)


async def test_callers_send_their_keys_and_classes_in_their_shares(start: StartGateway) -> None:
    """Each request comes from one caller, drawn by share: its key (the key's class) and
    the class it asks for."""
    raw = gateway_config(sim_backend("big-70b", slots=4, queue_limit=100))
    raw["auth"] = {"enabled": True, "keys": [
        {"id": "pager", "tenant": "ops", "priority": "critical",
         "sha256": hashlib.sha256(b"sk-pager").hexdigest()},
        {"id": "app", "tenant": "web", "sha256": hashlib.sha256(b"sk-app").hexdigest()}]}
    gw = await start(raw)
    callers = (Caller(1, "sk-pager"), Caller(2, "sk-app"), Caller(1, "sk-app", "sheddable"))
    plan = LoadPlan("chat", rate=60, seconds=2, prompts=PROMPTS, seed=5, callers=callers)
    stats = await run_load(gw.url, plan)
    assert settled(stats) == stats[Outcome.OK] == stats.sent > 60
    seen = collections.Counter((r.key_id, r.priority) for r in gw.gateway.recent)
    assert set(seen) == {("pager", "critical"), ("app", "standard"), ("app", "sheddable")}
    assert seen[("app", "standard")] / stats.sent == pytest.approx(0.5, abs=0.2)
    await assert_idle(gw)


SMALL_CONFIG = """
backends:
  big:
    simulated: {max_num_seqs: 2, ttft_s: 0.02, tokens_per_s: 0, output_tokens: 4}
    model: big-model
    slots: 2
    queue_limit: 4
  small:
    simulated: {max_num_seqs: 4, ttft_s: 0, tokens_per_s: 0, output_tokens: 4}
    model: small-model
    slots: 4
    queue_limit: 8
routes:
  chat:
    primary: big
    fallbacks: [small]
    overflow: fallback
"""


def test_the_command_fills_the_ledger_of_both_arms(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, ledger = tmp_path / "small.yaml", tmp_path / "ledger.sqlite3"
    config.write_text(SMALL_CONFIG, encoding="utf-8")
    # 2 slots / 0.02 s = 100 requests/s; a fifth of that for 2 s.
    argv = ["--config", str(config), "--seconds", "2", "--load", "0.2", "--ledger", str(ledger)]
    assert loadtest_main(argv) == 0
    out, err = capsys.readouterr()
    assert "big: capacity 100.00 requests/s; 0.2x load = 20.00 requests/s" in err
    sent = re.search(r"Sent (\d+) requests to chat", out)
    assert sent is not None, out
    assert int(sent[1]) == scheduled(20, 2, seed=0)
    with sqlite3.connect(ledger) as db:
        rows = db.execute("select count(*) from requests").fetchone()[0]
        arms = {arm for (arm,) in db.execute(
            "select distinct arm from requests where experiment = 'fallback-ab'")}
    assert rows == int(sent[1])
    assert arms == {"off", "on"}


def test_bad_usage() -> None:
    with pytest.raises(SystemExit) as exc:
        loadtest_main(["--url", "http://127.0.0.1:9"])  # --url needs --rate
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        loadtest_main(["--stream-share", "2"])
    assert exc.value.code == 2
