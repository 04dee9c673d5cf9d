"""`slotgate demo`: ten people, three slots. N concurrent streams at a gateway, watched live.

States and counts only, never prompts or completions, all from the gateway's own signals
(headers, SSE queue comments, 429s) read by aiohttp (the SDKs hide the queue comments).
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

import aiohttp
import orjson

from router.tools.run import loop_factory

if TYPE_CHECKING:
    from router.app import RunningGateway

SIMPLE = (
    "Say hello to a new colleague in one friendly sentence.",
    "Rewrite more politely: 'send me the report now'.",
    "Translate into French: 'Where is the train station?'",
    "Write a one-line greeting for a birthday card.",
)
HARD = (
    "Write a Python function that merges overlapping intervals, with unit tests.",
    "Prove that the square root of 2 is irrational, step by step.",
    "Train A leaves at 9:40 at 80 km/h, train B at 10:10 at 110 km/h on the same line. "
    "When does B catch up? Reason step by step.",
    "Design an LRU cache with O(1) get and put, then implement it in Rust.",
)
_FRAME_S = 0.1  # the live table's redraw period
_COLORS = {"queued": "33", "running": "36", "done": "32", "rejected": "35", "error": "31"}


class State(enum.StrEnum):
    SENT = "sent"
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    REJECTED = "rejected"  # HTTP 429 before any stream began
    ERROR = "error"


FINAL = frozenset({State.DONE, State.REJECTED, State.ERROR})


@dataclass(slots=True)
class Row:
    """One request as the client saw it."""

    request_id: str
    kind: str  # simple | hard
    prompt: str
    sent_at: float = 0.0
    state: State = State.SENT
    backend: str | None = None
    reason: str | None = None  # the route reason: primary | fallback:overflow | fallback:simple:...
    queued: bool = False
    positions: list[int] = field(default_factory=list)  # every queue position announced
    etas: list[float] = field(default_factory=list)  # the eta_s of each announcement
    queue_wait_ms: float | None = None
    ttft_s: float | None = None
    tokens: int = 0  # content chunks received
    ended_at: float | None = None
    status: int | None = None
    retry_after: str | None = None
    error: str | None = None

    def describe(self) -> str:
        if self.state is State.QUEUED:
            return (f"queued at position {self.positions[-1]} on {self.backend}, eta "
                    f"{self.etas[-1]:.1f}s" if self.positions else f"queued on {self.backend}")
        if self.state is State.RUNNING:
            return f"running on {self.backend}" + _why(self.reason)
        if self.state is State.DONE:
            return f"done on {self.backend}"
        if self.state is State.REJECTED:
            return f"rejected 429 (retry after {self.retry_after or '?'} s)"
        if self.state is State.ERROR:
            status = f" {self.status}" if self.status not in (None, 200) else ""
            return f"error{status} {self.error or ''}".rstrip()
        return "sent"


@dataclass(slots=True)
class DemoResult:
    model: str
    rows: list[Row]
    started_at: float = 0.0
    peak: Counter[str] = field(default_factory=Counter)  # most running at once, per backend
    on_change: Callable[[Row], None] | None = None  # told of every state or position change
    _running: Counter[str] = field(default_factory=Counter)

    def move(self, row: Row, state: State, now: float) -> None:
        """Change a row's state, keeping the client-side count of who runs where."""
        if row.state is State.RUNNING and row.backend:
            self._running[row.backend] -= 1
        row.state = state
        if state is State.RUNNING and row.backend:
            self._running[row.backend] += 1
            self.peak[row.backend] = max(self.peak[row.backend], self._running[row.backend])
        if state in FINAL:
            row.ended_at = now
        self.changed(row)

    def changed(self, row: Row) -> None:
        if self.on_change is not None:
            self.on_change(row)

    def count(self, state: State) -> int:
        return sum(row.state is state for row in self.rows)


