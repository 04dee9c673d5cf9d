"""Client API keys: 401 in OpenAI's shape for a missing or wrong key, the tenant in the
ledger, keys from the environment, and admin endpoints for admin keys only."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from router.app import RunningGateway
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    gateway_config,
    rows_of,
    sim_backend,
)

TEAM_KEY = "sk-team-a-0123456789"


def client(sdk: SdkClients, gw: RunningGateway, key: str) -> AsyncOpenAI:
    return sdk(gw, api_key=key)


def config(tmp_path: Path) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=2))
    raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite3")}
    raw["auth"] = {"enabled": True, "keys": [
        {"id": "team-a", "tenant": "research", "sha256": hashlib.sha256(
            TEAM_KEY.encode()).hexdigest()},
        {"id": "ops", "tenant": "platform", "key_env": "SLOTGATE_OPS_KEY", "admin": True},
    ]}
    return raw


async def test_keys_are_checked_and_the_tenant_recorded(
    sdk: SdkClients, start: StartGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLOTGATE_OPS_KEY", "sk-ops-secret")
    gw = await start(config(tmp_path))
    for key in ("", "sk-wrong", TEAM_KEY[:-1]):
        with pytest.raises(openai.AuthenticationError) as refused:
            await client(sdk, gw, key or "x").chat.completions.create(model="chat",
                                                                  messages=MESSAGES)
        assert refused.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    assert (await client(sdk, gw, TEAM_KEY).chat.completions.create(
        model="chat", messages=MESSAGES)).choices
    assert (await client(sdk, gw, "sk-ops-secret").chat.completions.create(
        model="chat", messages=MESSAGES)).choices
    await assert_idle(gw)
    rows = await rows_of(gw, str(tmp_path / "ledger.sqlite3"))
    # refusals of unknown callers are counted in metrics, never one ledger row each
    assert [(r.status, r.tenant) for r in rows] == [(200, "research"), (200, "platform")]


async def test_admin_endpoints_need_an_admin_key(
    sdk: SdkClients, start: StartGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLOTGATE_OPS_KEY", "sk-ops-secret")
    gw = await start(config(tmp_path))
    await client(sdk, gw, TEAM_KEY).chat.completions.create(model="chat", messages=MESSAGES)
    async with aiohttp.ClientSession() as http:
        for key, status in ((None, 401), (TEAM_KEY, 403), ("sk-ops-secret", 200)):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            async with http.get(gw.url + "/admin/report", headers=headers) as resp:
                assert resp.status == status, await resp.text()
            async with http.post(gw.url + "/admin/reload", headers=headers) as resp:
                assert resp.status == (status if status != 200 else 400)  # embedded config


async def test_a_key_from_a_missing_environment_variable_stops_startup(
    start: StartGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from router.common.config_error import ConfigError

    monkeypatch.delenv("SLOTGATE_OPS_KEY", raising=False)
    with pytest.raises(ConfigError, match="SLOTGATE_OPS_KEY is not set"):
        await start(config(tmp_path))


async def test_auth_off_is_announced(start: StartGateway,
                                     caplog: pytest.LogCaptureFixture) -> None:
    await start(gateway_config(sim_backend("m", slots=1)))
    assert "auth off: every client is accepted" in caplog.text


async def test_the_reload_command_sends_the_admin_key_from_the_environment(
    start: StartGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from router.cli import main

    monkeypatch.setenv("SLOTGATE_OPS_KEY", "sk-ops-secret")
    gw = await start(config(tmp_path))
    monkeypatch.delenv("SLOTGATE_ADMIN_KEY", raising=False)
    assert await asyncio.to_thread(main, ["reload", "--url", gw.url]) == 1
    assert "Incorrect API key" in capsys.readouterr().err
    monkeypatch.setenv("SLOTGATE_ADMIN_KEY", "sk-ops-secret")
    assert await asyncio.to_thread(main, ["reload", "--url", gw.url]) == 1
    said = capsys.readouterr().err  # past auth: this gateway runs the embedded config
    assert "Incorrect API key" not in said and "config" in said
    assert "sk-ops-secret" not in said
