"""The `slotgate` console script as a user runs it: serve the embedded config, then stop."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path

from openai import AsyncOpenAI

from tests.support import SLOTGATE


async def test_serve_embedded_config_answers_and_stops_on_sigterm(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        SLOTGATE, "serve", "--port", "0", cwd=tmp_path,  # the ledger file goes there
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            while b"listening on" not in (line := await proc.stdout.readline()):
                assert line, "slotgate serve exited before listening"
        url = line.decode().split("listening on ")[1].split()[0]
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
            models = await client.models.list()
            assert {m.id for m in models.data} == {"llama-70b", "llama-8b", "embed-small"}
            reply = await client.chat.completions.create(
                model="llama-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
            vectors = await client.embeddings.create(model="embed-small", input="hi")
        assert reply.usage is not None and reply.usage.completion_tokens == 3
        assert len(vectors.data[0].embedding) == 384  # out of the box: make run embeds
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
        with sqlite3.connect(tmp_path / "slotgate-ledger.sqlite3") as db:  # flushed on SIGTERM
            rows = db.execute("SELECT route, status, completion_tokens, api FROM requests "
                              "ORDER BY ts").fetchall()
        assert rows == [("llama-8b", 200, 3, "chat"), ("embed-small", 200, 0, "embeddings")]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_serve_refuses_a_broken_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("backends: {}\nroutes: {}\nsurprise: 1\n")
    proc = await asyncio.create_subprocess_exec(
        SLOTGATE, "serve", "--config", str(bad),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 1
    assert b"surprise" in err and b"backends" in err
