"""The canaries of the secrets tests (tests/test_secrets*.py): recognisable keys, a detector
that finds them in everything the gateway said (logs, responses, metrics, the ledger), and
the config, clients and headers that carry the keys."""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import aiohttp
import httpx2
import pytest
from openai import AsyncOpenAI

from router.app import RunningGateway

CLIENT_LOGGERS = ("openai", "httpx2", "httpcore2")
BACKEND_ENV = "SLOTGATE_CANARY_BACKEND_KEY"
ADMIN_ENV = "SLOTGATE_CANARY_ADMIN_KEY"
USAGE = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
LOGGERS = ("slotgate", "slotgate.access", "aiohttp", "asyncio", "policies", "router")


def canary(kind: str) -> str:
    """A key nobody could mistake: its kind, a random part, and a base64-like tail that
    URL-encoding changes."""
    return f"sk-canary-{kind}-{os.urandom(12).hex()}+/="


@dataclass(frozen=True)
class Canaries:
    team: str = field(default_factory=lambda: canary("client"))  # configured by sha256
    admin: str = field(default_factory=lambda: canary("admin"))  # read from ADMIN_ENV
    wrong: str = field(default_factory=lambda: canary("wrong"))  # refused, still a secret
    backend: str = field(default_factory=lambda: canary("backend"))  # read from BACKEND_ENV

    def named(self) -> dict[str, str]:
        return {"team": self.team, "admin": self.admin, "wrong": self.wrong,
                "backend": self.backend}

    def clients(self) -> dict[str, str]:
        return {k: v for k, v in self.named().items() if k != "backend"}


def spellings(secret: str) -> set[str]:
    """How a secret may show (lower-cased): as is, URL-encoded, or its random part alone.
    A SHA-256 of it, or a prefix of one, is not the secret and is not looked for."""
    random_part = secret.removesuffix("+/=").rsplit("-", 1)[1]
    return {s.lower() for s in (secret, quote(secret, safe=""), quote_plus(secret),
                                random_part)}


def leaks(seen: Iterable[tuple[str, str]], secrets: dict[str, str]) -> list[str]:
    """Every place a secret appears, as 'where: which secret, in ...context...'."""
    found = []
    for where, text in seen:
        low = text.lower()
        for name, secret in secrets.items():
            at = min((i for form in spellings(secret) if (i := low.find(form)) >= 0),
                     default=-1)
            if at >= 0:
                context = text[max(0, at - 60):at + len(secret) + 20]
                found.append(f"{where}: the {name} key, in ...{context!r}...")
    return found


def no_leak(seen: Iterable[tuple[str, str]], secrets: dict[str, str]) -> None:
    found = leaks(seen, secrets)
    assert not found, f"{len(found)} leaks:\n" + "\n".join(found)


@dataclass
class Seen:
    """Everything the gateway said, as (where, text)."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, where: str, data: str | bytes) -> None:
        text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
        self.items.append((where, text))

    async def sdk_response(self, response: httpx2.Response) -> None:
        """The SDK's every answer, whole (read here; the SDK then reads it from memory)."""
        await response.aread()
        where = f"{response.request.method} {response.request.url.path} -> {response.status_code}"
        self.add(where + " (headers)", f"{response.http_version} {response.status_code} "
                 f"{response.reason_phrase}\n" + "\n".join(
                     f"{k}: {v}" for k, v in response.headers.multi_items()))
        self.add(where + " (body)", response.content)

    async def call(self, http: aiohttp.ClientSession, method: str, url: str,
                   headers: dict[str, str] | None = None, data: bytes | None = None,
                   first_event: bool = False) -> tuple[int, bytes]:
        """One raw request; its status line, headers and body are kept."""
        async with http.request(method, url, headers=headers, data=data) as resp:
            body = await (resp.content.readuntil(b"\n\n") if first_event else resp.read())
            where = f"{method} {resp.url.path} -> {resp.status}"  # no query: it may hold a key
            self.add(where + " (headers)", f"HTTP {resp.status} {resp.reason}\n" + "\n".join(
                f"{k.decode('latin-1')}: {v.decode('latin-1')}" for k, v in resp.raw_headers))
            self.add(where + " (body)", body)
            return resp.status, body

    def logs(self, caplog: pytest.LogCaptureFixture) -> None:
        """Every log record, formatted and raw (message, arguments, exception)."""
        formatter = logging.Formatter()
        for rec in caplog.records:
            if rec.name.startswith(CLIENT_LOGGERS):
                continue  # the test's own SDK: what it saw, the responses already show
            parts = [rec.getMessage(), repr(rec.args), repr(rec.msg)]
            if rec.exc_info:
                parts.append(formatter.formatException(rec.exc_info))
            if rec.stack_info:
                parts.append(rec.stack_info)
            self.add(f"log {rec.name} {rec.levelname}", "\n".join(parts))

    def ledger(self, folder: Path) -> int:
        """Every row and column of every table, and every byte of the files; rows read."""
        db = sqlite3.connect(next(folder.glob("*.sqlite3")))
        count = 0
        try:
            tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master "
                                                "WHERE type = 'table'")]
            for table in tables:
                rows = db.execute(f'SELECT * FROM "{table}"').fetchall()
                count += len(rows) if table == "requests" else 0
                self.add(f"ledger table {table}", "\n".join(repr(row) for row in rows))
        finally:
            db.close()
        for path in folder.rglob("*"):  # the batch files' folder beside it too
            if path.is_file():
                self.add(f"ledger file {path.name}", path.read_bytes().decode("latin-1"))
        return count


# -- what both secrets tests send: keys in the config, in clients, in headers -------------------


def auth_config(keys: Canaries) -> dict[str, Any]:
    return {"enabled": True, "keys": [
        {"id": "team", "tenant": "research",
         "sha256": hashlib.sha256(keys.team.encode()).hexdigest()},
        {"id": "ops", "tenant": "platform", "key_env": ADMIN_ENV, "admin": True},
    ]}


def client(gw: RunningGateway, key: str, http: httpx2.AsyncClient) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, http_client=http)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


def smuggling(key: str) -> dict[str, str]:
    """The client's key in every header that could carry a credential upstream."""
    return {**bearer(key), "X-Api-Key": key, "Api-Key": key, "Cookie": f"session={key}",
            "Proxy-Authorization": f"Bearer {key}", "Connection": "keep-alive, X-Client-Secret",
            "X-Client-Secret": key}
