"""`slotgate evaluate` through a real gateway on simulated engines: each prompt answered by
the small model, replayed on the primary and judged in both orders by the live shadows'
code. The simulated judge prefers the answer of more words (router.upstream.simulated.
judge), so shorter small answers lose every verdict and answers of one length tie. Then the
prompt file's bounds and bad lines, the figures, and the command in a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from classifier.model import load_default
from policies.config import Config
from policies.quality.judging import Verdict
from router.app import RunningGateway, start_gateway
from router.config import config_from_dict
from router.quality import prompt_file
from router.quality.evaluation import (
    EvaluateError,
    Judged,
    Outcome,
    direct_route,
    evaluate,
    plan_for,
    with_direct_routes,
)
from router.quality.prompt_file import PromptFileError, parse_line, read_prompts
from router.tools.evaluate import embedded
from router.tools.evaluate_report import figures, text_lines
from tests.support import assert_idle, closed_port, engine, gateway_config, sim_backend

LONG = 24  # the primary's answers, in words
SHORT = 8  # the small model's
PROMPTS = [
    {"prompt": "Say hello to a new colleague in one friendly sentence.", "intent": "greeting"},
    {"prompt": "Translate into French: 'Where is the train station?'", "intent": "translate"},
    {"messages": [{"role": "user", "content": "Write a Python function that merges "
                   "overlapping intervals, with unit tests."}], "max_tokens": 64},
    {"prompt": "你好，今天过得怎么样？"},
    {"prompt": "What is the capital of Australia?", "intent": "simple_qa"},
]


def raw_config(small_words: int = SHORT) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=2, queue_limit=4, sim={"output_tokens": LONG}),
                          sim_backend("s", slots=2, queue_limit=4,
                                      sim={"output_tokens": small_words}))
    raw["routes"]["chat"]["fallback"] = {"when": "saturated"}  # min_confidence 0.8
    return raw


def write_prompts(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines), encoding="utf-8")
    return path


Serve = Callable[[Config], Any]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    running: list[RunningGateway] = []

    async def _serve(config: Config) -> RunningGateway:
        gw = await start_gateway(config, "127.0.0.1", 0)
        running.append(gw)
        return gw

    yield _serve
    for gw in running:
        await gw.close()


async def run(gw: RunningGateway, config: Config, tmp_path: Path,
              key: str | None = None) -> list[Judged]:
    prompts = read_prompts(write_prompts(tmp_path / "prompts.jsonl", PROMPTS))
    return await evaluate(gw.url, key, config, plan_for(config, "chat"), prompts,
                          load_default(), concurrency=3)


async def test_shorter_small_answers_lose_every_verdict(serve: Serve, tmp_path: Path) -> None:
    config = embedded(config_from_dict(raw_config()), "chat", None)
    gw = await serve(config)
    results = await run(gw, config, tmp_path)
    assert [r.line for r in results] == [1, 2, 3, 4, 5]
    assert {(r.outcome, r.verdict) for r in results} == {(Outcome.JUDGED, Verdict.WORSE)}
    assert [r.label for r in results] == ["greeting", "translate", None, None, "simple_qa"]
    assert [r.language for r in results] == ["en", "en", "en", "zh", "en"]
    assert all(0.0 <= r.p_simple <= 1.0 and r.prompt_tokens > 0 for r in results)
    small, big = engine(gw, "small").stats(), engine(gw).stats()
    assert small["requests"] == 5  # one answer each
    assert big["requests"] == 15 and big["completed"] == 15  # a replay and two judgements each
    found = figures(config, plan_for(config, "chat"), results)
    assert found["outcomes"]["judged"] == 5
    assert sum(g["verdicts"] for g in found["groups"]) == 5
    assert {g["non_loss"] for g in found["groups"]} == {0.0}
    assert all(t["non_loss"] in (0.0, None) for t in found["thresholds"])
    await assert_idle(gw)


async def test_answers_of_one_length_tie(serve: Serve, tmp_path: Path) -> None:
    config = embedded(config_from_dict(raw_config(small_words=LONG)), "chat", None)
    gw = await serve(config)
    results = await run(gw, config, tmp_path)
    assert {(r.outcome, r.verdict) for r in results} == {(Outcome.JUDGED, Verdict.TIE)}
    found = figures(config, plan_for(config, "chat"), results)
    assert {g["non_loss"] for g in found["groups"]} == {1.0}
    await assert_idle(gw)


async def test_a_running_gateway_is_asked_with_the_operators_key(
        serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With --url: the calls are the key's requests, on the config's own direct routes."""
    monkeypatch.setenv("EVAL_KEY", "sk-evaluate")
    raw = raw_config()
    raw["routes"] |= {"big-direct": {"primary": "big"}, "small-direct": {"primary": "small"}}
    raw["auth"] = {"enabled": True, "keys": [{"id": "ops", "tenant": "ops",
                                                  "key_env": "EVAL_KEY"}]}
    config = config_from_dict(raw)
    gw = await serve(config)
    plan = plan_for(config, "chat")
    assert plan.direct == {"small": "small-direct", "big": "big-direct"}
    results = await run(gw, config, tmp_path, key="sk-evaluate")
    assert {(r.outcome, r.verdict) for r in results} == {(Outcome.JUDGED, Verdict.WORSE)}
    refused = await run(gw, config, tmp_path, key="sk-wrong")
    assert {r.outcome for r in refused} == {Outcome.SMALL_FAILED}  # 401: nothing compared
    await assert_idle(gw)


