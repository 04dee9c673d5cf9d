"""`slotgate demo` against real gateways: what a client sees of slots, queues, 429s and overflow.

The simulated engine is slow enough (TTFT 0.2 s) that every request is admitted, queued
or rejected before the first one finishes; the test itself never sleeps.
"""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
from pathlib import Path

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
