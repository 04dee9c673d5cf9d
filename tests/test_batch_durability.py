"""Batch jobs survive their gateway, and several gateways drain one job: `slotgate serve`
processes in front of a simulated engine in this process, SIGKILLed mid-batch; SQLite for
one gateway and its restart, a real PostgreSQL and redis-server for several. Every line
is answered exactly once in the output, in the input's order."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import yaml

from router.upstream.simulated.app import RunningSim
from tests.support import GatewayProcess, RedisServer
from tests.support.batch_jobs import ended, jsonl, line, submit


def write_config(folder: Path, sim: RunningSim, ledger: dict[str, Any], slots: int = 2,
                 redis_url: str | None = None) -> Path:
    raw: dict[str, Any] = {
        "backends": {"big": {"url": sim.url + "/v1", "model": "m", "slots": slots,
                             "queue_limit": 8, "queue_timeout_s": 60}},
        "routes": {"chat": {"primary": "big", "overflow": "reject"}},
        "ledger": {**ledger, "flush_interval_s": 0.05},
        "batch": {"line_lease_s": 1.0, "poll_s": 0.1, "files_dir": str(folder / "files")},
        "logging": {"access": False},
    }
    if redis_url is not None:
        # a killed gateway's shared slots lapse within 3 s
        raw["coordination"] = {"mode": "redis", "url": redis_url, "lease_ttl_s": 3.0,
                               "recheck_s": 0.5}
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


async def answered_once(client: openai.AsyncOpenAI, batch_id: str, count: int) -> None:
    """The job completed with every line answered once, in the input's order."""
    done = await ended(client, batch_id, within_s=60)
    assert (done.status, done.request_counts.completed, done.request_counts.failed) == (
        "completed", count, 0)
    output = (await client.files.content(done.output_file_id)).read().splitlines()
    ids = [orjson.loads(x)["custom_id"] for x in output]
    assert ids == [f"q{i}" for i in range(count)]


async def test_a_gateway_killed_mid_batch_resumes_it_at_restart(
        tmp_path: Path, engine_sim: RunningSim) -> None:
    sim = engine_sim.engine
    sim.hold()  # the first lines run until the gateway dies
    config = write_config(tmp_path, engine_sim, {"path": str(tmp_path / "ledger.sqlite3")})
    first = await GatewayProcess.start(config)
    job = await submit(first.client(), jsonl(*(line(f"q{i}") for i in range(8))))
    await sim.wait_until(lambda e: e.active == 2)  # two lines hold both slots
    assert await first.stop(signal.SIGKILL) == -signal.SIGKILL
    await sim.wait_until(lambda e: e.active == 0)  # their connections closed: aborted
    sim.release()
    second = await GatewayProcess.start(config)
    try:
        await answered_once(second.client(), job.id, 8)
    finally:
        assert await second.stop() == 0


async def test_two_gateways_drain_one_job_on_postgresql_and_redis(
        tmp_path: Path, engine_sim: RunningSim, redis_server: RedisServer,
        postgres_url: str) -> None:
    sim = engine_sim.engine
    sim.hold()
    config = write_config(tmp_path, engine_sim, {"url": postgres_url}, slots=4,
                          redis_url=redis_server.url)
    doomed, survivor = await GatewayProcess.start(config), await GatewayProcess.start(config)
    try:
        job = await submit(doomed.client(), jsonl(*(line(f"q{i}") for i in range(30))))
        await sim.wait_until(lambda e: e.active == 4)  # the shared slots, all batch lines
        assert await doomed.stop(signal.SIGKILL) == -signal.SIGKILL
        sim.release()  # the survivor's lines end; the killed one's run again
        await answered_once(survivor.client(), job.id, 30)
        assert sim.peak <= 4  # never more than the shared slots, across both processes
    finally:
        assert await survivor.stop() == 0


async def test_two_live_gateways_never_run_a_line_twice(
        tmp_path: Path, engine_sim: RunningSim, redis_server: RedisServer,
        postgres_url: str) -> None:
    sim = engine_sim.engine
    config = write_config(tmp_path, engine_sim, {"url": postgres_url}, slots=3,
                          redis_url=redis_server.url)
    gateways = [await GatewayProcess.start(config) for _ in range(2)]
    try:
        job = await submit(gateways[0].client(), jsonl(*(line(f"q{i}") for i in range(40))))
        await answered_once(gateways[1].client(), job.id, 40)
        assert sim.peak <= 3
        assert len(sim.records) == 40 and not any(r.aborted for r in sim.records.values())
        ran = [await lines_run(g) for g in gateways]
        assert sum(done for done, _ in ran) == 40 and all(s == 0 for _, s in ran), ran
    finally:
        assert [await g.stop() for g in gateways] == [0, 0]


async def lines_run(gateway: GatewayProcess) -> tuple[int, int]:
    """(lines answered, answers superseded by another gateway's) from its /metrics."""
    async with aiohttp.ClientSession() as http, http.get(gateway.url + "/metrics") as resp:
        body = await resp.text()

    def total(outcome: str) -> int:
        return int(sum(float(x.rsplit(" ", 1)[1]) for x in body.splitlines()
                       if x.startswith("slotgate_batch_lines_total{")
                       and f'outcome="{outcome}"' in x))
    return total("done"), total("superseded")
