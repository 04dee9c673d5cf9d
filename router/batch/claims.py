"""A gateway's claims on batch lines, in the ledger's database: several gateways (or one
gateway's workers) drain one job together, and none runs a line another holds.

A line is claimed by one atomic statement that marks it `running`, with this process as
its owner and a lease that the runner renews while the line runs. A line whose lease has
lapsed (its gateway was killed, or cut off from the database) is claimable again, so a
killed gateway's lines run again elsewhere, or on its own restart, once their leases end.
An answer is written only by the line's owner of record, and only over `running`: a line
is answered once, however often it ran. A job is finished the same way: the first to
stamp it takes the finishing, and a stamp older than a lease is taken over.
"""

from __future__ import annotations

import os
import time

from router.ledger.base import Store

# A waiting line, or one whose claim lapsed (NULL: claimed before claims had leases).
_CLAIMABLE = ("(state = 'waiting' OR (state = 'running' AND "
              "(lease_until IS NULL OR lease_until < ?)))")


class Claims:
    def __init__(self, store: Store, lease_s: float) -> None:
        self.store = store
        self.lease_s = lease_s
        self.owner = os.urandom(8).hex()  # this process, for as long as it runs
        # PostgreSQL: concurrent claimers skip each other's locked rows instead of
        # queueing on them (SQLite runs one writer at a time: the statement is atomic).
        self._skip = " FOR UPDATE SKIP LOCKED" if store.name == "postgresql" else ""

    async def claim(self, job_id: str) -> tuple[int, str, str] | None:
        """The job's first claimable line (its number, custom_id and body), now this
        process's to run; None: no line is left to claim, or the job is no longer open
        (cancelled, or past its window: read in the same statement, so a runner holding
        an older view of the job starts nothing after its end)."""
        now = time.time()
        rows = await self.store.run(
            "UPDATE batch_lines SET state = 'running', owner = ?, lease_until = ? "
            f"WHERE batch_id = ? AND {_CLAIMABLE} AND line = (SELECT line FROM batch_lines "
            f"WHERE batch_id = ? AND {_CLAIMABLE} ORDER BY line LIMIT 1{self._skip}) "
            "AND EXISTS (SELECT 1 FROM batches WHERE id = ? AND status = 'in_progress' "
            "AND expires_at > ?) RETURNING line, custom_id, body",
            (self.owner, now + self.lease_s, job_id, now, job_id, now, job_id, now))
        if not rows:
            return None
        line, custom_id, body = rows[0]
        return int(line), str(custom_id), str(body)  # type: ignore[call-overload]

    async def settle(self, job_id: str, line: int, state: str, status: int,
                     answer: str) -> bool:
        """Write a line's answer, if this process still holds it; whether it did."""
        rows = await self.store.run(
            "UPDATE batch_lines SET state = ?, status_code = ?, answer = ?, owner = NULL, "
            "lease_until = NULL WHERE batch_id = ? AND line = ? AND owner = ? AND "
            "state = 'running' RETURNING line",
            (state, status, answer, job_id, line, self.owner))
        return bool(rows)

    async def give_back(self, job_id: str, line: int | None = None) -> None:
        """The line (None: every line of the job this process holds) waits again."""
        which, args = ("", ()) if line is None else (" AND line = ?", (line,))
        await self.store.run(
            "UPDATE batch_lines SET state = 'waiting', owner = NULL, lease_until = NULL "
            f"WHERE batch_id = ? AND owner = ? AND state = 'running'{which}",
            (job_id, self.owner, *args))

    async def end_unrun(self, job_id: str, state: str) -> None:
        """The job ends early: its lines nobody runs end as `state` (cancelled, expired);
        lines running under a live claim run to their end."""
        await self.store.run(f"UPDATE batch_lines SET state = ? WHERE batch_id = ? AND "
                             f"{_CLAIMABLE}", (state, job_id, time.time()))

    async def renew(self, job_ids: list[str]) -> None:
        """Extend the leases of the lines this process runs in these jobs."""
        until = time.time() + self.lease_s
        for job_id in job_ids:
            await self.store.run("UPDATE batch_lines SET lease_until = ? WHERE batch_id = ? "
                                 "AND state = 'running' AND owner = ?",
                                 (until, job_id, self.owner))

    async def held_elsewhere(self, job_id: str) -> int:
        """The job's lines other processes run now, under live claims."""
        rows = await self.store.run(
            "SELECT COUNT(*) FROM batch_lines WHERE batch_id = ? AND state = 'running' AND "
            "lease_until >= ? AND owner <> ?", (job_id, time.time(), self.owner))
        (count,), = rows
        assert isinstance(count, int)
        return count

    async def finishing(self, job_id: str) -> bool:
        """Whether this process takes the job's finishing (it stamps `finalizing_at`)."""
        now = time.time()
        rows = await self.store.run(
            "UPDATE batches SET finalizing_at = ? WHERE id = ? AND status IN "
            "('in_progress', 'cancelling') AND (finalizing_at IS NULL OR finalizing_at < ?) "
            "RETURNING id", (now, job_id, now - self.lease_s))
        return bool(rows)
