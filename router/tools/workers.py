"""`slotgate serve --workers N`: N gateway processes on one port (SO_REUSEPORT).

The parent validates the config, reserves the port, starts the workers ("spawn": fresh
interpreters that each run the ordinary single-process serve path), and supervises them:
SIGINT or SIGTERM is passed on to every worker as SIGTERM; a worker that dies on its own
stops the others and the parent exits 1. Workers are never restarted. A worker whose
parent is gone (even killed with SIGKILL) stops by itself.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType

from policies.config import Config, CoordinationMode, RedisDown
from router.telemetry import logs
from router.tools.run import Closable, run_until_signal

log = logging.getLogger("slotgate.workers")

STOP_GRACE_S = 10.0  # beyond server.shutdown_timeout_s, before a worker is killed


def refusal(config: Config, count: int) -> str | None:
    """Why `count` workers cannot share this config's slot pools, or None when they can."""
    if count == 1 or config.coordination.mode is CoordinationMode.REDIS:
        return None
    return (
        f"slotgate serve: --workers {count} needs shared slot pools, but this config has "
        f"coordination.mode: {config.coordination.mode.value}.\n"
        f"Each worker process would keep its own pools, so every backend would admit "
        f"{count} x its slots.\n"
        "Fix: share the pools through Redis in the config file:\n"
        "  coordination:\n"
        "    mode: redis\n"
        "    url: redis://127.0.0.1:6379/0\n"
        "or run a single process (leave out --workers)."
    )


