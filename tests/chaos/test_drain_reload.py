"""Deploys under load: SIGTERM while long streams run, and 20 config reloads (times the scale).

SIGTERM: a `slotgate serve` process under a steady mix of long streams and whole answers
is sent SIGTERM once several streams are mid-answer and others wait in the queue. Every
stream that had begun (or began later) finishes with its finish_reason: zero running
requests cut. Queued ones get 503 `draining` (in-band for a stream that already had its
200) or are served, newcomers get 503 with Retry-After until the listener closes and
then a refused connection; the process exits 0 with one ledger row per request it
answered.

Reload: an in-process gateway under a steady mix of streams and whole answers has its
config file rewritten and reloaded 20 times (times the scale): slots, queue limits and
the route's fallbacks change under the load. No request fails, every answer is complete,
and afterwards no slot is held and no ticket queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import yaml
from openai import AsyncOpenAI

from policies.config import SimulatedSpec
from router.app import RunningGateway, start_gateway
from router.config import load_config
from router.reload import reload_file
from router.upstream.simulated.app import start_simulator
from tests.support import MESSAGES, Changes, GatewayProcess, SdkClients, assert_idle, sim_backend

SEED = 20240612
STREAM_SHARE = 0.75  # of the requests; the rest ask for a whole answer


class Tally(Changes):
    """What the clients saw, and a way to wait (without polling) until it says something."""


# --- SIGTERM during steady load with long streams -------------------------------------------


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


# --- 20 reloads during steady load ----------------------------------------------------------

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
        big, small = (gw.gateway.simulators[name].engine for name in ("big", "small"))
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