def plan_demo(model: str = "llama-70b", requests: int = 10, seed: int | None = None
              ) -> DemoResult:
    """The requests to send: an even mix of simple and hard prompts in random order."""
    rng = random.Random(seed)
    kinds = (["simple", "hard"] * requests)[:requests]
    rng.shuffle(kinds)
    rows = [Row(f"demo-{i}", kind, rng.choice(SIMPLE if kind == "simple" else HARD))
            for i, kind in enumerate(kinds, 1)]
    return DemoResult(model, rows)


async def run_demo(url: str, demo: DemoResult, max_tokens: int = 60) -> DemoResult:
    """Send every planned request at once and follow each to its end."""
    demo.started_at = asyncio.get_running_loop().time()
    base = url.rstrip("/").removesuffix("/v1")
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        async with asyncio.TaskGroup() as tasks:
            for row in demo.rows:
                tasks.create_task(_follow(session, base, demo, row, max_tokens))
    return demo


async def _follow(session: aiohttp.ClientSession, url: str, demo: DemoResult, row: Row,
                  max_tokens: int) -> None:
    loop = asyncio.get_running_loop()
    body = {"model": demo.model, "messages": [{"role": "user", "content": row.prompt}],
            "stream": True, "max_tokens": max_tokens}
    headers = {"Content-Type": "application/json", "X-Request-Id": row.request_id}
    row.sent_at = loop.time()
    try:
        async with session.post(url + "/v1/chat/completions", data=orjson.dumps(body),
                                headers=headers) as resp:
            row.status, got = resp.status, resp.headers
            if resp.status != 200:
                row.retry_after = got.get("Retry-After")
                row.error = got.get("x-slotgate-reject-reason") or _error_code(await resp.read())
                demo.move(row, State.REJECTED if resp.status == 429 else State.ERROR,
                          loop.time())
                return
            row.backend = got.get("x-slotgate-backend")
            row.reason = got.get("x-slotgate-route-reason")
            wait = got.get("x-slotgate-queue-wait-ms")
            row.queued = wait is None  # a stream that must wait gets its headers at once
            row.queue_wait_ms = None if wait is None else float(wait)
            demo.move(row, State.QUEUED if row.queued else State.RUNNING, loop.time())
            async for raw in resp.content:
                _on_line(demo, row, raw.rstrip(b"\r\n"), loop.time())
            if row.state not in FINAL:
                row.error = "stream ended without [DONE]"
                demo.move(row, State.ERROR, loop.time())
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # ValueError: bad JSON
        row.error = type(exc).__name__
        demo.move(row, State.ERROR, loop.time())


def _on_line(demo: DemoResult, row: Row, line: bytes, now: float) -> None:
    if line.startswith(b": queue "):
        fields = _fields(line)
        position, eta = int(fields.get("position", "0")), float(fields.get("eta_s", "0"))
        if position > 0 and (not row.positions or row.positions[-1] != position
                             or row.etas[-1] != eta):
            row.positions.append(position)
            row.etas.append(eta)
            demo.changed(row)
    elif line.startswith(b": slot granted "):
        fields = _fields(line)
        row.backend = fields.get("backend", row.backend)
        row.reason = fields.get("reason", row.reason)
        row.queue_wait_ms = float(fields.get("queue_wait_ms", "0"))
        demo.move(row, State.RUNNING, now)
    elif line.startswith(b"data:") and row.state not in FINAL:
        data = line[5:].strip()
        event = None if data == b"[DONE]" else orjson.loads(data)
        if event is None:  # seen before EOF, so before the gateway frees the slot
            demo.move(row, State.DONE, now)
        elif isinstance(event, dict) and "error" in event:
            row.error = _error_code(data)
            demo.move(row, State.ERROR, now)
        elif isinstance(event, dict) and any(
                choice.get("delta", {}).get("content") for choice in event.get("choices", ())):
            row.tokens += 1
            if row.ttft_s is None:
                row.ttft_s = now - row.sent_at


def _fields(line: bytes) -> dict[str, str]:
    words = line.decode(errors="replace").split()
    return dict(word.split("=", 1) for word in words if "=" in word)


