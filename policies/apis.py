"""The client APIs a backend may serve, and which a backend serves by default.  Pure: no I/O.

A request is for one API (the endpoint it came on); it is sent only to a backend that
serves that API, natively. `responses` and `messages` are named now so that a config may
say which engines speak them (a later change decides pass-through vs translation by it).
"""

from __future__ import annotations

import enum


class Api(enum.StrEnum):
    """A client API: a closed set, also a metric label and a ledger column."""

    CHAT = "chat"  # /v1/chat/completions
    COMPLETIONS = "completions"  # /v1/completions
    EMBEDDINGS = "embeddings"  # /v1/embeddings
    RESPONSES = "responses"  # /v1/responses
    MESSAGES = "messages"  # /v1/messages (Anthropic)


# What a backend serves when its config does not say: every engine speaks chat and
# completions; the simulated engine embeds too.
DEFAULT_APIS: frozenset[Api] = frozenset({Api.CHAT, Api.COMPLETIONS})
SIMULATED_APIS: frozenset[Api] = DEFAULT_APIS | {Api.EMBEDDINGS}
# The APIs whose requests the intent classifier can read (steering applies to them only).
GENERATIVE_APIS: frozenset[Api] = frozenset({Api.CHAT, Api.COMPLETIONS, Api.RESPONSES,
                                             Api.MESSAGES})
