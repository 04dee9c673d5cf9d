"""prefix: the canonical text of a prompt, its chained block hashes, and the bounded table
of which replica last served each prefix (longest match, least recent evicted)."""

from __future__ import annotations

import random
from collections import OrderedDict

import orjson
import pytest

from policies.scheduler.prefix import (
    BLOCK_BYTES,
    NO_MATCH,
    AffinityTable,
    Match,
    block_hashes,
    chat_text,
    prompt_text,
    request_text,
)

TURNS = [{"role": "system", "content": "You are terse. " * 40}] + [
    {"role": "user" if i % 2 else "assistant", "content": f"Turn {i}: " + "words " * 50}
    for i in range(1, 9)]


def test_a_shared_prefix_gives_the_same_leading_hashes() -> None:
    common = "x" * (2 * BLOCK_BYTES + 100)
    one, two = block_hashes(common + "a" * 500), block_hashes(common + "b" * 500)
    assert one[:2] == two[:2]
    assert one[2] != two[2]  # the block where they part, and every block after it
    assert not set(one[2:]) & set(two[2:])


def test_a_longer_conversation_extends_the_shorter_ones_hashes() -> None:
    short = block_hashes(request_text({"messages": TURNS[:3]}))
    longer = block_hashes(request_text({"messages": TURNS}))
    assert len(short) >= 3 and len(longer) > len(short)
    assert longer[:len(short)] == short


def test_a_block_hash_names_its_whole_prefix() -> None:
    block = "y" * BLOCK_BYTES
    hashes = block_hashes(block * 3)
    assert len(set(hashes)) == 3  # the same block at three depths: three prefixes


def test_only_full_blocks_are_hashed() -> None:
    assert block_hashes("") == []
    assert block_hashes("z" * (BLOCK_BYTES - 1)) == []
    assert len(block_hashes("z" * (3 * BLOCK_BYTES + 7))) == 3
    assert len(block_hashes("é" * BLOCK_BYTES)) == 2  # bytes, not characters
    assert len(block_hashes("z" * 100, block_bytes=10)) == 10


def test_the_canonical_form_ignores_key_order_and_spacing() -> None:
    one = orjson.loads(b'{"model":"m","messages":[{"role":"user","content":[{"type":"text",'
                       b'"text":"look"},{"type":"image_url","image_url":{"url":"u",'
                       b'"detail":"low"}}]},{"role":"assistant","content":null,"tool_calls":'
                       b'[{"id":"1","type":"function","function":{"name":"f","arguments":'
                       b'"{}"}}]}],"tools":[{"type":"function","function":{"name":"f"}}]}')
    two = orjson.loads(b'{ "tools" : [ {"function": {"name": "f"}, "type": "function"} ],\n'
                       b'  "messages": [ {"content": [ {"text": "look", "type": "text"},\n'
                       b'    {"image_url": {"detail": "low", "url": "u"}, "type": "image_url"}'
                       b' ], "role": "user"},\n  {"tool_calls": [{"function": {"arguments": '
                       b'"{}", "name": "f"}, "type": "function", "id": "1"}], "role": '
                       b'"assistant"} ], "model": "other", "temperature": 0.2 }')
    assert request_text(one) == request_text(two)


@pytest.mark.parametrize(
    "other",
    [
        [{"role": "assistant", "content": "hello"}],  # the role
        [{"role": "user", "content": "hello!"}],  # the text
        [{"role": "user", "content": "hello", "name": "bob"}],  # the speaker
        [{"role": "user", "content": "hel"}, {"role": "user", "content": "lo"}],  # the cut
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}},
                                      {"type": "text", "text": "hello"}]}],  # an image
    ],
)
def test_what_the_engine_sees_changes_the_canonical_form(other: list[object]) -> None:
    assert chat_text([{"role": "user", "content": "hello"}]) != chat_text(other)


def test_the_text_of_a_string_content_equals_its_text_part() -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert chat_text(parts) == chat_text([{"role": "user", "content": "hello"}])


def test_tools_come_first_and_change_the_prefix() -> None:
    messages = [{"role": "user", "content": "hi"}]
    bare, tooled = chat_text(messages), chat_text(messages, [{"type": "function"}])
    assert tooled.endswith(bare) and tooled != bare


