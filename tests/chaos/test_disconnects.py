"""A thousand clients (times the scale) leave at random moments: while sending the body,
while queued, before the first byte, mid-stream, or after the end.

Afterwards no slot is held and no ticket queued, every generation the engine began either
completed or was aborted within a second of its client leaving, and the ledger holds
exactly one row per request that reached the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web

from router import dispatch
from router.common.parsed import Endpoint
from router.request.usage import CLIENT_CLOSED
from tests.support import (
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
    wait_pools,
)

REQUESTS = 1000  # times the scale
IN_FLIGHT = 20  # clients at once, against 4 slots and a queue of 48
ABORT_WITHIN_S = 1.0  # from the client leaving to the engine ending the generation
SEED = 20240611


@dataclass
class Workload:
    """What the clients did, by request id; `left_at` is time.monotonic() when one left."""

    kinds: dict[str, str] = field(default_factory=dict)
    left_at: dict[str, float] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)


def messages(rng: random.Random) -> Any:
    # 4 to 160 characters: 1 to 40 prompt tokens, so the prefill time varies too
    return [{"role": "user", "content": "x" * rng.randint(4, 160)}]


async def sdk_call(client: openai.AsyncOpenAI, rid: str, stream: bool, msgs: Any) -> str:
    headers = {"X-Request-Id": rid}
    if not stream:
        reply = await client.chat.completions.create(
            model="chat", messages=msgs, extra_headers=headers)
        assert reply.choices
        return "ok"
    response = await client.chat.completions.create(
        model="chat", messages=msgs, stream=True, extra_headers=headers)
    async with response as chunks:  # leaving the block (even cancelled) closes the connection
        async for _ in chunks:
            pass
    return "ok"


async def raw_cut_body(url: str, rid: str, chunked: bool, rng: random.Random,
                       work: Workload) -> str:
    """Send the headers and part of the body, then close the connection."""
    host, port = url.removeprefix("http://").split(":")
    body = orjson.dumps({"model": "chat", "messages": messages(rng)})
    part = body[: rng.randint(1, len(body) - 1)]
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nX-Request-Id: {rid}\r\n"
            "Authorization: Bearer sk-client-secret\r\n")
    if chunked:
        head += "Transfer-Encoding: chunked\r\n\r\n"
        sent = b"%x\r\n%s\r\n" % (len(part), part)
    else:
        head += f"Content-Length: {len(body)}\r\n\r\n"
        sent = part
    _, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head.encode() + sent)
        await writer.drain()
        await asyncio.sleep(rng.uniform(0, 0.02))  # the workload: a random moment to leave
    finally:
        work.left_at[rid] = time.monotonic()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return "cut"


async def one_client(i: int, gw: Any, client: openai.AsyncOpenAI, rng: random.Random,
                     work: Workload) -> None:
    rid = f"chaos-{i}"
    roll = rng.random()
    if roll < 0.1:
        work.kinds[rid] = "body"
        work.outcomes[await raw_cut_body(gw.url, rid, rng.random() < 0.5, rng, work)] += 1
        return
    stream = roll < 0.55
    work.kinds[rid] = "stream" if stream else "whole"
    # leave early (admission, queue), at a random moment, or never (after the end)
    pick = rng.random()
    leave_after = (rng.uniform(0, 0.02) if pick < 0.25 else
                   rng.uniform(0, 0.4) if pick < 0.85 else None)
    task = asyncio.create_task(sdk_call(client, rid, stream, messages(rng)))
    done, _ = await asyncio.wait({task}, timeout=leave_after)  # the workload's random moment
    if not done:
        work.left_at[rid] = time.monotonic()
        task.cancel()
    try:
        work.outcomes[await task] += 1
    except asyncio.CancelledError:
        work.outcomes["left"] += 1
    except openai.APIStatusError as exc:
        work.outcomes[f"http {exc.status_code}"] += 1
    except openai.APIError as exc:  # in-band, a stream's 200 sent while it queued
        code = exc.body.get("code") if isinstance(exc.body, dict) else None
        if code != "queue_timeout":  # the short queue timeout, on a box too busy to keep up
            raise
        work.outcomes["in-band queue_timeout"] += 1


def ledger_rows(path: Path) -> list[tuple[str, int, str | None]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT request_id, status, disconnect FROM requests").fetchall()




async def test_clients_leaving_at_random_moments_leave_no_trace(
    sdk: SdkClients, start: StartGateway, scale: int, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reached: Counter[str] = Counter()  # request ids whose handler began
    handle = dispatch.handle

    async def counted(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        reached[request.headers.get("X-Request-Id", "")] += 1
        return await handle(request, endpoint)

    monkeypatch.setattr(dispatch, "handle", counted)
    ledger_path = tmp_path / "ledger.sqlite3"
    sim = {"ttft_s": 0.01, "prefill_s_per_token": 0.001, "tokens_per_s": 200,
           "output_tokens": 20, "output_tokens_spread": 0.5, "seed": SEED}
    # A short queue timeout: should a slot ever leak, the line still moves.
    raw = gateway_config(sim_backend("big-70b", slots=4, queue_limit=48, queue_timeout_s=3,
                                     sim=sim))
    raw["ledger"] = {"path": str(ledger_path)}
    gw = await start(raw)
    big = engine(gw)
    rng = random.Random(SEED)
    work = Workload()
    client = sdk(gw, timeout=30.0)
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def paced(i: int, seed: int) -> None:
        async with gate:
            await one_client(i, gw, client, random.Random(seed), work)

    began = time.monotonic()
    async with asyncio.timeout(60 * scale):
        await asyncio.gather(*(paced(i, rng.getrandbits(32))
                               for i in range(REQUESTS * scale)))
    await client.close()
    clients_s = time.monotonic() - began

    await big.wait_until(lambda e: e.active == 0, timeout=5)

    # Every generation the engine began either completed or was aborted, never both; an
    # aborted one ended within ABORT_WITHIN_S after its client left (same monotonic clock).
    records = big.records.values()
    assert all(r.completed != r.aborted for r in records), [
        r for r in records if r.completed == r.aborted][:5]
    late = []
    for r in records:
        if r.aborted:
            assert r.request_id in work.left_at, f"{r.request_id} aborted, its client stayed"
            assert r.ended_at is not None
            gap = r.ended_at - work.left_at[r.request_id]
            if not 0 <= gap <= ABORT_WITHIN_S:
                late.append((r.request_id, round(gap, 3)))
    assert not late, late[:10]
    assert not any(work.kinds[r.request_id] == "body" for r in records)
    aborted = sum(r.aborted for r in records)
    assert aborted and len(records) - aborted  # both kinds happened

    # One ledger row per request that reached the handler, written at shutdown at the latest.
    await gw.close()
    assert gw.gateway.ledger is not None and gw.gateway.ledger.dropped == 0
    rows = ledger_rows(ledger_path)
    per_id = Counter(rid for rid, _, _ in rows)
    assert max(reached.values()) == 1  # ids are unique per request
    assert per_id == reached
    phases = Counter(disconnect for _, _, disconnect in rows)
    for rid, status, disconnect in rows:
        if work.kinds[rid] == "body":
            # cut while sending its body: the handler was reading it
            assert (status, disconnect) == (CLIENT_CLOSED, "admission"), (rid, status)
        elif disconnect is not None:
            assert rid in work.left_at and status == CLIENT_CLOSED, (rid, status, disconnect)
        else:
            assert status in (200, 429, 503), (rid, status)  # served, queue full or timeout
    print(f"\n{len(reached)} reached the handler of {REQUESTS * scale}; ledger phases "
          f"{dict(phases)}; engine saw {len(records)}, aborted {aborted}; "
          f"clients {dict(work.outcomes)} in {clients_s:.1f} s; "
          f"slots held at the end {gw.gateway.backends['big'].pool.active}")
    assert {"admission", "queued", "before_first_byte", "streaming", None} <= set(phases)
    served = sum(1 for _, status, disconnect in rows if status == 200 and disconnect is None)
    assert served
    await assert_idle(gw)


async def test_leaving_just_after_the_slot_is_granted_frees_it(
    sdk: SdkClients, start: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    handlers: dict[str, asyncio.Task[Any]] = {}
    handle = dispatch.handle

    async def tracked(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        handlers[request.headers.get("X-Request-Id", "")] = task
        return await handle(request, endpoint)

    monkeypatch.setattr(dispatch, "handle", tracked)
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=3)))
    sim, pool = engine(gw), gw.gateway.backends["big"].pool
    sim.hold()
    client = sdk(gw)
    msgs: Any = [{"role": "user", "content": "tell me something"}]
    holder = asyncio.create_task(client.chat.completions.create(
        model="chat", messages=msgs, extra_headers={"X-Request-Id": "holder"}))
    await sim.wait_until(lambda e: "holder" in e.records)
    waiter = asyncio.create_task(client.chat.completions.create(
        model="chat", messages=msgs, extra_headers={"X-Request-Id": "waiter"}))
    await wait_pools(gw, lambda s: s["big"] == (1, 1))

    def on_grant(_: object) -> None:
        # The holder's release has just handed its slot to the waiter's ticket, and the
        # waiter's handler has not resumed yet: its client leaves now (aiohttp cancels the
        # handler of a closed connection). The ticket's task still finishes first.
        if pool.queued == 0 and "waiter" in handlers:
            unwatch()
            handlers["waiter"].cancel()

    unwatch = pool.watch(on_grant)
    sim.release()
    await holder
    with contextlib.suppress(openai.APIError):
        async with asyncio.timeout(5):
            await waiter
    assert "waiter" not in sim.records  # it left before it was forwarded
    await assert_idle(gw)