def serve_workers(config: Config, host: str | None, port: int | None, level: str,
                  count: int, path: str | None = None) -> int:
    """Run `count` workers until SIGINT or SIGTERM: 0 when all stop cleanly, else 1 or 2.
    SIGHUP is passed on: each worker reloads `path` (None: the embedded config)."""
    reason = refusal(config, count)
    if reason is not None:
        print(reason, file=sys.stderr)
        return 2
    coordination = config.coordination
    if (coordination.on_redis_down is RedisDown.FAIL_OPEN_LOCAL
            and coordination.expected_replicas < count):
        log.warning("coordination.expected_replicas is %d but --workers is %d: while Redis is "
                    "down each worker admits slots / %d on its own",
                    coordination.expected_replicas, count, coordination.expected_replicas)
    host = host if host is not None else config.server.host
    port = port if port is not None else config.server.port
    try:
        hold = _reserve(host, port)
    except OSError as exc:
        print(f"slotgate: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    port = hold.getsockname()[1]  # the one port every worker binds, even for --port 0
    ctx = multiprocessing.get_context("spawn")
    workers: list[_Worker] = []
    failed = True
    with hold, _Wakeup() as wakeup:
        try:
            for index in range(1, count + 1):
                workers.append(_Worker.start(ctx, config, host, port, level, index, count,
                                             path))
            failed = _supervise(workers, wakeup, hold, f"http://{host}:{port}")
        finally:  # also when starting one failed: never leave a worker behind
            stop_failed = _stop(workers, config.server.shutdown_timeout_s + STOP_GRACE_S)
    return 1 if failed or stop_failed else 0


def _reserve(host: str, port: int) -> socket.socket:
    """Bind (never listen) with SO_REUSEPORT: the port is ours until the workers listen."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass
class _Worker:
    index: int
    count: int
    process: BaseProcess
    link: Connection  # "listening" comes over it; EOF at the other end when one side dies
    listening: bool = False
    stopped: bool = False  # sent SIGTERM by us: dying of it is a clean stop

    @classmethod
    def start(cls, ctx: multiprocessing.context.SpawnContext, config: Config, host: str,
              port: int, level: str, index: int, count: int, path: str | None) -> _Worker:
        ours, theirs = ctx.Pipe()
        process = ctx.Process(target=run_worker, name=f"slotgate-worker-{index}",
                              args=(config, host, port, level, index, count, theirs, path))
        process.start()
        theirs.close()  # only the worker holds its end now
        return cls(index, count, process, ours)

    def __str__(self) -> str:
        return f"worker {self.index}/{self.count} (pid {self.process.pid})"

    def terminate(self) -> None:
        if self.process.exitcode is None:
            self.stopped = True
            self.process.terminate()


def _supervise(workers: list[_Worker], wakeup: _Wakeup, hold: socket.socket, url: str) -> bool:
    """Wait for a stop signal (False) or a worker that exits on its own (True)."""
    while True:
        waiting = [w.link for w in workers if not w.listening and not w.link.closed]
        sentinels = {w.process.sentinel: w for w in workers}
        ready = wait([wakeup.reader, *waiting, *sentinels])
        if wakeup.reader in ready:
            if wakeup.drain() == {signal.SIGHUP}:
                log.info("slotgate: reloading the config in %d workers", len(workers))
                for w in workers:
                    if w.process.pid is not None and w.process.exitcode is None:
                        os.kill(w.process.pid, signal.SIGHUP)
                continue
            log.info("slotgate: stopping %d workers", len(workers))
            return False
        for w in workers:
            if w.link in ready:
                try:
                    w.listening = w.link.recv()
                except EOFError:  # it died before listening: its sentinel says so
                    w.link.close()
                if all(w.listening for w in workers):
                    hold.close()  # every worker listens: the reservation is done
                    pids = ", ".join(str(w.process.pid) for w in workers)
                    log.info("slotgate: %d workers serving %s (pids %s)", len(workers), url,
                             pids)
        for sentinel, w in sentinels.items():
            if sentinel in ready:
                w.process.join()
                log.error("slotgate: %s exited with code %s; stopping the others "
                          "(workers are not restarted)", w, w.process.exitcode)
                return True


def _stop(workers: list[_Worker], grace_s: float) -> bool:
    """SIGTERM every live worker, wait up to grace_s, kill what is left; True if any failed."""
    for w in workers:
        w.terminate()
    deadline = time.monotonic() + grace_s
    failed = False
    for w in workers:
        w.process.join(max(0.0, deadline - time.monotonic()))
        if w.process.exitcode is None:
            log.error("slotgate: %s did not stop within %g s; killing it", w, grace_s)
            w.process.kill()
            w.process.join()
        clean = (0, -signal.SIGTERM) if w.stopped else (0,)  # SIGTERM'd while starting
        failed = failed or w.process.exitcode not in clean
        w.link.close()
    return failed


class _Wakeup:
    """SIGINT and SIGTERM wake the supervisor through a socket instead of interrupting it."""

    def __init__(self) -> None:
        self.reader, self._writer = socket.socketpair()
        for end in (self.reader, self._writer):
            end.setblocking(False)

    def __enter__(self) -> _Wakeup:
        self._old_fd = signal.set_wakeup_fd(self._writer.fileno())
        self._old = {sig: signal.signal(sig, _ignore)
                     for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        return self

    def __exit__(self, *_: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._old_fd)
        self.reader.close()
        self._writer.close()

    def drain(self) -> set[int]:
        """The signals that arrived (the wake-up fd carries one byte per signal number)."""
        try:
            return set(self.reader.recv(4096))
        except BlockingIOError:
            return set()


def _ignore(sig: int, frame: FrameType | None) -> None:
    """The signal is already in the wake-up socket."""


def run_worker(config: Config, host: str, port: int, level: str, index: int, count: int,
               link: Connection, path: str | None = None) -> None:
    """One worker (in its own process): the single-process serve path on a shared port."""
    # Ctrl-C reaches every process in the terminal's group; the parent turns it into SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logs.setup(level)
    tag = f"[worker {index}/{count}, pid {os.getpid()}] "
    logging.getLogger("slotgate").addFilter(_Prefix(tag))  # its own lines, not access lines

    async def start() -> Closable:
        from router.app import start_gateway

        running = await start_gateway(config, host, port, reuse_port=True, config_path=path)
        link.send(True)
        loop = asyncio.get_running_loop()

        def parent_gone() -> None:  # EOF: stop as on SIGTERM (its handler is set by now)
            loop.remove_reader(link.fileno())
            os.kill(os.getpid(), signal.SIGTERM)

        loop.add_reader(link.fileno(), parent_gone)
        return running

    sys.exit(run_until_signal(start, f"{host}:{port}"))


class _Prefix(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = f"{self.prefix}{record.msg}"
        return True
