"""The report's breakdown by client API (chat, completions, embeddings, ...): each API's
figures over all arms, as a JSON-able list, text lines and an HTML table.

Present only when the rows hold more than one API (rows written before the ledger kept the
API, of no known endpoint, form "(none)"), so a report of one API is as it was before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from router.ledger.base import LedgerRow

APIS_TITLE = "Client APIs (all arms; tokens, cost and latency in ms)"
_COLUMNS = (("requests", "requests"), ("served", "served"), ("prompt_tokens", "prompt"),
            ("completion_tokens", "compl."), ("cost", "cost"), ("queue_wait_p95_ms", "wait p95"),
            ("ttft_p50_ms", "TTFT p50"), ("ttft_p95_ms", "TTFT p95"))
_NONE = "(none)"
_LABEL = 22


def api_breakdown(rows: Sequence[LedgerRow],
                  stats: Callable[[Sequence[LedgerRow]], dict[str, Any]]
                  ) -> list[dict[str, Any]] | None:
    """[{"api": name, **stats(its rows)}] in order of first appearance; None for one API."""
    by_api: dict[str, list[LedgerRow]] = {}
    for row in rows:
        by_api.setdefault(row.api or _NONE, []).append(row)
    if len(by_api) < 2:
        return None
    return [{"api": api, **stats(api_rows)} for api, api_rows in by_api.items()]


def _cell(value: Any, key: str) -> str:
    if value is None:
        return "-"
    if key == "cost":
        return f"{value:.4f}"
    return f"{value:,.0f}"


def api_text(report: dict[str, Any]) -> list[str]:
    found = report.get("apis")
    if not found:
        return []
    lines = ["", APIS_TITLE, _row("", [label for _, label in _COLUMNS])]
    for figures in found:
        lines.append(_row(figures["api"], [_cell(figures[k], k) for k, _ in _COLUMNS]))
    return lines


def api_html(report: dict[str, Any]) -> str:
    found = report.get("apis")
    if not found:
        return ""
    head = "".join(f"<th>{escape(label)}</th>" for _, label in _COLUMNS)
    rows = [f"<tr><th>api</th>{head}</tr>"]
    for figures in found:
        tds = "".join(f"<td>{escape(_cell(figures[k], k))}</td>" for k, _ in _COLUMNS)
        rows.append(f"<tr><td>{escape(figures['api'])}</td>{tds}</tr>")
    return (f"<h2>{escape(APIS_TITLE)}</h2><div class='scroll'><table>" + "".join(rows)
            + "</table></div>")


def _row(label: str, cells: Sequence[str]) -> str:
    shown = label if len(label) <= _LABEL else label[:_LABEL - 1] + "…"
    return shown.ljust(_LABEL) + "".join(c.rjust(9) for c in cells)  # 94 wide
