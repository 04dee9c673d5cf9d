"""Deploys under load: SIGTERM while long streams run.

A `slotgate serve` process under a steady mix of long streams and whole answers is sent
SIGTERM once several streams are mid-answer and others wait in the queue. Every stream
that had begun (or began later) finishes with its finish_reason: zero running requests
cut. Queued ones get 503 `draining` (in-band for a stream that already had its 200) or
are served, newcomers get 503 with Retry-After until the listener closes and then a
refused connection; the process exits 0 with one ledger row per request it answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import openai
import yaml
from openai import AsyncOpenAI

from policies.config import SimulatedSpec
from router.upstream.simulated.app import start_simulator
from tests.support import (
    MESSAGES,
    Changes,
    GatewayProcess,
)

SEED = 20240612
STREAM_SHARE = 0.75  # of the requests; the rest ask for a whole answer


class Tally(Changes):
    """What the clients saw, and a way to wait (without polling) until it says something."""


@dataclass
class Call:
    """One request as its client saw it."""

    rid: str
    stream: bool
    opened: bool = False  # a stream's 200 and headers arrived
    tokens: int = 0  # content tokens received
    finish_reason: str | None = None
    outcome: str = ""  # served | draining | refused | cut | dropped | other ...; "" while running
    retry_after: str | None = None  # of an HTTP 503
    in_band: bool = False  # a stream's 503 came as an error event after its 200

    @property
    def running(self) -> bool:
        return not self.outcome and self.tokens > 0


async def call_gateway(client: AsyncOpenAI, call: Call, tally: Tally) -> None:
    headers = {"X-Request-Id": call.rid}
    try:
        if call.stream:
            response = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True, extra_headers=headers)
            call.opened = True
            tally.changed()
            async with response as chunks:
                async for chunk in chunks:
                    if not chunk.choices:
                        continue
                    choice = chunk.choices[0]
                    if choice.delta.content:
                        call.tokens += 1
                        if call.tokens == 1:
                            tally.changed()
                    call.finish_reason = choice.finish_reason or call.finish_reason
            call.outcome = "served" if call.finish_reason else "cut"  # ended without one
        else:
            reply = await client.chat.completions.create(model="chat", messages=MESSAGES,
                                                         extra_headers=headers)
            call.finish_reason = reply.choices[0].finish_reason
            call.tokens = reply.usage.completion_tokens if reply.usage else 0
            call.outcome = "served"
    except openai.APIStatusError as exc:
        code = exc.body.get("code") if isinstance(exc.body, dict) else None
        call.retry_after = exc.response.headers.get("Retry-After")
        call.outcome = ("draining" if (exc.status_code, code) == (503, "draining")
                        else f"http {exc.status_code} {code}")
    except openai.APIConnectionError:
        # Nothing arrived: the listener is closed (or closing). After a 200: a cut.
        call.outcome = "cut" if call.tokens else "dropped" if call.opened else "refused"
    except openai.APIError as exc:  # an error event inside a stream that had its 200
        code = exc.body.get("code") if isinstance(exc.body, dict) else None
        call.in_band = True
        call.outcome = "cut" if call.tokens else "draining" if code == "draining" else (
            f"event {code}")
    tally.changed()


def drain_config(folder: Path, sim_url: str, slots: int, clients: int) -> Path:
    raw = {
        "server": {"shutdown_timeout_s": 120},  # far beyond the longest stream
        "backends": {"big": {"url": sim_url + "/v1", "model": "m", "slots": slots,
                             "queue_limit": clients, "queue_timeout_s": 120}},
        "routes": {"chat": {"primary": "big", "overflow": "reject"}},
        "ledger": {"path": "ledger.sqlite3"},
        "logging": {"access": False},
    }
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def ledger_rows(path: Path) -> dict[str, tuple[int, str | None, str | None, float]]:
    """request id -> (status, error, disconnect, queue_wait_ms); ids are unique per request."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT request_id, status, error, disconnect, queue_wait_ms "
                          "FROM requests").fetchall()
    per_id = Counter(rid for rid, *_ in rows)
    assert max(per_id.values(), default=1) == 1, per_id.most_common(3)  # one row per request
    return {rid: (status, error, disconnect, wait) for rid, status, error, disconnect, wait
            in rows}


