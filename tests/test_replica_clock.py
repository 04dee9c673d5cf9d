"""The replicas of a group each have their own clock where they differ: a group of two
simulated engines, one prefilling ten times faster than the other, teaches each replica
its own prefill rate (the group's lies between); the replica pick's hold weighs the cold
prefill at the rate of the replica where it would run, and the wait for the holder at the
holder's own stream rates."""

from __future__ import annotations

from typing import Any

import pytest

from policies.clock.answers import Hints
from policies.clock.clock import MIN_PREFILL_SAMPLES, MIN_RATE_SAMPLES, Answered, Clock
from policies.clock.lengths import uniform
from policies.scheduler import pick
from policies.scheduler.prefix import Match
from policies.slots import LocalSlotPool
from router.backend import Backend
from router.config import config_from_dict
from router.placement import Placement, _hold
from router.request.queue_report import QueueReporter
from tests.support import SdkClients, StartGateway, assert_idle

SLOW, FAST = 1e-4, 1e-5  # seconds per prompt token each engine prefills
ENGINE = {"ttft_s": 0.005, "prefix_cache_tokens": 100_000, "tokens_per_s": 0,
          "output_tokens": 2}


def two_speeds() -> dict[str, Any]:
    endpoints = [{"simulated": {**ENGINE, "prefill_s_per_token": rate}, "slots": 1}
                 for rate in (SLOW, FAST)]
    return {"backends": {"big": {"model": "m", "endpoints": endpoints, "pick": "round_robin"}},
            "routes": {"chat": {"primary": "big"}}}


async def test_each_replica_learns_its_engines_prefill_rate_and_the_group_lies_between(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(two_speeds())
    clock = gw.gateway.backends["big"].clock
    client = sdk(gw)
    for turn in range(2 * MIN_PREFILL_SAMPLES):  # round robin: big-0, big-1, big-0, ...
        if turn == 2 * MIN_PREFILL_SAMPLES - 2:  # one sample short each: the group's
            assert clock.prefill_on("big-0") == clock.prefill_on("big-1") \
                == clock.prefill_s_per_token
        # Prompts of ~100 and ~2,000 tokens, in turn for each replica, each new to its
        # engine's cache (its first block differs): the engine prefills all of it.
        words = "tell me about slots " * (20 if turn // 2 % 2 else 400)
        stream = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": f"{turn} {words}"}],
            stream=True, stream_options={"include_usage": True})
        async for _ in stream:
            pass
    served = [r.replica for r in gw.gateway.recent]
    assert served.count("big-0") == served.count("big-1") == MIN_PREFILL_SAMPLES
    assert all(r.cached_tokens == 0 for r in gw.gateway.recent)
    slow, fast = clock.prefill_on("big-0"), clock.prefill_on("big-1")
    assert SLOW / 2 < slow < SLOW * 2 and FAST / 2 < fast < FAST * 2
    assert fast < clock.prefill_s_per_token < slow
    await assert_idle(gw)


# The hold: wait for the busy replica `a` holding the prompt's 8 blocks (512 tokens), or
# run cold on another now? Replica `b` prefills at 1 ms a token (the 512 tokens: 0.51 s),
# `c` at 0.01 ms (5 ms); a new answer holds its slot ~0.1 s on the group's rates.

BLOCKS, TOKENS = 8, 1000  # the prefix `a` holds; the request's work (prompt and answer)
PLACE = Placement(list(range(BLOCKS)), TOKENS, None, block_bytes=256)  # 64 tokens a block


def taught(a_slow: bool) -> Clock:
    """A group's clock whose `b` prefills 100x slower than `c`, and whose `a` (when
    `a_slow`) streams at a tenth of the others' speed, 1 s to its first token."""
    clock = Clock(1.0, Hints(ttft_s=0.1, tokens_per_s=100.0, lengths=uniform(10, 0.0),
                             prefill_s_per_token=1e-4), grouped=True)
    if a_slow:
        for _ in range(MIN_RATE_SAMPLES):
            clock.observe(Answered(1.9, tokens=10, ttft_s=1.0), "a")  # 9 tokens in 0.9 s
    for replica, s_per_token in (("b", 1e-3), ("c", 1e-5)):
        for i in range(MIN_PREFILL_SAMPLES):
            prefilled = 100 + 200 * (i % 2)
            ttft_s = 0.01 + prefilled * s_per_token  # ... then 9 tokens at 100 a second
            clock.observe(Answered(ttft_s + 0.09, tokens=10, ttft_s=ttft_s,
                                   prefilled=prefilled), replica)
    return clock


def group_backend(clock: Clock, now: list[float]) -> tuple[Backend, LocalSlotPool]:
    """A group of replicas a, b and c of one slot each, on `clock`, at the time `now[0]`."""
    config = config_from_dict(two_speeds()).backends["big"]
    pool = LocalSlotPool("big", 3, 10, clock.holds, clock=lambda: now[0],
                         replicas={"a": 1, "b": 1, "c": 1}, answers=clock.answers)
    return Backend("big", config, {}, pool, QueueReporter(pool), clock), pool


@pytest.mark.parametrize(("choice", "a_slow", "waits"), [
    ("b", False, True),  # a cold prefill on b (0.51 s) is later than a's slot (~0.1 s)
    ("c", False, False),  # on c (5 ms) it is sooner
    ("b", True, False),  # a's own rates: its slot comes in ~1.9 s, later than b's prefill
])
def test_the_hold_weighs_the_cold_prefill_at_its_replicas_rate(
    choice: str, a_slow: bool, waits: bool,
) -> None:
    clock, now = taught(a_slow), [0.0]
    backend, pool = group_backend(clock, now)
    assert pool.acquire_nowait(("a",)) is not None  # the holder is busy
    snapshot = [pick.Replica("a", 1, 1, 0), pick.Replica("b", 1, 0, 0),
                pick.Replica("c", 1, 0, 0)]
    hold = _hold(backend, PLACE, snapshot, Match("a", BLOCKS), {"a": BLOCKS},
                 pick.Pick(choice, pick.PickReason.LEAST_LOADED, 0))
    assert (hold is not None) is waits
    group = clock.prefill_s_per_token  # the same for either choice: it would not tell
    assert clock.prefill_on("c") < group < clock.prefill_on("b")


@pytest.mark.parametrize(("warm_other", "waits"), [
    ("b", True),  # the warmest other is b: half the prefix cold there, 0.26 s
    ("c", False),  # c: 2.6 ms, sooner than a's slot, 0.1 s after the next one's
])
def test_with_no_replica_free_the_cold_prefill_runs_on_the_warmest_other(
    warm_other: str, waits: bool,
) -> None:
    clock, now = taught(False), [0.0]
    backend, pool = group_backend(clock, now)
    for replica in ("b", "c"):
        assert pool.acquire_nowait((replica,)) is not None
    now[0] = 0.1
    assert pool.acquire_nowait(("a",)) is not None  # a frees 0.1 s after the others
    snapshot = [pick.Replica(name, 1, 1, 0) for name in "abc"]
    hold = _hold(backend, PLACE, snapshot, Match("a", BLOCKS),
                 {"a": BLOCKS, warm_other: BLOCKS // 2}, None)
    assert (hold is not None) is waits

