"""The TTFT objectives' attainment (`router.report.slo`) as the report's text lines, HTML
table and CSV lines. Every string from the ledger is HTML-escaped."""

from __future__ import annotations

from html import escape
from typing import Any

SLO_TITLE = "TTFT objectives: first token within the class's objective (share of judged)"
HEADINGS = ("objective ms", "requests", "judged", "attained", "missed", "met")
CSV_HEADINGS = ("class", "objective_ms", "judged", "attained", "missed", "attainment")
_LABEL = 22


def slo_groups(report: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(scope, arm, figures of one class) for all arms, then each arm; none without "slo"."""
    slo = report.get("slo")
    if slo is None:
        return []
    out = [("total", "", c) for c in slo["total"]]
    for arm in slo["arms"]:
        out.extend(("arm", arm["arm"], c) for c in arm["classes"])
    return out


def objective(figures: dict[str, Any]) -> str:
    values = figures["objectives_ms"]
    if not values:
        return "-"
    low, high = values[0], values[-1]
    return f"{low:,.0f}" if low == high else f"{low:,.0f}-{high:,.0f}"


def cells(figures: dict[str, Any]) -> list[str]:
    met = figures["attainment"]
    return [objective(figures), f"{figures['requests']:,}", f"{figures['judged']:,}",
            f"{figures['attained']:,}", f"{figures['missed']:,}",
            "-" if met is None else f"{100 * met:.1f}%"]


def slo_text(report: dict[str, Any]) -> list[str]:
    found = slo_groups(report)
    if not found:
        return []
    lines = ["", SLO_TITLE, _row("", HEADINGS)]
    current = None
    for scope, arm, figures in found:
        group = "all arms" if scope == "total" else arm
        if group != current:
            lines.append(_clip(group))
            current = group
        lines.append(_row("  " + figures["class"], cells(figures)))
    return lines


def slo_html(report: dict[str, Any]) -> str:
    found = slo_groups(report)
    if not found:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in HEADINGS)
    rows = [f"<tr><th>arm / class</th>{head}</tr>"]
    current = None
    for scope, arm, figures in found:
        group = "all arms" if scope == "total" else arm
        if group != current:
            rows.append(f"<tr class='arm'><td>{escape(group)}</td>"
                        + "<td></td>" * len(HEADINGS) + "</tr>")
            current = group
        tds = "".join(f"<td>{escape(c)}</td>" for c in cells(figures))
        rows.append(f"<tr class='backend'><td>{escape(figures['class'])}</td>{tds}</tr>")
    return (f"<h2>{escape(SLO_TITLE)}</h2><div class='scroll'><table>" + "".join(rows)
            + "</table></div>")


def slo_csv(report: dict[str, Any]) -> list[tuple[str, str, list[Any]]]:
    """(scope "slo", arm ("" for all arms), values under CSV_HEADINGS) per class and group."""
    return [("slo", arm, [f["class"], objective(f), f["judged"], f["attained"], f["missed"],
                          "" if f["attainment"] is None else f["attainment"]])
            for _, arm, f in slo_groups(report)]


def _clip(label: str) -> str:
    return label if len(label) <= _LABEL else label[: _LABEL - 1] + "…"


def _row(label: str, values: tuple[str, ...] | list[str]) -> str:
    return (f"{_clip(label):<{_LABEL}}" + "".join(f"{v:>13}" for v in values)).rstrip()
