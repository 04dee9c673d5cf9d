"""The cost report (`router.report.build.build_report`) as text, CSV, JSON or one HTML page.

The HTML page is self-contained: inline CSS, charts as inline SVG (`router.report.charts`),
no script and no URL of any kind (its Content-Security-Policy forbids loading anything), so
it opens offline and can be mailed as one file. Every string from the ledger is HTML-escaped.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any

import orjson

from router.report.apis import api_html, api_text
from router.report.batch_tables import batch_html, batch_text
from router.report.charts import cost_chart, share_chart, wait_chart
from router.report.quality_tables import CSV_HEADINGS as QUALITY_HEADINGS
from router.report.quality_tables import quality_csv, quality_html, quality_text
from router.report.slo_tables import CSV_HEADINGS, slo_csv, slo_html, slo_text
from router.report.tenant_tables import CSV_HEADINGS as TENANT_HEADINGS
from router.report.tenant_tables import tenant_csv, tenant_html, tenant_text


@dataclass(frozen=True, slots=True)
class Column:
    key: str  # a key of `router.report.build.group_stats`
    label: str
    kind: str  # count | share (a fraction) | pct (already in %) | money | unit_money | ms


SECTIONS: dict[str, tuple[Column, ...]] = {
    "Traffic": (
        Column("requests", "requests", "count"), Column("served", "served", "count"),
        Column("fallback_share", "fallback", "share"), Column("rate_429", "429", "share"),
        Column("timeout_rate", "timeout", "share"), Column("error_rate", "error", "share"),
        Column("disconnect_rate", "discon.", "share"),
        Column("estimated_share", "est. tok", "share"),
    ),
    "Cost": (
        Column("cost", "cost", "money"), Column("cost_per_request", "per request", "unit_money"),
        Column("cost_per_1k", "per 1k req", "money"),
        Column("counterfactual_cost", "all-primary", "money"),
        Column("saving", "saving", "money"), Column("saving_pct", "saving %", "pct"),
    ),
    "Tokens and latency (ms)": (
        Column("prompt_tokens", "prompt tok", "count"),
        Column("completion_tokens", "compl. tok", "count"),
        Column("queue_wait_p50_ms", "wait p50", "ms"),
        Column("queue_wait_p95_ms", "wait p95", "ms"),
        Column("ttft_p50_ms", "TTFT p50", "ms"), Column("ttft_p95_ms", "TTFT p95", "ms"),
    ),
}
CSV_KEYS: tuple[str, ...] = (
    "requests", "served", "fallback", "fallback_share", "status_429", "rate_429", "timeouts",
    "timeout_rate", "errors", "error_rate", "disconnects", "disconnect_rate", "prompt_tokens",
    "completion_tokens", "estimated_share", "cost", "cost_per_request", "cost_per_1k",
    "counterfactual_cost", "saving", "saving_pct", "queue_wait_n", "queue_wait_p50_ms",
    "queue_wait_p95_ms", "ttft_n", "ttft_p50_ms", "ttft_p95_ms",
)
REPLICAS_TITLE = "Replicas per backend (all arms; share of the backend's requests; tokens)"
REPLICA_COLUMNS: tuple[Column, ...] = (
    Column("requests", "requests", "count"), Column("share", "share", "share"),
    Column("prompt_tokens", "prompt", "count"), Column("completion_tokens", "compl.", "count"),
    Column("cost", "cost", "money"), Column("ttft_p50_ms", "TTFT p50", "ms"),
    Column("ttft_p95_ms", "TTFT p95", "ms"),
)
LABEL_WIDTH = 22
SPARK = "▁▂▃▄▅▆▇█"


def fmt(value: Any, kind: str) -> str:
    """One figure for people: "-" when undefined."""
    if value is None:
        return "-"
    formats: dict[str, Callable[[Any], str]] = {
        "count": lambda v: f"{v:,}", "share": lambda v: f"{100 * v:.1f}%",
        "pct": lambda v: f"{v:.1f}%", "money": lambda v: f"{v:,.4f}",
        "unit_money": lambda v: f"{v:,.6f}", "ms": lambda v: f"{v:,.1f}",
    }
    return formats[kind](value)


def groups(report: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(scope, arm, backend, figures) for the total, each arm and each backend within it."""
    out = [("total", "", "", report["total"])]
    for arm in report["arms"]:
        out.append(("arm", arm["arm"], "", arm))
        out.extend(("backend", arm["arm"], b["backend"], b) for b in arm["backends"])
    return out


