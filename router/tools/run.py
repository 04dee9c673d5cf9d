"""Running a server process: the event loop (uvloop when installed) and its signals.

`run_until_signal` starts a server, serves until SIGINT or SIGTERM (SIGHUP reloads what
can reload) and closes it; the commands that serve (serve, simulate, the workers) and the
tools that drive a loop (demo, loadtest) share it. No argument parsing here.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable


class Closable(Protocol):
    async def close(self) -> None: ...


@runtime_checkable
class Reloadable(Closable, Protocol):
    async def reload(self) -> None: ...


def run_until_signal(start: Callable[[], Awaitable[Closable]], where: str) -> int:
    """Start a server on uvloop (when installed), serve until SIGINT or SIGTERM, close it."""

    async def serve() -> None:
        # Handlers first: a signal that comes while starting (after "listening on" was
        # logged, say) must not kill the process; a SIGHUP then reloads once started.
        stop, hup = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, hup.set)
        running = await start()
        reloads: set[asyncio.Task[None]] = set()
        if isinstance(running, Reloadable):  # SIGHUP: reload the config file
            def reload() -> None:
                task = asyncio.ensure_future(running.reload())
                reloads.add(task)
                task.add_done_callback(reloads.discard)

            loop.add_signal_handler(signal.SIGHUP, reload)
            if hup.is_set():
                reload()
        try:
            await stop.wait()
        finally:
            await running.close()

    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(serve())
    except OSError as exc:
        print(f"slotgate: cannot listen on {where}: {exc}", file=sys.stderr)
        return 1
    return 0


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when installed (faster sockets), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
