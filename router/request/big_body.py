"""Request bodies of a mebibyte or more: parsed off the event loop, one at a time (and
dumped for the engine there too), and the heap they took handed back to the system once
the last of them has ended.

orjson holds the GIL while it parses, so a thread does not make a parse free: the loop
still waits for the longest single C call of it (orjson's parse, a numpy pass of the
bounds check, the translation's copy: about 10 ms each for 7 MiB), but no longer for the
whole parse and translation (100 ms and more). Big parses run one at a time on one thread,
so the loop contends for the GIL with that thread alone; those waiting queue here, their
bytes already counted in the process's body bound. While one runs, the interpreter's
switch interval is 0.5 ms (from 5): a loop thread back from a system call waits that long
at most for the GIL, not 5 ms per call. glibc keeps what large bodies freed in
its arenas (its mmap threshold grows past them); `malloc_trim` returns it, on the same
thread (ctypes lets the GIL go meanwhile) once no big body is held.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

BIG_BODY = 1 << 20  # bytes from which a body is parsed off the loop
_SWITCH_S = 0.0005  # the switch interval while a big parse runs
T = TypeVar("T")


def _trimmer() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None elsewhere (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return trim


class BigBodies:
    """The thread big bodies are parsed on, and how many are held now."""

    def __init__(self) -> None:
        self._thread: ThreadPoolExecutor | None = None  # started with the first big body
        self._trim = _trimmer()
        self.can_trim = self._trim is not None  # glibc
        self.held = 0  # requests with a big body, not yet ended
        self.parsing = 0  # parses submitted and not yet done
        self._switch = 0.0  # the interval before the first of them
        self.parsed = 0  # big bodies parsed off the loop so far
        self.worked = 0  # works done on the thread so far: the parses and the dumps
        self.trims = 0

    def _pool(self) -> ThreadPoolExecutor:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="slotgate-big-body")
        return self._thread

    async def parse(self, parse: Callable[..., T], raw: bytes, *args: object) -> T:
        """`parse(raw, *args)` on the big bodies' thread (counted held until `ended`)."""
        self.held += 1
        self.parsed += 1
        return await self.off_loop(parse, raw, *args)

    async def off_loop(self, work: Callable[..., T], *args: object) -> T:
        """`work(*args)` on the big bodies' thread: more of a big body's work (its dump
        for the engine), queued behind the parses."""
        self.worked += 1
        if self.parsing == 0:
            self._switch = sys.getswitchinterval()
            sys.setswitchinterval(min(self._switch, _SWITCH_S))
        self.parsing += 1
        done = asyncio.get_running_loop().run_in_executor(self._pool(), work, *args)
        done.add_done_callback(self._parsed)  # (also when its request is cancelled)
        return await done

    def _parsed(self, _: object) -> None:
        self.parsing -= 1
        if self.parsing == 0:
            sys.setswitchinterval(self._switch)

    def ended(self) -> None:
        """A request whose body went through `parse` has ended (in its finally)."""
        self.held -= 1
        if self.held == 0 and self._trim is not None and self._thread is not None:
            self._thread.submit(self._trimmed)

    def _trimmed(self) -> None:
        if self._trim is not None and self.held == 0:
            self._trim(0)
            self.trims += 1

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
