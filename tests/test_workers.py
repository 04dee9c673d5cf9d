"""`slotgate serve --workers N`: several gateway processes on one port, pools in Redis."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
from openai import AsyncOpenAI

from tests.support import SLOTGATE, RedisServer, gateway_config, sim_backend

LISTENING = re.compile(rb"\[worker (\d+)/(\d+), pid (\d+)\] slotgate listening on (http://\S+)")


async def test_workers_refuse_local_coordination() -> None:
    # The embedded config keeps its pools in the process: two workers would mean 2 x slots.
    proc = await asyncio.create_subprocess_exec(
        SLOTGATE, "serve", "--workers", "2", "--port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode == 2
    assert out == b""
    assert b"coordination.mode: local" in err
    assert b"would keep its own pools" in err and b"2 x its slots" in err
    assert b"mode: redis" in err and b"url: redis://" in err


async def test_workers_must_be_positive() -> None:
    proc = await asyncio.create_subprocess_exec(
        SLOTGATE, "serve", "--workers", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode == 2
    assert b"--workers: must be at least 1" in err


@dataclass
class Workers:
    proc: asyncio.subprocess.Process
    url: str
    port: int
    pids: dict[int, int]  # worker index -> pid
    rest: asyncio.Task[bytes]  # the rest of the output: done when every process closed it


@asynccontextmanager
async def serve_workers(tmp_path: Path, raw: dict[str, Any], count: int
                        ) -> AsyncIterator[Workers]:
    """`slotgate serve --workers count --port 0` on `raw`, until its workers all listen."""
    path = tmp_path / "slotgate.yaml"
    path.write_text(json.dumps(raw))  # JSON is YAML
    proc = await asyncio.create_subprocess_exec(
        SLOTGATE, "serve", "--config", str(path), "--port", "0", "--workers", str(count),
        cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    drain: asyncio.Task[bytes] | None = None
    pids: dict[int, int] = {}
    try:
        assert proc.stdout is not None
        seen: list[bytes] = []
        async with asyncio.timeout(60):  # the parent's word comes after every worker's
            while b"workers serving" not in (line := await proc.stdout.readline()):
                assert line, b"slotgate exited before serving:\n" + b"".join(seen)
                seen.append(line)
        drain = asyncio.create_task(proc.stdout.read())  # keep the pipe empty
        found = [m.groups() for m in map(LISTENING.search, seen) if m is not None]
        assert sorted(int(i) for i, _, _, _ in found) == list(range(1, count + 1))
        assert {int(n) for _, n, _, _ in found} == {count}
        urls = {url.decode() for _, _, _, url in found}
        assert len(urls) == 1, f"workers listen on different addresses: {urls}"
        url = urls.pop()
        pids.update({int(i): int(pid) for i, _, pid, _ in found})
        assert len(set(pids.values())) == count
        yield Workers(proc, url, int(url.rsplit(":", 1)[1]), pids, drain)
    finally:  # after a failure too: stop it all, the gentle way first
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(60):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if drain is not None:
            async with asyncio.timeout(60):
                await drain


def tcp_sockets(port: int, state: str) -> set[int]:
    """Inodes of the TCP sockets on local `port` in `state` (0A: listen, 01: established)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
                inodes.add(int(fields[9]))
    return inodes


def sockets_of(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:["):-1]))
    return inodes


def alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def exited(pid: int) -> None:
    """Wait until `pid`, a child of some other process, has terminated."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, done.set_result, None)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def stop(workers: Workers) -> None:
    """SIGTERM to the parent: every worker stops, the parent exits 0, nothing is left."""
    workers.proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(60):
        assert await workers.proc.wait() == 0
    assert [pid for pid in workers.pids.values() if alive(pid)] == []


def redis_config(redis_server: RedisServer, backend: dict[str, Any]) -> dict[str, Any]:
    raw = gateway_config(backend, server={"host": "127.0.0.1"})
    raw["coordination"] = {"mode": "redis", "url": redis_server.url}
    return raw


async def test_two_workers_share_one_port_and_stop_on_sigterm(
        tmp_path: Path, redis_server: RedisServer) -> None:
    raw = redis_config(redis_server, sim_backend("m", slots=4, queue_limit=16,
                                                 sim={"output_tokens": 3}))
    async with serve_workers(tmp_path, raw, 2) as workers:
        listening = tcp_sockets(workers.port, "0A")
        for index, pid in workers.pids.items():
            assert sockets_of(pid) & listening, f"worker {index} holds no listening socket"
        client = AsyncOpenAI(base_url=workers.url + "/v1", api_key="unused", max_retries=0)
        async with client:
            models = await client.models.list()
            assert [m.id for m in models.data] == ["chat"]
            replies = await asyncio.gather(*(
                client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": f"hi {i}"}],
                    max_tokens=3)
                for i in range(8)))
        assert [r.usage.completion_tokens if r.usage else None for r in replies] == [3] * 8
        await stop(workers)


async def test_workers_admit_no_more_than_the_slots_together(
        tmp_path: Path, redis_server: RedisServer) -> None:
    # One slot, no queue, and a request that holds it for 2 s: of 16 requests sent at once
    # over 16 connections, which the kernel spreads over both workers, exactly one is served.
    raw = redis_config(redis_server, sim_backend("m", slots=1, queue_limit=0,
                                                 sim={"ttft_s": 2, "output_tokens": 1}))
    async with serve_workers(tmp_path, raw, 2) as workers:
        client = AsyncOpenAI(base_url=workers.url + "/v1", api_key="unused", max_retries=0)
        async with client:
            results = await asyncio.gather(*(
                client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
                for _ in range(16)), return_exceptions=True)
            # The connections stay open (keep-alive): see which worker accepted which.
            established = tcp_sockets(workers.port, "01")
            served_by = sorted(i for i, pid in workers.pids.items()
                               if sockets_of(pid) & established)
        # Both workers took connections (all 16 on one: odds 2**-15); were it not so, a
        # single worker's own pool would explain the refusals below.
        assert served_by == [1, 2]
        rejected = [r for r in results if isinstance(r, openai.RateLimitError)]
        assert len(rejected) == 15, results
        await stop(workers)


async def test_a_worker_that_dies_stops_the_others(
        tmp_path: Path, redis_server: RedisServer) -> None:
    raw = redis_config(redis_server, sim_backend("m", slots=2))
    async with serve_workers(tmp_path, raw, 2) as workers:
        os.kill(workers.pids[1], signal.SIGKILL)
        async with asyncio.timeout(60):
            assert await workers.proc.wait() == 1
            rest = await workers.rest
        assert not alive(workers.pids[2])
        assert (f"worker 1/2 (pid {workers.pids[1]}) exited with code -9; stopping the "
                f"others (workers are not restarted)").encode() in rest


async def test_workers_stop_by_themselves_when_the_parent_is_killed(
        tmp_path: Path, redis_server: RedisServer) -> None:
    raw = redis_config(redis_server, sim_backend("m", slots=2))
    async with serve_workers(tmp_path, raw, 2) as workers:
        workers.proc.kill()
        await workers.proc.wait()
        async with asyncio.timeout(60):
            await asyncio.gather(*map(exited, workers.pids.values()))
