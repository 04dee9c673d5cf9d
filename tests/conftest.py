"""Shared fixtures: real gateways on loopback ports over simulated engines; raw engines and
a pool for the upstream client's tests; local and redis pools for the slot pools' contract.

Every integration test ends with `await assert_idle(gw)`: no slot held, no ticket queued.
Plain helpers live in tests/support/.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from policies.config import QueueOrder, SimulatedSpec
from router.app import RunningGateway, start_gateway
from router.config import config_from_dict
from router.upstream.client import HttpPool
from router.upstream.simulated.app import RunningSim, start_simulator
from tests.support import (
    REQUIRE_ALL,
    RedisServer,
    SdkClients,
    StartGateway,
    closed_port,
    require_program,
)
from tests.support.anthropic import AnthropicClients
from tests.support.canaries import ADMIN_ENV, BACKEND_ENV, LOGGERS, Canaries
from tests.support.engines import Raw
from tests.support.pools import PoolFactory

if TYPE_CHECKING:
    from playwright.async_api import Browser

# tests/engine drives a real llama.cpp server (minutes, its own venv): `make test-engine`.
collect_ignore: list[str] = [] if os.environ.get("SLOTGATE_ENGINE") == "1" else ["engine"]
# tests/agents drives the real Claude Code and Codex CLIs (npm): `make test-agents`.
if os.environ.get("SLOTGATE_AGENTS") != "1":
    collect_ignore.append("agents")
# Debian's chromium, headless, as root, on a machine with no way out.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


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


@pytest.fixture
async def sdk() -> AsyncIterator[SdkClients]:
    """`sdk(gw, **kwargs)`: the official SDK pointed at a gateway; every client is closed."""
    clients = SdkClients()
    try:
        yield clients
    finally:
        await clients.aclose()


@pytest.fixture
async def claude() -> AsyncIterator[AnthropicClients]:
    """`claude(gw, **kwargs)`: the official Anthropic SDK pointed at a gateway."""
    clients = AnthropicClients()
    try:
        yield clients
    finally:
        await clients.aclose()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain aiohttp client, for what the SDK would not send."""
    async with aiohttp.ClientSession() as session:
        yield session


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


@pytest.fixture
async def redis_server() -> AsyncIterator[RedisServer]:
    """A private redis-server (skip, or fail under SLOTGATE_REQUIRE_ALL=1, without one)."""
    server = RedisServer(require_program("redis-server"), closed_port())
    await server.start()
    try:
        yield server
    finally:
        await server.stop(kill=True)


# -- the upstream client's tests: a raw engine and a pool ---------------------------------------


@pytest.fixture
async def raw() -> AsyncIterator[Raw]:
    raw = Raw()
    yield raw
    for task in raw.tasks:
        task.cancel()
    await asyncio.gather(*raw.tasks, return_exceptions=True)
    for server in raw.servers:
        server.close()
        await server.wait_closed()


@pytest.fixture
async def pool() -> AsyncIterator[HttpPool]:
    pool = HttpPool()
    yield pool
    await pool.close()


# -- the slot pools' contract (tests/test_pool_contract*.py) ------------------------------------


@pytest.fixture(params=["local", "local-fair", "redis", "redis-fair"])
def pool_backend(request: pytest.FixtureRequest) -> tuple[str | None, QueueOrder]:
    """(None, order) for a local pool (`-fair`: `queue_order: fair`, each waiter a tenant
    of its own); (the url of a private redis-server, order) for a shared one."""
    kind, _, order = request.param.partition("-")
    if kind == "local":
        return None, QueueOrder(order or "fifo")
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url, QueueOrder(order or "fifo")


@pytest.fixture
async def pool_factory(
        pool_backend: tuple[str | None, QueueOrder]) -> AsyncIterator[PoolFactory]:
    factory = PoolFactory(*pool_backend)
    try:
        yield factory
    finally:
        await factory.close()
    assert not factory.violations, f"states outside the bounds: {factory.violations}"


@pytest.fixture
async def redis_factory(redis_server: RedisServer) -> AsyncIterator[PoolFactory]:
    """Shared pools only: for what needs two replicas for real."""
    factory = PoolFactory(redis_server.url)
    try:
        yield factory
    finally:
        await factory.close()
    assert not factory.violations, f"states outside the bounds: {factory.violations}"


# -- the secrets canary (tests/test_secrets*.py) ------------------------------------------------


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> Canaries:
    made = Canaries()
    monkeypatch.setenv(ADMIN_ENV, made.admin)
    monkeypatch.setenv(BACKEND_ENV, made.backend)
    return made


@pytest.fixture
def caplog_debug(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)  # the root: every logger without a level of its own
    for name in LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


@pytest.fixture
async def engine_sim() -> AsyncIterator[RunningSim]:
    """A fast simulated engine with room for many sequences, on its own loopback port:
    only the gateways in front of it (their slots, their keys' limits) limit it."""
    sim = await start_simulator(
        SimulatedSpec(max_num_seqs=256, ttft_s=0, tokens_per_s=0, output_tokens=4), "m")
    try:
        yield sim
    finally:
        await sim.close()
