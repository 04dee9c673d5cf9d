"""Under steady load the primary is killed mid-stream, hangs, then answers 500s.

No client waits past the deadline the config implies, the primary's breaker opens and
closes again once the faults stop, and the fallback serves the load meanwhile.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable

import openai
import pytest

from policies.health.breaker import BreakerState, CircuitBreaker
from router.upstream.simulated.engine import FaultMode, SimEngine
from tests.support import (
    MESSAGES,
    Changes,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
    wait_pools,
)

CLIENTS = 30  # requests in flight, times the scale
FAULTS = 12  # requests of the primary that fail, per fault mode
SEED = 7

SIM = {"ttft_s": 0.01, "tokens_per_s": 400, "output_tokens": 10}
SERVE_S = SIM["ttft_s"] + SIM["output_tokens"] / SIM["tokens_per_s"]  # one healthy answer


def timeouts(scale: int) -> tuple[dict[str, float], dict[str, float], float]:
    """The backends' timeouts and the deadline they imply for any client call.

    One event loop carries the clients, the gateway and both engines: at a larger scale
    every timeout (and the slack) stretches with it, or the loop's own delay would trip them.
    """
    big = {"queue_timeout_s": 1.0 * scale, "first_byte_timeout_s": 0.3 * scale,
           "idle_timeout_s": 0.3 * scale, "breaker_failures": 3, "breaker_open_s": 0.5 * scale}
    small = {"queue_timeout_s": 1.0 * scale, "first_byte_timeout_s": 1.0 * scale,
             "idle_timeout_s": 1.0 * scale}
    slack_s = 3.0 * scale  # the loop's own delays on a loaded box (missed by 0.2 s at 1.0)
    # The longest a request may take: a wait in the primary's line, its first-byte timeout,
    # one retry that waits in the fallback's line, then a healthy answer there.
    deadline_s = (big["queue_timeout_s"] + big["first_byte_timeout_s"]
                  + small["queue_timeout_s"] + SERVE_S + slack_s)
    return big, small, deadline_s


class BreakerWatch:
    """Wait, without polling, for a breaker to reach a state (chained to its on_change)."""

    def __init__(self, breaker: CircuitBreaker) -> None:
        self.breaker = breaker
        self.history: list[BreakerState] = []
        self._changes = Changes()
        inner = breaker.on_change

        def changed(state: BreakerState) -> None:
            if inner is not None:
                inner(state)
            self.history.append(state)
            self._changes.changed()

        breaker.on_change = changed

    async def reach(self, state: BreakerState, within_s: float = 10.0) -> None:
        await self._changes.wait_until(lambda: self.breaker.state is state, within_s)


def completed(sim: SimEngine) -> int:
    return sum(r.completed for r in sim.records.values())


def at_least(n: int, measure: Callable[[SimEngine], int]) -> Callable[[SimEngine], bool]:
    return lambda sim: measure(sim) >= n


def met(mode: FaultMode) -> Callable[[SimEngine], int]:
    return lambda sim: sum(r.fault is mode for r in sim.records.values())


async def call(client: openai.AsyncOpenAI, stream: bool) -> str:
    if not stream:
        reply = await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert reply.choices
        return "ok"
    response = await client.chat.completions.create(model="chat", messages=MESSAGES,
                                                    stream=True)
    async with response as chunks:
        async for _ in chunks:
            pass
    return "ok"




async def test_a_failing_primary_never_holds_clients_past_their_deadline(
    sdk: SdkClients, start: StartGateway, scale: int
) -> None:
    big_timeouts, small_timeouts, deadline_s = timeouts(scale)
    gw = await start(gateway_config(
        sim_backend("big-70b", slots=8 * scale, queue_limit=16 * scale, **big_timeouts,
                    sim={**SIM, "seed": SEED}),
        sim_backend("small-8b", slots=16 * scale, queue_limit=64 * scale, **small_timeouts,
                    sim={**SIM, "seed": SEED + 1}),
        overflow="fallback",
    ))
    big, small, health = engine(gw, "big"), engine(gw, "small"), gw.gateway.health
    watch = BreakerWatch(health.breakers["big"])
    client = sdk(gw, timeout=deadline_s + 5)
    stop = asyncio.Event()
    took: list[float] = []
    outcomes: Counter[str] = Counter()
    unexpected: list[str] = []

    async def steady(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            began = time.monotonic()
            try:
                outcomes[await call(client, rng.random() < 0.5)] += 1
            except openai.APIStatusError as exc:
                outcomes[f"http {exc.status_code}"] += 1
            except openai.APIError as exc:  # in-band: the stream had begun
                body = exc.body if isinstance(exc.body, dict) else {}
                outcomes[f"in-band {body.get('code')}"] += 1
                if body.get("code") is None:
                    unexpected.append(f"{type(exc).__name__}: {exc} ({exc.__cause__!r})")
            took.append(time.monotonic() - began)

    within = 10.0 * scale  # every wait below has a deadline
    rng = random.Random(SEED)
    load = [asyncio.create_task(steady(rng.getrandbits(32))) for _ in range(CLIENTS * scale)]
    try:
        await big.wait_until(at_least(20, completed), within)
        for mode in (FaultMode.DROP, FaultMode.HANG, FaultMode.ERROR_500):
            served_small = completed(small)
            big.inject_fault(mode, FAULTS)
            await watch.reach(BreakerState.OPEN, within)  # (it may have closed again by
            # the time this task runs: the health checks probe after breaker_open_s)
            # the fallback takes the load while the primary is out
            await small.wait_until(at_least(served_small + 20, completed), within)
            # every injected fault was met, the health checks put the primary back ...
            await big.wait_until(at_least(FAULTS, met(mode)), within)
            async with asyncio.timeout(within):
                await health.recovered("big")
            await watch.reach(BreakerState.CLOSED, within)
            assert not health.is_open("big"), mode
            # ... and it serves again
            await big.wait_until(at_least(completed(big) + 20, completed), within)
    finally:
        stop.set()
        async with asyncio.timeout(deadline_s + 10):
            await asyncio.gather(*load)
        await client.close()

    print(f"\n{len(took)} calls, slowest {max(took):.2f} s (deadline {deadline_s:.2f} s); "
          f"{dict(outcomes)}; breaker {[s.value for s in watch.history]}")
    assert max(took) <= deadline_s
    assert watch.history.count(BreakerState.OPEN) >= 3  # at least once per fault mode
    assert watch.history[-1] is BreakerState.CLOSED
    assert outcomes["ok"] >= 0.8 * len(took)
    await assert_idle(gw)
    await big.wait_until(lambda e: e.active == 0, timeout=5)
    await small.wait_until(lambda e: e.active == 0, timeout=5)
    records = [*big.records.values(), *small.records.values()]
    # no generation is left behind: a healthy one ended, a hung one was given up on
    assert all(r.completed or r.aborted for r in records if r.fault is None)
    assert all(r.aborted for r in records if r.fault is FaultMode.HANG)
    # A client sees an answer, an HTTP error, or an error event in its stream; never a
    # broken connection. (A backend's own 500 is relayed when the retry budget is spent, or
    # when the health check made for it passed: in-band for a stream that queued, as is a
    # hung engine's timeout for a stream that had its 200 while it queued; and the 503 of
    # a moment when both breakers were open, in-band for such a stream.)
    expected = {"ok", "http 500", "http 502", "http 503", "http 504", "http 429",
                "in-band upstream_dropped", "in-band upstream_error",
                "in-band upstream_timeout", "in-band backend_unavailable"}
    if not set(outcomes) <= expected:
        pytest.fail(f"unexpected outcomes: {outcomes} {unexpected[:3]}")


async def test_a_queued_stream_retried_into_a_full_fallback_keeps_one_response(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=1),
                                    sim_backend("m-small", slots=1, queue_limit=1)))
    big, small = engine(gw, "big"), engine(gw, "small")
    client = sdk(gw)
    # "a" fails on the primary and is retried on the fallback, where it keeps the one slot
    big.inject_fault(FaultMode.ERROR_500)
    small.hold()
    a = asyncio.create_task(client.chat.completions.create(
        model="chat", messages=MESSAGES, extra_headers={"X-Request-Id": "a"}))
    await small.wait_until(lambda e: "a" in e.records)
    # "b" keeps the primary's slot, so the stream "x" queues there (its headers go out)
    big.hold()
    b = asyncio.create_task(client.chat.completions.create(
        model="chat", messages=MESSAGES, extra_headers={"X-Request-Id": "b"}))
    await big.wait_until(lambda e: "b" in e.records)
    stream = await client.chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, extra_headers={"X-Request-Id": "x"})
    await wait_pools(gw, lambda s: s["big"] == (1, 1))
    # "x" gets the primary's slot, fails there and is retried on the full fallback: it queues
    big.inject_fault(FaultMode.ERROR_500)
    big.release()
    await b
    await wait_pools(gw, lambda s: s["small"] == (1, 1))
    small.release()
    await a
    async with asyncio.timeout(5), stream:
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text
    assert small.records["x"].completed
    await assert_idle(gw)
