"""The W3C `tracestate` and `baggage` a client sends are bounded as their specifications
say (tracestate: 32 members, 512 bytes; baggage: 180 members, 8,192 bytes): past a bound
the header is dropped whole, unparsed and not forwarded; the `traceparent` still holds."""

from __future__ import annotations

from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from router.app import RunningGateway
from router.tracing.context import (
    MAX_BAGGAGE_BYTES,
    MAX_BAGGAGE_MEMBERS,
    MAX_TRACESTATE_BYTES,
    MAX_TRACESTATE_MEMBERS,
    within,
)
from router.upstream.forwarding import forward_headers
from tests.support import SdkClients, StartGateway, assert_idle, engine, gateway_config, sim_backend
from tests.support.otlp import Receiver, one, receiver, traced

CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
HUGE_STATE = ",".join(f"k{i}=v{'x' * 24}" for i in range(450))  # ~14 KB, 450 members
HUGE_BAGGAGE = ",".join(f"k{i}={'y' * 24}" for i in range(450))  # ~14 KB, 450 members


def members(n: int, size: int = 0) -> str:
    """A list of `n` members, padded to `size` bytes by its last value."""
    head = ",".join(f"k{i}=v" for i in range(n))
    return head + "x" * max(0, size - len(head))


def test_the_bounds_are_the_specifications() -> None:
    for name, max_bytes, max_members in (
            ("tracestate", MAX_TRACESTATE_BYTES, MAX_TRACESTATE_MEMBERS),
            ("baggage", MAX_BAGGAGE_BYTES, MAX_BAGGAGE_MEMBERS)):
        assert within(name, [members(max_members)])
        assert not within(name, [members(max_members + 1)])
        assert within(name, [members(1, max_bytes)])
        assert not within(name, [members(1, max_bytes + 1)])
        # two headers are one list: their members and bytes (and the joining comma) add up
        assert within(name, [members(1, max_bytes // 2), members(1, max_bytes // 2 - 1)])
        assert not within(name, [members(1, max_bytes // 2), members(1, max_bytes // 2)])
        half = members(max_members // 2)
        assert not within(name, [half, half, "z=1"])
    assert (MAX_TRACESTATE_BYTES, MAX_TRACESTATE_MEMBERS) == (512, 32)
    assert (MAX_BAGGAGE_BYTES, MAX_BAGGAGE_MEMBERS) == (8192, 180)
    assert not within("tracestate", ["k=" + "é" * 256])  # bytes, not characters


def forwarded(**headers: str) -> dict[str, str]:
    given = CIMultiDictProxy(CIMultiDict(headers))
    return {k.lower(): v for k, v in forward_headers(given, "rid", None)}


def test_untraced_forwarding_drops_what_is_past_its_bound() -> None:
    kept = forwarded(traceparent=TRACEPARENT, tracestate="congo=t61rcWkgMzE", baggage="a=1")
    assert (kept["tracestate"], kept["baggage"]) == ("congo=t61rcWkgMzE", "a=1")
    cut = forwarded(traceparent=TRACEPARENT, tracestate=HUGE_STATE, baggage=HUGE_BAGGAGE)
    assert cut["traceparent"] == TRACEPARENT
    assert "tracestate" not in cut and "baggage" not in cut


async def ask(sdk: SdkClients, gw: RunningGateway, rid: str, **headers: str) -> Any:
    return await sdk(gw).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        extra_headers={"X-Request-Id": rid, "traceparent": TRACEPARENT, **headers})


async def test_a_traced_gateway_keeps_the_parent_and_drops_the_rest(
    start: StartGateway, sdk: SdkClients, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")  # the batch exported every 20 ms
    async with receiver() as otlp:
        await _traced(otlp, start, sdk)


async def _traced(otlp: Receiver, start: StartGateway, sdk: SdkClients) -> None:
    gw = await start(traced(gateway_config(sim_backend("m", slots=1)), otlp))
    await ask(sdk, gw, "huge", tracestate=HUGE_STATE, baggage=HUGE_BAGGAGE)
    await ask(sdk, gw, "small", tracestate="congo=t61rcWkgMzE", baggage="a=1")
    await assert_idle(gw)
    sim = engine(gw)
    huge, small = sim.records["huge"], sim.records["small"]
    for rec in (huge, small):  # the child of the client's span, in the client's trace
        assert rec.traceparent is not None and rec.traceparent.split("-")[1] == CLIENT_TRACE
    assert (huge.tracestate, huge.baggage) == (None, None)
    assert (small.tracestate, small.baggage) == ("congo=t61rcWkgMzE", "a=1")
    spans = await otlp.trace_of("huge", 2)
    server = one(spans, "chat chat")
    assert (server.trace_id, server.parent_id) == (CLIENT_TRACE, CLIENT_SPAN)
