"""The simulated engine as a pairwise judge. Asked to compare answers A and B in the
gateway's judge prompt (policies.quality.judging), it prefers the answer of more words,
and calls two answers within 10% of each other a tie: a fixed rule, so that a test or a
demo knows each verdict (a simulated primary that answers at greater length wins)."""

from __future__ import annotations

from typing import Any

_A, _B, _ASK = "[Answer A]\n", "\n\n[Answer B]\n", "\n\nWhich answer serves the user better?"
_TIE_WITHIN = 0.1


def pick(body: dict[str, Any]) -> str | None:
    """"A", "B" or "TIE" for a judge's request; None for any other request."""
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    content = last.get("content") if isinstance(last, dict) else None
    if not isinstance(content, str) or _ASK not in content:
        return None
    a_at, b_at = content.find(_A), content.find(_B)
    if a_at < 0 or b_at < a_at:
        return None
    a = len(content[a_at + len(_A):b_at].split())
    b = len(content[b_at + len(_B):content.rfind(_ASK)].split())
    if a > b * (1 + _TIE_WITHIN):
        return "A"
    if b > a * (1 + _TIE_WITHIN):
        return "B"
    return "TIE"