def _error_code(body: bytes) -> str:
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return "unreadable error body"
    if isinstance(error, dict):
        return str(error.get("code") or error.get("type") or "error")
    return "error"


def table_lines(demo: DemoResult, now: float, color: bool = False) -> list[str]:
    width = max([7, *(len(row.request_id) for row in demo.rows)])
    lines = [f"{'request':<{width}}  kind    {'state':<48} {'eta':>7} {'wait':>7} "
             f"{'TTFT':>7} {'tokens':>6} {'elapsed':>7}"]
    for row in demo.rows:
        state, told = f"{row.describe():<48}", row.etas[0] if row.etas else None
        if color and row.state.value in _COLORS:
            state = f"\x1b[{_COLORS[row.state.value]}m{state}\x1b[0m"
        end = row.ended_at if row.ended_at is not None else now
        wait = row.queue_wait_ms / 1000 if row.queue_wait_ms is not None else (
            now - row.sent_at if row.state is State.QUEUED else None)
        lines.append(f"{row.request_id:<{width}}  {row.kind:<6}  {state} {_secs(told):>7} "
                     f"{_secs(wait):>7} {_secs(row.ttft_s):>7} {row.tokens:>6} "
                     f"{_secs(end - row.sent_at):>7}")
    return lines


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def summary_lines(demo: DemoResult) -> list[str]:
    queued = [row for row in demo.rows if row.queued]
    lines = [f"{len(demo.rows)} streaming requests to {demo.model}: {demo.count(State.DONE)} done, "
             f"{len(queued)} queued, {demo.count(State.REJECTED)} rejected (429), "
             f"{demo.count(State.ERROR)} errors"]
    if demo.peak:
        lines.append("most running at once: " + ", ".join(
            f"{backend} {n}" for backend, n in demo.peak.most_common()))
    waits = [row.queue_wait_ms for row in queued if row.queue_wait_ms is not None]
    off = sorted(abs(row.etas[0] - row.queue_wait_ms / 1000) for row in queued
                 if row.etas and row.queue_wait_ms is not None)  # the ETA told on queueing
    if waits:
        lines.append(f"queue wait of the {len(waits)} that queued: mean "
                     f"{sum(waits) / len(waits) / 1000:.2f} s, max {max(waits) / 1000:.2f} s"
                     + (f"; their first ETA was off by {off[len(off) // 2]:.2f} s at the "
                        f"median, {off[-1]:.2f} s at most" if off else ""))
    return [*lines, explain(demo)]


def _moved(reason: str | None) -> str | None:
    """'simple' or 'overflow' when the gateway sent the request to a fallback, else None."""
    if reason and reason.startswith("fallback:"):
        return reason.split(":")[1]
    return None


def _why(reason: str | None) -> str:
    moved = _moved(reason)
    if moved == "simple":
        intent, p = (reason or "").split(":")[2:4]
        return f" (simple: {intent} p={p})"
    return " (overflow)" if moved == "overflow" else ""


def explain(demo: DemoResult) -> str:
    """One sentence on what happened, derived from the rows."""
    rows, parts = demo.rows, []
    primary = next((r.backend for r in rows if r.reason == "primary" and r.backend), None)
    if primary is not None:
        crowded = any(r.queued or _moved(r.reason) or r.state is State.REJECTED for r in rows)
        peak = demo.peak[primary]
        parts.append(f"{peak} slot{'s' * (peak != 1)} on {primary}" if crowded
                     else f"{peak} ran at once on {primary}, nobody waited")
        waited = sum(r.queued and r.backend == primary for r in rows)
        if waited:
            parts.append(f"{waited} waited in its queue")
    simple = Counter(r.backend for r in rows if _moved(r.reason) == "simple" and r.backend)
    for backend, n in simple.items():
        parts.append(f"{n} simple request{'s' * (n != 1)} went to {backend} instead of waiting")
    overflowed = Counter(r.backend for r in rows if _moved(r.reason) == "overflow" and r.backend)
    for backend, n in overflowed.items():
        there = sum(r.queued and r.backend == backend for r in rows)
        parts.append(f"{n} overflowed to {backend}" + (f" ({there} queued there)" if there else ""))
    retries = sorted({int(r.retry_after) for r in rows
                      if r.state is State.REJECTED and r.retry_after and r.retry_after.isdigit()})
    if rejected := demo.count(State.REJECTED):
        span = "?" if not retries else f"{retries[0]}" + (
            f"-{retries[-1]}" if len(retries) > 1 else "")
        parts.append(f"{rejected} turned away with 429 (Retry-After {span} s)")
    errors = Counter(r.error or "unknown" for r in rows if r.state is State.ERROR)
    if errors:
        parts.append(f"{errors.total()} failed (" + ", ".join(
            f"{n} {code}" for code, n in errors.most_common()) + ")")
    return (", ".join(parts) or "no requests") + "."


