"""The tokens shadow comparisons spent in the current hour, in all and per tenant (the
`quality.max_*tokens_per_hour` bounds): counted in memory, per process, and started afresh
on the hour."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable


class HourlyTokens:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.hour = -1
        self.total = 0
        self.by_tenant: Counter[str] = Counter()

    def _roll(self) -> None:
        hour = int(self.clock() // 3600)
        if hour != self.hour:
            self.hour, self.total = hour, 0
            self.by_tenant.clear()

    def spend(self, tenant: str | None, tokens: int) -> None:
        self._roll()
        self.total += tokens
        if tenant:
            self.by_tenant[tenant] += tokens

    def spent(self, tenant: str | None) -> int:
        """This hour's tokens: in all (`tenant` None), or on one tenant's requests."""
        self._roll()
        return self.total if tenant is None else self.by_tenant[tenant]
