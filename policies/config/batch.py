"""Batch jobs' config: where their files go and how large one may be (OpenAI's own bounds
by default: 200 MB and 50,000 requests per input file)."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field

from policies.config.base import StrictModel

MIB = 1024 * 1024


class BatchConfig(StrictModel):
    """The Files and Batches APIs; they keep their records in the ledger's database, so
    they are there only when a ledger is configured."""

    # The files' bytes, one per id (several gateways share it through a common volume).
    # None: beside a SQLite ledger (`<path>.files`), else `slotgate-files`.
    files_dir: str | None = Field(default=None, min_length=1, max_length=4096)
    max_file_bytes: int = Field(default=200 * MIB, ge=1, le=10 * 1024 * MIB)
    max_lines: int = Field(default=50_000, ge=1, le=10_000_000)  # requests in one input file
    max_line_bytes: int = Field(default=8 * MIB, ge=1, le=1024 * MIB)  # one request's line
    upload_timeout_s: float = Field(default=600.0, gt=0, le=86_400)  # one upload, in all
    # How long a gateway's claim on a running line holds unless renewed (every third of
    # it): a killed gateway's lines run again elsewhere, or at its restart, after this.
    line_lease_s: float = Field(default=30.0, ge=0.5, le=3600)
    # How often a gateway looks for jobs other gateways took in, with nothing else
    # happening (a job taken in here wakes its runner at once).
    poll_s: float = Field(default=5.0, gt=0, le=3600)
    # Of each backend's slots, the share batch lines may hold (at least one slot when
    # above 0; 0: no batch work there); `backend_max_share` overrides it per backend.
    max_share: float = Field(default=1.0, ge=0, le=1)
    backend_max_share: dict[str, Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=dict, max_length=1000)

    def share_of(self, backend: str, slots: int) -> int:
        """How many of `backend`'s `slots` batch lines may hold."""
        share = self.backend_max_share.get(backend, self.max_share)
        return 0 if share <= 0 else max(1, math.floor(share * slots + 1e-9))
