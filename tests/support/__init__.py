"""What test modules share that is not a fixture: configs and gateways in this process,
the SDK clients, waiting for a condition (event-driven; polling only where the gateway offers
no signal), `slotgate serve` processes, ledger rows and ordered sends. Test modules import
from here (fixtures come from conftest.py), never from one another (tests/test_house.py).
Tools of one family of tests sit beside it: canaries (secrets), engines (the upstream
client's raw servers), pools (the slot-pool contract), tenants (two tenants' keys).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from policies.slots import SlotPool
from router.app import RunningGateway
from router.upstream.simulated.engine import SimEngine
from tests.support.ledger import T0 as T0
from tests.support.ledger import hand_ledger as hand_ledger
from tests.support.ledger import row as row
from tests.support.ledger import rows_of as rows_of

REQUIRE_ALL = os.environ.get("SLOTGATE_REQUIRE_ALL") == "1"

# The one chat a test sends when what it says does not matter.
MESSAGES: Any = [{"role": "user", "content": "tell me something"}]
# The `slotgate` program of this virtual environment.
SLOTGATE = str(Path(sys.executable).parent / "slotgate")
# A small valid chat request, and the header for a JSON body (the error tests).
CHAT: dict[str, Any] = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
JSON = {"Content-Type": "application/json"}


# -- gateways in this process ----------------------------------------------------------------


def require_program(name: str) -> str:
    """The path of a system program, or skip (fail under SLOTGATE_REQUIRE_ALL=1)."""
    path = shutil.which(name)
    if path is None:
        reason = f"{name} is not installed (apt-get install it, or see .ci/run)"
        if REQUIRE_ALL:
            pytest.fail(reason + "; SLOTGATE_REQUIRE_ALL=1 forbids skipping")
        pytest.skip(reason)
    return path


def sim_backend(model: str, slots: int, queue_limit: int = 0, **extra: Any) -> dict[str, Any]:
    """A backend entry over a fast simulated engine with exactly `slots` sequences."""
    sim = {"max_num_seqs": slots, "ttft_s": 0, "tokens_per_s": 0, "output_tokens": 8}
    sim.update(extra.pop("sim", {}))
    return {"simulated": sim, "model": model, "slots": slots, "queue_limit": queue_limit,
            **extra}


def gateway_config(
    primary: dict[str, Any],
    fallback: dict[str, Any] | None = None,
    overflow: str = "reject",
    server: dict[str, Any] | None = None,
) -> dict[str, Any]:
    backends = {"big": primary}
    route: dict[str, Any] = {"primary": "big", "overflow": overflow}
    if fallback is not None:
        backends["small"] = fallback
        route["fallbacks"] = ["small"]
    return {"server": server or {}, "backends": backends, "routes": {"chat": route}}


StartGateway = Callable[[dict[str, Any]], Awaitable[RunningGateway]]


def engine(gw: RunningGateway, backend: str = "big", replica: str | None = None) -> SimEngine:
    """The simulated engine of `backend` (of its `replica`, else its first)."""
    group = gw.gateway.backends[backend]
    sim = (group.replicas[replica] if replica is not None else group.first()).simulator
    assert sim is not None, f"backend {backend} is not simulated"
    engine: SimEngine = sim.engine
    return engine


def pools_of(gw: RunningGateway) -> dict[str, SlotPool]:
    """Each backend's slot pool, by name."""
    return {name: backend.pool for name, backend in gw.gateway.backends.items()}


async def wait_pools(gw: RunningGateway, predicate: Callable[[dict[str, tuple[int, int]]], bool],
                     within_s: float = 10.0) -> None:
    """Wait, without polling, until predicate({pool: (active, queued)}) holds."""
    pools = pools_of(gw)
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def check(_: object = None) -> None:
        state = {name: (p.active, p.queued) for name, p in pools.items()}
        if not done.done() and predicate(state):
            done.set_result(None)

    unwatch = [pool.watch(check) for pool in pools.values()]
    try:
        check()
        async with asyncio.timeout(within_s):
            await done
    finally:
        for stop in unwatch:
            stop()


async def assert_idle(gw: RunningGateway) -> None:
    """The closing check of every integration test: no slot held, no ticket queued."""
    try:
        await wait_pools(gw, lambda s: all(v == (0, 0) for v in s.values()), within_s=5.0)
    except TimeoutError:
        state = {n: (p.active, p.queued) for n, p in pools_of(gw).items()}
        pytest.fail(f"pools not idle: {state}")


def closed_port() -> int:
    """A loopback port that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def serve_app(app: Any) -> tuple[Any, str]:
    """Serve an aiohttp app on a free loopback port; returns (runner, base url)."""
    from aiohttp import web

    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


class RedisServer:
    """A real redis-server on a free loopback port, owned by one test: it may be stopped
    and started again on the same port (nothing is persisted)."""

    def __init__(self, program: str, port: int) -> None:
        self.program = program
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[bytes] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            self.program, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--protected-mode", "no", "--loglevel", "notice",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        assert self.proc.stdout is not None
        async with asyncio.timeout(10):  # its own word that it listens
            while b"Ready to accept connections" not in (line := await self.proc.stdout.readline()):
                assert line, "redis-server exited at start"
        self._drain = asyncio.create_task(self.proc.stdout.read())  # keep the pipe empty

    def freeze(self) -> None:
        """SIGSTOP: connections stay open, nothing is answered (a blip, not a crash)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    async def stop(self, kill: bool = False) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGCONT)  # a frozen one must run to die by TERM
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            await self.proc.wait()
        if self._drain is not None:
            await self._drain
        self.proc = self._drain = None


