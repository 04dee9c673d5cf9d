"""Batch work (`router.report.batch`) as the report's text lines and HTML tables: each
tenant's interactive and batch figures side by side, then each backend's slot time and the
idle capacity batch lines filled, with how that share is computed. Every string from the
ledger is HTML-escaped."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from html import escape
from typing import Any

TENANTS_TITLE = "Batch work per tenant (all arms; interactive beside batch; tokens and cost)"
TENANT_HEADINGS = ("inter. req", "inter. tok", "inter. cost", "batch req", "batch tok",
                   "batch cost")
BACKENDS_TITLE = "Batch lines' slot time per backend (all arms; slot-seconds)"
BACKEND_HEADINGS = ("slots", "interactive", "idle", "batch", "lines", "idle filled")
_LABEL = 22


def how(batch: dict[str, Any]) -> str:
    """How the idle share is computed, with the window it is computed over."""
    return (f"Window {batch['window']['seconds']:,.1f} s, from the first request's arrival "
            "to the last one's end. Idle = slots x window - interactive slot-seconds; idle "
            "filled = batch slot-seconds / idle.")


def tenant_cells(t: dict[str, Any]) -> list[str]:
    return [cell for side in (t["interactive"], t["batch"])
            for cell in (f"{side['requests']:,}", f"{side['tokens']:,}", f"{side['cost']:,.4f}")]


def backend_cells(b: dict[str, Any]) -> list[str]:
    filled, idle = b["idle_filled"], b["idle_slot_s"]
    return ["-" if b["slots"] is None else f"{b['slots']:,}", _s(b["interactive_slot_s"]),
            _s(idle), _s(b["batch_slot_s"]), f"{b['batch_lines']:,}",
            "-" if filled is None else f"{100 * filled:.1f}%"]


def batch_text(report: dict[str, Any]) -> list[str]:
    batch = report.get("batch")
    if not batch:
        return []
    lines = ["", TENANTS_TITLE, _row("", TENANT_HEADINGS)]
    lines += [_row(t["tenant"], tenant_cells(t)) for t in batch["tenants"]]
    lines += ["", BACKENDS_TITLE, *textwrap.wrap(how(batch), 88), _row("", BACKEND_HEADINGS)]
    lines += [_row(b["backend"], backend_cells(b)) for b in batch["backends"]]
    return lines


def batch_html(report: dict[str, Any]) -> str:
    batch = report.get("batch")
    if not batch:
        return ""
    return (f"<h2>{escape(TENANTS_TITLE)}</h2>"
            + _table("tenant", TENANT_HEADINGS, batch["tenants"], "tenant", tenant_cells)
            + f"<h2>{escape(BACKENDS_TITLE)}</h2><p>{escape(how(batch))}</p>"
            + _table("backend", BACKEND_HEADINGS, batch["backends"], "backend",
                     backend_cells))


def _table(first: str, headings: Sequence[str], entries: list[dict[str, Any]], key: str,
           cells: Callable[[dict[str, Any]], list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headings)
    rows = [f"<tr><th>{first}</th>{head}</tr>"]
    for entry in entries:
        tds = "".join(f"<td>{escape(c)}</td>" for c in cells(entry))
        rows.append(f"<tr><td>{escape(entry[key])}</td>{tds}</tr>")
    return "<div class='scroll'><table>" + "".join(rows) + "</table></div>"


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:,.1f}"


def _row(label: str, values: Sequence[str]) -> str:
    shown = label if len(label) <= _LABEL else label[:_LABEL - 1] + "…"
    return (f"{shown:<{_LABEL}}" + "".join(f"{v:>12}" for v in values)).rstrip()
