"""Ledger rows name the replica that served them, as the answer's x-slotgate-endpoint does,
in SQLite and in the real PostgreSQL; the report breaks the group down by replica."""

from __future__ import annotations

from typing import Any

from router.report.build import build_report
from tests.support import MESSAGES, SdkClients, StartGateway, assert_idle, rows_of

FAST = {"ttft_s": 0, "tokens_per_s": 0, "output_tokens": 8, "max_num_seqs": 8}


def config(target: str) -> dict[str, Any]:
    """`big`: two simulated replicas taking turns; `one`: a single engine."""
    endpoints = [{"simulated": FAST, "slots": 1, "name": name} for name in ("gpu-a", "gpu-b")]
    return {
        "backends": {"big": {"model": "m", "endpoints": endpoints, "pick": "round_robin"},
                     "one": {"model": "m1", "simulated": FAST, "slots": 1}},
        "routes": {"chat": {"primary": "big"}, "solo": {"primary": "one"}},
        "ledger": {"url" if target.startswith("postgres") else "path": target},
    }


async def test_rows_name_the_replica_that_served_them(
    sdk: SdkClients, start: StartGateway, ledger_target: str
) -> None:
    gw = await start(config(ledger_target))
    client = sdk(gw)
    answered: dict[str, str] = {}  # request id -> the replica the answer named
    for i, model in enumerate(["chat"] * 4 + ["solo"] * 2):
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=MESSAGES, extra_headers={"X-Request-Id": f"req-{i}"})
        answered[f"req-{i}"] = raw.headers["x-slotgate-endpoint"]
    await assert_idle(gw)
    rows = await rows_of(gw, ledger_target)
    assert {r.request_id: r.replica for r in rows} == answered
    assert [answered[f"req-{i}"] for i in range(6)] == ["gpu-a", "gpu-b"] * 2 + ["one"] * 2
    assert {(r.backend, r.replica) for r in rows} == {("big", "gpu-a"), ("big", "gpu-b"),
                                                      ("one", "one")}
    assert all(r.endpoint == "/v1/chat/completions" for r in rows)  # the API path, as ever
    big, one = build_report(rows, resamples=10)["replicas"]
    assert [(r["replica"], r["requests"], r["share"]) for r in big["replicas"]] == [
        ("gpu-a", 2, 0.5), ("gpu-b", 2, 0.5)]
    assert [(r["replica"], r["requests"]) for r in one["replicas"]] == [("one", 2)]