def test_each_backend_needs_a_route_of_its_own() -> None:
    raw = raw_config()
    raw["routes"]["small-only"] = {"primary": "small"}
    raw["experiments"] = {"ab": {"route": "small-only", "arms": {"a": {}, "b": {}}}}
    config = config_from_dict(raw)
    assert direct_route(config, "small") is None  # an experiment may send it elsewhere
    with pytest.raises(EvaluateError, match="to 'small' alone"):
        plan_for(config, "chat")
    served = with_direct_routes(config, ["small", "big", "small"])
    assert {n: r.primary for n, r in served.routes.items() if n.startswith("evaluate.")} == {
        "evaluate.small": "small", "evaluate.big": "big"}
    assert plan_for(served, "chat").direct == {"small": "evaluate.small", "big": "evaluate.big"}
    for route, small, message in (("nope", None, "unknown route 'nope'"),
                                  ("small-only", None, "has no fallback"),
                                  ("chat", "elsewhere", "unknown backend 'elsewhere'"),
                                  ("chat", "big", "is the route's primary")):
        with pytest.raises(EvaluateError, match=message):
            plan_for(served, route, small)


def test_the_in_process_gateway_keeps_no_ledger_auth_or_shadows() -> None:
    raw = raw_config()
    raw["ledger"] = {"path": "somewhere.sqlite3"}
    raw["routes"]["chat"]["quality"] = {"shadow_rate": 1.0}
    config = embedded(config_from_dict(raw), "chat", None)
    assert not config.ledger.enabled and not config.auth.enabled
    assert all(r.quality.shadow_rate == 0.0 for r in config.routes.values())
    assert config.routes["chat"].fallbacks == ("small",)  # the route itself as it was


# -- the prompt file ---------------------------------------------------------------------


def test_a_line_becomes_a_chat_request() -> None:
    said = parse_line(b'{"prompt": "hi", "intent": "greeting", "model": "x", "stream": true}', 7)
    assert (said.line, said.label) == (7, "greeting")
    assert said.body == {"messages": [{"role": "user", "content": "hi"}]}
    chat = parse_line(b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, '
                      b'"temperature": 0.2}', 1)
    assert chat.label is None and chat.body["max_tokens"] == 9
    assert chat.body["temperature"] == 0.2  # what else a chat request says passes through


@pytest.mark.parametrize(("line", "message"), [
    ("not json", "not JSON"),
    ("[1, 2]", "a line is a JSON object, not list"),
    ("{}", "a line has either 'messages'"),
    ('{"prompt": "a", "messages": [{"role": "user", "content": "a"}]}',
     "a line has either 'messages'"),
    ('{"prompt": 3}', "'prompt' is a non-empty string"),
    ('{"prompt": "   "}', "'prompt' is a non-empty string"),
    ('{"messages": []}', "'messages' is a non-empty list"),
    ('{"messages": [{"content": "hi"}]}', "'messages' is a non-empty list of objects, each"),
    ('{"prompt": "hi", "max_tokens": 0}', "'max_tokens' is a whole number"),
    ('{"prompt": "hi", "max_tokens": true}', "'max_tokens' is a whole number"),
    ('{"prompt": "hi", "intent": ""}', "'intent' is a label"),
    ('{"prompt": "hi", "intent": 4}', "'intent' is a label"),
])
def test_a_bad_line_is_refused_with_its_number(tmp_path: Path, line: str, message: str) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [{"prompt": "fine"}, "", line, {"prompt": "x"}])
    with pytest.raises(PromptFileError, match=re.escape("p.jsonl, line 3: " + message)) as caught:
        read_prompts(path)
    assert caught.value.line == 3


