"""The batch series on /metrics: every configured backend's and every job status's at 0
from the start, then the lines waiting per backend and the jobs by status as the runner
reads them while a job runs and once it has ended."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

from router.app import RunningGateway
from router.batch.metrics import OUTCOMES, STATUSES
from tests.support import SdkClients, StartGateway, assert_idle, engine, gateway_config, sim_backend
from tests.support.batch_jobs import ended, jsonl, line, submit
from tests.support.scrape import Samples, scrape, value

KEY = "sk-alice-0123456789"


def config(tmp_path: Path) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=1, queue_limit=4), sim_backend("s", slots=1))
    raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite3"), "flush_interval_s": 0.05}
    raw["batch"] = {"files_dir": str(tmp_path / "files")}
    raw["auth"] = {"enabled": True, "public": ["metrics"], "keys": [
        {"id": "alice", "tenant": "alice", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}]}
    return raw


async def scraped_until(gw: RunningGateway, wanted: dict[tuple[str, str, str], float],
                        within_s: float = 10) -> Samples:
    """/metrics once every (series, label, value) of `wanted` reads its figure (the runner
    reads the database in its own turns: polled, as Prometheus would see it)."""
    async with asyncio.timeout(within_s):
        while True:
            samples = await scrape(gw)
            if all(value(samples, name, **{label: of}) == figure
                   for (name, label, of), figure in wanted.items()):
                return samples
            await asyncio.sleep(0.02)


async def test_every_batch_series_reads_zero_from_the_start(start: StartGateway,
                                                            tmp_path: Path) -> None:
    gw = await start(config(tmp_path))
    samples = await scrape(gw)
    expected: set[tuple[str, tuple[tuple[str, str], ...]]] = {
        ("slotgate_batch_jobs", (("status", status),)) for status in STATUSES}
    for backend in ("big", "small"):
        label = (("backend", backend),)
        expected |= {("slotgate_batch_lines_total", (("backend", backend), ("outcome", o)))
                     for o in OUTCOMES}
        expected |= {(name, label) for name in (
            "slotgate_batch_preemptions_total", "slotgate_batch_lines_running",
            "slotgate_batch_lines_waiting")}
    batch = {k: v for k, v in samples.items() if k[0].startswith("slotgate_batch_")}
    assert batch == dict.fromkeys(expected, 0.0)


async def test_lines_waiting_and_jobs_by_status(sdk: SdkClients, start: StartGateway,
                                                tmp_path: Path) -> None:
    gw = await start(config(tmp_path))
    alice = sdk(gw, api_key=KEY)
    sim = engine(gw)
    sim.hold()
    job = await submit(alice, jsonl(*(line(f"q{i}") for i in range(3))))
    await sim.wait_until(lambda e: e.active == 1)  # the first line holds the only slot
    samples = await scraped_until(gw, {
        ("slotgate_batch_lines_waiting", "backend", "big"): 2,
        ("slotgate_batch_jobs", "status", "in_progress"): 1})
    assert value(samples, "slotgate_batch_lines_running", backend="big") == 1
    assert value(samples, "slotgate_batch_lines_waiting", backend="small") == 0
    cancelled = await submit(alice, jsonl(line("c0")))
    await alice.batches.cancel(cancelled.id)
    sim.release()
    assert (await ended(alice, job.id)).status == "completed"
    assert (await ended(alice, cancelled.id)).status == "cancelled"
    samples = await scraped_until(gw, {
        ("slotgate_batch_lines_waiting", "backend", "big"): 0,
        ("slotgate_batch_jobs", "status", "completed"): 1,
        ("slotgate_batch_jobs", "status", "cancelled"): 1,
        ("slotgate_batch_jobs", "status", "in_progress"): 0})
    assert value(samples, "slotgate_batch_lines_total", backend="big", outcome="done") == 3
    await assert_idle(gw)
