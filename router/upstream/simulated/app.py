"""The simulated engine's HTTP side: the OpenAI-compatible routes, the test controls under
/sim/ and the server that runs it (the embedded default backend and the test double).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from policies.config import SimulatedSpec
from policies.scheduler.prefix import block_hashes, request_text
from router.upstream.simulated import judge
from router.upstream.simulated.embed import embed_plan
from router.upstream.simulated.engine import FaultMode, SimEngine, error_response
from router.upstream.simulated.metrics import CONTENT_TYPE, exposition
from router.upstream.simulated.reply import Plan
from router.upstream.simulated.tools import tool_call


def _chars(value: object) -> int:
    """Characters of text in a content or prompt value; a token id counts as 4."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):  # a content part: only text parts count
        return _chars(value.get("text")) if value.get("type") == "text" else 0
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 4 if isinstance(value, int) else 0


def _rendered(body: dict[str, object], messages: list[object]) -> int:
    """Characters of a chat prompt as an engine's template renders it: every message's
    text, the tool calls in the history and the tools' definitions (as JSON)."""
    chars = 0
    for message in messages:
        if isinstance(message, dict):
            chars += _chars(message.get("content"))
            if message.get("tool_calls"):
                chars += len(orjson.dumps(message["tool_calls"]))
    tools = body.get("tools")
    return chars + (len(orjson.dumps(tools)) if tools else 0)


def _stops(value: object) -> tuple[str, ...]:
    """The `stop` strings: one string or a list of them (empty ones mean nothing)."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ValueError("'stop' must be a string or a list of strings")
    return tuple(s for s in stops if s)


def _plan(body: object, chat: bool, default_model: str, block_bytes: int = 0) -> Plan:
    """The request's demands; with `block_bytes`, its prompt's block hashes too."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list")
        chars = _rendered(body, messages)
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
    blocks = tuple(block_hashes(request_text(body), block_bytes)) if block_bytes else ()
    return Plan(chat, model, body.get("stream") is True, usage, max(1, chars // 4), max_tokens,
                blocks, tool_call(body) if chat else None, stop=_stops(body.get("stop")),
                says=judge.pick(body) if chat else None)


def _embeddings_plan(body: object, default_model: str) -> Plan:
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    model = body.get("model") or default_model
    if not isinstance(model, str):
        raise ValueError("'model' must be a string")
    embed = embed_plan(body)
    return Plan(False, model, False, False, embed.tokens, None, embed=embed)


SIM_ENGINE = web.AppKey("sim_engine", SimEngine)
# The largest body taken: twice the largest `server.max_body_bytes` a config may set, since
# a gateway forwards what that allows and a translated Messages body grows a little.
MAX_BODY_BYTES = 2 * 256 * 1024 * 1024


async def _completion(request: web.Request, chat: bool) -> web.StreamResponse:
    engine = request.app[SIM_ENGINE]
    block_bytes = engine.cache.block_bytes if engine.cache is not None else 0
    try:
        plan = _plan(orjson.loads(await request.read()), chat, engine.model, block_bytes)
    except orjson.JSONDecodeError:
        return error_response(400, "the request body is not valid JSON")
    except ValueError as exc:
        return error_response(400, str(exc))
    refusal = over_window(plan, engine.spec.max_model_len)
    if refusal is not None:
        return error_response(400, refusal, "BadRequestError")
    if plan.tool is not None and engine.spec.tool_calls == "never":
        plan = dataclasses.replace(plan, tool=None)
    return await engine.serve(request, plan)


def over_window(plan: Plan, window: int | None) -> str | None:
    """vLLM's refusal of a request beyond its context window (`--max-model-len`), in its
    words (vLLM 0.8 and later), or None."""
    if window is None:
        return None
    prompt = plan.prompt_tokens
    if prompt > window:
        return (f"This model's maximum context length is {window} tokens. However, your "
                f"request has {prompt} input tokens. Please reduce the length of the input "
                f"messages.")
    if plan.max_tokens is not None and prompt + plan.max_tokens > window:
        return (f"'max_tokens' or 'max_completion_tokens' is too large: {plan.max_tokens}. "
                f"This model's maximum context length is {window} tokens and your request "
                f"has {prompt} input tokens ({plan.max_tokens} > {window} - {prompt}).")
    return None


async def _embeddings(request: web.Request) -> web.StreamResponse:
    engine = request.app[SIM_ENGINE]
    try:
        plan = _embeddings_plan(orjson.loads(await request.read()), engine.model)
    except ValueError as exc:  # orjson.JSONDecodeError is a ValueError
        return error_response(400, str(exc))
    return await engine.serve(request, plan)


async def _models(request: web.Request) -> web.Response:
    engine = request.app[SIM_ENGINE]
    if engine.sick:  # the failure that made a request 500 shows in the health check too
        engine.sick = False
        return error_response(503, "simulated backend failure", "server_error")
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
        return error_response(400, str(exc))
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


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=exposition(request.app[SIM_ENGINE]).encode(),
                        headers={"Content-Type": CONTENT_TYPE})


def _json(obj: object) -> web.Response:
    return web.Response(body=orjson.dumps(obj), content_type="application/json")




def create_sim_app(engine: SimEngine) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[SIM_ENGINE] = engine
    app.router.add_post("/v1/chat/completions", functools.partial(_completion, chat=True))
    app.router.add_post("/v1/completions", functools.partial(_completion, chat=False))
    app.router.add_post("/v1/embeddings", _embeddings)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
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
