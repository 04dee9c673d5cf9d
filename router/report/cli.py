"""`slotgate report`: what each experiment arm cost, saved and made people wait.

Reads the ledger named by the config (or --ledger), keeps the rows the filters select and
prints the report as a terminal table, JSON or CSV, or writes one HTML page.
Exit status: 0 done, 1 no config, no ledger or no rows to report on, 2 bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from policies.config import Config
from router.common.config_error import ConfigError, from_env
from router.config import load_config
from router.ledger.base import LedgerRow, RowFilter
from router.report.build import NONE_GROUP, build_report, parse_when
from router.report.quality import QualityInputs
from router.report.quality import load as load_quality
from router.report.render import render_csv, render_html, render_json, render_text
from router.report.tenants import tenant_weights

POSTGRES_PREFIXES = ("postgresql://", "postgres://")


class ReportError(Exception):
    """A reason to exit 1, said in one line on stderr."""


def report_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="slotgate report")
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's way out: --help (0) or a bad flag (2)
        return exc.code if isinstance(exc.code, int) else 2
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.parser
    now = time.time()
    try:
        where = RowFilter(
            since=None if args.since is None else parse_when(args.since, now),
            until=None if args.until is None else parse_when(args.until, now),
            experiment=args.experiment, route=args.route,
        )
    except ValueError as exc:
        return _usage_error(parser, str(exc))
    try:
        target, config = _ledger_and_config(args.config, args.ledger)
        rows, quality = asyncio.run(fetch_rows(target, where, config))
        if not rows:
            raise ReportError(f"{_public(target)}: {_nothing_found(where)}")
        if args.baseline is not None and args.baseline not in {_arm(r) for r in rows}:
            arms = ", ".join(sorted({_arm(r) for r in rows}))
            return _usage_error(parser, f"--baseline {args.baseline!r} is not an arm "
                                        f"of these rows (arms: {arms})")
        report = build_report(rows, currency=config.currency, baseline=args.baseline,
                              weights=tenant_weights(config.auth.keys),
                              slots={n: b.slots for n, b in config.backends.items()},
                              quality=quality)
    except ReportError as exc:
        print(f"slotgate report: {exc}", file=sys.stderr)
        return 1
    report["filter"] = {"since": where.since, "until": where.until,
                        "experiment": where.experiment, "route": where.route}
    return _output(args, report)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`slotgate report`'s flags, on its sub-command or on `report_main`'s parser."""
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--config", help="YAML config (default: the embedded config.yaml); "
                                         "names the ledger, the currency and the tenants' "
                                         "weights")
    parser.add_argument("--ledger", metavar="PATH_OR_URL",
                        help="a SQLite file or a postgresql:// URL (overrides the config)")
    parser.add_argument("--since", metavar="WHEN",
                        help="from this time on: ISO 8601 (UTC unless a zone is given), "
                             "or a span back from now such as 30m, 2h, 7d")
    parser.add_argument("--until", metavar="WHEN", help="before this time (same forms)")
    parser.add_argument("--experiment", metavar="NAME", help="only this experiment's rows")
    parser.add_argument("--route", metavar="NAME", help="only requests for this model name")
    parser.add_argument("--baseline", metavar="ARM",
                        help="the arm the others are compared with (default: the first by name)")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the report as JSON")
    out.add_argument("--csv", action="store_true", help="print one CSV line per group")
    out.add_argument("--html", metavar="FILE", help="write a self-contained HTML page")
    parser.set_defaults(func=_run, parser=parser)


def _usage_error(parser: argparse.ArgumentParser, message: str) -> int:
    parser.print_usage(sys.stderr)
    print(f"slotgate report: error: {message}", file=sys.stderr)
    return 2


def _ledger_and_config(config_path: str | None, ledger: str | None) -> tuple[str, Config]:
    try:
        config = load_config(config_path)
        target = ledger or from_env(config.ledger.target, config.ledger.url_env,
                                    "ledger.url_env")
    except ConfigError as exc:
        raise ReportError(str(exc)) from None
    if target is None:
        where = config_path or "the embedded config"
        raise ReportError(f"{where} configures no ledger (ledger.path or ledger.url); "
                          "name one with --ledger")
    if not target.startswith(POSTGRES_PREFIXES) and not Path(target).is_file():
        raise ReportError(f"{target}: no such ledger file")
    return target, config


async def fetch_rows(target: str, where: RowFilter,
                     config: Config) -> tuple[list[LedgerRow], QualityInputs]:
    """The rows of the ledger at `target` that `where` selects, and the verdicts of their
    window (of its route, if it names one)."""
    from router.ledger.open import open_store

    store = open_store(target)
    try:
        await store.open()
        return await store.fetch(where), await load_quality(store, config, where)
    except Exception as exc:
        # The store's driver decides the error classes (sqlite3, asyncpg, OSError); any of
        # them means the same to the user: that ledger cannot be read.
        raise ReportError(f"{_public(target)}: cannot read the ledger "
                          f"({type(exc).__name__}: {exc})") from exc
    finally:
        await store.close()


def _output(args: argparse.Namespace, report: dict[str, Any]) -> int:
    if args.html is not None:
        try:
            Path(args.html).write_text(render_html(report), encoding="utf-8")
        except OSError as exc:
            print(f"slotgate report: cannot write {args.html}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.html}", file=sys.stderr)
        return 0
    render = render_json if args.json else render_csv if args.csv else render_text
    sys.stdout.write(render(report))
    return 0


def _arm(row: LedgerRow) -> str:
    return NONE_GROUP if row.arm is None else row.arm


def _public(target: str) -> str:
    """The ledger's name without a password, fit for messages."""
    if not target.startswith(POSTGRES_PREFIXES) or "@" not in target:
        return target
    scheme, rest = target.split("://", 1)
    return f"{scheme}://…@{rest.rsplit('@', 1)[1]}"


def _nothing_found(where: RowFilter) -> str:
    times = [(name, None if ts is None else _iso(ts))
             for name, ts in (("since", where.since), ("until", where.until))]
    parts = [f"{name} {value}" for name, value in (
        *times, ("experiment", where.experiment), ("route", where.route)) if value is not None]
    if not parts:
        return "the ledger holds no requests"
    return "no requests match " + ", ".join(parts)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")
