"""The access log's sampling of refusals.

Every answered request gets one access line, except requests refused before their caller
was known (auth on, no or a wrong key): of those, at most one line per status per
`logging.refusal_interval_s`, carrying `"suppressed": N`, the lines left out since the
previous one of that status. A flood of wrong keys thus costs a few lines a second, not
one each. A valid key's refusals before any engine work are kept to
`logging.refusals_per_key_s` lines and ledger rows per key per second, likewise. No I/O
besides the log call; one clock read per refused request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import orjson

from router.common.record import RequestRecord


class LogSampler:
    """Per status: when a line was last written, and how many were left out since."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last: dict[int, float] = {}  # statuses: a closed set, so bounded
        self._skipped: dict[int, int] = {}

    def admit(self, status: int, interval_s: float) -> int | None:
        """None: leave this line out; else how many lines of `status` were left out."""
        now = self.clock()
        last = self._last.get(status)
        if last is not None and now - last < interval_s:
            self._skipped[status] = self._skipped.get(status, 0) + 1
            return None
        self._last[status] = now
        return self._skipped.pop(status, 0)


class KeyRefusals:
    """A valid key's refusals before any engine work: per key, at most `limit` written
    (access line and ledger row) in each second, and how many were left out since the
    last one written. Keys come from the config, so the table is bounded."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._window: dict[str, tuple[int, int, int]] = {}  # key: (second, written, left out)

    def admit(self, rec: RequestRecord, limit: int) -> int | None:
        """None: leave `rec` out of the log and ledger; else the count left out before it
        (0 for every request that is not such a refusal)."""
        key = rec.key_id
        if key is None or not 400 <= rec.status < 500 or rec.slot_at is not None or not limit:
            return 0
        second = int(self.clock())
        start, written, skipped = self._window.get(key, (second, 0, 0))
        if start != second:
            written = 0
        if written >= limit:
            self._window[key] = (second, written, skipped + 1)
            return None
        self._window[key] = (second, written + 1, 0)
        return skipped


def log_refused(log: logging.Logger, sampler: LogSampler, rec: RequestRecord,
                interval_s: float) -> None:
    """The access line of a refused, unknown caller, if the sampler lets it through."""
    skipped = sampler.admit(rec.status, interval_s)
    if skipped is None:
        return
    if skipped:
        log.info(orjson.dumps({**orjson.loads(orjson.dumps(rec)),
                               "suppressed": skipped}).decode())
    else:
        log.info(orjson.dumps(rec).decode())
