"""`slotgate demo` against real gateways: what a client sees of slots, queues, 429s and overflow.

The simulated engine is slow enough (TTFT 0.2 s) that every request is admitted, queued
or rejected before the first one finishes; the test itself never sleeps.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import subprocess
import sys
from pathlib import Path

from router.tools import demo_batch
from router.tools.batch_bursts import BatchPlan, Sample, run_batch_demo
from router.tools.demo import State, demo_main, plan_demo, run_demo, summary_lines
from tests.support import StartGateway, assert_idle, gateway_config, sim_backend

SLOW = {"ttft_s": 0.2, "tokens_per_s": 200, "output_tokens": 20}


async def test_full_queue_rejects_with_429(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("big-70b", slots=2, queue_limit=2, sim=SLOW)))
    demo = await run_demo(gw.url, plan_demo("chat", 6, seed=1), max_tokens=20)
    rows = demo.rows
    assert demo.peak == {"big": 2}
    queued = [r for r in rows if r.queued]
    assert sorted(r.positions[0] for r in queued) == [1, 2]
    assert all(r.state is State.DONE and r.backend == "big" and r.queue_wait_ms for r in queued)
    rejected = [r for r in rows if r.state is State.REJECTED]
    assert len(rejected) == 2
    for r in rejected:
        assert r.status == 429 and r.error == "queue_full"
        assert r.retry_after is not None and int(r.retry_after) >= 1
    done = [r for r in rows if r.state is State.DONE]
    assert len(done) == 4
    assert all(r.tokens == 20 and r.ttft_s is not None for r in done)
    assert {r.request_id for r in rows} == {f"demo-{i}" for i in range(1, 7)}
    assert {r.kind for r in rows} == {"simple", "hard"}
    assert demo.count(State.ERROR) == 0
    explained = summary_lines(demo)[-1]
    assert explained.startswith("2 slots on big, 2 waited in its queue, 2 turned away with 429")
    await assert_idle(gw)


async def test_overflow_runs_on_the_fallback(start: StartGateway) -> None:
    gw = await start(gateway_config(
        sim_backend("big-70b", slots=2, queue_limit=2, sim=SLOW),
        sim_backend("small-8b", slots=2, queue_limit=0, sim=SLOW),
        overflow="fallback",
    ))
    demo = await run_demo(gw.url, plan_demo("chat", 6, seed=2), max_tokens=20)
    rows = demo.rows
    assert demo.count(State.REJECTED) == 0 and demo.count(State.DONE) == 6
    assert demo.peak == {"big": 2, "small": 2}
    overflowed = [r for r in rows if r.reason == "fallback:overflow"]
    assert len(overflowed) == 2
    assert all(r.backend == "small" and not r.queued for r in overflowed)
    queued = [r for r in rows if r.queued]
    assert sorted(r.positions[0] for r in queued) == [1, 2]
    assert all(r.backend == "big" for r in queued)
    explained = "2 slots on big, 2 waited in its queue, 2 overflowed to small."
    assert summary_lines(demo)[-1] == explained
    await assert_idle(gw)


async def test_demo_main_prints_the_summary(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("big-70b", slots=1, queue_limit=1, sim=SLOW)))
    out = io.StringIO()
    argv = ["--url", gw.url, "--model", "chat", "--requests", "3", "--max-tokens", "5",
            "--no-live", "--seed", "3"]
    assert await asyncio.to_thread(demo_main, argv, out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "3 streaming requests to chat: 2 done, 1 queued, 1 rejected (429), 0 errors"
    assert lines[1] == "most running at once: big 1"
    assert lines[-1].startswith("1 slot on big, 1 waited in its queue, 1 turned away with 429")
    await assert_idle(gw)


def test_the_real_command_on_the_embedded_config(tmp_path: Path) -> None:
    slotgate = str(Path(sys.executable).parent / "slotgate")
    done = subprocess.run(
        [slotgate, "demo", "--no-live", "--requests", "4", "--max-tokens", "5"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "4 streaming requests to llama-70b: 4 done" in done.stdout
    # The fourth finds the 3 slots busy: it waits, or leaves for the 8B if it is simple.
    assert ("slots on llama-70b, 1 waited in its queue" in done.stdout
            or "1 simple request went to llama-8b instead of waiting" in done.stdout), done.stdout
    assert "\x1b[" not in done.stdout


# A batch line (60 tokens) lasts longer than the demo's look at /metrics (every 0.25 s), so
# the first burst, sent once the batch holds every slot, finds batch lines there to cut.
LINES = {"ttft_s": 0.05, "tokens_per_s": 100, "output_tokens": 100}


async def test_the_batch_demo_fills_the_gaps_and_gives_slots_back(
        start: StartGateway, tmp_path: Path) -> None:
    raw = gateway_config(sim_backend("big-70b", slots=2, queue_limit=4, sim=LINES))
    raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite3"), "flush_interval_s": 0.05}
    gw = await start(raw)
    plan = BatchPlan("chat", lines=30, seconds=3.0, every_s=2.0, burst=4, max_tokens=5,
                     line_tokens=60)
    seconds: list[Sample] = []
    result = await run_batch_demo(gw.url, plan, lambda sample, _: seconds.append(sample))
    assert result.primary == "big" and result.bursts
    rows = result.rows()
    assert len(rows) == 4 * len(result.bursts)
    assert all(r.state is State.DONE and r.backend == "big" and r.ttft_s for r in rows)
    done = result.job["request_counts"]["completed"]
    assert 0 < done < 30 and result.job["status"] == "in_progress"  # cancelled at the end
    preempted = result.samples[-1].preempted
    assert preempted >= 2  # the first burst's 4 find both slots held by batch lines
    assert all(s.capacity == 2 and s.active <= 2 for s in result.samples)
    assert seconds[0].batch == 2  # told a second from the moment the batch held every slot
    assert all(int(b.at) > int(a.at) for a, b in itertools.pairwise(seconds))
    lines = demo_batch.summary_lines(result)
    assert lines[0] == f"batch of 30 lines on big: {done} done, 0 failed, {30 - done} left " \
                       "when the demo stopped (cancelled)"
    assert lines[1].startswith(f"interactive: {len(rows)} requests in {len(result.bursts)} "
                               f"bursts of 4, {len(rows)} answered ({len(rows)} on big), "
                               "TTFT p50 ")
    assert lines[2] == f"preemptions: {preempted} batch lines gave their slot to an " \
                       "interactive request and ran again later"
    assert lines[3].startswith("big's slot-seconds: ")
    await assert_idle(gw)  # (the lines the cancel left running finish)


def test_the_real_batch_command_on_the_embedded_config(tmp_path: Path) -> None:
    slotgate = str(Path(sys.executable).parent / "slotgate")
    root = str(Path(__file__).resolve().parent.parent)  # this tree's code, not an install's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [slotgate, "demo", "--batch", "--lines", "40", "--seconds", "4", "--every", "3",
         "--max-tokens", "10"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path, env=env,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0].split()[:3] == ["t", "llama-70b", "slots"] and out[1].endswith("0/0")
    assert "[BBB]" in out[1]  # the timeline starts once the batch holds the 3 slots
    assert "interactive: 12 requests in 2 bursts of 6, 12 answered (" in done.stdout
    assert "batch of 40 lines on llama-70b: " in done.stdout
    assert "preemptions: 0 " not in done.stdout and "\x1b[" not in done.stdout
    assert list(tmp_path.iterdir()) == []  # the ledger and files were in a temporary folder
