"""An OpenAI-compatible simulated LLM engine: the embedded default backend and the test double.

Continuous batching over `max_num_seqs` sequences with TTFT, prefill and decode timing, plus
test controls (hold/release, injected faults, per-request records). It never logs content.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import itertools
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from policies.config import SimulatedSpec

_MAX_RECORDS = 10_000
_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "again", "and", "so")
_WORD_JSON = tuple(orjson.dumps(w + " ") for w in _WORDS)
_CYCLE = "".join(w + " " for w in _WORDS)
_PREFIXES = tuple(_CYCLE[: sum(len(w) + 1 for w in _WORDS[:j])] for j in range(len(_WORDS)))
# An engine's own stream headers (as vLLM sends them), not the gateway's (router.sse).
_ENGINE_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_DONE = b"data: [DONE]\n\n"


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


@dataclass(slots=True, frozen=True)
class _Plan:
    chat: bool
    model: str
    stream: bool
    include_usage: bool
    prompt_tokens: int
    max_tokens: int | None


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
            "running": self.running, "waiting": len(self._queue), "held": self.held,
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

    def _begin(self, request: web.Request, plan: _Plan) -> SimRecord:
        rid = request.headers.get("x-request-id") or f"sim-{next(self._ids)}"
        rec = SimRecord(rid, plan.stream, plan.prompt_tokens, 0, time.monotonic())
        if len(self.records) >= _MAX_RECORDS:
            del self.records[next(iter(self.records))]
        self.records[rid] = rec
        self.active += 1
        self.peak = max(self.peak, self.active)
        rec.fault = self._take_fault()
        self._changed()
        return rec

    async def _serve(self, request: web.Request, plan: _Plan) -> web.StreamResponse:
        rec = self._begin(request, plan)
        resp: web.StreamResponse | None = None
        try:
            if rec.fault is FaultMode.REFUSE or (rec.fault is FaultMode.DROP and not plan.stream):
                return _abort(request)
            if rec.fault is FaultMode.ERROR_500:
                self.sick = True
                return _error(500, "simulated backend failure", "server_error")
            if rec.fault is FaultMode.REQUEST_500:
                return _error(500, "simulated failure on this request's input", "server_error")
            if rec.fault is FaultMode.HANG:
                await asyncio.get_running_loop().create_future()
            if plan.stream:
                resp = web.StreamResponse(headers=_ENGINE_SSE_HEADERS)
                await resp.prepare(request)
            await self._acquire()
            try:
                body = await self._generate(request, rec, plan, resp)
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
        self, request: web.Request, rec: SimRecord, plan: _Plan, stream: web.StreamResponse | None
    ) -> bytes | None:
        """Emit the tokens, one write each on a stream; return the rest of the answer.

        None means the connection was dropped on purpose (FaultMode.DROP).
        """
        spec = self.spec
        n, finish = self._length(plan.max_tokens)
        rid = ("chatcmpl-" if plan.chat else "cmpl-") + rec.request_id
        created = int(time.time())
        if stream is not None:
            first, head, tail, last = _frames(plan, rid, created, finish)
        # sleep(0) when there is no TTFT: every request yields to the loop at least once
        await asyncio.sleep(spec.ttft_s + plan.prompt_tokens * spec.prefill_s_per_token)
        tps, slowdown, final = spec.tokens_per_s, spec.batch_slowdown, n - 1
        drop = rec.fault is FaultMode.DROP
        for i in range(n):
            if i and tps:
                await asyncio.sleep((1.0 + slowdown * (self.running - 1)) / tps)
            if self._hold_after is not None:
                await self._pause(i)
            if stream is not None:
                word = _WORD_JSON[i % len(_WORDS)]
                await stream.write((head if i else first) + word + (last if i == final else tail))
            if i == 0:
                rec.first_token_at = time.monotonic()
            rec.completion_tokens = i + 1
            if self._waiters:
                self._changed()
            if drop:
                _abort(request)
                return None
        usage = {"prompt_tokens": plan.prompt_tokens, "completion_tokens": n,
                 "total_tokens": plan.prompt_tokens + n}
        answer: dict[str, object] = {"id": rid, "object": "text_completion", "created": created,
                                     "model": plan.model, "choices": [], "usage": usage}
        if stream is not None:
            if not plan.include_usage:
                return _DONE
            if plan.chat:
                answer["object"] = "chat.completion.chunk"
            return b"data: " + orjson.dumps(answer) + b"\n\n" + _DONE
        text = _CYCLE * (n // len(_WORDS)) + _PREFIXES[n % len(_WORDS)]
        choice: dict[str, object] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if plan.chat:
            answer["object"] = "chat.completion"
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        answer["choices"] = [choice]
        return orjson.dumps(answer)


def _frames(plan: _Plan, rid: str, created: int, finish: str) -> tuple[bytes, bytes, bytes, bytes]:
    """Fixed bytes around each token's JSON string, so a chunk costs two concatenations."""
    obj = b"chat.completion.chunk" if plan.chat else b"text_completion"
    start = b'data: {"id":%s,"object":"%s","created":%d,"model":%s,"choices":[{"index":0,' % (
        orjson.dumps(rid), obj, created, orjson.dumps(plan.model))
    if plan.chat:
        first = start + b'"delta":{"role":"assistant","content":'
        head = start + b'"delta":{"content":'
        close = b'},"logprobs":null,"finish_reason":'
    else:
        first = head = start + b'"text":'
        close = b',"logprobs":null,"finish_reason":'
    end = b'}],"usage":null}\n\n' if plan.include_usage else b"}]}\n\n"
    return first, head, close + b"null" + end, close + orjson.dumps(finish) + end