async def test_sigterm_under_load_cuts_no_running_stream(tmp_path: Path, scale: int) -> None:
    slots = 4 * scale
    clients = 3 * slots  # about two slots' worth always waiting in the queue
    output_tokens = 30 * min(scale, 4)  # 0.5 s per stream on average; 2 s at full size
    # Lengths vary (+/- half), so answers end at scattered moments, not in waves.
    spec = SimulatedSpec(max_num_seqs=slots, ttft_s=0.005, tokens_per_s=60,
                         output_tokens=output_tokens, output_tokens_spread=0.5, seed=SEED)
    sim = await start_simulator(spec, "m")
    gateway = await GatewayProcess.start(drain_config(tmp_path, sim.url, slots, clients))
    client = AsyncOpenAI(base_url=gateway.url + "/v1", api_key="sk-test", max_retries=0,
                         timeout=30.0 * scale)
    rng = random.Random(SEED)
    calls: list[Call] = []
    tally = Tally()
    exited = asyncio.Event()

    async def one_client(index: int, seed: int) -> None:
        own = random.Random(seed)
        for n in range(10_000):
            call = Call(f"drain-{index}-{n}", stream=own.random() < STREAM_SHARE)
            calls.append(call)
            await call_gateway(client, call, tally)
            if call.outcome not in ("served", "draining"):
                return  # refused (the gateway is gone) or a failure the test reports
            if call.outcome == "draining":  # as a client does: retry after Retry-After
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(float(call.retry_after or 1)):
                        await exited.wait()

    began = time.monotonic()
    workers = [asyncio.create_task(one_client(i, rng.getrandbits(32))) for i in range(clients)]
    try:
        async with asyncio.timeout(60 * scale):
            # Steady load: every client has been answered about once, several streams are
            # mid-answer and at least one more stream has its 200 but no token (in the queue).
            await tally.wait_until(
                lambda: (sum(c.outcome == "served" for c in calls) >= clients
                         and sum(c.running for c in calls) >= max(3, slots // 2)
                         and any(c.opened and not c.tokens and not c.outcome for c in calls)),
                within_s=30 * scale)
            running = [c for c in calls if c.running]
            waiting = [c for c in calls if c.opened and not c.tokens and not c.outcome]
            sent_before = len(calls)
            gateway.proc.send_signal(signal.SIGTERM)
            sigterm_at = time.monotonic()
            await gateway.said(b"draining")
            code = await gateway.proc.wait()
            exited.set()
            drained_s = time.monotonic() - sigterm_at
            await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await client.close()
        await gateway.stop(signal.SIGKILL)
        await sim.close()
    total_s = time.monotonic() - began
    log = b"".join(gateway.lines).decode(errors="replace")
    assert code == 0, log[-3000:]

    outcomes = Counter(c.outcome for c in calls)
    # Zero running requests cut: every stream mid-answer at SIGTERM, and every answer that
    # began at all, ran to its end with a finish_reason and every token.
    assert all(c.outcome == "served" for c in running), [c for c in running
                                                         if c.outcome != "served"]
    served = [c for c in calls if c.outcome == "served"]
    records = sim.engine.records
    whole = [c for c in served if c.finish_reason == "stop"
             and c.tokens == records[c.rid].completion_tokens > 0]
    assert len(whole) == len(served), [c for c in served if c not in whole][:5]
    assert set(outcomes) <= {"served", "draining", "refused"}, outcomes
    assert "still running after" not in log  # the gateway's own word: nothing was cut
    draining = [c for c in calls if c.outcome == "draining"]
    assert all(c.tokens == 0 for c in draining)
    # An HTTP 503 carries Retry-After; a stream that had its 200 (queued) is told in-band.
    assert all(c.in_band or (c.retry_after or "").isdigit() for c in draining), draining[:5]
    assert all(c.opened for c in draining if c.in_band)
    # Every client ends on a refused connection: the gateway closed its listener and left.
    assert outcomes["refused"] == clients

    # The engine: no generation aborted, one completed per answer served.
    assert not [r for r in records.values() if r.aborted or not r.completed]
    assert set(records) == {c.rid for c in served}

    # The ledger: one row per request the gateway answered, none for a refused connection.
    rows = ledger_rows(tmp_path / "ledger.sqlite3")
    answered = {c.rid: c for c in calls if c.outcome in ("served", "draining")}
    assert set(rows) == set(answered), (set(rows) ^ set(answered))
    for rid, (status, error, disconnect, _) in rows.items():
        expected = (200, None) if answered[rid].outcome == "served" else (503, "draining")
        assert (status, error, disconnect) == (*expected, None), (rid, status, error, disconnect)
    queued_503 = sum(error == "draining" and wait > 0 for _, error, _, wait in rows.values())
    newcomers_503 = sum(error == "draining" and wait == 0 for _, error, _, wait in rows.values())
    waiting_served = sum(c.outcome == "served" for c in waiting)
    assert running and queued_503 and newcomers_503  # the run covered all three cases

    print(f"\nSIGTERM after {sent_before} requests from {clients} clients ({slots} slots, "
          f"{output_tokens}-token streams): {len(running)} streams running at SIGTERM, "
          f"cut {outcomes['cut'] + outcomes['dropped']}; queued answered 503 {queued_503} "
          f"(of the streams waiting with their 200: {len(waiting) - waiting_served} 503, "
          f"{waiting_served} served); newcomers 503 {newcomers_503}; refused connections "
          f"{outcomes['refused']}; served {len(served)}; ledger rows {len(rows)}; "
          f"drained and exited in {drained_s:.2f} s; {total_s:.1f} s in all")
