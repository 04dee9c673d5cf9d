"""Connection floods against a `slotgate serve` process (uvloop, as in production): the
memory that unfinished heads may hold, and a slowloris under a low open-file limit."""

from __future__ import annotations

import asyncio
import resource
import signal
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from openai import AsyncOpenAI

from tests.hostile.conftest import answered
from tests.support import MESSAGES, SLOTGATE, GatewayProcess, gateway_config, sim_backend


def config(**server: Any) -> dict[str, Any]:
    return gateway_config(sim_backend("m", slots=2), server=server)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


async def test_unfinished_heads_leave_memory_flat(tmp_path: Path) -> None:
    """400 connections each sending a 2 MiB head in 16 KiB headers (each under the header
    limit) once took a `slotgate serve` process from 552 to 1,726 MiB."""
    if sys.platform != "linux":
        pytest.skip("reads /proc")
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(
        {**config(), "logging": {"access": False}}), encoding="utf-8")
    gateway = await GatewayProcess.start(path)
    try:
        host, port = gateway.url.removeprefix("http://").split(":")
        before = rss_bytes(gateway.proc.pid)
        line = b"X-Pad: " + b"a" * (16 * 1024 - 100) + b"\r\n"

        async def attack(source: str) -> bytes:
            reader, writer = await asyncio.open_connection(host, int(port),
                                                           local_addr=(source, 0))
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            try:
                for _ in range(128):  # 2 MiB, never the blank line that ends a head
                    writer.write(line)
                    await writer.drain()
            except ConnectionError:
                pass
            return await answered(reader)

        # four addresses: the per-address cap is not what stops this
        answers = await asyncio.gather(*(attack(f"127.0.0.{2 + i % 4}") for i in range(400)))
        grown = rss_bytes(gateway.proc.pid) - before
        assert all(a.startswith(b"HTTP/1.1 431 ") or a == b"<reset>" for a in answers)
        # Most hear their 431; the rest lose it to the reset that follows the server's
        # close while they still write (288 of 400 did on one busy clean run).
        assert sum(a.startswith(b"HTTP/1.1 431 ") for a in answers) >= 200
        assert grown < 150 * 1024 * 1024, grown  # each connection held at most ~64 KiB
        async with gateway.client() as client:  # and a normal client is served
            answer = await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert answer.choices[0].message.content
    finally:
        await gateway.stop(signal.SIGKILL)


async def served_or_refused(client: AsyncOpenAI) -> bool:
    """A chat answered (True), or refused for want of a place (False): a 503, or a reset
    when the refusal closed the connection before the request was read."""
    try:
        answer = await client.chat.completions.create(model="chat", messages=MESSAGES)
    except openai.InternalServerError as exc:
        assert exc.status_code == 503 and b"too_many_connections" in exc.response.content
        return False
    except openai.APIConnectionError:
        return False
    assert answer.choices[0].message.content
    return True


async def test_a_flood_under_a_low_open_file_limit_leaves_normal_clients_served(
    tmp_path: Path,
) -> None:
    """The issue's slowloris in miniature: a `slotgate serve` process limited to 256 open
    files, 300 connections from four addresses that send part of a head and stall."""
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({**config(head_timeout_s=8), "logging": {"access": False}}),
                    encoding="utf-8")

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    proc = await asyncio.create_subprocess_exec(
        SLOTGATE, "serve", "--config", str(path), "--port", "0", cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        preexec_fn=low_limit)
    assert proc.stdout is not None
    try:
        lines: list[bytes] = []
        async with asyncio.timeout(30):
            while b"listening on" not in (line := await proc.stdout.readline()):
                assert line, b"".join(lines)
                lines.append(line)
        assert any(b"at most 188 open" in line for line in lines), lines  # 256 - 64 - 2*2
        url = line.decode().split("listening on ")[1].split()[0]
        drain = asyncio.create_task(proc.stdout.read())
        host, port = url.removeprefix("http://").split(":")
        stalled = []
        for i in range(300):
            reader, writer = await asyncio.open_connection(
                host, int(port), local_addr=(f"127.0.0.{2 + i % 4}", 0))
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            stalled.append((reader, writer))
        async with AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
            # Only a head older than a tick (1 s) may be evicted for a newcomer: until the
            # oldest is, newcomers are refused. The first one served is the event awaited,
            # well before the stalled heads' deadline (8 s) could make room instead.
            async with asyncio.timeout(6):
                while not await served_or_refused(client):  # noqa: ASYNC110 - no event to wait on
                    await asyncio.sleep(0.05)  # a refused newcomer tries again
            for _ in range(2):  # served while the stalled connections fill every place
                assert await served_or_refused(client)
        answers = [await answered(reader) for reader, _ in stalled]
        refused = sum(a.startswith(b"HTTP/1.1 503 ") or a == b"<reset>" for a in answers)
        evicted = answers.count(b"")
        timed_out = sum(a.startswith(b"HTTP/1.1 408 ") for a in answers)
        assert refused + evicted + timed_out == 300, answers
        assert evicted, answers  # the newcomer's place was a stalled head's
        # never more than 188 at once: each one admitted past the cap evicted another
        assert refused + evicted >= 300 - 188, (refused, evicted)
        for _, writer in stalled:
            writer.close()
    finally:
        proc.kill()
        await proc.wait()
    drain.cancel()
