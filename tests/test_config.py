"""router.config: the shipped config loads; every problem is named by key path and line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from policies.apis import Api
from policies.config import Config, Overflow, cross_check
from router.common.config_error import ConfigError, ConfigProblem
from router.config import (
    DEFAULT_CONFIG_PATH,
    check_main,
    config_from_dict,
    load_config,
    parse_config,
)

PROJECT = Path(__file__).resolve().parent.parent

# Line numbers matter below: each problem sits on a line of its own.
BAD = """\
server:
  port: 8080
  retry_after_min_s: 30
  retry_after_max_s: 10
colour: blue
backends:
  big:
    url: http://10.0.0.1:8000
    model: big-model
    slots: 0
    flavour: spicy
  both:
    url: http://10.0.0.2:8000
    simulated: {}
    model: m
    slots: 2
  neither:
    model: m
    slots: 2
  small:
    simulated:
      max_num_seqs: 2
    model: small
    slots: 2
    slots: 3
    queue_limit: lots
routes:
  chat:
    primary: big
    fallbacks: [llama-9b, big]
    overflow: sometimes
  code:
    primary: small
    fallbacks: [big, big]
  ghost:
    primary: llama-9b
"""

# (key path, line, words the message must contain)
EXPECTED = [
    ("server.retry_after_max_s", 4, "retry_after_min_s"),
    ("colour", 5,
     "unknown key (allowed: server, logging, backends, routes, currency, ledger, batch, "
     "quality, fleet, experiments, coordination, auth, slo, tracing)"),
    ("backends.big.slots", 10, "greater than or equal to 1"),
    ("backends.big.flavour", 11, "unknown key"),
    ("backends.both", 12, "exactly one of 'url' or 'simulated'"),
    ("backends.neither", 17, "exactly one of 'url' or 'simulated'"),
    ("backends.small.slots", 25, "duplicate key (first at line 24"),
    ("backends.small.queue_limit", 26, "valid integer"),
    (
        "routes.chat.fallbacks[0]",
        30,
        "unknown backend 'llama-9b' (known: big, both, neither, small)",
    ),
    ("routes.chat.fallbacks[1]", 30, "'big' is this route's primary"),
    ("routes.chat.overflow", 31, "'fallback' or 'reject'"),
    ("routes.code.fallbacks[1]", 34, "'big' is already fallbacks[0]"),
    ("routes.ghost.primary", 36, "unknown backend 'llama-9b'"),
]

GOOD_BACKEND = {"simulated": {}, "model": "m", "slots": 1}


@pytest.fixture(scope="module")
def bad_problems() -> list[ConfigProblem]:
    with pytest.raises(ConfigError) as caught:
        parse_config(BAD, "bad.yaml")
    return caught.value.problems


def test_shipped_config_loads() -> None:
    assert DEFAULT_CONFIG_PATH == PROJECT / "config.yaml"
    for config in (load_config(), load_config(DEFAULT_CONFIG_PATH)):
        assert sorted(config.backends) == ["embed-small", "llama-70b", "llama-8b"]
        assert sorted(config.routes) == ["embed-small", "llama-70b", "llama-8b"]
        assert config.routes["llama-70b"].fallbacks == ("llama-8b",)
        assert config.routes["llama-8b"].overflow is Overflow.REJECT
        assert config.backends["embed-small"].served_apis == {Api.EMBEDDINGS}
        assert config.backends["llama-8b"].served_apis == {Api.CHAT, Api.COMPLETIONS,
                                                           Api.EMBEDDINGS}  # simulated


@pytest.mark.parametrize(("path", "line", "words"), EXPECTED, ids=[e[0] for e in EXPECTED])
def test_each_problem_has_path_and_line(
    bad_problems: list[ConfigProblem], path: str, line: int, words: str
) -> None:
    matches = [p for p in bad_problems if p.path == path and words in p.message]
    assert matches, f"{path}: {words!r} not among {[str(p) for p in bad_problems]}"
    assert matches[0].line == line
    assert str(matches[0]) == f"{line}: {path}: {matches[0].message}"


def test_every_problem_and_nothing_else(bad_problems: list[ConfigProblem]) -> None:
    assert sorted((p.path, p.line) for p in bad_problems) == sorted(
        (path, line) for path, line, _ in EXPECTED
    )
    assert [p.line for p in bad_problems] == sorted(p.line or 0 for p in bad_problems)


def test_error_text_lists_every_problem_with_source() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(BAD, "bad.yaml")
    lines = str(caught.value).splitlines()
    assert len(lines) == len(EXPECTED)
    assert "bad.yaml:10: backends.big.slots: Input should be greater than or equal to 1" in lines
    assert caught.value.source == "bad.yaml"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("server:\n  port: 1\n bad: [\n", 3, "YAML syntax"),
        ("backends:\n  a: [1, 2\nroutes: {}\n", 3, "YAML syntax"),
        ("a: 1\n---\nb: 2\n", 2, "single document"),
        ("backends: !!python/object:os.system {}\n", 1, "could not determine a constructor"),
    ],
    ids=["bad-indent", "unclosed-flow", "two-documents", "unsafe-tag"],
)
def test_yaml_syntax_error_has_line(text: str, line: int, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    [problem] = caught.value.problems
    assert problem.line == line
    assert words in problem.message
    assert str(caught.value).startswith(f"<string>:{line}: ")


@pytest.mark.parametrize(
    ("text", "path", "line", "words"),
    [
        ("", "", None, "mapping"),
        ("- 1\n", "", 1, "mapping"),
        ("routes: {r: {primary: a}}\n", "backends", 1, "Field required"),
        (
            "backends: {a: {url: x, model: m, slots: 1}}\nroutes: {a: {primary: a}}\n",
            "backends.a.url",
            1,
            "valid URL",
        ),
        (
            "backends: {a: {url: 'http://u:sk-1@h:8000/v1', model: m, slots: 1}}\n"
            "routes: {a: {primary: a}}\n",
            "backends.a",
            1,
            "no credentials in 'url'",
        ),
        (
            "backends:\n  a:\n    simulated:\n      seeed: 1\n",
            "backends.a.simulated.seeed",
            4,
            "unknown key (allowed: max_num_seqs,",
        ),
        (
            "backends:\n  a:\n    simulated: {}\n    model: m\n    slots: 1\n"
            "routes:\n  a:\n    primary: a\n    fallbacks: a\n",
            "routes.a.fallbacks",
            9,
            "should be a list",
        ),
        (
            "backends:\n  a:\n    simulated: {}\n    model: m\n    slots: 1\n"
            "    capabilities: [tools, audio]\n"
            "routes:\n  a:\n    primary: a\n",
            "backends.a.capabilities[1]",
            6,
            "'tools', 'vision' or 'json_schema'",
        ),
        (
            "backends:\n  a:\n    simulated: {}\n    model: m\n    slots: 1\n"
            "    rates: {ttft_s: 0.5, tokens_per_s: 0}\nroutes: {a: {primary: a}}\n",
            "backends.a.rates.tokens_per_s",
            6,
            "greater than 0",
        ),
        (
            "backends:\n  a:\n    simulated: {}\n    model: m\n    slots: 1\n"
            "    rates: {output_tokens: 100, tokens: 3}\nroutes: {a: {primary: a}}\n",
            "backends.a.rates.tokens",
            6,
            "unknown key",
        ),
        (
            "backends:\n  a:\n    simulated: {}\n    model: m\n    slots: 1\n"
            "    price: {gpu_hour: 2, gpus: 1, batch_discount: 1.5}\nroutes: {a: {primary: a}}\n",
            "backends.a.price.batch_discount",
            6,
            "less than or equal to 1",
        ),
    ],
    ids=["empty", "list-root", "missing-section", "bad-url", "url-credentials",
         "nested-unknown-key", "not-a-list", "unknown-capability", "rates-zero-speed",
         "rates-unknown-key", "batch-discount-over-one"],
)
def test_single_problem(text: str, path: str, line: int | None, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    problems = [p for p in caught.value.problems if p.path == path]
    assert problems and words in problems[0].message, caught.value.problems
    assert problems[0].line == line


def test_merge_keys_may_override_without_duplicate_error() -> None:
    text = (
        "base: &base {simulated: {}, model: m, slots: 1}\n"
        "backends:\n  a: {<<: *base, slots: 2}\n"
        "routes: {a: {primary: a}}\n"
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    assert [p.path for p in caught.value.problems] == ["base"]  # only the unknown top key


def test_config_from_dict_reports_paths_without_lines() -> None:
    config = config_from_dict({"backends": {"a": GOOD_BACKEND}, "routes": {"a": {"primary": "a"}}})
    assert config.backends["a"].slots == 1
    with pytest.raises(ConfigError) as caught:
        config_from_dict(
            {"backends": {"a": {**GOOD_BACKEND, "slots": 0}}, "routes": {"r": {"primary": "b"}}}
        )
    assert {(p.path, p.line) for p in caught.value.problems} == {
        ("backends.a.slots", None),
        ("routes.r.primary", None),
    }
    assert "<dict>: routes.r.primary: unknown backend 'b' (known: a)" in str(caught.value)


def test_models_refuse_bad_cross_references_when_built_directly() -> None:
    data = {
        "backends": {"a": GOOD_BACKEND},
        "routes": {"r": {"primary": "a", "fallbacks": ["a", "x"]}},
    }
    with pytest.raises(ValidationError) as caught:
        Config(**data)  # type: ignore[arg-type]
    assert [e["loc"] for e in caught.value.errors()] == [
        ("routes", "r", "fallbacks", 0),
        ("routes", "r", "fallbacks", 1),
    ]


def test_cross_check_is_pure() -> None:
    config = config_from_dict({"backends": {"a": GOOD_BACKEND}, "routes": {"a": {"primary": "a"}}})
    assert cross_check(config.backends.keys(), config.routes) == []


def test_policies_do_not_import_yaml() -> None:
    code = "import sys, policies.config; sys.exit(bool({'yaml', 'aiohttp'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], cwd=PROJECT).returncode == 0


def test_load_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "nope.yaml")
    assert "cannot read" in str(caught.value)


def test_check_main_good(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(DEFAULT_CONFIG_PATH.read_text())
    assert check_main([str(good)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{good}: OK (3 backends, 3 routes)\n"
    assert err == ""


def test_check_main_bad(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    assert check_main([str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == len(EXPECTED)
    for path, line, _ in EXPECTED:
        assert any(text.startswith(f"{bad}:{line}: {path}: ") for text in lines), (path, err)


def test_check_main_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_main([str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: cannot read" in capsys.readouterr().err
    assert check_main([]) == 2


def test_check_command_in_subprocess(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    code = "from router.config import check_main; import sys; sys.exit(check_main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(bad)], cwd=PROJECT, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert done.stdout == ""
    for path, line, _ in EXPECTED:
        assert f"{bad}:{line}: {path}: " in done.stderr
