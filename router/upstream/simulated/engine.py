"""The simulated engine's model: continuous batching over `max_num_seqs` sequences with TTFT,
prefill and decode timing, plus test controls (hold/release, injected faults, per-request
records). It writes the answers; `router.upstream.simulated.app` serves it. It never logs content.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from aiohttp import web

from policies.config import SimulatedSpec
from router.upstream.simulated import tools
from router.upstream.simulated.cache import PrefixCache
from router.upstream.simulated.embed import EmbedPlan, answer
from router.upstream.simulated.reply import Plan, ending, frames
from router.upstream.simulated.text import WORD_JSON, WORDS, Stopped, cut

_MAX_RECORDS = 10_000
# An engine's own stream headers (as vLLM sends them), not the gateway's (router.common.sse).
_ENGINE_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class FaultMode(enum.StrEnum):
    REFUSE = "refuse"  # close the TCP connection without any response
    ERROR_500 = "error_500"  # answer 500 (OpenAI-shaped); the next health check fails too
    # 500 for a request the engine chokes on while it stays healthy (its checks pass)
    REQUEST_500 = "request_500"
    HANG = "hang"  # accept and never answer
    DROP = "drop"  # streams: headers and the first token, then abort; else abort at once


@dataclass(slots=True)
class SimRecord:
    request_id: str
    stream: bool
    prompt_tokens: int
    completion_tokens: int
    started_at: float
    first_token_at: float | None = None
    ended_at: float | None = None
    completed: bool = False
    aborted: bool = False  # the client went away before completion
    fault: FaultMode | None = None
    cached_tokens: int = 0  # prompt tokens the prefix cache spared the prefill
    planned_ttft_s: float | None = None  # the wait before the first token, once scheduled
    traceparent: str | None = None  # the W3C trace context it came with, if any
    tracestate: str | None = None
    baggage: str | None = None


class SimEngine:
    """At most `max_num_seqs` sequences generate at once; later requests wait FIFO for one."""

    def __init__(self, spec: SimulatedSpec, model: str) -> None:
        self.spec = spec
        self.model = model
        self.active = 0  # HTTP handlers in flight, including those waiting for a sequence
        self.peak = 0
        self.running = 0  # sequences generating
        self.held = 0  # generations paused at a hold
        self.records: dict[str, SimRecord] = {}
        self._queue: deque[asyncio.Future[None]] = deque()
        self._hold_after: int | None = None  # pause generations at this many tokens
        self._gate = asyncio.Event()  # set to let paused generations re-check the hold
        self._faults: deque[tuple[FaultMode, int]] = deque()  # (mode, requests left)
        self.sick = False  # the next GET /v1/models fails (an ERROR_500 answer sets it)
        self._waiters: list[tuple[Callable[[SimEngine], bool], asyncio.Future[None]]] = []
        self._rng = random.Random(spec.seed)
        self._ids = itertools.count(1)
        self.cache = (PrefixCache(spec.prefix_cache_tokens, spec.cache_block_tokens)
                      if spec.prefix_cache_tokens else None)

    @property
    def waiting(self) -> int:
        """Requests waiting for a sequence."""
        return len(self._queue)

    def hold(self, after_tokens: int = 0) -> None:
        """Pause every generation, running or new, once it has emitted `after_tokens` tokens."""
        self.release()  # generations paused by an earlier hold re-check against this one
        self._hold_after = max(0, after_tokens)
        self._changed()

    def release(self) -> None:
        self._hold_after = None
        self._gate.set()
        self._gate = asyncio.Event()
        self._changed()

    def inject_fault(self, mode: FaultMode, count: int = 1) -> None:
        if count > 0:
            self._faults.append((FaultMode(mode), count))

    def reset(self) -> None:
        self.release()
        self._faults.clear()
        self.sick = False
        self.records.clear()
        self.peak = self.active

    async def wait_until(
        self,
        predicate: Callable[[SimEngine], bool],
        timeout: float = 10.0,  # noqa: ASYNC109 - every wait in a test needs a deadline
    ) -> None:
        if predicate(self):
            return
        waiter = (predicate, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter[1]
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def stats(self) -> dict[str, object]:
        records = self.records.values()
        return {
            "model": self.model, "active": self.active, "peak": self.peak,
            "running": self.running, "waiting": self.waiting, "held": self.held,
            "hold_after_tokens": self._hold_after,
            "requests": len(self.records), "aborted": sum(r.aborted for r in records),
            "completed": sum(r.completed for r in records),
        }

    def _changed(self) -> None:
        if not self._waiters:
            return
        for predicate, fut in self._waiters:
            if fut.done():
                continue
            try:
                if predicate(self):
                    fut.set_result(None)
            except Exception as exc:  # surfaces in the waiting test, not in a handler
                fut.set_exception(exc)

    def _take_fault(self) -> FaultMode | None:
        if not self._faults:
            return None
        mode, left = self._faults[0]
        if left > 1:
            self._faults[0] = (mode, left - 1)
        else:
            self._faults.popleft()
        return mode

    def _length(self, max_tokens: int | None) -> tuple[int, str]:
        spec = self.spec
        n = spec.output_tokens
        if spec.output_tokens_spread:
            spread = n * spec.output_tokens_spread
            n = max(1, round(self._rng.uniform(n - spread, n + spread)))
        if max_tokens is not None and n > max_tokens:
            return max_tokens, "length"
        return n, "stop"

    async def _acquire(self) -> None:
        if self.running < self.spec.max_num_seqs and not self._queue:
            self.running += 1
        else:
            fut = asyncio.get_running_loop().create_future()
            self._queue.append(fut)
            try:
                await fut  # _release hands its sequence over directly: running stays the same
            except asyncio.CancelledError:
                if fut.cancelled():
                    with contextlib.suppress(ValueError):
                        self._queue.remove(fut)
                else:
                    self._release()  # handed a sequence just as we were cancelled
                raise
        self._changed()

    def _release(self) -> None:
        while self._queue:
            fut = self._queue.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.running -= 1

    async def _pause(self, emitted: int) -> None:
        while self._hold_after is not None and emitted >= self._hold_after:
            self.held += 1
            self._changed()
            try:
                await self._gate.wait()
            finally:
                self.held -= 1

    def _begin(self, request: web.Request, plan: Plan) -> SimRecord:
        rid = request.headers.get("x-request-id") or f"sim-{next(self._ids)}"
        rec = SimRecord(rid, plan.stream, plan.prompt_tokens, 0, time.monotonic(),
                        traceparent=request.headers.get("traceparent"),
                        tracestate=request.headers.get("tracestate"),
                        baggage=request.headers.get("baggage"))
        if len(self.records) >= _MAX_RECORDS:
            del self.records[next(iter(self.records))]
        self.records[rid] = rec
        self.active += 1
        self.peak = max(self.peak, self.active)
        rec.fault = self._take_fault()
        self._changed()
        return rec

    async def serve(self, request: web.Request, plan: Plan) -> web.StreamResponse:
        rec = self._begin(request, plan)
        resp: web.StreamResponse | None = None
        try:
            if rec.fault is FaultMode.REFUSE or (rec.fault is FaultMode.DROP and not plan.stream):
                return _abort(request)
            if rec.fault is FaultMode.ERROR_500:
                self.sick = True
                return error_response(500, "simulated backend failure", "server_error")
            if rec.fault is FaultMode.REQUEST_500:
                return error_response(500, "simulated failure on this request's input",
                                      "server_error")
            if rec.fault is FaultMode.HANG:
                await asyncio.get_running_loop().create_future()
            if plan.stream:
                resp = web.StreamResponse(headers=_ENGINE_SSE_HEADERS)
                await resp.prepare(request)
            await self._acquire()
            try:
                body = await (self._generate(request, rec, plan, resp) if plan.embed is None
                              else self._embed(rec, plan, plan.embed))
            finally:
                self._release()
            if body is None:  # dropped on purpose
                return resp if resp is not None else web.Response()
            if resp is None:
                resp, body = web.Response(body=body, content_type="application/json"), b""
                await resp.prepare(request)
            await resp.write_eof(body)
            rec.completed = True
            return resp
        except asyncio.CancelledError:
            rec.aborted = True
            raise
        except ConnectionResetError:  # includes aiohttp.ClientConnectionResetError
            rec.aborted = True
            return resp if resp is not None else web.Response()
        finally:
            rec.ended_at = time.monotonic()
            self.active -= 1
            self._changed()

    async def _generate(
        self, request: web.Request, rec: SimRecord, plan: Plan, stream: web.StreamResponse | None
    ) -> bytes | None:
        """Emit the tokens, one write each on a stream; return the rest of the answer.

        None means the connection was dropped on purpose (FaultMode.DROP).
        """
        spec = self.spec
        n, finish = self._length(plan.max_tokens)
        rid = ("chatcmpl-" if plan.chat else "cmpl-") + rec.request_id
        created = int(time.time())
        call, call_id, parts = plan.tool, "call_" + rec.request_id, []
        if call is not None:  # one piece of the arguments per token, cut by max_tokens
            parts = tools.pieces(call.arguments, self._length(None)[0])
            n, finish = min(len(parts), plan.max_tokens or len(parts)), "tool_calls"
            finish = "length" if n < len(parts) else finish
        stopped = cut(n, plan.stop) if plan.stop and call is None else None
        if plan.says is not None:  # a judge's one-word pick
            stopped = Stopped((plan.says,), "")
        if stopped is not None:
            n, finish = len(stopped.pieces), "stop"
        if stream is not None:
            first, head, tail, last = frames(plan, rid, created, finish,
                                              stopped.matched if stopped else None)
        # sleep(0) when there is no TTFT: every request yields to the loop at least once
        await asyncio.sleep(planned_ttft(self.spec, self.cache, rec, plan))
        if self.cache is not None:
            self.cache.insert(plan.blocks)
        tps, slowdown, final = spec.tokens_per_s, spec.batch_slowdown, n - 1
        drop = rec.fault is FaultMode.DROP
        for i in range(n):
            if i and tps:
                await asyncio.sleep((1.0 + slowdown * (self.running - 1)) / tps)
            if self._hold_after is not None:
                await self._pause(i)
            if stream is not None and call is not None:
                await stream.write(tools.chunk(rid, created, plan.model, call, call_id, parts[i],
                                               i == 0, finish if i == final else None,
                                               plan.include_usage))
            elif stream is not None:
                word = (WORD_JSON[i % len(WORDS)] if stopped is None
                        else orjson.dumps(stopped.pieces[i]))
                await stream.write((head if i else first) + word + (last if i == final else tail))
            if i == 0:
                rec.first_token_at = time.monotonic()
            rec.completion_tokens = i + 1
            if self._waiters:
                self._changed()
            if drop:
                _abort(request)
                return None
        return ending(plan, rid, created, n, finish, stream is not None, stopped,
                      (call, call_id, "".join(parts[:n])) if call is not None else None,
                      rec.cached_tokens if self.cache is not None else None)


    async def _embed(self, rec: SimRecord, plan: Plan, embed: EmbedPlan) -> bytes:
        """A batch of embeddings: the TTFT (and prefill) once, a hold honoured before the
        answer, which comes whole."""
        await asyncio.sleep(planned_ttft(self.spec, None, rec, plan))
        if self._hold_after is not None:
            await self._pause(0)
        rec.first_token_at = time.monotonic()
        return orjson.dumps(answer(embed, plan.model))


def planned_ttft(spec: SimulatedSpec, cache: PrefixCache | None, rec: SimRecord,
                 plan: Plan) -> float:
    """TTFT plus the prefill of the prompt tokens the prefix cache does not hold (kept on
    the record)."""
    if cache is not None:
        rec.cached_tokens = cache.lookup(plan.blocks, plan.prompt_tokens)
    uncached = plan.prompt_tokens - rec.cached_tokens
    rec.planned_ttft_s = spec.ttft_s + uncached * spec.prefill_s_per_token
    return rec.planned_ttft_s


def _abort(request: web.Request) -> web.StreamResponse:
    # aiohttp's attempt to send this response fails quietly on the aborted transport
    if request.transport is not None:
        request.transport.abort()
    return web.Response()


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")
