"""Fair shares of one pool's line between tenants: the virtual token counter.

Among the waiters of one priority class, a `fair` line grants the next slot to the tenant
with the least weighted tokens served on the pool so far, first come, first served within
a tenant (the virtual token counter of Sheng et al., "Fairness in Serving Large Language
Models", OSDI 2024). Tokens count as they are served: a grant charges its prompt, the
answer's tokens as they stream, each divided by the tenant's weight.

A tenant that lines up with nothing waiting is lifted to the least counter of the tenants
waiting (none: to the counter of the tenant served last), so time spent idle is no credit
to spend later, and a newcomer cannot starve those already in line.

Pure bookkeeping, no I/O; the local pool (`policies.slots.fair`) and the Redis scripts
(`policies.slots.lua`) apply the same rules.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from policies.clock.lengths import OUTPUT_PRIOR

MAX_TENANTS = 10_000  # counters kept per pool; the lowest idle ones go first


@dataclass(frozen=True, slots=True)
class Waiter:
    """One waiter as the order sees it (in arrival order within its class)."""

    tenant: str
    weight: float = 1.0
    tokens: int = 0  # what its grant and answer are expected to charge, before weighting


def expected_tokens(prompt_tokens: int, max_tokens: int | None) -> int:
    """What a waiter is expected to be charged: its prompt and its answer (its cap)."""
    return prompt_tokens + (OUTPUT_PRIOR if max_tokens is None else max_tokens)


class Counters:
    """Each tenant's weighted tokens served on one pool."""

    __slots__ = ("last", "limit", "served")

    def __init__(self, limit: int = MAX_TENANTS) -> None:
        self.served: dict[str, float] = {}
        self.last = 0.0  # the counter of the tenant granted last (lifts when none waits)
        self.limit = limit

    def get(self, tenant: str) -> float:
        return self.served.get(tenant, 0.0)

    def lift(self, tenant: str, waiting: Iterable[float], running: float = 0.0) -> None:
        """`tenant` lines up with none of its own waiting; `waiting`: the counters of the
        tenants that have waiters now; `running`: what its running answers have added to
        its own so far, not yet folded in (its live counter is lifted, not the folded one)."""
        floor = min(waiting, default=self.last) - running
        if self.served.get(tenant, 0.0) < floor:
            self.served[tenant] = floor

    def charge(self, tenant: str, tokens: float, weight: float = 1.0) -> None:
        self.served[tenant] = self.served.get(tenant, 0.0) + tokens / weight

    def granted(self, tenant: str) -> None:
        self.last = self.served.get(tenant, 0.0)

    def trim(self, busy: Iterable[str]) -> None:
        """Keep at most `limit` counters: the lowest of tenants not in `busy` (waiting or
        running) go first; forgotten, a tenant is lifted like any newcomer when it returns,
        so losing a low counter takes nothing from anyone. Once over, an eighth more go,
        so that the sort is paid once per limit / 8 newcomers, not by each."""
        excess = len(self.served) - self.limit
        if excess <= 0:
            return
        excess += self.limit // 8
        keep = set(busy)
        idle = sorted((c, t) for t, c in self.served.items() if t not in keep)
        for _, tenant in idle[:excess]:
            del self.served[tenant]


def pick(heads: Iterable[tuple[str, int]], served: Mapping[str, float]) -> str | None:
    """Of each waiting tenant's first waiter, (tenant, arrival number): the tenant served
    next: the least counter, then the earliest arrival."""
    best: tuple[float, int, str] | None = None
    for tenant, seq in heads:
        key = (served.get(tenant, 0.0), seq, tenant)
        if best is None or key < best:
            best = key
    return None if best is None else best[2]


def order(waiters: Sequence[Waiter], served: Mapping[str, float],
          limit: int | None = None) -> list[int]:
    """The grant order of one class's `waiters` (their indices, arrival order given), as
    the counters stand and each grant charges its expected tokens: the first `limit`."""
    queues: dict[str, list[int]] = {}
    for i, waiter in enumerate(waiters):
        queues.setdefault(waiter.tenant, []).append(i)
    heap = [(served.get(t, 0.0), q[0], t, 0) for t, q in queues.items()]
    heapq.heapify(heap)
    out: list[int] = []
    wanted = len(waiters) if limit is None else min(limit, len(waiters))
    while len(out) < wanted:
        counter, i, tenant, k = heapq.heappop(heap)
        out.append(i)
        waiter = waiters[i]
        counter += waiter.tokens / waiter.weight
        queue = queues[tenant]
        if k + 1 < len(queue):
            heapq.heappush(heap, (counter, queue[k + 1], tenant, k + 1))
    return out
