"""The other client APIs through slotgate to a real engine (llama.cpp serves chat
completions only): the Anthropic Messages API, translated, with the official SDK."""

from __future__ import annotations

from typing import Any

from tests.engine.conftest import Engines
from tests.engine.gateway import engine_config
from tests.support import StartGateway, assert_idle
from tests.support.anthropic import AnthropicClients

RIVER: Any = [{"role": "user", "content": "Write about the history of the river."}]


async def test_messages_streamed_to_llama_cpp_with_the_anthropic_sdk(
    start: StartGateway, idle: Engines, claude: AnthropicClients
) -> None:
    gw = await start(engine_config(idle))
    events: list[str] = []
    async with claude(gw).messages.stream(model="chat", max_tokens=16, messages=RIVER,
                                          system="You are a historian.") as stream:
        async for event in stream:
            events.append(event.type)
        message = await stream.get_final_message()
    assert events[0] == "message_start" and "content_block_delta" in events
    assert events[-1] == "message_stop"
    assert message.stop_reason in ("end_turn", "max_tokens")
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text.strip()
    assert 1 <= message.usage.output_tokens <= 16 and message.usage.input_tokens > 0
    whole = await claude(gw).messages.create(model="chat", max_tokens=8, messages=RIVER)
    assert whole.content and whole.stop_reason in ("end_turn", "max_tokens")
    await assert_idle(gw)
