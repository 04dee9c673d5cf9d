"""The ledger's table of verdicts (migration 12): one row per judged shadow, written by the
shadow runner and read by the report. Only figures and labels: never a prompt or an answer.

Through `Store.run`, so the same SQL (`?` placeholders) serves SQLite and PostgreSQL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import cast

from policies.quality.judging import JUDGE_VERSION, Verdict
from policies.quality.stats import VerdictRow
from router.common.record import new_id
from router.ledger.base import Store

_FIELDS = ("id, ts, request_id, tenant, route, intent, language, p_simple, prompt_tokens, "
           "small_backend, primary_backend, verdict, judge_version, saved")
_READ = "ts, route, intent, language, p_simple, prompt_tokens, verdict, saved"


@dataclass(frozen=True, slots=True)
class VerdictRecord:
    """What the shadow runner writes about one judged request."""

    request_id: str
    tenant: str | None
    route: str
    intent: str | None
    language: str
    p_simple: float | None
    prompt_tokens: int
    small_backend: str
    primary_backend: str
    verdict: Verdict | None  # None: the judge's reply could not be read
    saved: float  # what the downgrade saved on this request, in the config's currency
    ts: float = field(default_factory=time.time)
    # The question and both answers (small, primary), kept only with quality.keep_texts.
    texts: tuple[str, str, str] | None = None


async def record(store: Store, verdict: VerdictRecord,
                 retention_days: float | None = None) -> None:
    """One verdict, judged by this release's judge (JUDGE_VERSION), and its texts when it
    carries them; verdicts and texts older than `retention_days` (the ledger's) go."""
    v, verdict_id = verdict, new_id()
    await store.run(
        f"INSERT INTO verdicts ({_FIELDS}) VALUES ({', '.join('?' * 14)})",
        (verdict_id, v.ts, v.request_id, v.tenant, v.route, v.intent, v.language, v.p_simple,
         v.prompt_tokens, v.small_backend, v.primary_backend,
         None if v.verdict is None else v.verdict.value, JUDGE_VERSION, v.saved))
    if v.texts is not None:
        await store.run("INSERT INTO verdict_texts (verdict_id, ts, question, small_answer, "
                        "primary_answer) VALUES (?, ?, ?, ?, ?)", (verdict_id, v.ts, *v.texts))
    if retention_days is not None:
        before = v.ts - retention_days * 86_400
        for table in ("verdicts", "verdict_texts"):
            await store.run(f"DELETE FROM {table} WHERE ts < ?", (before,))


async def fetch(store: Store, since: float | None, until: float | None,
                route: str | None = None, *,
                judge_version: str = JUDGE_VERSION) -> list[VerdictRow]:
    """The verdicts of `judge_version` in [since, until) (either end open when None), of
    one route or all, oldest first."""
    clause, args = _where(since, until, route)
    rows = await store.run(f"SELECT {_READ} FROM verdicts WHERE judge_version = ?{clause} "
                           "ORDER BY ts, id", (judge_version, *args))
    return [_verdict_row(values) for values in rows]


async def other_versions(store: Store, since: float | None, until: float | None,
                         route: str | None = None, *,
                         judge_version: str = JUDGE_VERSION) -> int:
    """How many verdicts in the same window were given by another judge version (left out
    of `fetch`: a changed prompt gives figures of its own)."""
    clause, args = _where(since, until, route)
    ((count,),) = await store.run(
        f"SELECT COUNT(*) FROM verdicts WHERE judge_version <> ?{clause}",
        (judge_version, *args))
    return cast(int, count)


def _where(since: float | None, until: float | None,
           route: str | None) -> tuple[str, list[object]]:
    terms: list[str] = []
    args: list[object] = []
    for term, value in (("ts >= ?", since), ("ts < ?", until), ("route = ?", route)):
        if value is not None:
            terms.append(f" AND {term}")
            args.append(value)
    return "".join(terms), args


# A row as _READ selects it (both drivers return these Python types for these columns).
_Stored = tuple[float, str, str | None, str, float | None, int, str | None, float]


def _verdict_row(values: tuple[object, ...]) -> VerdictRow:
    ts, route, intent, lang, p_simple, prompt_tokens, verdict, saved = cast(_Stored, values)
    return VerdictRow(ts=ts, route=route, intent=intent, language=lang, p_simple=p_simple,
                      prompt_tokens=prompt_tokens,
                      verdict=None if verdict is None else Verdict(verdict), saved=saved)