def _abort(request: web.Request) -> web.StreamResponse:
    # aiohttp's attempt to send this response fails quietly on the aborted transport
    if request.transport is not None:
        request.transport.abort()
    return web.Response()


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _chars(value: object) -> int:
    """Characters of text in a content or prompt value; a token id counts as 4."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):  # a content part: only text parts count
        return _chars(value.get("text")) if value.get("type") == "text" else 0
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 4 if isinstance(value, int) else 0


def _plan(body: object, chat: bool, default_model: str) -> _Plan:
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list")
        chars = sum(_chars(m.get("content")) for m in messages if isinstance(m, dict))
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list) or not prompt:
            raise ValueError("'prompt' must be a string or a non-empty list")
        chars = _chars(prompt)
    model = body.get("model") or default_model
    if not isinstance(model, str):
        raise ValueError("'model' must be a string")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise ValueError("'max_tokens' must be a positive integer")
    options = body.get("stream_options")
    usage = isinstance(options, dict) and options.get("include_usage") is True
    return _Plan(chat, model, body.get("stream") is True, usage, max(1, chars // 4), max_tokens)


SIM_ENGINE = web.AppKey("sim_engine", SimEngine)


async def _completion(request: web.Request, chat: bool) -> web.StreamResponse:
    engine = request.app[SIM_ENGINE]
    try:
        plan = _plan(orjson.loads(await request.read()), chat, engine.model)
    except orjson.JSONDecodeError:
        return _error(400, "the request body is not valid JSON")
    except ValueError as exc:
        return _error(400, str(exc))
    return await engine._serve(request, plan)


async def _models(request: web.Request) -> web.Response:
    engine = request.app[SIM_ENGINE]
    if engine.sick:  # the failure that made a request 500 shows in the health check too
        engine.sick = False
        return _error(503, "simulated backend failure", "server_error")
    model = {"id": engine.model, "object": "model", "created": 0,
             "owned_by": "slotgate-simulated"}
    return _json({"object": "list", "data": [model]})


async def _control(request: web.Request) -> web.Response:
    engine = request.app[SIM_ENGINE]
    action = request.match_info["action"]
    try:
        raw = await request.read()
        body = orjson.loads(raw) if raw else {}
        if not isinstance(body, dict):
            raise ValueError("the request body must be a JSON object")
        if action == "hold":
            engine.hold(int(body.get("after_tokens", 0)))
        elif action == "fault":
            engine.inject_fault(FaultMode(str(body.get("mode"))), int(body.get("count", 1)))
    except (ValueError, TypeError) as exc:  # orjson.JSONDecodeError is a ValueError
        return _error(400, str(exc))
    if action == "release":
        engine.release()
    elif action == "reset":
        engine.reset()
    return _json(engine.stats())


async def _inspect(request: web.Request) -> web.Response:
    engine = request.app[SIM_ENGINE]
    if request.match_info["what"] == "stats":
        return _json(engine.stats())
    return _json(list(engine.records.values()))


def _json(obj: object) -> web.Response:
    return web.Response(body=orjson.dumps(obj), content_type="application/json")


def create_sim_app(engine: SimEngine) -> web.Application:
    app = web.Application()
    app[SIM_ENGINE] = engine
    app.router.add_post("/v1/chat/completions", functools.partial(_completion, chat=True))
    app.router.add_post("/v1/completions", functools.partial(_completion, chat=False))
    app.router.add_get("/v1/models", _models)
    app.router.add_get(r"/sim/{what:stats|requests}", _inspect)
    app.router.add_post(r"/sim/{action:hold|release|fault|reset}", _control)
    return app


@dataclass
class RunningSim:
    engine: SimEngine
    url: str
    runner: web.AppRunner = field(repr=False)

    async def close(self) -> None:
        self.engine.release()
        await self.runner.cleanup()


async def start_simulator(
    spec: SimulatedSpec, model: str, host: str = "127.0.0.1", port: int = 0
) -> RunningSim:
    engine = SimEngine(spec, model)
    # a short shutdown timeout: in-flight simulated generations are not worth waiting for
    runner = web.AppRunner(create_sim_app(engine), handler_cancellation=True, access_log=None,
                           shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, backlog=1024).start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return RunningSim(engine, f"http://{shown}:{bound_port}", runner)
