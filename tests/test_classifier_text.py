"""The classifier's input: the text taken from a request body (classifier/text.py), for
every shape of body, junk included, and cut to its budget."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from classifier import request_text
from classifier.text import BUDGET, HEAD, SYSTEM_HEAD, _content_text, clip


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **extra}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (chat({"role": "user", "content": "hello"}), "hello"),
        (chat({"role": "user", "content": "  padded  "}), "padded"),
        (
            chat(
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "last"},
            ),
            "last",
        ),
        (chat({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}), "q"),
        (
            chat({"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}),
            "Be brief.\nhi",
        ),
        (
            chat({"role": "developer", "content": "Rules"}, {"role": "user", "content": "x"}),
            "Rules\nx",
        ),
        (
            chat(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "describe"},
                        {"type": "image_url", "image_url": {"url": "u"}},
                        {"type": "text", "text": "this"},
                    ],
                }
            ),
            "describe\nthis",
        ),
        (
            chat(
                {
                    "role": "user",
                    "content": [{"type": "text", "text": 5}, {"type": "text"}, "raw part", None, 3],
                }
            ),
            "raw part",
        ),
        (chat({"role": "system", "content": "only a system prompt"}), "only a system prompt"),
        (chat({"role": "assistant", "content": "no user turn"}), "no user turn"),
        (chat(), ""),
        ({"model": "m", "prompt": "complete me"}, "complete me"),
        ({"model": "m", "prompt": ["one", "two", 3, ""]}, "one\ntwo"),
        ({"model": "m", "prompt": [1, 2, 3]}, ""),
        ({"model": "m", "prompt": None}, ""),
        ({"model": "m"}, ""),
        ({"messages": "not a list"}, ""),
        (
            {"messages": [None, 3, "x", [], {"role": "user"}, {"role": "user", "content": {}}]},
            "",
        ),
        (
            {"messages": [{"role": ["odd"], "content": "kept as the last message"}]},
            "kept as the last message",
        ),
        ({}, ""),
        ({"model": "m", "input": "a responses request", "instructions": "rules"},
         "rules\na responses request"),
        ({"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "items"}]}, {"type": "function_call_output",
                                                        "call_id": "c", "output": "x"}]},
         "items"),
    ],
)
def test_request_text_shapes(body: dict[str, Any], expected: str) -> None:
    assert request_text(body) == expected


@pytest.mark.parametrize("junk", [None, 3, "text", b"bytes", [], [{"role": "user"}], 1.5])
def test_request_text_never_raises_on_junk(junk: Any) -> None:
    assert request_text(junk) == ""


_PARTS = st.one_of(st.sampled_from(["", " x ", "part"]), st.none(), st.integers(),
                   st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text",
                                                                   "image_url"]),
                                          "text": st.sampled_from(["", " ", "a", "b c"])}))
_TURNS = st.one_of(
    st.fixed_dictionaries({
        "role": st.sampled_from(["system", "developer", "user", "assistant", "tool", None, 5,
                                  ["user"]]),
        "content": st.one_of(st.sampled_from(["", "  ", "q", " sys ", "answer"]), st.none(),
                             st.lists(_PARTS, max_size=4))}),
    st.sampled_from([None, "turn", 3]))


def _read_in_order(messages: list[Any]) -> str:
    """request_text's rule, read turn by turn from the first: the first system prompt
    with text, the last user turn with text (else the last turn with text)."""
    system = user = last_any = ""
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = _content_text(message.get("content"))
        if not content:
            continue
        role = message.get("role")
        if role in ("system", "developer"):  # (by ==: a list as role is no system)
            system = system or content
        elif role == "user":
            user = content
        last_any = content
    text = user or (last_any if last_any != system else "")
    head = system[:SYSTEM_HEAD].strip()
    return head + "\n" + text if head and text else head or text


@given(st.lists(_TURNS, max_size=8))
@settings(max_examples=400, deadline=None)
def test_request_text_reads_only_the_turns_it_keeps_and_finds_the_same(
        messages: list[Any]) -> None:
    """It reads a conversation from both ends (the last user turn, the first system
    prompt): the same text as reading every turn in order."""
    assert request_text({"messages": messages}) == _read_in_order(messages)


def test_request_text_keeps_only_the_system_head() -> None:
    system = "S" * 1000
    text = request_text(
        chat({"role": "system", "content": system}, {"role": "user", "content": "question"})
    )
    assert text == "S" * SYSTEM_HEAD + "\nquestion"


def test_long_texts_keep_head_and_tail_within_budget() -> None:
    long = "a" * 3000 + "TAIL"
    text = request_text(chat({"role": "user", "content": "HEAD" + long}))
    assert len(text) == BUDGET
    assert text.startswith("HEAD") and text.endswith("TAIL")
    assert text[HEAD] == "\n"
    assert clip("short") == "short"
