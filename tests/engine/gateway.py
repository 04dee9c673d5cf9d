"""What the engine tests share: the prompts, request ids the engine accepts, the gateway's
config in front of the two llama.cpp servers, and reading back what the gateway kept."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from router.app import RunningGateway
from router.common.record import RequestRecord
from router.ledger.base import LedgerRow, RowFilter
from router.ledger.open import open_store
from tests.engine.conftest import MODEL_ID, Engines, LlamaServer

ASK: Any = [{"role": "user", "content": "Write about the history of the river."}]
HELLO: Any = [{"role": "user", "content": "Good morning!"}]
COMPLEX: Any = [{"role": "user", "content":
                 "Explain in detail how a CPU pipeline works, step by step."}]
# Gemma's <eos> and <end_of_turn>: forbidden, a generation runs to max_tokens.
NO_EOS = {"1": -100, "106": -100}


def rid(name: str) -> str:
    """A request id for the X-Request-Id header. llama-cpp-python's server answers an
    empty 400 to any X-Request-Id that is not a UUID, so ids sent to it must be UUIDs."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "slotgate-engine-test:" + name))


def engine_config(engines: Engines, on_disconnect: str = "abort", steer: bool = False,
                  ledger: Path | None = None) -> dict[str, Any]:
    def backend(server: LlamaServer) -> dict[str, Any]:
        return {"url": server.url + "/v1", "model": MODEL_ID, "slots": 1, "queue_limit": 4,
                "queue_timeout_s": 300, "context_window": 2048,
                # a non-streaming answer comes whole, when the generation is done
                "first_byte_timeout_s": 300, "on_disconnect": on_disconnect}

    route: dict[str, Any] = {"primary": "big", "overflow": "reject"}
    raw: dict[str, Any] = {"backends": {"big": backend(engines.primary)},
                           "routes": {"chat": route}}
    if steer:
        raw["backends"]["small"] = backend(engines.fallback)
        route.update(fallbacks=["small"], fallback={"when": "saturated"})
    if ledger is not None:
        raw["ledger"] = {"path": str(ledger), "flush_interval_s": 0.05}
    return raw


async def free(server: LlamaServer, within_s: float) -> bool:
    """Is the engine free? Its /v1/models waits for the model lock, which a running
    generation holds: an answer within `within_s` says no generation is running."""
    try:
        async with (aiohttp.ClientSession() as session,
                    asyncio.timeout(within_s),
                    session.get(server.url + "/v1/models") as resp):
            return resp.status == 200
    except TimeoutError:
        return False


def record(gw: RunningGateway, request_id: str) -> RequestRecord:
    found = [r for r in gw.gateway.recent if r.request_id == rid(request_id)]
    assert found, f"no record of {request_id}"
    return found[-1]


async def ledger_rows(gw: RunningGateway, path: Path) -> dict[str, LedgerRow]:
    await gw.close()  # graceful: every row is written before it returns
    store = open_store(str(path))
    await store.open()
    try:
        return {row.request_id: row for row in await store.fetch(RowFilter())}
    finally:
        await store.close()
