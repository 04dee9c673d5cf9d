"""Prompt-prefix hashing and the affinity table: which replica last served a prompt's prefix,
so a request can go where the engine likely still holds that prefix's KV cache.

A request's prompt is rendered to one canonical text (no tokenizer: the same messages give
the same bytes whatever their JSON spelling), cut into fixed-size blocks of bytes, and each
block hashed together with the previous block's hash, so block i's hash names the whole
prefix up to block i (a path in a radix tree). A trailing partial block is not hashed:
a conversation's hashes then extend those of every earlier turn of it.

Pure: no I/O, no clock. The table is the one piece of state; picking itself is
`policies.scheduler.pick`, which takes the table's answer as an input.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import orjson
import xxhash

# Bytes per block: about 64 tokens of English, coarse enough to keep hashing cheap, fine
# enough that a shared system prompt fills a few blocks.
BLOCK_BYTES = 256
# Each block's hash is xxh3-64 of its bytes seeded with the previous block's hash: 64 bits
# (a collision among a table's entries is out of reach), about 5x faster than blake2b.

# Separators no well-formed text message holds: between a message's role, its other fields
# and its text, between content parts, between messages.
_FIELD, _PART, _MESSAGE = "\x1f", "\x1d", "\x1e"


def _json(value: object) -> str:
    """A value as canonical JSON: keys sorted, no whitespace."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _content_text(content: object) -> str:
    """A message's content: a string as is; of a list of parts, the text parts' text and
    any other part (an image, audio) as canonical JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return _PART.join(part["text"] if isinstance(part, dict) and part.get("type") == "text"
                          and isinstance(part.get("text"), str) else _json(part)
                          for part in content)
    return _json(content)


def chat_text(messages: Sequence[object], tools: object = None) -> str:
    """The canonical text of a chat request: the tools (rendered ahead of the messages by
    chat templates), then per message its role, name, tool call id and tool calls, and
    its text. Fields that change nothing the engine sees (key order, spacing) drop out."""
    out = [_json(tools) + _MESSAGE] if tools else []
    for message in messages:
        if not isinstance(message, dict):
            out.append(_json(message) + _MESSAGE)
            continue
        head = [str(message.get("role", ""))]
        for key in ("name", "tool_call_id", "tool_calls"):
            if message.get(key) is not None:
                head.append(_json(message[key]))
        out.append(_FIELD.join(head) + _FIELD + _content_text(message.get("content"))
                   + _MESSAGE)
    return "".join(out)


def prompt_text(prompt: object) -> str:
    """The canonical text of a completions prompt: a string as is, token ids as
    comma-separated numbers, a batch as its prompts one after the other."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(item, int) for item in prompt):
        return ",".join(map(str, prompt))
    if isinstance(prompt, list):
        return _MESSAGE.join(prompt_text(item) for item in prompt)
    return _json(prompt)


def request_text(body: Mapping[str, object]) -> str:
    """The canonical text of a chat or completions request body (parsed JSON)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return chat_text(messages, body.get("tools"))
    return prompt_text(body.get("prompt"))


def block_hashes(text: str, block_bytes: int = BLOCK_BYTES) -> list[int]:
    """The chained hash of each full block of `text`'s UTF-8 bytes: entry i names the
    prefix of i + 1 blocks, so two texts share their leading hashes exactly as long as
    they share their leading blocks."""
    data = memoryview(text.encode())
    hashes: list[int] = []
    previous = 0
    xxh3 = xxhash.xxh3_64_intdigest
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        previous = xxh3(data[start:start + block_bytes], previous)
        hashes.append(previous)
    return hashes


class Match(NamedTuple):
    """The replica that last served the longest known prefix, and how many blocks long
    that prefix is (None and 0 when no block is known)."""

    replica: str | None
    blocks: int


NO_MATCH = Match(None, 0)


MAX_OWNERS = 16  # replicas remembered per block (a group's replicas, as a rule, all fit)


class AffinityTable:
    """Block hash -> the replicas that served it, most recent last, at most `table_size`
    blocks, the least recently recorded evicted first.

    `record` touches a prompt's blocks from its last to its first, so a prefix is always
    at least as recent as any longer prefix of the same prompt: eviction takes the longer
    ones first and the blocks known of a prompt are always a prefix of its blocks; a
    replica that served a block served each block before it. `match` and `held` rely on
    that to binary-search for the longest.
    """

    def __init__(self, table_size: int) -> None:
        if table_size < 1:
            raise ValueError("table_size must be at least 1")
        self.table_size = table_size
        self._owners: OrderedDict[int, list[str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def _known(self, hashes: Sequence[int], replica: str | None = None) -> int:
        """How many leading blocks of `hashes` are known (to have been served by
        `replica`; None: by any)."""
        owners = self._owners
        low, high = 0, len(hashes)  # hashes[:low] known; hashes[high:] not
        while low < high:
            middle = (low + high + 1) // 2
            found = owners.get(hashes[middle - 1])
            if found is not None and (replica is None or replica in found):
                low = middle
            else:
                high = middle - 1
        return low

    def match(self, hashes: Sequence[int]) -> Match:
        """The replica that last served the longest prefix of `hashes` known, and its
        length."""
        low = self._known(hashes)
        return Match(self._owners[hashes[low - 1]][-1], low) if low else NO_MATCH

    def held(self, hashes: Sequence[int]) -> dict[str, int]:
        """Each replica known to hold a prefix of `hashes`, with that prefix's length in
        blocks (its engine's cache may hold it: it served it)."""
        longest = self._known(hashes)
        if not longest:
            return {}
        out = dict.fromkeys(self._owners[hashes[longest - 1]], longest)
        for replica in self._owners[hashes[0]]:
            if replica not in out:
                out[replica] = self._known(hashes[:longest - 1], replica)
        return out

    def record(self, hashes: Sequence[int], replica: str) -> None:
        """`replica` now serves the prompt of `hashes`: it holds each of its prefixes."""
        owners = self._owners
        for block in reversed(hashes):
            found = owners.get(block)
            if found is None:
                owners[block] = [replica]
            else:
                if replica in found:
                    found.remove(replica)
                elif len(found) >= MAX_OWNERS:
                    del found[0]
                found.append(replica)
                owners.move_to_end(block)
        while len(owners) > self.table_size:
            owners.popitem(last=False)
