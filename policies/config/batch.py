"""Batch jobs' config: where their files go and how large one may be (OpenAI's own bounds
by default: 200 MB and 50,000 requests per input file)."""

from __future__ import annotations

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
