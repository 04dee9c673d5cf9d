"""Claude Code (`claude -p`, its default tools) and Codex (`codex exec`, its default
features) through a gateway on the embedded config, as the README sets them up: each ends
well (exit 0, a text answer), every request is a ledger row, nothing is refused; with auth
on (the right key works, a wrong one fails: Claude Code after one request); while the 70B
and its fallback are full (a 429 is retried and the run still ends well); with an engine
that answers in text (no tool round trip: one request each); and Claude Code against a
context window smaller than it assumes (it asks again with a max_tokens that fits).

The simulated engine answers a fresh prompt with a call of the offered shell tool (an
`echo`) and the tool's result with text: each run below is one tool round trip.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.agents.harness import (
    KEY_ENV,
    MODEL,
    AccessLines,
    Run,
    claude_env,
    codex_env,
    embedded,
    run,
    serve,
    unwatch,
)
from tests.support import assert_idle, engine, rows_of, wait_pools

KEY = "sk-agent-test-0123456789"
ENDPOINTS = {"claude": "/v1/messages", "codex": "/v1/responses"}
WORDS = "the quick brown fox"  # the simulated engine's text


def cli_args(agent: str) -> list[str]:
    if agent == "claude":  # echo is allowed without asking (-p cannot ask)
        return ["-p", "Run echo in the shell, then say what it printed.",
                "--allowedTools", "Bash(echo:*)"]
    return ["exec", "--skip-git-repo-check", "Run echo in the shell, then say what it printed."]


async def run_agent(agent: str, agents_bin: Path, url: str, home: Path, key: str = KEY,
                    within_s: float | None = None) -> Run:
    env = (claude_env(home, url, key) if agent == "claude" else codex_env(home, url, key))
    extra = {} if within_s is None else {"within_s": within_s}
    return await run(agents_bin / agent, cli_args(agent), env, home, **extra)


def explain(result: Run, lines: AccessLines) -> str:
    return (f"exit {result.code} after {result.seconds:.1f} s\nstdout: {result.out[-2000:]}\n"
            f"stderr: {result.err[-3000:]}\naccess: {lines.lines[-10:]}")


async def check_served(agent: str, result: Run, lines: AccessLines, gw: Any,
                       ledger: Path, retried: bool = False) -> None:
    """Exit 0, a text answer, one ledger row per access line of the API, at least a tool
    round trip (two requests), no 4xx other than the expected 429s."""
    assert result.code == 0, explain(result, lines)
    assert WORDS in result.out, explain(result, lines)
    api = [line for line in lines.lines if line.get("endpoint") == ENDPOINTS[agent]]
    refused = [line for line in lines.lines if 400 <= int(line.get("status", 0)) < 500
               and not (retried and line.get("status") == 429)]
    assert refused == [], explain(result, lines)
    await assert_idle(gw)
    rows = [r for r in await rows_of(gw, str(ledger)) if r.endpoint == ENDPOINTS[agent]]
    assert len(rows) == len(api) >= 2, explain(result, lines)
    assert sum(r.status == 200 for r in rows) >= 2
    assert all(r.route == MODEL for r in rows)


async def test_claude_without_tools_answers_in_one_request(agents_bin: Path,
                                                           tmp_path: Path) -> None:
    """`--tools ""`: no tool offered, so the answer is text at once: one request."""
    ledger = tmp_path / "ledger.sqlite3"
    gw, lines = await serve(embedded(ledger))
    try:
        result = await run(agents_bin / "claude", ["-p", "say hello", "--tools", ""],
                           claude_env(tmp_path, gw.url, KEY), tmp_path)
        assert result.code == 0 and WORDS in result.out, explain(result, lines)
        api = [line for line in lines.lines if line.get("endpoint") == ENDPOINTS["claude"]]
        assert [line["status"] for line in api] == [200], explain(result, lines)
        await assert_idle(gw)
        rows = await rows_of(gw, str(ledger))
        assert [(r.endpoint, r.status, r.route) for r in rows] == [
            (ENDPOINTS["claude"], 200, MODEL)]
    finally:
        unwatch(lines)
        await gw.close()


@pytest.mark.parametrize("agent", ["claude", "codex"])
async def test_an_agent_answered_without_a_tool_round_trip(agent: str, agents_bin: Path,
                                                           tmp_path: Path) -> None:
    """Default tools offered (Codex always offers its own), an engine that answers in text
    (`tool_calls: never`): one request, one ledger row, exit 0."""
    ledger = tmp_path / "ledger.sqlite3"
    raw = embedded(ledger)
    for backend in ("llama-70b", "llama-8b"):
        raw["backends"][backend]["simulated"]["tool_calls"] = "never"
    gw, lines = await serve(raw)
    try:
        result = await run_agent(agent, agents_bin, gw.url, tmp_path)
        assert result.code == 0 and WORDS in result.out, explain(result, lines)
        api = [line for line in lines.lines if line.get("endpoint") == ENDPOINTS[agent]]
        assert [line["status"] for line in api] == [200], explain(result, lines)
        await assert_idle(gw)
        rows = await rows_of(gw, str(ledger))
        assert [(r.endpoint, r.status, r.route) for r in rows] == [
            (ENDPOINTS[agent], 200, MODEL)]
    finally:
        unwatch(lines)
        await gw.close()


async def test_claude_in_a_context_window_smaller_than_it_assumes(agents_bin: Path,
                                                                  tmp_path: Path) -> None:
    """An engine with a 40,000-token window (vLLM's --max-model-len) and Claude Code's
    own max_tokens (32,000) beside its ~19,000-token prompt: the engine refuses in vLLM's
    words, the gateway says it in Anthropic's, and Claude Code asks again with what the
    window leaves. Before, it stopped at the first 400 (exit 1)."""
    ledger = tmp_path / "ledger.sqlite3"
    raw = embedded(ledger)
    for backend in ("llama-70b", "llama-8b"):
        raw["backends"][backend]["simulated"]["max_model_len"] = 40_000
    gw, lines = await serve(raw)
    try:
        result = await run_agent("claude", agents_bin, gw.url, tmp_path)
        assert result.code == 0 and WORDS in result.out, explain(result, lines)
        api = [(line["status"], line.get("error")) for line in lines.lines
               if line.get("endpoint") == ENDPOINTS["claude"]]
        assert (400, "context_length_exceeded") in api, explain(result, lines)
        assert {status for status, _ in api} == {200, 400}, explain(result, lines)
        assert api[-1] == (200, None), explain(result, lines)
        await assert_idle(gw)
    finally:
        unwatch(lines)
        await gw.close()


@pytest.mark.parametrize("agent", ["claude", "codex"])
async def test_an_agent_on_the_embedded_config(agent: str, agents_bin: Path,
                                               tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    gw, lines = await serve(embedded(ledger))
    try:
        result = await run_agent(agent, agents_bin, gw.url, tmp_path)
        await check_served(agent, result, lines, gw, ledger)
    finally:
        unwatch(lines)
        await gw.close()


@pytest.mark.parametrize("agent", ["claude", "codex"])
async def test_an_agent_with_auth_on(agent: str, agents_bin: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The right key served; then a wrong one refused, and the CLI gives up on it."""
    monkeypatch.setenv(KEY_ENV, KEY)
    ledger = tmp_path / "ledger.sqlite3"
    gw, lines = await serve(embedded(ledger, auth=True))
    try:
        result = await run_agent(agent, agents_bin, gw.url, tmp_path)
        await check_served(agent, result, lines, gw, ledger)
        unwatch(lines)
        gw, lines = await serve(embedded(tmp_path / "wrong.sqlite3", auth=True))
        wrong = await run_agent(agent, agents_bin, gw.url, tmp_path / "wrong",
                                key="sk-not-a-key", within_s=30.0)
        assert wrong.code != 0, explain(wrong, lines)
        assert {line.get("status") for line in lines.lines} == {401}
        # Counted, not timed: Claude Code honours `x-should-retry: false` and asks once.
        # Codex retries a 401 whatever the headers say (its stream retries, meant for a
        # token refresh): its five retries, about 7 s, are its own.
        asked = len(lines.lines)
        assert asked == 1 if agent == "claude" else asked <= 6, explain(wrong, lines)
    finally:
        unwatch(lines)
        await gw.close()


async def _occupy(session: aiohttp.ClientSession, url: str, model: str) -> None:
    body = {"model": model, "max_tokens": 1, "messages": [
        {"role": "user", "content": "Prove that there are infinitely many primes."}]}
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        await resp.read()


@pytest.mark.parametrize("agent", ["claude", "codex"])
async def test_an_agent_while_the_queues_are_full(agent: str, agents_bin: Path,
                                                  tmp_path: Path) -> None:
    """The 8B's slots and line, then the 70B's, held full: the agent's first request is
    refused (429 + Retry-After); released once that 429 is logged, the retry is served."""
    ledger = tmp_path / "ledger.sqlite3"
    gw, lines = await serve(embedded(ledger))
    big, small = engine(gw, "llama-70b"), engine(gw, "llama-8b")
    big.hold()
    small.hold()
    tasks: list[asyncio.Task[Any]] = []
    try:
        async with aiohttp.ClientSession() as session:
            tasks += [asyncio.create_task(_occupy(session, gw.url, "llama-8b"))
                      for _ in range(24)]
            await wait_pools(gw, lambda s: s["llama-8b"] == (8, 16), within_s=30)
            tasks += [asyncio.create_task(_occupy(session, gw.url, MODEL)) for _ in range(8)]
            await wait_pools(gw, lambda s: s["llama-70b"] == (3, 5), within_s=30)
            cli = asyncio.create_task(run_agent(agent, agents_bin, gw.url, tmp_path))
            refused = asyncio.create_task(lines.wait_for(
                lambda line: line.get("status") == 429
                and line.get("endpoint") == ENDPOINTS[agent], within_s=60))
            tasks += [cli, refused]
            await asyncio.wait([cli, refused], return_when=asyncio.FIRST_COMPLETED)
            assert refused.done() and not cli.done(), (
                explain(cli.result(), lines) if cli.done() else "no 429 within 60 s")
            big.release()
            small.release()
            await asyncio.gather(*tasks)
            result = cli.result()
        await check_served(agent, result, lines, gw, ledger, retried=True)
    finally:
        big.release()
        small.release()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        unwatch(lines)
        await gw.close()