class LiveTable:
    """The table redrawn in place with ANSI escapes, for a terminal."""

    def __init__(self, demo: DemoResult, out: TextIO) -> None:
        self.demo, self.out, self._drawn = demo, out, 0

    def draw(self) -> None:
        lines = table_lines(self.demo, asyncio.get_running_loop().time(), color=True)
        up = f"\x1b[{self._drawn}F" if self._drawn else ""
        self.out.write(up + "".join(line + "\x1b[K\n" for line in lines))
        self.out.flush()
        self._drawn = len(lines)

    async def run(self) -> None:
        self.out.write("\x1b[?25l")  # hide the cursor while redrawing
        try:
            while True:
                self.draw()
                await asyncio.sleep(_FRAME_S)  # a frame rate, not a synchronisation
        finally:
            self.draw()
            self.out.write("\x1b[?25h")
            self.out.flush()


async def _main(args: argparse.Namespace, out: TextIO) -> int:
    demo = plan_demo(args.model, args.requests, args.seed)
    live = not args.no_live and out.isatty()
    if not args.no_live and not live:
        def line_per_change(row: Row) -> None:
            at = asyncio.get_running_loop().time() - demo.started_at
            print(f"{at:6.2f}s  {row.request_id:<8} {row.kind:<6}  {row.describe()}", file=out,
                  flush=True)

        demo.on_change = line_per_change

    running: RunningGateway | None = None
    url: str | None = args.url
    if url is None:
        from router.app import start_gateway
        from router.config import load_config

        running = await start_gateway(load_config(None), "127.0.0.1", 0)
        url = running.url
    redraw = asyncio.create_task(LiveTable(demo, out).run()) if live else None
    try:
        await run_demo(url, demo, args.max_tokens)
    finally:
        if redraw is not None:
            redraw.cancel()
            await asyncio.gather(redraw, return_exceptions=True)
        if running is not None:
            await running.close()
    if demo.on_change is not None:
        print(file=out)
        print("\n".join(table_lines(demo, asyncio.get_running_loop().time())), file=out)
    if not args.no_live:
        print(file=out)
    print("\n".join(summary_lines(demo)), file=out)
    return 1 if demo.count(State.ERROR) else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`slotgate demo`'s flags, on its sub-command or on `demo_main`'s parser."""
    parser.description = "ten people, three slots"
    parser.add_argument("--url", help="a running gateway (default: start the embedded config)")
    parser.add_argument("--model", default="llama-70b", help="the public route name to ask for")
    parser.add_argument("--requests", type=int, default=10, help="how many concurrent streams")
    parser.add_argument("--max-tokens", type=int, default=60)
    parser.add_argument("--no-live", action="store_true", help="print only the summary")
    parser.add_argument("--seed", type=int, help="fixes the mix of prompts")
    parser.set_defaults(func=_run, parser=parser)


def demo_main(argv: list[str], out: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slotgate demo")
    add_arguments(parser)
    return _run(parser.parse_args(argv), out)


def _run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    if args.requests < 1 or args.max_tokens < 1:
        args.parser.error("--requests and --max-tokens must be at least 1")
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(_main(args, out or sys.stdout))
    except KeyboardInterrupt:
        return 130
