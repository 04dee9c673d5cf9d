"""What one request asks of the simulated engine (`Plan`) and the bytes of its reply that
do not depend on time: the fixed frame around each streamed token and the reply's end (the
usage chunk and [DONE] of a stream, or the whole JSON answer). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from router.upstream.simulated import tools
from router.upstream.simulated.embed import EmbedPlan
from router.upstream.simulated.text import Stopped, text
from router.upstream.simulated.tools import ToolCall

DONE = b"data: [DONE]\n\n"


@dataclass(slots=True, frozen=True)
class Plan:
    """What one request asks of the engine, read from its body by the app."""

    chat: bool
    model: str
    stream: bool
    include_usage: bool
    prompt_tokens: int
    max_tokens: int | None
    blocks: tuple[int, ...] = ()  # the prompt's block hashes, when the engine caches prefixes
    tool: ToolCall | None = None  # answer with this tool call (router.upstream.simulated.tools)
    embed: EmbedPlan | None = None  # an embeddings request: one batch, no tokens generated
    stop: tuple[str, ...] = ()  # the request's `stop` strings (router.upstream.simulated.text)
    says: str | None = None  # a fixed answer (a judge's pick: router.upstream.simulated.judge)


def frames(plan: Plan, rid: str, created: int, finish: str, matched: str | None = None
           ) -> tuple[bytes, bytes, bytes, bytes]:
    """Fixed bytes around each token's JSON string, so a chunk costs two concatenations
    (`matched`: the stop string that ended the answer, as vLLM's `stop_reason`)."""
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
    reason = b',"stop_reason":' + orjson.dumps(matched) if matched is not None else b""
    return first, head, close + b"null" + end, close + orjson.dumps(finish) + reason + end


def ending(plan: Plan, rid: str, created: int, tokens: int, finish: str, streamed: bool,
           stopped: Stopped | None, call: tuple[ToolCall, str, str] | None,
           cached: int | None = None) -> bytes:
    """The rest of a reply of `tokens` tokens: a stream's usage chunk (if asked for) and
    [DONE], else the whole answer. `call`: the tool call, its id and its arguments sent;
    `cached`: the prompt tokens the prefix cache held (reported as vLLM does, with a
    prefix cache)."""
    usage: dict[str, object] = {"prompt_tokens": plan.prompt_tokens,
                                "completion_tokens": tokens,
                                "total_tokens": plan.prompt_tokens + tokens}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    answer: dict[str, object] = {"id": rid, "object": "text_completion", "created": created,
                                 "model": plan.model, "choices": [], "usage": usage}
    if streamed:
        if not plan.include_usage:
            return DONE
        if plan.chat:
            answer["object"] = "chat.completion.chunk"
        return b"data: " + orjson.dumps(answer) + b"\n\n" + DONE
    choice: dict[str, object] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if stopped is not None:
        choice["stop_reason"] = stopped.matched
    words = text(tokens) if stopped is None else "".join(stopped.pieces)
    if call is not None:
        answer["object"] = "chat.completion"
        choice["message"] = tools.message(*call)
    elif plan.chat:
        answer["object"] = "chat.completion"
        choice["message"] = {"role": "assistant", "content": words}
    else:
        choice["text"] = words
    answer["choices"] = [choice]
    return orjson.dumps(answer)
