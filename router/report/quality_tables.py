"""The quality of downgrades (`router.report.quality`) as the report's text lines, HTML
tables and CSV lines: the verdicts per route, intent and language, then per route the table
"if min_confidence were X", each with a legend of how it is computed and the judge's
version. Every string from the ledger is HTML-escaped."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from html import escape
from typing import Any

GROUPS_TITLE = "Quality of downgrades: the small model's answers against the primary's"
GROUP_HEADINGS = ("language", "verdicts", "non-loss", "95% interval", "no verdict", "saved")
THRESHOLD_HEADINGS = ("moved", "non-loss", "95% interval", "verdicts", "saved")
CSV_HEADINGS = ("route", "intent", "language", "verdicts", "no_verdict", "non_loss",
                "non_loss_low", "non_loss_high", "saved", "min_confidence", "share_moved",
                "judge_version")
_LABEL = 22
_GROUP_WIDTHS = (10, 10, 10, 16, 11, 12)
_THRESHOLD_WIDTHS = (10, 10, 16, 10, 12)


def groups_legend(quality: dict[str, Any]) -> str:
    others = quality["other_versions"]
    left_out = (f" ({others:,} verdict{'s' if others != 1 else ''} of other judge versions "
                "left out)" if others else "")
    return (f"Judge {quality['judge_version']}, both orders{left_out}. Non-loss: share of "
            "verdicts judging the small model's answer better or as good (95% Wilson "
            "interval); no verdict: the judge's reply was unreadable; saved: what these "
            "downgrades saved.")


def thresholds_title(route: dict[str, Any]) -> str:
    return f"If min_confidence were X: route {route['route']}"


def thresholds_legend(route: dict[str, Any]) -> str:
    now = route["min_confidence"]
    saved = ("the primary's cost less the small backend's on the same tokens, or the same "
             "slot time at a GPU-time price, which overstates the small model's cost"
             if route["saved_known"]
             else "unknown: the config names no small backend")
    return (f"Now {'never' if now is None else f'{now:g}'}, small backend "
            f"{route['small_backend'] or '-'}; {route['classified']:,} classified requests "
            "(served, of an intent it may move). Moved: share with p_simple >= X; non-loss: "
            "over the verdicts with p_simple >= X (shadows follow moved requests only: below "
            f"today's threshold the figure is theirs); saved: what moving them saves ({saved}).")


def group_cells(g: dict[str, Any]) -> list[str]:
    return [g["language"], f"{g['verdicts']:,}", _pct(g["non_loss"]), _interval(g),
            f"{g['no_verdict']:,}", f"{g['saved']:,.4f}"]


def threshold_cells(t: dict[str, Any]) -> list[str]:
    saved = t["saved"]
    return [_pct(t["share_moved"]), _pct(t["non_loss"]), _interval(t), f"{t['verdicts']:,}",
            "-" if saved is None else f"{saved:,.4f}"]


def level(t: dict[str, Any], route: dict[str, Any]) -> str:
    now = route["min_confidence"] is not None and t["min_confidence"] == route["min_confidence"]
    return f"{t['min_confidence']:.2f}" + (" (now)" if now else "")


def quality_text(report: dict[str, Any]) -> list[str]:
    quality = report.get("quality")
    if not quality:
        return []
    lines = ["", GROUPS_TITLE, *textwrap.wrap(groups_legend(quality), 96),
             group_head("route / intent")]
    for route in quality["routes"]:
        lines.append(_clip(route["route"]))
        lines += [group_line("  " + (g["intent"] or "(none)"), g)
                  for g in quality["groups"] if g["route"] == route["route"]]
    for route in quality["routes"]:
        lines += ["", thresholds_title(route), *textwrap.wrap(thresholds_legend(route), 96),
                  threshold_head()]
        lines += [threshold_line(t, route) for t in route["thresholds"]]
    return lines


def group_head(first: str) -> str:
    """The text heading of the verdicts' table (`first` over its labels)."""
    return _row(first, GROUP_HEADINGS, _GROUP_WIDTHS)