def replica_groups(report: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(scope, backend, replica, figures) for each backend of the replica breakdown and each
    of its replicas; none when the report has no breakdown (one engine per backend)."""
    out = []
    for b in report.get("replicas", ()):
        out.append(("backend", b["backend"], "", b))
        out.extend(("replica", b["backend"], r["replica"], r) for r in b["replicas"])
    return out


def render_json(report: dict[str, Any]) -> str:
    return orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n"


def render_csv(report: dict[str, Any]) -> str:
    """One line per group (total, arms, backends within arms) under a header row.

    With a replica breakdown, two more columns, replica and share, and a line per replica
    of each backend (scope "replica", all arms: arm empty). With TTFT objectives, six more
    (class ... attainment) and a line per class of all arms and of each arm (scope "slo").
    With tenants, six more (tenant ... jain_weighted) and a line per tenant of each backend
    (scope "tenant", all arms). With verdicts, twelve more (route ... judge_version) and a
    line per route, intent and language (scope "quality") and per threshold of each route
    (scope "threshold").
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    replicas = [g for g in replica_groups(report) if g[0] == "replica"]
    slo = slo_csv(report)
    tenants = tenant_csv(report)
    quality = quality_csv(report)
    extra: tuple[str, ...] = ("", "") if replicas else ()
    slo_extra: tuple[str, ...] = ("",) * len(CSV_HEADINGS) if slo else ()
    tenant_extra: tuple[str, ...] = ("",) * len(TENANT_HEADINGS) if tenants else ()
    tail: tuple[str, ...] = ("",) * len(QUALITY_HEADINGS) if quality else ()
    writer.writerow(("scope", "arm", "backend", *CSV_KEYS, *(("replica", "share") if replicas
                                                             else ()),
                     *(CSV_HEADINGS if slo else ()), *(TENANT_HEADINGS if tenants else ()),
                     *(QUALITY_HEADINGS if quality else ())))
    for scope, arm, backend, figures in groups(report):
        writer.writerow((scope, arm, backend, *_csv_figures(figures), *extra, *slo_extra,
                         *tenant_extra, *tail))
    for scope, backend, replica, figures in replicas:
        writer.writerow((scope, "", backend, *_csv_figures(figures), replica, figures["share"],
                         *slo_extra, *tenant_extra, *tail))
    for scope, arm, values in slo:
        writer.writerow((scope, arm, "", *[""] * len(CSV_KEYS), *extra, *values,
                         *tenant_extra, *tail))
    for backend, figures, values in tenants:
        writer.writerow(("tenant", "", backend, *_csv_figures(figures), *extra, *slo_extra,
                         *values, *tail))
    for scope, values in quality:
        writer.writerow((scope, "", "", *[""] * len(CSV_KEYS), *extra, *slo_extra,
                         *tenant_extra, *values))
    return buffer.getvalue()


def _csv_figures(figures: dict[str, Any]) -> list[Any]:
    return ["" if figures[k] is None else figures[k] for k in CSV_KEYS]


def render_text(report: dict[str, Any]) -> str:
    """Fixed-width tables, at most 100 columns wide."""
    lines = _text_header(report)
    for title, columns in SECTIONS.items():
        lines += ["", title, _text_row("", [c.label for c in columns])]
        for scope, arm, backend, figures in groups(report):
            label = {"total": "all arms", "arm": arm, "backend": "  " + backend}[scope]
            lines.append(_text_row(label, [fmt(figures[c.key], c.kind) for c in columns]))
    lines += _text_replicas(report) + api_text(report) + slo_text(report)
    lines += tenant_text(report) + batch_text(report) + quality_text(report)
    lines += _text_comparisons(report)
    lines += _text_timeseries(report)
    return "\n".join(lines) + "\n"


def _text_replicas(report: dict[str, Any]) -> list[str]:
    found = replica_groups(report)
    if not found:
        return []
    lines = ["", REPLICAS_TITLE, _text_row("", [c.label for c in REPLICA_COLUMNS])]
    for scope, backend, replica, figures in found:
        label = backend if scope == "backend" else "  " + replica
        lines.append(_text_row(label, [fmt(figures.get(c.key), c.kind)
                                       for c in REPLICA_COLUMNS]))
    return lines


def _text_header(report: dict[str, Any]) -> list[str]:
    h = report["header"]
    return [
        f"slotgate cost report: {h['rows']:,} requests from {h['first']} to {h['last']}",
        f"currency {h['currency']}; experiments: {', '.join(h['experiments']) or '-'}; "
        f"routes: {', '.join(h['routes']) or '-'}",
        f"arms: {', '.join(h['arms'])} (baseline {h['baseline']}); backend rows indented",
        *([f"selected: {selected}"] if (selected := selection(report)) else []),
    ]


def selection(report: dict[str, Any]) -> str:
    """The rows the command selected ("" for all), from the "filter" it adds to a report."""
    chosen = report.get("filter") or {}
    parts = [f"{key} {_stamp(chosen[key]) if key in ('since', 'until') else chosen[key]}"
             for key in ("since", "until", "experiment", "route") if chosen.get(key) is not None]
    return ", ".join(parts)


def _stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def _clip(label: str) -> str:
    return label if len(label) <= LABEL_WIDTH else label[: LABEL_WIDTH - 1] + "…"


def _text_row(label: str, cells: Sequence[str]) -> str:
    label = _clip(label)
    width = 9 if len(cells) > 6 else 12
    return (f"{label:<{LABEL_WIDTH}}" + "".join(f"{c:>{width}}" for c in cells)).rstrip()


def _text_comparisons(report: dict[str, Any]) -> list[str]:
    h = report["header"]
    if not report["comparisons"]:
        return []
    lines = ["", f"Each arm minus the baseline {h['baseline']} ({100 * h['ci_level']:.0f}% "
                 f"bootstrap CI, {h['resamples']:,} resamples, seed {h['seed']})"]
    for c in report["comparisons"]:
        cost, wait, saving = c["cost_per_request"], c["queue_wait_p95_ms"], c["saving_pct"]
        lines += [
            f"{_clip(c['arm'])} ({c['requests']:,} requests) vs {_clip(c['baseline'])} "
            f"({c['baseline_requests']:,})",
            _text_diff("  cost per request", cost, "unit_money"),
            f"  {'saving':<18}{fmt(saving['value'], 'pct'):>30}  {_ci(saving['ci'], 'pct')}",
            _text_diff("  queue wait p95 ms", wait, "ms"),
        ]
    return lines


def _text_diff(label: str, figure: dict[str, Any], kind: str) -> str:
    pair = f"{fmt(figure['arm'], kind)} vs {fmt(figure['baseline'], kind)}"
    diff = figure["diff"]
    sign = "+" if diff is not None and diff >= 0 else ""
    return f"{label:<20}{pair:>28}  diff {sign}{fmt(diff, kind)}  {_ci(figure['ci'], kind)}"


def _ci(ci: list[float] | None, kind: str) -> str:
    return "CI -" if ci is None else f"CI [{fmt(ci[0], kind)}, {fmt(ci[1], kind)}]"


def _text_timeseries(report: dict[str, Any]) -> list[str]:
    ts = report["timeseries"]
    lines = ["", f"Share served by fallback over time ({len(ts['starts'])} buckets of "
                 f"{ts['bucket_s']:,.0f} s; '·' nothing served)"]
    for arm in ts["arms"]:
        spark = "".join("·" if s is None else SPARK[round(s * (len(SPARK) - 1))]
                        for s in arm["fallback_share"])
        requests = sum(arm["requests"])
        lines.append(f"{_clip(arm['arm']):<{LABEL_WIDTH + 1}}{spark}  ({requests:,} requests)")
    return lines


# ---- HTML -----------------------------------------------------------------------------

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1040px;color:#1f2937}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0;font-variant-numeric:tabular-nums}
th,td{padding:3px 9px;border-bottom:1px solid #e5e7eb;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}tr.arm td{font-weight:600}
tr.backend td:first-child{padding-left:24px}.scroll{overflow-x:auto}
svg.chart{display:block;background:#fafafa;border:1px solid #e5e7eb}
svg text{font-size:11px;fill:#4b5563}.legend span{margin-right:14px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
"""
# Only on a page with the replica breakdown: the page of one engine per backend is unchanged.
REPLICA_CSS = "tr.group td{font-weight:600}tr.replica td:first-child{padding-left:24px}\n"


def render_html(report: dict[str, Any]) -> str:
    h = report["header"]
    title = f"slotgate cost report: {h['first']} to {h['last']}"
    replicas = replica_groups(report)
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta http-equiv='Content-Security-Policy' "
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<title>{escape(title)}</title><style>{CSS}{REPLICA_CSS if replicas else ''}</style>"
        "</head><body>",
        f"<h1>{escape(title)}</h1>",
        _html_header(report),
        _html_comparisons(report),  # the answer first: what the arms changed, with its CI
        "<h2>Cost per arm</h2>", cost_chart(report),
        "<h2>Queue wait per arm</h2>", wait_chart(report),
        "<h2>Share served by fallback over time</h2>", share_chart(report),
    ]
    for name, columns in SECTIONS.items():
        parts += [f"<h2>{escape(name)}</h2>", _html_groups(report, columns)]
    if replicas:
        parts += [f"<h2>{escape(REPLICAS_TITLE)}</h2>", _html_replicas(replicas)]
    if apis := api_html(report):
        parts.append(apis)
    if slo := slo_html(report):
        parts.append(slo)
    if tenants := tenant_html(report):
        parts.append(tenants)
    if batch := batch_html(report):
        parts.append(batch)
    if quality := quality_html(report):
        parts.append(quality)
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _html_header(report: dict[str, Any]) -> str:
    h = report["header"]
    items = {
        "requests": f"{h['rows']:,}", "currency": h["currency"],
        "experiments": ", ".join(h["experiments"]) or "-", "routes": ", ".join(h["routes"]) or "-",
        "arms": ", ".join(h["arms"]), "baseline": h["baseline"],
        "quantiles": f"numpy {h['quantile_method']}", "selected": selection(report) or "all",
    }
    return "<p>" + "; ".join(f"<b>{k}</b> {escape(v)}" for k, v in items.items()) + "</p>"


def _html_groups(report: dict[str, Any], columns: Sequence[Column]) -> str:
    head = "".join(f"<th>{escape(c.label)}</th>" for c in columns)
    rows = [f"<tr><th>group</th>{head}</tr>"]
    for scope, arm, backend, figures in groups(report):
        label = {"total": "all arms", "arm": arm, "backend": backend}[scope]
        cells = "".join(f"<td>{escape(fmt(figures[c.key], c.kind))}</td>" for c in columns)
        rows.append(f"<tr class='{scope}'><td>{escape(label)}</td>{cells}</tr>")
    return "<div class='scroll'><table>" + "".join(rows) + "</table></div>"


def _html_replicas(found: list[tuple[str, str, str, dict[str, Any]]]) -> str:
    head = "".join(f"<th>{escape(c.label)}</th>" for c in REPLICA_COLUMNS)
    rows = [f"<tr><th>backend / replica</th>{head}</tr>"]
    for scope, backend, replica, figures in found:
        label, row_class = (backend, "group") if scope == "backend" else (replica, "replica")
        cells = "".join(f"<td>{escape(fmt(figures.get(c.key), c.kind))}</td>"
                        for c in REPLICA_COLUMNS)
        rows.append(f"<tr class='{row_class}'><td>{escape(label)}</td>{cells}</tr>")
    return "<div class='scroll'><table>" + "".join(rows) + "</table></div>"


def _html_comparisons(report: dict[str, Any]) -> str:
    h = report["header"]
    rows = ["<tr><th>arm</th><th>cost per request</th><th>diff</th><th>CI</th>"
            "<th>saving</th><th>CI</th><th>wait p95 ms</th><th>diff</th><th>CI</th></tr>"]
    for c in report["comparisons"]:
        cost, wait, saving = c["cost_per_request"], c["queue_wait_p95_ms"], c["saving_pct"]
        cells = (c["arm"], fmt(cost["arm"], "unit_money"), fmt(cost["diff"], "unit_money"),
                 _ci(cost["ci"], "unit_money"), fmt(saving["value"], "pct"),
                 _ci(saving["ci"], "pct"), fmt(wait["arm"], "ms"), fmt(wait["diff"], "ms"),
                 _ci(wait["ci"], "ms"))
        rows.append("<tr>" + "".join(f"<td>{escape(x)}</td>" for x in cells) + "</tr>")
    caption = (f"Each arm minus the baseline {h['baseline']}: {100 * h['ci_level']:.0f}% "
               f"percentile bootstrap, {h['resamples']:,} resamples, seed {h['seed']}")
    return (f"<h2>Comparison</h2><p>{escape(caption)}</p><div class='scroll'><table>"
            + "".join(rows) + "</table></div>")
