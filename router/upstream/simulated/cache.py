"""The simulated engine's prefix cache: an LRU of prompt blocks bounded in tokens, so a
prompt sharing a prefix with a recent one prefills only the rest, as vLLM's automatic
prefix caching does.

Blocks are named by `policies.scheduler.prefix.block_hashes` (chained: a hash names its whole
prefix), so the gateway's affinity table and the engine agree on what a shared prefix is.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BYTES_PER_TOKEN = 4  # of the rendered prompt: a block of n tokens hashes 4n bytes


class PrefixCache:
    """At most `capacity_tokens // block_tokens` blocks, the least recently used evicted
    first. Hits and queries are counted in tokens, as vLLM counts them."""

    def __init__(self, capacity_tokens: int, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.max_blocks = capacity_tokens // block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # of those, tokens found cached

    @property
    def block_bytes(self) -> int:
        return self.block_tokens * BYTES_PER_TOKEN

    @property
    def tokens(self) -> int:
        """Tokens held now."""
        return len(self._blocks) * self.block_tokens

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def lookup(self, blocks: Sequence[int], prompt_tokens: int) -> int:
        """The prompt's tokens found cached: its leading blocks held, up to all its tokens
        but the last (which an engine computes anyway, for the first token's logits)."""
        held = 0
        for block in blocks:
            if block not in self._blocks:
                break
            held += 1
        cached = max(0, min(held * self.block_tokens, prompt_tokens - 1))
        self.queries += prompt_tokens
        self.hits += cached
        return cached

    def insert(self, blocks: Sequence[int]) -> None:
        """A prefilled prompt's blocks become the most recent, its first block the most
        recent of all: a prefix outlives its longer extensions, so what stays of a prompt
        is always a prefix of it."""
        cache = self._blocks
        for block in reversed(blocks):
            cache[block] = None
            cache.move_to_end(block)
        while len(cache) > self.max_blocks:
            cache.popitem(last=False)
