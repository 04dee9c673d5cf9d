"""A drain that reaches every gateway sharing the Redis coordination (#34).

The drained replicas of each backend are a Redis set (`{prefix:backend}:drained`, beside
the shared pool's keys); a drain adds its replica there and publishes the backend's name
on `<prefix>:fleet:drains`. Every gateway listens on that channel (the coordinator's one
subscription) and, on a message, reads the set again and applies it: the same local drain
as the one asked (router.fleet.drain.retire), idempotent. A gateway that missed messages
learns the set at startup, when its subscription is made again, and every
`fleet.refresh_s`. A reload listing a drained replica again takes it out of the set, and
every gateway brings it back.

A drain asked while Redis does not answer is this gateway's until Redis answers again; it
is written to the set then (as is a return asked meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from policies.slots.base import CoordinationError
from router.fleet.replicas import is_last, retire
from router.fleet.shared import key

if TYPE_CHECKING:
    from policies.config import BackendConfig
    from policies.slots.coordinator import RedisCoordinator
    from router.backend import Backend

log = logging.getLogger("slotgate.fleet")

# KEYS[1]: a backend's drained set. ARGV: SADD or SREM, the channel, the message, names.
CHANGE = """
redis.call(ARGV[1], KEYS[1], unpack(ARGV, 4))
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""
MEMBERS = "return redis.call('SMEMBERS', KEYS[1])"
# KEYS[1]: the shared pool's seats (replica -> holders). ARGV[1]: the replica.
HOLDERS = "return tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')"


class SharedDrains:
    """This gateway's part of the fleet's drains; a `Subscriber` of the coordinator."""

    def __init__(self, backends: Callable[[], Mapping[str, Backend]],
                 refresh_s: Callable[[], float], coordinator: RedisCoordinator) -> None:
        """`backends`: the gateway's now; `refresh_s`: how often to read the sets again."""
        self.backends, self.refresh_s, self.coordinator = backends, refresh_s, coordinator
        self.channel = f"{coordinator.prefix}:fleet:drains"
        coordinator.pools[self.channel.encode()] = self  # before the coordinator starts
        client = coordinator.client
        for name, text in (("fleet_change", CHANGE), ("fleet_members", MEMBERS),
                           ("fleet_holders", HOLDERS)):
            coordinator.scripts[name] = client.register_script(text)
        # Asked here while Redis did not answer: to write to the set once it does.
        self.unsent: dict[str, dict[str, str]] = {}  # backend -> replica -> SADD or SREM
        self._lock = asyncio.Lock()  # one sync at a time: a return changes the backend
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.Task[None] | None = None

    # -- the coordinator's subscription ---------------------------------------------------

    def wake(self) -> None:  # subscribed (again): messages may have been lost
        self._spawn(self.sync_all())

    def heard(self, message: bytes) -> None:  # a backend's set changed
        self._spawn(self.sync(message.decode(errors="replace")))

    # -- asked here -------------------------------------------------------------------------

    async def spread(self, backend: str, replica: str) -> None:
        """Tell every gateway (after this one's drain)."""
        await self._send(backend, {replica: "SADD"})

    async def returned(self, backend: str, drained: set[str], config: BackendConfig) -> None:
        """A reload cleared this gateway's drains: those its config lists leave the set,
        so every gateway brings them back (one not listed stays drained elsewhere: their
        configs may still list it)."""
        listed = {e.name for e in config.replicas(backend) if e.name is not None} & drained
        if listed:
            await self._send(backend, dict.fromkeys(sorted(listed), "SREM"))

    async def vanished(self, backend: str, names: set[str]) -> None:
        """Discovery no longer finds these drained replicas: they leave the set, so one
        found again later under the same name (a pod made anew) serves again."""
        await self._send(backend, dict.fromkeys(sorted(names), "SREM"))

    async def holding(self, backend: Backend, replica: str) -> int | None:
        """The requests every gateway holds on the replica (None: Redis did not answer)."""
        await backend.pool.recount()  # lapsed leases (a dead gateway's) leave first
        seats = key(self.coordinator.prefix, backend.name, "seats")
        try:
            return int(await self.coordinator.call("fleet_holders", [seats], [replica]))
        except CoordinationError:
            return None

    # -- applying the set --------------------------------------------------------------------

    async def sync_all(self) -> None:
        for name in list(self.backends()):
            await self.sync(name)

    async def sync(self, name: str) -> None:
        """Apply the backend's set here: drain what it holds, bring back what left it."""
        backend = self.backends().get(name)
        if backend is None:
            return
        async with self._lock:
            try:
                await self._flush(name)
                reply = await self.coordinator.call(
                    "fleet_members", [key(self.coordinator.prefix, name, "drained")], [])
            except CoordinationError as exc:
                log.debug("drained replicas of %s not read (%s)", name, exc)
                return
            await self._apply(backend, {m.decode(errors="replace") for m in reply})

    async def _apply(self, backend: Backend, members: set[str]) -> None:
        for replica in sorted(members - backend.drained):
            if replica not in backend.replicas:
                continue  # not in this gateway's config
            if is_last(backend, replica):
                log.warning("replica %s of %s is drained by another gateway but is the last "
                            "here in service: kept", replica, backend.name)
                continue
            retire(backend, replica)
            log.info("replica %s of %s drained (by another gateway)", replica, backend.name)
        back = backend.drained - members - set(self.unsent.get(backend.name, {}))
        if back:
            backend.drained -= back
            await backend.change(backend.config)
            log.info("replicas %s of %s back in service (a reload elsewhere)",
                     ", ".join(sorted(back)), backend.name)

    async def _send(self, backend: str, changes: dict[str, str]) -> None:
        unsent = self.unsent.setdefault(backend, {})
        unsent.update(changes)
        try:
            await self._flush(backend)
        except CoordinationError as exc:
            log.warning("Redis did not answer (%s): the drains of %s are this gateway's "
                        "until it does", exc, backend)

    async def _flush(self, backend: str) -> None:
        unsent = self.unsent.get(backend, {})
        drained = key(self.coordinator.prefix, backend, "drained")
        for op in ("SADD", "SREM"):
            names = sorted(n for n, o in unsent.items() if o == op)
            if names:
                await self.coordinator.call("fleet_change", [drained],
                                            [op, self.channel, backend, *names])
                for name in names:
                    unsent.pop(name, None)

    # -- running -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Learn the set before serving, then again every `fleet.refresh_s`."""
        await self.sync_all()
        self._loop = asyncio.create_task(self._every_look(), name="fleet-drains")

    async def _every_look(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s())
            try:
                await self.sync_all()
            except Exception:  # a bug here must not end the syncs for good: log it, go on
                log.exception("syncing the drained replicas failed; again next look")

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("syncing the drained replicas failed", exc_info=task.exception())

    async def close(self) -> None:
        tasks = {t for t in (self._loop, *self._tasks) if t is not None}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # their ends: logged by _done
