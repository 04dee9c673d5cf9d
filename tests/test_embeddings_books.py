"""The `api` of a request in the books: ledger rows (SQLite and PostgreSQL), metric labels,
the access log and `slotgate report`; and the config check of `apis`."""

from __future__ import annotations

import hashlib
from typing import Any

import openai
import orjson
import pytest

from router.common.config_error import ConfigError
from router.config import config_from_dict
from router.report.build import build_report
from router.report.render import render_json, render_text
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    gateway_config,
    hand_ledger,
    rows_of,
    sim_backend,
)
from tests.support.scrape import scrape, value

TOKENS = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}


async def test_rows_metrics_log_and_report_carry_the_api(
    sdk: SdkClients, start: StartGateway, ledger_target: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    raw = gateway_config(sim_backend("m", slots=2, price=TOKENS))  # simulated: chat + embeds
    raw["ledger"] = {"url" if ledger_target.startswith("postgres") else "path": ledger_target}
    gw = await start(raw)
    client = sdk(gw)
    caplog.set_level("INFO", logger="slotgate.access")
    await client.chat.completions.create(model="chat", messages=MESSAGES)
    await client.completions.create(model="chat", prompt="hello")
    vectors = await client.embeddings.create(model="chat", input=["a b c d", "e f g h"])
    tokens = vectors.usage.prompt_tokens
    await assert_idle(gw)
    samples = await scrape(gw)
    for api in ("chat", "completions", "embeddings"):
        assert value(samples, "slotgate_requests_total", route="chat", backend="big",
                     status_class="2xx", api=api) == 1
    assert value(samples, "slotgate_ttft_seconds_count", backend="big", api="embeddings") == 1
    assert value(samples, "slotgate_tokens_total", backend="big", direction="in") > tokens
    lines = [orjson.loads(r.getMessage()) for r in caplog.records
             if r.name == "slotgate.access"]
    assert [line["api"] for line in lines] == ["chat", "completions", "embeddings"]
    rows = await rows_of(gw, ledger_target)
    assert [(r.api, r.endpoint) for r in rows] == [
        ("chat", "/v1/chat/completions"), ("completions", "/v1/completions"),
        ("embeddings", "/v1/embeddings")]
    embedded = rows[2]
    assert (embedded.prompt_tokens, embedded.completion_tokens) == (tokens, 0)
    assert not embedded.tokens_estimated  # the engine's usage (prompt and total tokens)
    assert embedded.cost == pytest.approx(tokens / 1e6)  # input tokens only
    report = build_report(rows)
    by_api = {g["api"]: g for g in report["apis"]}
    assert list(by_api) == ["chat", "completions", "embeddings"]
    assert by_api["embeddings"]["requests"] == 1
    assert by_api["embeddings"]["prompt_tokens"] == tokens
    assert orjson.loads(render_json(report))["apis"] == report["apis"]
    text = render_text(report)
    assert "Client APIs" in text and "embeddings" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_a_report_of_one_api_has_no_breakdown() -> None:
    assert "apis" not in build_report(hand_ledger())


def _problems(raw: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        config_from_dict(raw)
    return {p.path: p.message for p in caught.value.problems}


@pytest.mark.parametrize(("apis", "words"), [
    (["chat", "images"], "Input should be"),
    ([], "at least 1 item"),
    (["chat", "chat"], "each API is listed once"),
    ("chat", "a list"),
])
def test_bad_apis_are_refused_at_their_key(apis: object, words: str) -> None:
    problems = _problems(gateway_config(sim_backend("m", slots=1, apis=apis)))
    found = {path: m for path, m in problems.items() if path.startswith("backends.big.apis")}
    assert found and any(words in m for m in found.values()), problems


def test_steering_an_embeddings_only_route_is_refused() -> None:
    raw = gateway_config(sim_backend("e", slots=1, apis=["embeddings"]),
                         sim_backend("e2", slots=1, apis=["embeddings"]))
    raw["routes"]["chat"]["fallback"] = {"when": "saturated"}
    problems = _problems(raw)
    assert "serves only embeddings" in problems["routes.chat.fallback.when"]
    raw["routes"]["chat"]["fallback"] = {"when": "never"}
    assert config_from_dict(raw).routes["chat"].fallbacks == ("small",)


def test_a_fallback_serving_none_of_the_primary_apis_is_refused() -> None:
    raw = gateway_config(sim_backend("e", slots=1, apis=["embeddings"]),
                         sim_backend("llm", slots=1, apis=["chat", "completions"]))
    assert "serves none of the APIs" in _problems(raw)["routes.chat.fallbacks[0]"]
    raw["backends"]["small"]["apis"] = ["chat", "embeddings"]
    assert config_from_dict(raw).backends["small"].served_apis == {"chat", "embeddings"}


def test_apis_default_by_kind() -> None:
    raw = gateway_config(sim_backend("m", slots=1))
    raw["backends"]["real"] = {"url": "http://127.0.0.1:9/v1", "model": "m", "slots": 1}
    config = config_from_dict(raw)
    assert config.backends["big"].served_apis == {"chat", "completions", "embeddings"}
    assert config.backends["real"].served_apis == {"chat", "completions"}


async def test_embedding_tokens_count_against_a_key_budget(
    sdk: SdkClients, start: StartGateway
) -> None:
    secret = "sk-embedder-0123456789"
    raw = gateway_config(sim_backend("m", slots=1, apis=["embeddings"]))
    raw["auth"] = {"enabled": True, "keys": [
        {"id": "embedder", "tenant": "t", "sha256": hashlib.sha256(secret.encode()).hexdigest(),
         "budgets": [{"period": "day", "tokens": 40}]}]}
    gw = await start(raw)
    client = sdk(gw, api_key=secret)
    used = 0
    while used < 40:
        answer = await client.embeddings.create(model="chat", input=["x" * 40, "y" * 40])
        used += answer.usage.total_tokens  # 20 a request: prompt tokens only
    assert used == 40
    with pytest.raises(openai.RateLimitError) as over:
        await client.embeddings.create(model="chat", input="z")
    assert over.value.body["code"] == "budget_exceeded"  # type: ignore[index]
    await assert_idle(gw)
