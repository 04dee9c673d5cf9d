"""A small authoritative DNS server on loopback for the discovery tests (dnslib's server,
in a thread): A, AAAA and SRV records the test changes as it runs, NXDOMAIN for a name it
does not hold, SERVFAIL while `failing`, and an event per answered question so a test
waits for the gateway's next look instead of for time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dnslib import AAAA, QTYPE, RCODE, RR, SRV, A, DNSRecord
from dnslib.server import DNSServer


class _Quiet:
    """dnslib's logger, saying nothing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class Zone:
    def __init__(self) -> None:
        self.records: dict[tuple[str, str], list[Any]] = {}  # (name., type) -> rdata
        self.failing = False
        self.asked = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._answered: asyncio.Event | None = None
        self.port = 0

    def set_a(self, name: str, *addresses: str) -> None:
        self._set(name, "A", [A(a) for a in addresses])

    def set_aaaa(self, name: str, *addresses: str) -> None:
        self._set(name, "AAAA", [AAAA(a) for a in addresses])

    def set_srv(self, name: str, *targets: tuple[str, int]) -> None:
        """(target, port) pairs, priority 0, weight 1 each."""
        self._set(name, "SRV", [SRV(0, 1, port, target) for target, port in targets])

    def _set(self, name: str, kind: str, rdata: list[Any]) -> None:
        with self._lock:
            key = (name.rstrip(".") + ".", kind)
            if rdata:
                self.records[key] = rdata
            else:
                self.records.pop(key, None)

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        reply = request.reply()
        name, kind = str(request.q.qname), QTYPE[request.q.qtype]
        with self._lock:
            if self.failing:
                reply.header.rcode = RCODE.SERVFAIL
            elif not any(n == name for n, _ in self.records):
                reply.header.rcode = RCODE.NXDOMAIN
            for rdata in self.records.get((name, kind), ()):
                reply.add_answer(RR(name, getattr(QTYPE, kind), rdata=rdata, ttl=0))
            self.asked += 1
        if self._loop is not None and self._answered is not None:
            self._loop.call_soon_threadsafe(self._answered.set)
        return reply

    async def next_question(self, within_s: float = 10.0) -> None:
        """Until the server answers its next question."""
        assert self._answered is not None
        self._answered.clear()
        async with asyncio.timeout(within_s):
            await self._answered.wait()

    async def next_questions(self, count: int, within_s: float = 10.0) -> None:
        """Until `count` more questions are answered (whole looks of the gateway)."""
        target = self.asked + count
        async with asyncio.timeout(within_s):
            while self.asked < target:
                await self.next_question(within_s)

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextmanager
def serving(zone: Zone) -> Iterator[Zone]:
    """`zone` answering on a free UDP port of 127.0.0.1 until the block ends."""
    zone._loop = asyncio.get_running_loop()
    zone._answered = asyncio.Event()
    server = DNSServer(zone, address="127.0.0.1", port=0, logger=_Quiet())
    zone.port = server.server.server_address[1]
    server.start_thread()
    try:
        yield zone
    finally:
        server.server.shutdown()
        server.server.server_close()
