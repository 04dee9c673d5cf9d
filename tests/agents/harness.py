"""Running an agent CLI against a gateway on the embedded config: the gateway in this
process (its access lines watched as they are logged), the CLI as a child process in a
fresh HOME (and CODEX_HOME), telemetry and auto-update off, only loopback base URLs.
The recipes here are the README's."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from router.app import RunningGateway, start_gateway
from router.config import DEFAULT_CONFIG_PATH, config_from_dict

CLI_WITHIN_S = 180.0  # one CLI run, tool round trip included, on a busy machine
MODEL = "llama-70b"
KEY_ENV = "SLOTGATE_AGENT_KEY"


def embedded(ledger: Path, auth: bool = False) -> dict[str, Any]:
    """The embedded config.yaml, its ledger in `ledger`; `auth`: one key from KEY_ENV."""
    raw: dict[str, Any] = yaml.safe_load(DEFAULT_CONFIG_PATH.read_text())
    raw["ledger"] = {"path": str(ledger)}
    raw.setdefault("logging", {})["refusal_interval_s"] = 0  # every refusal is logged
    if auth:
        key = {"id": "agent", "tenant": "agents", "key_env": KEY_ENV}
        raw["auth"] = {"enabled": True, "keys": [key]}
    return raw


class AccessLines(logging.Handler):
    """The gateway's access lines, parsed, and a wait for one that matches."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict[str, Any]] = []
        self._changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(orjson.loads(record.getMessage()))
        except orjson.JSONDecodeError:
            return
        self._changed.set()

    async def wait_for(self, predicate: Any, within_s: float) -> None:
        async with asyncio.timeout(within_s):
            while not any(predicate(line) for line in self.lines):
                self._changed.clear()
                await self._changed.wait()


async def serve(raw: dict[str, Any]) -> tuple[RunningGateway, AccessLines]:
    lines = AccessLines()
    logger = logging.getLogger("slotgate.access")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    return await start_gateway(config_from_dict(raw), "127.0.0.1", 0), lines


def unwatch(lines: AccessLines) -> None:
    logging.getLogger("slotgate.access").removeHandler(lines)


@dataclass
class Run:
    code: int
    out: str
    err: str
    seconds: float
    home: Path = field(repr=False)


def base_env(home: Path) -> dict[str, str]:
    """Nothing of this process's environment but PATH: no key or base URL leaks in."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "LANG": "C.UTF-8"}


def claude_env(home: Path, url: str, key: str) -> dict[str, str]:
    """The README's Claude Code recipe."""
    return {**base_env(home), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": key,
            "ANTHROPIC_MODEL": MODEL, "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}


def codex_config(url: str) -> str:
    """The README's Codex recipe: a provider of its own in config.toml."""
    return f"""model = "{MODEL}"
model_provider = "slotgate"
check_for_update_on_startup = false

[model_providers.slotgate]
name = "slotgate"
base_url = "{url}/v1"
env_key = "SLOTGATE_API_KEY"
wire_api = "responses"

[analytics]
enabled = false

[feedback]
enabled = false
"""


def codex_env(home: Path, url: str, key: str) -> dict[str, str]:
    codex_home = home / "codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(url))
    return {**base_env(home), "CODEX_HOME": str(codex_home), "SLOTGATE_API_KEY": key}


async def run(program: Path, args: list[str], env: dict[str, str], home: Path,
              within_s: float = CLI_WITHIN_S) -> Run:
    """Run the CLI in `home`/work; killed (by its process id) past `within_s`."""
    work = home / "work"
    work.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        str(program), *args, cwd=work, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(within_s):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        return Run(-9, out.decode(errors="replace"), err.decode(errors="replace"),
                   time.monotonic() - began, home)
    return Run(proc.returncode if proc.returncode is not None else -1,
               out.decode(errors="replace"), err.decode(errors="replace"),
               time.monotonic() - began, home)
