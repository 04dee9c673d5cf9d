"""Logging for `slotgate serve`: plain lines on stderr, cheap enough for one access line
per request.

Two costs of the standard setup dominate at thousands of requests per second: building
each record (the caller's frame, thread and process names) and one write system call per
line (stderr is line-buffered). So, as the logging HOWTO's "Optimization" section allows,
records skip the caller, thread and process lookups (no format here uses them), and access
lines are written in batches: when `max_lines` are waiting, at least every `interval_s` (a
timer on the running event loop), before any other line, and at exit. Every other line
(startup, reloads, warnings) is written at once. A process killed outright loses at most
`interval_s` of access lines; the ledger still has those requests.

An access line need not be a record at all: `access(line)` hands it straight to the
batching handler while that handler is the only one listening (`slotgate serve`'s setup:
no other handler, no filter), and sends it through `logging` otherwise (a test's capture,
an application embedding the gateway with handlers of its own). Same line, same batches,
a fifth of the calls.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
from typing import TextIO

FORMAT = "%(message)s"
ACCESS = "slotgate.access"  # the logger whose lines are batched


class BatchedLines(logging.Handler):
    """Formats each record at once; writes access lines in batches (see the module doc)."""

    def __init__(self, stream: TextIO | None = None, max_lines: int = 256,
                 interval_s: float = 0.1) -> None:
        super().__init__()
        self.stream = stream or sys.stderr
        self.max_lines = max_lines
        self.interval_s = interval_s
        self._lines: list[str] = []
        self._timer: asyncio.TimerHandle | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append(self.format(record))
        except Exception:  # logging's contract: report it, never raise
            self.handleError(record)
            return
        if record.name != ACCESS or len(self._lines) >= self.max_lines:
            self.flush()
        elif self._timer is None:
            self._later()

    def add(self, line: str) -> None:
        """An access line with no record made for it (`access`), batched as `emit` does
        (under the handler's lock, as `handle` takes it)."""
        with self.lock:  # type: ignore[union-attr]  # (made in Handler.__init__)
            lines = self._lines
            lines.append(line)
            if len(lines) >= self.max_lines:
                self.flush()
            elif self._timer is None:
                self._later()

    def _later(self) -> None:
        """Write the waiting lines `interval_s` from now (at once with no loop running)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (startup, another thread): write now
            self.flush()
            return
        self._timer = loop.call_later(self.interval_s, self._flush_from_timer)

    def _flush_from_timer(self) -> None:
        self._timer = None
        self.acquire()
        try:
            self.flush()
        finally:
            self.release()

    def flush(self) -> None:
        if not self._lines:
            return
        text = "\n".join(self._lines) + "\n"
        self._lines.clear()
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: nothing else to tell
            pass

    def close(self) -> None:
        self.acquire()
        try:
            self.flush()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        finally:
            self.release()
        super().close()


_access = logging.getLogger(ACCESS)
_root = logging.getLogger()
_batched: BatchedLines | None = None  # the handler `setup` installed


def access(line: str) -> None:
    """Write one access line (the caller has checked that INFO is enabled for it)."""
    handlers, batched = _root.handlers, _batched
    if (batched is not None and len(handlers) == 1 and handlers[0] is batched
            and not (_access.handlers or _access.filters or _root.filters or batched.filters)):
        batched.add(line)
    else:
        _access.info(line)


def setup(level: str) -> BatchedLines:
    """Log at `level` to stderr through one batching handler; returns it."""
    global _batched
    logging._srcfile = None  # no caller lookup per record
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = BatchedLines()
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    atexit.register(handler.close)
    _batched = handler
    return handler
