"""The load-step bench's autoscaler (bench/load_step.py): what KEDA and a Deployment would
do with the gateway's desired replica count, in a few lines.

Every `every_s` it reads `GET /admin/scaling`. A count above the replicas listed and
starting starts more: each is in service `startup_s` later (a pod pulling, loading its
model, passing its readiness probe), when it is added to the config's `endpoints` as a
`simulated:` replica and the gateway reloads it (`POST /admin/reload`). A count below
cancels replicas still starting, then removes listed ones from the config (newest first):
the reload retires them and they run out what they hold, as a preStop drain would.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml


@dataclass(frozen=True)
class Moved:
    """One change the autoscaler made: the replicas listed in the config from `at`."""

    at: float  # time.monotonic
    listed: int
    starting: int


@dataclass
class Scaler:
    url: str
    path: Path  # the config file the gateway reads again on reload
    raw: dict[str, Any]  # the config; its backend's endpoints are rewritten
    backend: str
    replica: dict[str, Any]  # one endpoint: its `simulated` engine and slots
    startup_s: float
    every_s: float
    listed: list[str] = field(default_factory=list)
    starting: list[asyncio.Task[None]] = field(default_factory=list)
    moves: list[Moved] = field(default_factory=list)
    _made: int = 0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def write(self) -> None:
        """The config file with the replicas listed now."""
        self.raw["backends"][self.backend]["endpoints"] = [
            {**self.replica, "name": name} for name in self.listed]
        self.path.write_text(yaml.safe_dump(self.raw, sort_keys=False), encoding="utf-8")

    def first(self, count: int) -> None:
        """The replicas the gateway starts with (no reload)."""
        while len(self.listed) < count:
            self.listed.append(self._name())
        self.write()
        self.moves.append(Moved(time.monotonic(), count, 0))

    async def run(self, http: aiohttp.ClientSession) -> None:
        """Read the count every `every_s` and follow it, until cancelled."""
        try:
            while True:
                async with http.get(self.url + "/admin/scaling") as resp:
                    desired = int((await resp.json())["backends"][self.backend]["desired"])
                await self.follow(http, desired)
                await asyncio.sleep(self.every_s)
        finally:
            for task in self.starting:
                task.cancel()

    async def follow(self, http: aiohttp.ClientSession, desired: int) -> None:
        while len(self.listed) + len(self.starting) < desired:
            self.starting.append(asyncio.create_task(self._start(http)))
        while self.starting and len(self.listed) + len(self.starting) > desired:
            task = self.starting.pop()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if len(self.listed) > desired:
            del self.listed[desired:]
            await self._reload(http)

    async def _start(self, http: aiohttp.ClientSession) -> None:
        await asyncio.sleep(self.startup_s)  # the pod starting
        me = asyncio.current_task()
        self.starting = [t for t in self.starting if t is not me]
        self.listed.append(self._name())
        await self._reload(http)

    async def _reload(self, http: aiohttp.ClientSession) -> None:
        async with self._lock:
            self.write()
            async with http.post(self.url + "/admin/reload") as resp:
                body = await resp.json()
                assert resp.status == 200, body
            self.moves.append(Moved(time.monotonic(), len(self.listed), len(self.starting)))

    def _name(self) -> str:
        self._made += 1
        return f"{self.backend}-pod-{self._made}"
