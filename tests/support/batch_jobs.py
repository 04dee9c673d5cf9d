"""Batch jobs in tests: a gateway with a ledger and two tenants' keys, an input file's lines,
a job submitted with the official SDK, and the job once it has ended."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import openai
import orjson

from tests.support import gateway_config, sim_backend

KEYS = {"alice": "sk-alice-0123456789", "bob": "sk-bob-0123456789"}


def config(tmp_path: Path, slots: int = 2, **sim: Any) -> dict[str, Any]:
    """One backend `big` of `slots` (a simulated engine: `sim`), a SQLite ledger, and a
    key for each tenant of KEYS."""
    raw = gateway_config(sim_backend("m", slots=slots, queue_limit=4, sim=sim))
    raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite3"), "flush_interval_s": 0.05}
    raw["auth"] = {"enabled": True, "keys": [
        {"id": name, "tenant": name, "sha256": hashlib.sha256(key.encode()).hexdigest()}
        for name, key in KEYS.items()]}
    return raw


def line(custom_id: str, url: str = "/v1/chat/completions", **body: Any) -> bytes:
    """One request of an input file: a short chat for the route `chat`."""
    body = {"model": "chat", "messages": [{"role": "user", "content": f"hi {custom_id}"}],
            "max_tokens": 4, **body}
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def jsonl(*lines: bytes) -> bytes:
    return b"\n".join(lines) + b"\n"


async def submit(client: openai.AsyncOpenAI, content: bytes, **kwargs: Any) -> Any:
    """A job of `content`, uploaded as its input file."""
    made = await client.files.create(file=("in.jsonl", content), purpose="batch")
    return await client.batches.create(input_file_id=made.id, endpoint="/v1/chat/completions",
                                       completion_window="24h", **kwargs)


async def ended(client: openai.AsyncOpenAI, batch_id: str, within_s: float = 20) -> Any:
    """The job once it has ended (the API offers no signal; a client polls it too)."""
    async with asyncio.timeout(within_s):
        while True:
            job = await client.batches.retrieve(batch_id)
            if job.status in ("completed", "failed", "expired", "cancelled"):
                return job
            await asyncio.sleep(0.02)
