"""Shared fixtures: real gateways on loopback ports over simulated engines.

Every integration test ends with `await assert_idle(gw)`: no slot held, no ticket queued.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pytest
from openai import AsyncOpenAI

from router.app import RunningGateway, start_gateway
from router.config import config_from_dict
from router.simulated import SimEngine

if TYPE_CHECKING:
    from playwright.async_api import Browser

REQUIRE_ALL = os.environ.get("SLOTGATE_REQUIRE_ALL") == "1"
# tests/engine drives a real llama.cpp server (minutes, its own venv): `make test-engine`.
collect_ignore: list[str] = [] if os.environ.get("SLOTGATE_ENGINE") == "1" else ["engine"]
# Debian's chromium, headless, as root, on a machine with no way out.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


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


@pytest.fixture
async def start() -> AsyncIterator[StartGateway]:
    running: list[RunningGateway] = []

    async def _start(raw: dict[str, Any]) -> RunningGateway:
        gw = await start_gateway(config_from_dict(raw), "127.0.0.1", 0)
        running.append(gw)
        return gw

    yield _start
    for gw in running:
        await gw.close()


def sdk(gw: RunningGateway, **kwargs: Any) -> AsyncOpenAI:
    """The official SDK pointed at the gateway; no retries so every status is seen."""
    return AsyncOpenAI(base_url=gw.url + "/v1", api_key="sk-client-secret", max_retries=0,
                       **kwargs)


def engine(gw: RunningGateway, backend: str = "big") -> SimEngine:
    return gw.gateway.simulators[backend].engine


async def wait_pools(gw: RunningGateway, predicate: Callable[[dict[str, tuple[int, int]]], bool],
                     within_s: float = 10.0) -> None:
    """Wait, without polling, until predicate({pool: (active, queued)}) holds."""
    pools = gw.gateway.pools
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
        state = {n: (p.active, p.queued) for n, p in gw.gateway.pools.items()}
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


POSTGRES_ADMIN_URL = os.environ.get(
    "SLOTGATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A fresh, empty database on the real PostgreSQL server, dropped afterwards.

    The server is SLOTGATE_TEST_POSTGRES_URL (default: the local one, trust auth).
    """
    try:
        import asyncpg
    except ImportError:
        pytest.skip("asyncpg is not installed (pip install -e '.[test]')")
    try:
        admin = await asyncpg.connect(POSTGRES_ADMIN_URL, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        reason = f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL} ({exc})"
        if REQUIRE_ALL:
            pytest.fail(reason + "; SLOTGATE_REQUIRE_ALL=1 forbids skipping")
        pytest.skip(reason)
    name = "slotgate_test_" + os.urandom(6).hex()
    await admin.execute(f"CREATE DATABASE {name}")
    try:
        base, _, _ = POSTGRES_ADMIN_URL.rpartition("/")
        yield f"{base}/{name}"
    finally:
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        await admin.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_target(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """Where a test's ledger goes: a SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite3")
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Debian's headless Chromium driven by Playwright (never a downloaded browser)."""
    chromium = require_program("chromium")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        reason = "the playwright package is not installed (pip install playwright)"
        if REQUIRE_ALL:
            pytest.fail(reason + "; SLOTGATE_REQUIRE_ALL=1 forbids skipping")
        pytest.skip(reason)
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


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

    async def stop(self, kill: bool = False) -> None:
        if self.proc is not None and self.proc.returncode is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            await self.proc.wait()
        if self._drain is not None:
            await self._drain
        self.proc = self._drain = None


@pytest.fixture
async def redis_server() -> AsyncIterator[RedisServer]:
    """A private redis-server (skip, or fail under SLOTGATE_REQUIRE_ALL=1, without one)."""
    server = RedisServer(require_program("redis-server"), closed_port())
    await server.start()
    try:
        yield server
    finally:
        await server.stop(kill=True)