def group_line(label: str, g: dict[str, Any]) -> str:
    """One group's text line."""
    return _row(label, group_cells(g), _GROUP_WIDTHS)


def threshold_head() -> str:
    return _row("min_confidence", THRESHOLD_HEADINGS, _THRESHOLD_WIDTHS)


def threshold_line(t: dict[str, Any], route: dict[str, Any]) -> str:
    """One level's text line (the route's `min_confidence` marked "now")."""
    return _row(level(t, route), threshold_cells(t), _THRESHOLD_WIDTHS)


def quality_html(report: dict[str, Any]) -> str:
    quality = report.get("quality")
    if not quality:
        return ""
    rows = [_head("route / intent", GROUP_HEADINGS)]
    for route in quality["routes"]:
        rows.append(f"<tr class='arm'><td colspan='{len(GROUP_HEADINGS) + 1}'>"
                    f"{escape(route['route'])}</td></tr>")
        rows += [_tr(g["intent"] or "(none)", group_cells(g), "backend")
                 for g in quality["groups"] if g["route"] == route["route"]]
    parts = [f"<h2>{escape(GROUPS_TITLE)}</h2><p>{escape(groups_legend(quality))}</p>",
             _table(rows)]
    for route in quality["routes"]:
        lines = [_head("min_confidence", THRESHOLD_HEADINGS)]
        lines += [_tr(level(t, route), threshold_cells(t)) for t in route["thresholds"]]
        parts += [f"<h2>{escape(thresholds_title(route))}</h2>"
                  f"<p>{escape(thresholds_legend(route))}</p>", _table(lines)]
    return "\n".join(parts)


def quality_csv(report: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    """(scope, values under CSV_HEADINGS): "quality" per route, intent and language, then
    "threshold" per level of each route."""
    quality = report.get("quality")
    if not quality:
        return []
    version = quality["judge_version"]
    out: list[tuple[str, list[Any]]] = [
        ("quality", _blank([g["route"], g["intent"], g["language"], g["verdicts"],
                            g["no_verdict"], g["non_loss"], g["low"], g["high"], g["saved"],
                            None, None, version]))
        for g in quality["groups"]]
    out += [("threshold", _blank([route["route"], None, None, t["verdicts"], None,
                                  t["non_loss"], t["low"], t["high"], t["saved"],
                                  t["min_confidence"], t["share_moved"], version]))
            for route in quality["routes"] for t in route["thresholds"]]
    return out


def _blank(values: list[Any]) -> list[Any]:
    return ["" if v is None else v for v in values]


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def _interval(figures: dict[str, Any]) -> str:
    if figures["verdicts"] == 0:
        return "-"
    return f"{100 * figures['low']:.1f}-{100 * figures['high']:.1f}%"


def _head(first: str, headings: Sequence[str]) -> str:
    return f"<tr><th>{escape(first)}</th>" + "".join(f"<th>{escape(h)}</th>"
                                                     for h in headings) + "</tr>"


def _tr(label: str, cells: Sequence[str], row_class: str = "") -> str:
    tds = "".join(f"<td>{escape(c)}</td>" for c in cells)
    cls = f" class='{row_class}'" if row_class else ""
    return f"<tr{cls}><td>{escape(label)}</td>{tds}</tr>"


def _table(rows: Sequence[str]) -> str:
    return "<div class='scroll'><table>" + "".join(rows) + "</table></div>"


def _clip(label: str) -> str:
    return label if len(label) <= _LABEL else label[: _LABEL - 1] + "…"


def _row(label: str, values: Sequence[str], widths: Sequence[int]) -> str:
    cells = "".join(f"{v:>{w}}" for v, w in zip(values, widths, strict=True))
    return (f"{_clip(label):<{_LABEL}}" + cells).rstrip()
