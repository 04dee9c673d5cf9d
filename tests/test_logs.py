"""The serving log handler: access lines in batches, every other line at once, in order."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterator

import pytest

from router.telemetry import logs
from router.telemetry.logs import ACCESS, BatchedLines


class Written(io.StringIO):
    """A stream that says when it was flushed."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed = asyncio.Event()

    def flush(self) -> None:
        super().flush()
        self.flushed.set()


@pytest.fixture
def loggers() -> Iterator[tuple[logging.Logger, logging.Logger]]:
    access, other = logging.getLogger(ACCESS), logging.getLogger("slotgate.logs-test")
    saved = [(lg, lg.handlers, lg.propagate, lg.level) for lg in (access, other)]
    yield access, other
    for logger, handlers, propagate, level in saved:
        logger.handlers, logger.propagate = handlers, propagate
        logger.setLevel(level)


def attach(stream: io.StringIO, loggers: tuple[logging.Logger, ...],
           max_lines: int) -> BatchedLines:
    handler = BatchedLines(stream, max_lines=max_lines, interval_s=0.05)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for logger in loggers:
        logger.handlers, logger.propagate = [handler], False
        logger.setLevel(logging.INFO)
    return handler


async def test_access_lines_wait_for_a_batch_or_the_timer(
    loggers: tuple[logging.Logger, logging.Logger],
) -> None:
    stream = Written()
    handler = attach(stream, loggers, max_lines=3)
    access, other = loggers
    access.info("a1")
    access.info("a2")
    assert stream.getvalue() == ""  # batched
    other.warning("reloaded")  # any other line goes out at once, after those before it
    assert stream.getvalue() == "a1\na2\nreloaded\n"
    for line in ("a3", "a4", "a5"):
        access.info(line)
    assert stream.getvalue().endswith("a5\n")  # a full batch
    stream.flushed.clear()
    access.info("a6")
    assert "a6" not in stream.getvalue()
    async with asyncio.timeout(5):
        await stream.flushed.wait()  # the timer writes it
    assert stream.getvalue().endswith("a5\na6\n")
    handler.close()


def test_without_a_running_loop_lines_are_written_at_once(
    loggers: tuple[logging.Logger, logging.Logger],
) -> None:
    stream = io.StringIO()
    handler = attach(stream, loggers, max_lines=100)
    loggers[0].info("at startup")
    assert stream.getvalue() == "at startup\n"
    handler.close()


class Records(logging.Handler):
    """Every record that reached it."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def test_an_access_line_needs_no_record_while_the_batching_handler_is_alone() -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logs._batched)
    try:
        handler = logs.setup("info")
        stream = handler.stream = Written()
        logs.access("alone")  # no record made: straight into the batch
        assert stream.getvalue() == ""
        records = Records()
        root.addHandler(records)  # another listener (a test's capture, an app's own)
        logs.access("heard")  # now through logging: both handlers get it
        assert records.messages == ["heard"]  # the line before made no record
        handler.flush()
        assert stream.getvalue() == "alone\nheard\n"  # one stream, in order
    finally:
        if logs._batched is not None:
            logs._batched.close()
        root.handlers, logs._batched = saved[0], saved[2]
        root.setLevel(saved[1])