class SdkClients:
    """The official SDK pointed at a gateway, one client per call; the `sdk` fixture closes
    every client it built. No retries, so every status is seen."""

    def __init__(self) -> None:
        self._made: list[AsyncOpenAI] = []

    def __call__(self, gw: RunningGateway, **kwargs: Any) -> AsyncOpenAI:
        kwargs.setdefault("api_key", "sk-client-secret")
        kwargs.setdefault("max_retries", 0)
        client = AsyncOpenAI(base_url=gw.url + "/v1", **kwargs)
        self._made.append(client)
        return client

    async def aclose(self) -> None:
        while self._made:
            await self._made.pop().close()


def assert_openai_error(body: Any, kind: str, code: str | None = None) -> None:
    """`body` is an error in OpenAI's shape, of type `kind` (and `code`, if given)."""
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    assert body["error"]["type"] == kind
    if code is not None:
        assert body["error"]["code"] == code


# -- waiting ----------------------------------------------------------------------------------
# Wait for an event: `wait_pools` (the gateway's pools), `SimEngine.wait_until` (the simulated
# engine), `Changes.wait_until` (state the test itself owns). `poll_until` is the bounded
# fallback for the few facts nothing signals (an upstream connection's draining count).


class Changes:
    """Whoever changes the watched state calls `changed()`; waiters re-check then."""

    def __init__(self) -> None:
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []

    def changed(self) -> None:
        for predicate, fut in self._waiters:
            if not fut.done() and predicate():
                fut.set_result(None)

    async def wait_until(self, predicate: Callable[[], bool], within_s: float) -> None:
        if predicate():
            return
        waiter = (predicate, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(within_s):
                await waiter[1]
        finally:
            self._waiters.remove(waiter)


async def poll_until(condition: Callable[[], bool], within_s: float = 10.0,
                     every_s: float = 0.005) -> None:
    """Poll a condition the gateway offers no signal for, with a deadline. Prefer an event:
    `wait_pools`, `SimEngine.wait_until` or `Changes.wait_until`."""
    async with asyncio.timeout(within_s):
        while not condition():  # noqa: ASYNC110 - no event to wait on
            await asyncio.sleep(every_s)


# -- gateway processes ------------------------------------------------------------------------


class GatewayProcess:
    """`slotgate serve --config FILE --port 0`, its URL read from its own log; `stop()`
    also closes the SDK clients `client()` made."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str) -> None:
        self.proc = proc
        self.url = url
        self.lines: list[bytes] = []
        self._clients: list[AsyncOpenAI] = []
        self._new_line = asyncio.Event()
        self._drain = asyncio.create_task(self._read())  # keep the pipe empty

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self.lines.append(line)
            self._new_line.set()

    async def said(self, text: bytes) -> None:
        """Wait until the process logs a line containing `text`."""
        async with asyncio.timeout(30):
            while not any(text in line for line in self.lines):
                self._new_line.clear()
                await self._new_line.wait()

    @classmethod
    async def start(cls, config: Path) -> GatewayProcess:
        proc = await asyncio.create_subprocess_exec(
            SLOTGATE, "serve", "--config", str(config), "--port", "0", cwd=config.parent,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            while b"listening on" not in (line := await proc.stdout.readline()):
                assert line, "slotgate serve exited before listening"
        return cls(proc, line.decode().split("listening on ")[1].split()[0])

    def client(self) -> AsyncOpenAI:
        self._clients.append(
            AsyncOpenAI(base_url=self.url + "/v1", api_key="sk-test", max_retries=0))
        return self._clients[-1]

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal the process, wait for its exit, then close its clients (only then: a
        client closing first would end its requests before the signal does)."""
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        # A SIGTERM drains for up to server.shutdown_timeout_s (30 s by default) before it
        # cuts: a bound of the same 30 s raced the gateway's own (one run on a loaded box).
        async with asyncio.timeout(90):
            code = await self.proc.wait()
            await self._drain
        while self._clients:
            await self._clients.pop().close()
        return code


# -- the ledger -------------------------------------------------------------------------------


# -- ordered sends ----------------------------------------------------------------------------


async def drain_stream(client: openai.AsyncOpenAI, request_id: str) -> str:
    stream = await client.chat.completions.create(
        model="chat", messages=MESSAGES, stream=True,
        extra_headers={"X-Request-Id": request_id},
    )
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


async def send_in_order(
    client: openai.AsyncOpenAI, gw: RunningGateway, n: int,
    send: Callable[[openai.AsyncOpenAI, str], Coroutine[Any, Any, Any]] = drain_stream,
) -> tuple[list[asyncio.Task[Any]], list[Any]]:
    """Send n requests (streams by default; else `send(client, request_id)`) one at a
    time, each admitted or rejected before the next leaves."""
    tasks: list[asyncio.Task[Any]] = []
    rejected: list[Any] = []
    for i in range(n):
        before = sum(p.active + p.queued for p in pools_of(gw).values())
        task: asyncio.Task[Any] = asyncio.create_task(send(client, f"req-{i}"))
        tasks.append(task)

        def grew(state: dict[str, tuple[int, int]], before: int = before) -> bool:
            return sum(a + q for a, q in state.values()) > before

        admitted = asyncio.create_task(wait_pools(gw, grew))
        await asyncio.wait({task, admitted}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():  # rejected at once, or served before we looked
            admitted.cancel()
            if task.exception() is not None:
                rejected.append(task.exception())
        else:
            await admitted
    return tasks, rejected
