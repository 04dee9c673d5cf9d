"""The tenants' split of each backend (`router.report.tenants`) as the report's text lines,
HTML table and CSV lines. Every string from the ledger is HTML-escaped."""

from __future__ import annotations

from html import escape
from typing import Any

TENANTS_TITLE = ("Tenants per backend (all arms; share of the backend's served tokens; "
                 "queue wait in ms)")
HEADINGS = ("weight", "requests", "tokens", "share", "wait p50", "wait p95", "429s")
CSV_HEADINGS = ("tenant", "weight", "tokens", "token_share", "jain", "jain_weighted")
_LABEL = 22


def cells(figures: dict[str, Any]) -> list[str]:
    weight, share = figures["weight"], figures["token_share"]
    return ["-" if weight is None else f"{weight:g}", f"{figures['requests']:,}",
            f"{figures['tokens']:,}", "-" if share is None else f"{100 * share:.1f}%",
            _ms(figures["queue_wait_p50_ms"]), _ms(figures["queue_wait_p95_ms"]),
            f"{figures['status_429']:,}"]


def fairness(backend: dict[str, Any]) -> str:
    """Jain's index in words, saying what it was computed over."""
    f = backend["fairness"]
    if f["jain"] is None:
        return f"Jain's fairness index - over {f['tenants']} tenants (no token served)"
    basis = "tokens / weight" if f["weighted"] else "tokens; weights not all known"
    return f"Jain's fairness index {f['jain']:.3f} over {f['tenants']} tenants ({basis})"


def tenant_text(report: dict[str, Any]) -> list[str]:
    found = report.get("tenants")
    if not found:
        return []
    lines = ["", TENANTS_TITLE, _row("", HEADINGS)]
    for backend in found:
        lines.append(_clip(backend["backend"]) + "  " + fairness(backend))
        lines.extend(_row("  " + t["tenant"], cells(t)) for t in backend["tenants"])
    return lines


def tenant_html(report: dict[str, Any]) -> str:
    found = report.get("tenants")
    if not found:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in HEADINGS)
    rows = [f"<tr><th>backend / tenant</th>{head}</tr>"]
    for backend in found:
        rows.append(f"<tr class='arm'><td>{escape(backend['backend'])}</td>"
                    f"<td colspan='{len(HEADINGS)}'>{escape(fairness(backend))}</td></tr>")
        for t in backend["tenants"]:
            tds = "".join(f"<td>{escape(c)}</td>" for c in cells(t))
            rows.append(f"<tr class='backend'><td>{escape(t['tenant'])}</td>{tds}</tr>")
    return (f"<h2>{escape(TENANTS_TITLE)}</h2><div class='scroll'><table>" + "".join(rows)
            + "</table></div>")


def tenant_csv(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], list[Any]]]:
    """(backend, the tenant's figures, values under CSV_HEADINGS) per tenant of each
    backend; Jain's index (and whether weighted) is its backend's, on each of its lines."""
    out: list[tuple[str, dict[str, Any], list[Any]]] = []
    for backend in report.get("tenants", ()):
        f = backend["fairness"]
        jain = "" if f["jain"] is None else f["jain"]
        out.extend((backend["backend"], t, [t["tenant"], "" if t["weight"] is None
                                            else t["weight"], t["tokens"],
                                            "" if t["token_share"] is None else t["token_share"],
                                            jain, f["weighted"]])
                   for t in backend["tenants"])
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _clip(label: str) -> str:
    return label if len(label) <= _LABEL else label[: _LABEL - 1] + "…"


def _row(label: str, values: tuple[str, ...] | list[str]) -> str:
    return (f"{_clip(label):<{_LABEL}}" + "".join(f"{v:>11}" for v in values)).rstrip()