def test_completions_prompts() -> None:
    assert request_text({"prompt": "Once upon a time"}) == "Once upon a time"
    assert prompt_text([1, 22, 333]) == "1,22,333"
    assert prompt_text(["ab", "cd"]).startswith("ab") and prompt_text(["ab", "cd"]) != "abcd"
    assert prompt_text([[1, 2], [3]]) == prompt_text(["1,2", "3"])
    assert request_text({}) == request_text({"prompt": None})


def test_malformed_messages_still_have_a_text() -> None:
    assert chat_text(["just a string", 7, {"content": 3}]) != chat_text([])


def chain(seed: int, blocks: int) -> list[int]:
    return block_hashes(random.Random(seed).randbytes(blocks * BLOCK_BYTES).hex()[
        :blocks * BLOCK_BYTES])


def test_match_returns_the_longest_known_prefix_and_its_replica() -> None:
    table = AffinityTable(100)
    assert table.match(chain(1, 6)) == NO_MATCH
    assert table.match([]) == NO_MATCH
    long = chain(1, 6)
    table.record(long[:2], "a")
    assert table.match(long) == Match("a", 2)
    table.record(long[:5], "b")  # b served more of it, the shared two blocks included
    assert table.match(long) == Match("b", 5)
    assert table.match(long[:2]) == Match("b", 2)
    assert table.match([*long[:3], *chain(2, 3)]) == Match("b", 3)
    assert table.match(chain(2, 3)) == NO_MATCH


def test_held_names_every_replica_that_served_a_prefix_with_its_length() -> None:
    table = AffinityTable(100)
    system, long = chain(1, 3), [*chain(1, 3), *chain(2, 4)]
    assert table.held(long) == {}
    table.record(system, "a")
    table.record(long, "b")
    table.record(system, "c")
    assert table.held(long) == {"a": 3, "b": 7, "c": 3}
    assert table.match(long) == Match("b", 7)
    assert table.match(system) == Match("c", 3)  # the latest to serve it


def test_the_table_is_bounded_least_recently_recorded_out() -> None:
    table = AffinityTable(4)
    one, two, three = chain(1, 2), chain(2, 2), chain(3, 2)
    table.record(one, "a")
    table.record(two, "b")
    table.match(one)  # a match alone does not refresh
    table.record(two, "b")
    table.record(three, "c")
    assert len(table) == 4
    assert (table.match(one), table.match(two), table.match(three)) == (
        NO_MATCH, Match("b", 2), Match("c", 2))


def test_eviction_keeps_a_prompts_leading_blocks() -> None:
    table = AffinityTable(3)
    table.record(chain(1, 5), "a")
    assert len(table) == 3
    assert table.match(chain(1, 5)) == Match("a", 3)
    with pytest.raises(ValueError, match="table_size"):
        AffinityTable(0)


def test_match_agrees_with_a_linear_scan_after_any_records() -> None:
    """The binary search relies on the known blocks of a prompt being a prefix of its
    blocks: checked against a plain LRU and a longest-first scan, over prompts that share
    prefixes (a tree of conversations) in a table too small for them."""
    rng = random.Random(17)
    trunks = [chain(seed, 8) for seed in range(6)]
    for _ in range(200):
        size = rng.randint(1, 30)
        table, model = AffinityTable(size), OrderedDict[int, list[str]]()
        for _ in range(50):
            trunk = rng.choice(trunks)
            hashes = trunk[:rng.randint(0, 8)] + chain(rng.randrange(3), rng.randint(0, 3))
            hashes = block_hashes("".join(f"{h:016x}" for h in hashes), 16)
            if rng.random() < 0.5:
                replica = rng.choice("abc")
                table.record(hashes, replica)
                for block in reversed(hashes):
                    model[block] = [*(r for r in model.get(block, []) if r != replica), replica]
                    model.move_to_end(block)
                while len(model) > size:
                    model.popitem(last=False)
            longest = next((i for i in range(len(hashes), 0, -1) if hashes[i - 1] in model), 0)
            expected = Match(model[hashes[longest - 1]][-1], longest) if longest else NO_MATCH
            assert table.match(hashes) == expected
            held = {replica: next(i for i in range(len(hashes), 0, -1)
                                  if replica in model.get(hashes[i - 1], []))
                    for replica in "abc" if any(replica in model.get(h, []) for h in hashes)}
            assert table.held(hashes) == held
