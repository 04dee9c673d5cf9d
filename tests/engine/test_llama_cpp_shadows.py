"""A shadow comparison through the real llama.cpp engine (#33): a simple request moved to
the small engine while the primary is busy is replayed on the primary once it is idle,
and judged there in both orders. The model is small, so this checks the mechanism (the
replay, the judge's calls, the verdict row), not the quality of its verdicts: an answer
it gives that is not A, B or TIE is recorded as no verdict."""

from __future__ import annotations

from pathlib import Path

from router.quality.verdicts import fetch
from tests.engine.conftest import Engines
from tests.engine.gateway import COMPLEX, HELLO, NO_EOS, engine_config, rid
from tests.support import SdkClients, StartGateway, assert_idle, poll_until


async def test_a_moved_request_is_replayed_and_judged_on_the_idle_primary(
    start: StartGateway, idle: Engines, sdk: SdkClients, tmp_path: Path
) -> None:
    raw = engine_config(idle, steer=True, ledger=tmp_path / "ledger.sqlite3")
    raw["routes"]["chat"]["quality"] = {"shadow_rate": 1.0}
    gw = await start(raw)
    client = sdk(gw)
    busy = await client.chat.completions.create(
        model="chat", messages=COMPLEX, max_tokens=400, logit_bias=NO_EOS, stream=True,
        extra_headers={"X-Request-Id": rid("busy")})
    assert (await busy.__anext__()).choices  # the primary is generating
    moved = await client.chat.completions.with_raw_response.create(
        model="chat", messages=HELLO, max_tokens=8, extra_headers={"X-Request-Id": rid("hi")})
    assert moved.headers["x-slotgate-backend"] == "small"
    shadows = gw.gateway.shadows
    assert shadows is not None and len(shadows.pending) == 1  # waiting: the primary is busy
    await busy.close()  # the primary is idle: the replay and the two judgements run there
    await poll_until(lambda: any(k.startswith("verdict:") for k in shadows.counts)
                     and not shadows.busy, within_s=300, every_s=0.2)
    assert shadows.counts["cut"] == 0 and shadows.counts["replay_failed"] == 0
    await assert_idle(gw)
    ledger = gw.gateway.ledger
    assert ledger is not None
    [verdict] = await fetch(ledger.store, None, None)  # (of this judge's version)
    assert (verdict.route, verdict.language) == ("chat", "en")
    assert verdict.intent is not None and verdict.prompt_tokens > 0
