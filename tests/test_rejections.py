"""Every refusal of the gateway's own goes through one table (router/request/rejections.py):
its status, code and message, the `x-slotgate-reject-reason` header, `llm_rejection_total`,
and the one Retry-After, clamped to `server.retry_after_min_s`..`retry_after_max_s`.

The tree is read for any other maker of a 429 or 503 or of a Retry-After (only the engine's
own, relayed, may have one); then refusals that used to bypass the table, and both ways a
line is found full, are walked on a real gateway with a floor of 2 s and a cap of 3 s."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import aiohttp
import pytest

from policies.config import ServerConfig
from policies.scheduler.admission import RejectReason
from router.app import RunningGateway
from router.console.pages import PAGES
from router.request import rejections
from tests.support import (
    MESSAGES,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
    wait_pools,
)

ROOT = Path(__file__).resolve().parent.parent
# Where a Retry-After may be written outside the table: an engine's own, relayed (proxy),
# the Anthropic shape's default for an engine's 429/503 that had none, and the parse of an
# engine's header (dispatch: how long a backend waits out its 429).
ENGINE_ONLY = {"router/upstream/proxy.py", "router/apis/anthropic.py", "router/dispatch.py"}
FLOOR, CAP = 2, 3
SERVER = {"retry_after_min_s": FLOOR, "retry_after_max_s": CAP}


def _sources() -> list[Path]:
    return [p for d in ("router", "policies") for p in (ROOT / d).rglob("*.py")]


def test_no_429_or_503_is_made_outside_the_table() -> None:
    makers = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ApiError"
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in (429, 503)):
                makers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert makers == []


def test_no_retry_after_is_written_outside_the_table() -> None:
    writers = []
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        if rel == "router/request/rejections.py" or rel in ENGINE_ONLY:
            continue
        text = path.read_text(encoding="utf-8")
        if '"Retry-After"' in text and "router/tools/" not in rel:  # (the demo reads it)
            writers.append(rel)
    assert writers == []


def test_every_reason_has_its_answer() -> None:
    assert set(rejections._ANSWERS) == set(RejectReason)
    for status, kind, message in rejections._ANSWERS.values():
        assert status in (429, 503) and kind and message


def _count(gw: RunningGateway, reason: RejectReason) -> float:
    prefix = "llm_rejection_total{"
    return sum(float(line.rsplit(" ", 1)[1])
               for line in gw.gateway.metrics.exposition().decode().splitlines()
               if line.startswith(prefix) and f'reason="{reason.value}"' in line)


async def _refused(response: aiohttp.ClientResponse, reason: RejectReason) -> None:
    assert response.headers["x-slotgate-reject-reason"] == reason.value
    assert FLOOR <= int(response.headers["Retry-After"]) <= CAP
    body = await response.json()
    assert body["error"]["code"] == reason.value


async def test_refusals_walked_on_a_gateway(start: StartGateway) -> None:
    raw = gateway_config(sim_backend("m", slots=1, queue_limit=0), server=SERVER)
    gw = await start(raw)
    url = gw.url + "/v1/chat/completions"
    body = {"model": "chat", "messages": MESSAGES}
    sim = engine(gw)
    async with aiohttp.ClientSession() as http:
        # a full line (no queue): the forecast is far off, the cap holds it
        sim.hold()
        holder = asyncio.ensure_future(http.post(url, json=body))
        await wait_pools(gw, lambda pools: pools["big"][0] == 1)
        before = _count(gw, RejectReason.QUEUE_FULL)
        async with http.post(url, json=body) as full:
            assert full.status == 429
            await _refused(full, RejectReason.QUEUE_FULL)
        assert _count(gw, RejectReason.QUEUE_FULL) == before + 1
        sim.release()
        async with await holder as held:
            assert held.status == 200
        # the backend and its route out of service (no fallback): was a table of its own
        gw.gateway.health.open("big")
        before = _count(gw, RejectReason.BACKEND_UNAVAILABLE)
        async with http.post(url, json=body) as down:
            assert down.status == 503
            await _refused(down, RejectReason.BACKEND_UNAVAILABLE)
            assert "'big'" in (await down.json())["error"]["message"]
        assert _count(gw, RejectReason.BACKEND_UNAVAILABLE) == before + 1
        # the dashboards' feed full: was a literal Retry-After of 10
        gw.app[PAGES].max_subscribers = 0
        async with http.get(gw.url + "/dashboard/events") as feed:
            assert feed.status == 503
            await _refused(feed, RejectReason.SUBSCRIBERS)
            assert int(feed.headers["Retry-After"]) == CAP  # its 10 s, capped
    await assert_idle(gw)


@pytest.mark.parametrize(("after_s", "expected"), [
    (0, FLOOR), (0.2, FLOOR), (2.2, 3), (3, 3), (1e9, CAP), (float("inf"), CAP)])
def test_the_one_clamp(after_s: float, expected: int) -> None:
    server = ServerConfig(retry_after_min_s=FLOOR, retry_after_max_s=CAP)
    assert rejections.retry_after_s(after_s, server) == expected
