"""The real coding agents' CLIs (Claude Code, Codex), installed from npm by `make agents`
at the versions pinned in tests/agents/package-lock.json (or the newest with
SLOTGATE_AGENTS_LATEST=1), kept in SLOTGATE_AGENTS_CACHE outside the repository.

Without node or the CLIs these tests skip, or fail under SLOTGATE_REQUIRE_ALL=1.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from tests.support import REQUIRE_ALL

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("SLOTGATE_AGENTS_CACHE",
                            Path.home() / ".cache" / "slotgate" / "agents"))


def bin_dir() -> Path:
    """node_modules/.bin of the installed CLIs (the Makefile computes the same folder)."""
    if os.environ.get("SLOTGATE_AGENTS_BIN"):
        return Path(os.environ["SLOTGATE_AGENTS_BIN"])
    if os.environ.get("SLOTGATE_AGENTS_LATEST") == "1":
        return CACHE / "latest" / "node_modules" / ".bin"
    lock = hashlib.sha256((HERE / "package-lock.json").read_bytes()).hexdigest()[:12]
    return CACHE / f"pinned-{lock}" / "node_modules" / ".bin"


def _missing(reason: str) -> None:
    if REQUIRE_ALL:
        pytest.fail(reason + "; SLOTGATE_REQUIRE_ALL=1 forbids skipping")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def agents_bin() -> Path:
    """The folder holding `claude` and `codex`; skip (or fail) without them."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        _missing("node and npm are not installed (apt-get install nodejs npm)")
    found = bin_dir()
    missing = [name for name in ("claude", "codex") if not (found / name).exists()]
    if missing:
        _missing(f"the agent CLIs are not installed ({', '.join(missing)} missing in "
                 f"{found}): run `make agents`")
    return found
