"""How fast a batch line gives its slot back, and the two baselines it is judged against,
all read on one clock (time.monotonic: the bench, the gateways and their simulated
engines share one process):

- probes: one interactive stream at a time, sent while batch lines hold every slot of
  the 70B (its pool full, no interactive request in flight); from its arrival to its slot
  (the gateway's queue wait; its sequence's start on the engine: its first token less the
  engine's planned first-token time) and to the end of the cut line's engine request;
- hand-offs: a closed loop of interactive streams, more than the slots, on a gateway with
  no batch: from one request's end on the engine to the next one's start there;
- aborts: straight to the engine, a stream closed by its client after its first token:
  how long the engine takes to notice (its record's end).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass

import aiohttp
from batch_gateway import PRIMARY, BenchGateway
from batch_slots import BATCH_PREFIX
from batch_traffic import Stream, chat, stream_chat

from router.tools.demo import HARD, SIMPLE

FULL_WAIT_S = 5.0  # for the batch to fill the slots again after a probe


@dataclass
class Probe:
    stream: Stream
    simple: bool  # a prompt the route's classifier may steer to the small model
    reached_s: float | None = None  # arrival -> its request reaches the engine
    slot_s: float | None = None  # arrival -> its sequence starts on the engine
    cut_end_s: float | None = None  # arrival -> the cut line's engine request ends


@dataclass
class Probes:
    probes: list[Probe]
    misses: int  # waits for a full pool that timed out
    most_held: int  # the most slots the batch held while the bench waited


async def _full(gw: BenchGateway, within_s: float) -> tuple[bool, int]:
    """Wait until the batch holds every slot (no interactive request is in flight while
    probes run), woken by the pool's changes; whether it did, and the most it held."""
    pool, most = gw.pool, 0
    try:
        async with asyncio.timeout(within_s):
            while pool.active < pool.capacity or pool.queued:
                most = max(most, pool.active)
                await pool.next_change()
    except TimeoutError:
        return False, most
    return True, pool.active


async def probe_preemption(session: aiohttp.ClientSession, gw: BenchGateway, count: int,
                           seed: int) -> Probes:
    """`count` probes, one in four with a simple prompt; stops after two misses."""
    rng = random.Random(seed)
    out = Probes([], 0, 0)
    for n in range(count):
        full, most = await _full(gw, FULL_WAIT_S)
        out.most_held = max(out.most_held, most)
        if not full:
            out.misses += 1
            if out.misses >= 2:
                break
            continue
        await asyncio.sleep(rng.uniform(0.0, 0.5))  # somewhere in the lines' answers
        if gw.pool.active < gw.pool.capacity:
            continue  # a line ended meanwhile: the next turn waits for a full pool again
        simple = n % 4 == 3
        prompt = rng.choice(SIMPLE if simple else HARD)
        stream = await stream_chat(session, gw.url, chat(prompt, 2, PRIMARY), f"pre-{n}",
                                   gw.headers)
        out.probes.append(_read_engine(gw, Probe(stream, simple)))
    return out


def _read_engine(gw: BenchGateway, probe: Probe) -> Probe:
    arrived = probe.stream.sent_at
    rec = gw.engine.records.get(probe.stream.request_id)
    if rec is not None:
        probe.reached_s = rec.started_at - arrived
    if rec is not None and rec.first_token_at is not None and rec.planned_ttft_s is not None:
        probe.slot_s = rec.first_token_at - rec.planned_ttft_s - arrived
    cuts = [r.ended_at for r in gw.records() if r.aborted and r.ended_at is not None
            and r.request_id.startswith(BATCH_PREFIX) and r.ended_at >= arrived]
    if cuts:
        probe.cut_end_s = min(cuts) - arrived
    return probe


async def hand_offs(session: aiohttp.ClientSession, gw: BenchGateway, count: int,
                    clients: int) -> list[float]:
    """Engine gaps (s) between a request's end and the start of the one its slot went to:
    `clients` (more than the slots) send one-token streams back to back."""
    ids = itertools.count()
    streams: list[Stream] = []

    async def client() -> None:
        while (n := next(ids)) < count:
            body = chat(HARD[n % len(HARD)], 1, PRIMARY)
            streams.append(await stream_chat(session, gw.url, body, f"ho-{n}", gw.headers))

    await asyncio.gather(*(client() for _ in range(clients)))
    records = {r.request_id: r for r in gw.records() if r.request_id.startswith("ho-")}
    ends = sorted(r.ended_at for r in records.values() if r.ended_at is not None)
    gaps = []
    for stream in streams[clients:]:  # the first ones found free slots
        rec = records.get(stream.request_id)
        if rec is None or not stream.queue_wait_ms:
            continue  # it waited for none: no hand-off
        before = [end for end in ends if end <= rec.started_at]
        if before:
            gaps.append(rec.started_at - before[-1])
    return gaps


async def engine_aborts(session: aiohttp.ClientSession, gw: BenchGateway,
                        count: int) -> list[float]:
    """Seconds from a client closing its stream (after the first token) to the end of
    its request on the engine, straight to the engine (no gateway)."""
    return [await _abort(session, gw, f"abort-{n}") for n in range(count)]


async def _abort(session: aiohttp.ClientSession, gw: BenchGateway, rid: str) -> float:
    resp = await session.post(gw.sim.url + "/v1/chat/completions",
                              json=chat(HARD[0], 50, PRIMARY), headers={"x-request-id": rid})
    async for raw in resp.content:
        if raw.startswith(b"data:"):
            break
    closed = time.monotonic()
    resp.close()  # the connection with it, as a gateway's cut does
    rec = gw.engine.records[rid]
    await gw.engine.wait_until(lambda _: rec.ended_at is not None, 5.0)
    assert rec.ended_at is not None
    return rec.ended_at - closed
