"""The discovered groups kept up to date (#34): every `discover.refresh_s`, each backend
with `discover` finds its replicas (router/fleet/discovery.py) and changes to them as a
reload would (router.backend.Backend.change): a replica found joins unready and gets
slots once its health check passes (router/upstream/replica_health.py); one gone takes no
new work and runs out what it holds; one drained by an admin stays out while it is found.

A group with no replica ready is cold (policies/fleet/warmup.py): its line keeps
admitting with an ETA of the warm-up left; the first request of a cold spell wakes it,
once: `discover.wake_url` is POSTed, and the desired replica counts are worked out again
at once (a scaled-to-zero backend's goes from 0 to 1). With Redis coordination each
gateway finds and checks on its own; the slots stay exact, since each replica's holders
are counted in Redis by its name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Protocol

import aiohttp
from pydantic import HttpUrl

from policies.config import BackendConfig, EndpointConfig
from policies.fleet.warmup import Warmup
from router.fleet.discovery import Found, find

if TYPE_CHECKING:
    from policies.config import Config
    from router.backend import Backend
    from router.fleet.shared_drains import SharedDrains
    from router.fleet.signals import FleetSignals
    from router.upstream.replica_health import ReplicaHealth

log = logging.getLogger("slotgate")

WAKE_TIMEOUT_S = 5.0  # the scale-up hook's bound


class Fleet(Protocol):
    """What discovery reads and changes of the gateway (router.gateway.Gateway)."""

    config: Config
    backends: dict[str, Backend]
    replica_health: ReplicaHealth
    fleet: FleetSignals | None
    drains: SharedDrains | None
    discovery: DiscoveredGroups | None


class DiscoveredGroups:
    def __init__(self, gw: Fleet) -> None:
        self.gw = gw
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._now: dict[str, asyncio.Event] = {}  # a refresh asked for before its time
        self._hooks: set[asyncio.Task[None]] = set()
        self.refreshed = asyncio.Event()  # set after each refresh (for whoever waits on one)

    def start(self) -> None:
        for name, config in self.gw.config.backends.items():
            if config.discover is not None and name not in self._tasks:
                self._now[name] = asyncio.Event()
                self._watch_cold(self.gw.backends[name])
                self._tasks[name] = asyncio.create_task(self._loop(name),
                                                        name=f"discovery-{name}")

    def _watch_cold(self, backend: Backend) -> None:
        backend.pool.watch(lambda _pool: self._cold_check(backend))

    def refresh_now(self, name: str) -> None:
        """Look again at once (a reload changed its `discover`)."""
        if name in self._now:
            self._now[name].set()

    async def close(self) -> None:
        tasks = [*self._tasks.values(), *self._hooks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self, name: str) -> None:
        while True:
            config = self.gw.config.backends.get(name)
            if config is None or config.discover is None:
                return  # removed by a reload, or no longer discovered (a restart's change)
            try:
                found = await find(config.discover)
                if found is not None:
                    await self.apply(name, config, found)
            except Exception:  # a bug here must not end discovery for good: log, go on
                log.exception("discovery of backend %s failed; the group is kept as it "
                              "was and looked up again next time", name)
            self.refreshed.set()
            self.refreshed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(config.discover.refresh_s):
                    await self._now[name].wait()
            self._now[name].clear()

    async def apply(self, name: str, declared: BackendConfig, found: list[Found]) -> None:
        """`name`'s group becomes `found` (less the replicas an admin drained)."""
        assert declared.discover is not None
        backend, discover = self.gw.backends[name], declared.discover
        _warmup_of(backend, declared)
        live = {n for n, r in backend.replicas.items() if not r.retired}
        await self._forget_drains(backend, {f.name for f in found})
        wanted = [f for f in found if f.name not in backend.drained]
        names = {f.name for f in wanted}
        endpoints = tuple(EndpointConfig(name=f.name, url=HttpUrl(f.url), slots=discover.slots,
                                         api_key_env=declared.api_key_env) for f in wanted)
        derived = declared.model_copy(update={"endpoints": endpoints,
                                              "slots": discover.slots * len(endpoints)})
        if names == live and derived == backend.config:
            return
        new, gone = names - live, live - names
        await backend.change(derived, unready=new)
        health = self.gw.replica_health
        for replica in sorted(new):
            log.info("backend %s: replica %s found at %s; checking it before it serves",
                     name, replica, backend.replicas[replica].upstream.base_url)
            backend.replicas[replica].breaker = health.add(name, replica, derived,
                                                           backend.pool, discover.check_s)
        for replica in sorted(gone):
            log.info("backend %s: replica %s is gone; it runs out what it holds", name,
                     replica)
            health.forget(name, replica)

    async def _forget_drains(self, backend: Backend, found: set[str]) -> None:
        """A drained replica no longer found is forgotten: found again later under its
        name (a pod made anew), it serves again."""
        vanished = backend.drained - found
        if vanished:
            backend.drained -= vanished
            if self.gw.drains is not None:
                await self.gw.drains.vanished(backend.name, vanished)

    def _cold_check(self, backend: Backend) -> None:
        """After each change of a discovered pool: wake a cold group at its first
        waiter; a warm one is ready for its next cold spell."""
        pool, warmup = backend.pool, backend.pool.cold
        if warmup is None:
            return
        if pool.capacity:
            warmup.warmed()
        elif pool.queued and warmup.wake(time.monotonic()):
            log.warning("backend %s is cold (no replica ready): waking it for %d waiting",
                        backend.name, pool.queued)
            if self.gw.fleet is not None:
                self.gw.fleet.wake(backend.name)  # scaled to zero: it asks for one now
            url = self.gw.config.backends[backend.name].discover
            if url is not None and url.wake_url is not None:
                hook = asyncio.ensure_future(_wake(str(url.wake_url), backend.name,
                                                   pool.queued))
                self._hooks.add(hook)
                hook.add_done_callback(self._hooks.discard)


def _warmup_of(backend: Backend, declared: BackendConfig) -> None:
    """The pool's warm-up settings, as the config says now (a spell's wake is kept)."""
    discover = declared.discover
    assert discover is not None
    warmup = backend.pool.cold
    if warmup is None:
        backend.pool.cold = Warmup(discover.warmup_s, discover.warmup_timeout_s,
                                   discover.slots)
    else:
        warmup.warmup_s, warmup.timeout_s = discover.warmup_s, discover.warmup_timeout_s
        warmup.slots = discover.slots


async def _wake(url: str, backend: str, queued: int) -> None:
    """The scale-up hook: POST {"backend", "queued"}; a failure is logged, not retried
    (the desired-replicas gauge says the same)."""
    try:
        timeout = aiohttp.ClientTimeout(total=WAKE_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.post(
                url, json={"backend": backend, "queued": queued, "desired": 1}) as resp:
            await resp.read()
            if resp.status >= 300:
                log.warning("the wake hook of backend %s answered %d", backend, resp.status)
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("the wake hook of backend %s failed: %s", backend, type(exc).__name__)


def start_discovery(gw: Fleet) -> None:
    """Keep the groups with `discover` current; again after a reload, for a backend it
    added."""
    if not any(b.discover is not None for b in gw.config.backends.values()):
        return
    if gw.discovery is None:
        gw.discovery = DiscoveredGroups(gw)
    gw.discovery.start()
