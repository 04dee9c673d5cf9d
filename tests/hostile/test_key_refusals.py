"""A valid key's refusals before any engine work are sampled like a wrong key's: counted
in full in the metrics, written to the access log and the ledger at most
`logging.refusals_per_key_s` times per key per second, the next line written carrying the
count left out. Before this, each of 10,000 malformed requests wrote a ledger row and a
log line (3.55 MB of ledger, 7.55 MB of log)."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.support import StartGateway, gateway_config, sim_backend
from tests.support.ledger import rows_of

KEY = "sk-refusals-0123456789"
SENT = 300


async def test_a_keys_refusals_are_written_a_few_a_second(
    start: StartGateway, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = str(tmp_path / "ledger.sqlite3")
    raw: dict[str, Any] = gateway_config(sim_backend("m", slots=1))
    raw["auth"] = {"enabled": True, "keys": [
        {"id": "k", "tenant": "t", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}]}
    raw["ledger"] = {"path": ledger}
    raw["logging"] = {"refusals_per_key_s": 5}
    gw = await start(raw)
    now = [1000.0]  # the sampler's clock: one second for the whole flood, then the next
    gw.gateway.key_refusals.clock = lambda: now[0]
    caplog.set_level(logging.INFO, "slotgate.access")
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        for i in range(SENT):
            body = b"{not json" if i % 2 else b'{"model": "chat"}'
            async with http.post(gw.url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 400
        now[0] += 1
        async with http.post(gw.url + "/v1/chat/completions", data=b"[]",
                             headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400
        async with http.post(gw.url + "/v1/chat/completions", json={  # served: always kept
                "model": "chat", "messages": [{"role": "user", "content": "hi"}]}) as resp:
            assert resp.status == 200
    requests = gw.gateway.metrics.requests.values
    assert sum(n for labels, n in requests.items() if labels[2] == "4xx") == SENT + 1
    lines = [orjson.loads(r.getMessage()) for r in caplog.records
             if r.name == "slotgate.access"]
    assert [line["status"] for line in lines] == [400] * 6 + [200]
    assert [line.get("suppressed") for line in lines] == [None] * 5 + [SENT - 5, None]
    rows = await rows_of(gw, ledger)
    assert sorted(row.status for row in rows) == [200] + [400] * 6
