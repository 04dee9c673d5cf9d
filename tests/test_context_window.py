"""A request beyond the engine's context window, told in the words each API's clients act
on: OpenAI's code `context_length_exceeded` with the engine's message, and for Messages
Anthropic's two wordings, which Claude Code parses for their numbers (it compacts on
"prompt is too long", asks again with a smaller max_tokens on "input length and
`max_tokens` exceed context limit"). The engine is the simulated one with vLLM's
`--max-model-len` and vLLM's words; the other engines' wordings are read as they write
them."""

from __future__ import annotations

import re

import anthropic
import openai
import pytest

from router.apis.context_window import Overflow, anthropic_message, overflow
from router.app import RunningGateway
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    gateway_config,
    sim_backend,
)
from tests.support.anthropic import AnthropicClients

WINDOW = 2000
# What Claude Code 2.1 matches (its compaction and its max_tokens retry).
PROMPT_TOO_LONG = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.I)
MAX_TOKENS_EXCEED = re.compile(
    r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)")
LONG = [{"role": "user", "content": "word " * 3000}]  # ~3,750 tokens as the engine counts


@pytest.mark.parametrize(("message", "found"), [
    ("'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum "
     "context length is 4096 tokens and your request has 2778 input tokens "
     "(8000 > 4096 - 2778). None", Overflow(2778, 4096, 8000)),
    ("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
     "(4000 in the messages, 1000 in the completion). Please reduce the length of the "
     "messages or completion.", Overflow(4000, 4096, 1000)),
    ("This model's maximum context length is 4096 tokens. However, your request has 5000 "
     "input tokens. Please reduce the length of the input messages.", Overflow(5000, 4096)),
    ("The decoder prompt (length 9000) is longer than the maximum model length of 8192. "
     "Make sure that `max_model_len` is no smaller than the number of text tokens.",
     Overflow(9000, 8192)),
    ("The input (40000 tokens) is longer than the model's context length (32768 tokens).",
     Overflow(40000, 32768)),
    ("Requested token count exceeds the model's maximum context length of 32768 tokens. You "
     "requested a total of 40000 tokens: 8000 tokens from the input messages and 32000 "
     "tokens for the completion. Please reduce the number of tokens in the input messages "
     "or the completion to fit within the limit.", Overflow(8000, 32768, 32000)),
    ("Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: "
     "3000 `inputs` tokens and 2000 `max_new_tokens`", Overflow(3000, 4096, 2000)),
    ("the request exceeds the available context size, try increasing it "
     "(n_prompt_tokens: 5000, n_ctx: 4096)", Overflow(5000, 4096)),
    ("'messages' must be a non-empty list", None),
    ("max_tokens must be at least 1, got 0.", None),
])
def test_each_engines_wording_is_read(message: str, found: Overflow | None) -> None:
    assert overflow(message) == found


def test_anthropic_wordings_carry_the_numbers_claude_code_reads() -> None:
    alone = PROMPT_TOO_LONG.search(anthropic_message(Overflow(5000, 4096)))
    assert alone is not None and alone.groups() == ("5000", "4096")
    both = MAX_TOKENS_EXCEED.search(anthropic_message(Overflow(2778, 4096, 8000)))
    assert both is not None and both.groups() == ("2778", "8000", "4096")
    # a prompt that fills the window alone is told as such, whatever max_tokens was
    assert PROMPT_TOO_LONG.search(anthropic_message(Overflow(4096, 4096, 10)))


async def _gateway(start: StartGateway) -> RunningGateway:
    return await start(gateway_config(sim_backend("m", slots=2, queue_limit=4, sim={
        "max_model_len": WINDOW})))


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_get_anthropics_words(start: StartGateway, claude: AnthropicClients,
                                             stream: bool) -> None:
    gw = await _gateway(start)
    client = claude(gw)
    with pytest.raises(anthropic.BadRequestError) as too_much:
        await client.messages.create(model="chat", max_tokens=16_000, stream=stream,
                                     messages=[{"role": "user", "content": "say hello"}])
    found = MAX_TOKENS_EXCEED.search(too_much.value.message)
    assert found is not None, too_much.value.message
    prompt, cap, limit = map(int, found.groups())
    assert (cap, limit) == (16_000, WINDOW) and 0 < prompt < WINDOW
    with pytest.raises(anthropic.BadRequestError) as too_long:
        await client.messages.create(model="chat", max_tokens=16, stream=stream,
                                     messages=LONG)  # type: ignore[arg-type]
    found = PROMPT_TOO_LONG.search(too_long.value.message)
    assert found is not None, too_long.value.message
    assert int(found.group(1)) > WINDOW and int(found.group(2)) == WINDOW
    # Claude Code's retry: max_tokens within what the window leaves is answered
    answer = await client.messages.create(model="chat", max_tokens=WINDOW - prompt - 1,
                                          messages=[{"role": "user", "content": "say hello"}])
    assert answer.stop_reason in ("end_turn", "max_tokens")
    await assert_idle(gw)


async def test_openai_clients_get_the_code_and_the_engines_words(
        start: StartGateway, sdk: SdkClients) -> None:
    gw = await _gateway(start)
    client = sdk(gw)
    with pytest.raises(openai.BadRequestError) as chat:
        await client.chat.completions.create(model="chat", messages=MESSAGES,
                                             max_tokens=32_000)
    assert chat.value.code == "context_length_exceeded"
    assert "maximum context length is 2000 tokens" in chat.value.message  # vLLM's, relayed
    with pytest.raises(openai.BadRequestError) as responses:
        await client.responses.create(model="chat", input="word " * 3000,
                                      max_output_tokens=16)
    assert responses.value.code == "context_length_exceeded"
    await assert_idle(gw)