def test_the_file_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    long = tmp_path / "long.jsonl"
    long.write_text('{"prompt": "hi"}\n{"prompt": "' + "x" * prompt_file.MAX_LINE_BYTES + '"}\n')
    with pytest.raises(PromptFileError, match="line 2: longer than 1,048,576 bytes"):
        read_prompts(long)
    many = write_prompts(tmp_path / "many.jsonl", [{"prompt": f"p{i}"} for i in range(4)])
    monkeypatch.setattr(prompt_file, "MAX_PROMPTS", 3)
    with pytest.raises(PromptFileError, match="more than 3 prompts: split the file or give"):
        read_prompts(many)
    assert [p.line for p in read_prompts(many, limit=2)] == [1, 2]
    monkeypatch.setattr(prompt_file, "MAX_BYTES", 40)
    with pytest.raises(PromptFileError, match="larger than 40 bytes"):
        read_prompts(many)
    with pytest.raises(PromptFileError, match="no prompt in the file"):
        read_prompts(write_prompts(tmp_path / "blank.jsonl", ["", "  "]))
    with pytest.raises(PromptFileError, match=r"missing\.jsonl: No such file"):
        read_prompts(tmp_path / "missing.jsonl")


# -- the figures -------------------------------------------------------------------------


def test_figures_keep_failures_apart_and_the_threshold_table_to_movable_intents() -> None:
    config = embedded(config_from_dict(raw_config()), "chat", None)
    plan = plan_for(config, "chat")
    results = [
        Judged(1, "greeting", "greeting", 0.95, "en", 10, Outcome.JUDGED, Verdict.TIE, 0.5),
        Judged(2, "greeting", "greeting", 0.85, "en", 10, Outcome.JUDGED, Verdict.WORSE, 0.5),
        Judged(3, None, "greeting", 0.6, "en", 10, Outcome.NO_VERDICT),
        Judged(4, "math", "code", 0.1, "en", 10, Outcome.JUDGED, Verdict.BETTER, 1.0),
        Judged(5, None, "greeting", 0.9, "en", 0, Outcome.REFUSED),
    ]
    found = figures(config, plan, results)
    assert found["outcomes"] == {"judged": 3, "no_verdict": 1, "small_failed": 0,
                                 "replay_failed": 0, "refused": 1, "failed": 0}
    groups = {g["intent"]: g for g in found["groups"]}
    assert (groups["greeting"]["verdicts"], groups["greeting"]["no_verdict"]) == (2, 1)
    assert groups["greeting"]["non_loss"] == 0.5 and groups["code"]["non_loss"] == 1.0
    assert found["classified"] == 3  # code is never moved
    at = {t["min_confidence"]: t for t in found["thresholds"]}
    assert (at[0.5]["share_moved"], at[0.5]["verdicts"], at[0.5]["non_loss"]) == (1.0, 2, 0.5)
    assert (at[0.9]["verdicts"], at[0.9]["non_loss"], at[0.9]["saved"]) == (1, 1.0, 0.5)
    assert (found["labelled"], found["labels_agreed"]) == (3, 2)
    assert found["results"][0]["verdict"] == "tie"
    text = "\n".join(text_lines(found, "p.jsonl"))
    assert "3 judged, 1 without a verdict; 1 refused by the gateway" in text
    assert "0.80 (now)" in text and "the classifier agreed on 2 (66.7%)" in text


# -- the command -------------------------------------------------------------------------


def slotgate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The `slotgate` program of this environment, running this tree's code."""
    root = str(Path(__file__).resolve().parent.parent)  # not the tree an install points at
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([str(Path(sys.executable).parent / "slotgate"), *args],
                          capture_output=True, text=True, timeout=60, check=False, cwd=cwd,
                          env=env)


def test_the_command_end_to_end(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw_config()))
    prompts = write_prompts(tmp_path / "prompts.jsonl", PROMPTS)

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return slotgate(tmp_path, "evaluate", *args, "--config", str(config))

    done = command(str(prompts), "--route", "chat", "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["outcomes"]["judged"] == 5
    assert {r["verdict"] for r in found["results"]} == {"worse"}
    text = command(str(prompts), "--route", "chat", "--limit", "2")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"2 prompts of {prompts} on route chat: small (small) "
                                  "against big (primary), judged by big")
    assert "If min_confidence were X: route chat" in text.stdout
    bad = write_prompts(tmp_path / "bad.jsonl", [{"prompt": "hi"}, "{oops"])
    refused = command(str(bad), "--route", "chat")
    assert refused.returncode == 2 and "bad.jsonl, line 2: not JSON" in refused.stderr
    unknown = command(str(prompts), "--route", "nope")
    assert unknown.returncode == 2 and "unknown route 'nope'" in unknown.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bad.jsonl", "config.yaml", "prompts.jsonl"]  # no ledger left behind


def test_the_command_says_when_no_gateway_answers(tmp_path: Path) -> None:
    raw = raw_config()
    raw["routes"] |= {"big-direct": {"primary": "big"}, "small-direct": {"primary": "small"}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    prompts = write_prompts(tmp_path / "prompts.jsonl", PROMPTS)
    url = f"http://127.0.0.1:{closed_port()}"
    done = slotgate(tmp_path, "evaluate", str(prompts), "--route", "chat", "--config",
                    str(config), "--url", url)
    assert done.returncode == 1 and done.stderr.startswith(f"slotgate evaluate: {url}: ")
    assert done.stdout == ""
