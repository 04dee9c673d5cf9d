"""TTFT objectives in the config: defaults, a route's override, bad values at their key
paths (also through `slotgate config check`), the pure helpers, and a hot reload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.clock.answers import AnswerModel, hints
from policies.clock.lengths import OUTPUT_PRIOR, WINDOW
from policies.clock.slo import Verdict, objective_s, verdict
from policies.clock.ttft import first_byte_s, predict_ttft_s
from policies.config import BackendConfig, Priority
from router.app import start_gateway
from router.common.config_error import ConfigError
from router.config import check_main, config_from_dict, load_config, parse_config
from router.reload import ReloadRefused, reload_file
from router.request.options import expected_output
from tests.support import MESSAGES, SdkClients, assert_idle, sim_backend

BASE = """\
backends:
  big:
    simulated: {}
    model: m
    slots: 2
routes:
  chat:
    primary: big
"""

# Line numbers matter: each problem sits on a line of its own.
BAD = BASE + """\
    slo:
      sheddable: {ttft_s: -1}
      batch: {ttft_s: 3}
slo:
  critical: {ttft_s: 0}
  standard: {}
  sheddable: {ttft_s: soon}
  urgent: {ttft_s: 1}
"""
EXPECTED = [
    ("routes.chat.slo.sheddable.ttft_s", 10, "greater than 0"),
    ("routes.chat.slo.batch", 11, "unknown key"),
    ("slo.critical.ttft_s", 13, "greater than 0"),
    ("slo.standard.ttft_s", 14, "required"),
    ("slo.sheddable.ttft_s", 15, "valid number"),
    ("slo.urgent", 16, "unknown key"),
]


def test_defaults_for_every_class() -> None:
    config = parse_config(BASE)
    route = config.routes["chat"]
    assert {p: objective_s(config, route, p) for p in Priority} == {
        Priority.CRITICAL: 2.0, Priority.STANDARD: 5.0, Priority.SHEDDABLE: 20.0}
    assert objective_s(config, None, Priority.STANDARD) == 5.0


def test_a_route_overrides_only_the_classes_it_names() -> None:
    config = parse_config(BASE + "    slo: {critical: {ttft_s: 0.5}}\n"
                          "  other: {primary: big}\n"
                          "slo: {standard: {ttft_s: 8}}\n")
    chat, other = config.routes["chat"], config.routes["other"]
    assert objective_s(config, chat, Priority.CRITICAL) == 0.5  # the route's
    assert objective_s(config, chat, Priority.STANDARD) == 8.0  # the top level's
    assert objective_s(config, chat, Priority.SHEDDABLE) == 20.0  # the default
    assert objective_s(config, other, Priority.CRITICAL) == 2.0


def test_bad_values_are_reported_at_their_key_paths() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(BAD, "bad.yaml")
    problems = caught.value.problems
    assert sorted((p.path, p.line) for p in problems) == sorted((p, n) for p, n, _ in EXPECTED)
    for path, _, words in EXPECTED:
        assert any(p.path == path and words in p.message for p in problems), (path, problems)


def test_config_check_names_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    assert check_main([str(bad)]) == 1
    err = capsys.readouterr().err
    for path, line, _ in EXPECTED:
        assert f"{bad}:{line}: {path}: " in err
    good = tmp_path / "good.yaml"
    good.write_text(BASE + "slo: {critical: {ttft_s: 1.5}}\n")
    assert check_main([str(good)]) == 0


@pytest.mark.parametrize(("objective", "ttft", "elapsed", "left", "expected"), [
    (2000.0, 1999.0, 5000.0, False, Verdict.ATTAINED),
    (2000.0, 2000.0, 2000.0, False, Verdict.ATTAINED),  # within: at most the objective
    (2000.0, 2000.5, 2000.5, False, Verdict.MISSED),
    (2000.0, None, 10.0, False, Verdict.MISSED),  # rejected at once: no first token
    (2000.0, None, 10.0, True, None),  # the client left before its objective was due
    (2000.0, None, 2500.0, True, Verdict.MISSED),  # ... after it
    (None, 10.0, 10.0, False, None),  # no objective: its route was never known
])
def test_verdict(objective: float | None, ttft: float | None, elapsed: float, left: bool,
                 expected: Verdict | None) -> None:
    assert verdict(objective, ttft, elapsed, left) is expected


ENGINE = {"ttft_s": 0.3, "tokens_per_s": 50, "output_tokens": 101}  # 2.3 s to the last
RATES = {"ttft_s": 1.0, "tokens_per_s": 10, "output_tokens": 21}  # ~21: 10.5 to 31.5
REAL = {"url": "http://127.0.0.1:9", "model": "m", "slots": 1, "initial_hold_s": 4}


def config_of(backend: dict[str, Any]) -> BackendConfig:
    config = config_from_dict({"backends": {"b": backend}, "routes": {"chat": {"primary": "b"}}})
    return config.backends["b"]


def cold(backend: dict[str, Any]) -> tuple[AnswerModel, float]:
    """A backend's answer model as the gateway starts it, and its pool's mean hold then."""
    config = config_of(backend)
    return AnswerModel(hints(config)), config.initial_hold_s


@pytest.mark.parametrize(("backend", "stream", "max_tokens", "expected"), [
    (sim_backend("m", 1, sim=ENGINE), True, None, 0.3),  # the engine's own first token
    (sim_backend("m", 1, sim=ENGINE), False, None, 2.3),  # and 100 more tokens at 50 a second
    (sim_backend("m", 1, sim=ENGINE), False, 51, 1.3),  # no more than max_tokens
    (sim_backend("m", 1, sim=ENGINE, rates=RATES), True, None, 1.0),  # the hint before it
    (sim_backend("m", 1, sim=ENGINE, rates=RATES), False, 8, 1.7),  # 7 more tokens at 10/s
    (sim_backend("m", 1, sim=ENGINE, rates={"ttft_s": 1.0}), False, 51, 2.0),  # the rest: the
    ({**REAL, "rates": RATES}, False, None, pytest.approx(3.03, abs=0.01)),     # engine's
    (REAL, True, None, 1.0),  # nothing known: the prior, a first chunk in a second
    (REAL, False, 100, 4.0),  # and a whole answer in the pool's mean hold (initial_hold_s)
    ({**REAL, "initial_hold_s": 0.5}, True, None, 0.5),  # a first chunk within that hold
    ({**REAL, "rates": {"ttft_s": 0.2}}, True, None, 0.2),  # a first token is enough...
    ({**REAL, "rates": {"ttft_s": 0.2}}, False, 100, 4.0),  # ... for a stream only
    ({**REAL, "rates": {"ttft_s": 0.2, "tokens_per_s": 10}}, False, 11, 1.2),  # to its cap
    ({**REAL, "rates": {"ttft_s": 0.2, "tokens_per_s": 10}}, False, None, 4.0),  # no cap
])
def test_a_cold_first_byte_expectation(backend: dict[str, Any], stream: bool,
                                       max_tokens: int | None, expected: float) -> None:
    answers, hold_s = cold(backend)
    assert first_byte_s(answers, stream, max_tokens, lambda: hold_s) == expected


# What ends, in order: (tokens, its first-token time, its slot hold) (None: a whole answer,
# no first-token time seen), then the expected first byte of a stream and of a whole answer.
LEARNING: list[tuple[str, list[tuple[int, float | None, float]], float, float]] = [
    ("cold: the engine's", [], 0.3, 2.3),
    ("a whole answer teaches no rate", [(41, None, 9.0)], 0.3, 2.3),
    ("the first stream replaces the rates (41 tokens at 20/s)", [(41, 1.0, 3.0)], 1.0, 6.0),
    ("8 lengths measured replace the hinted ones", [(41, 1.0, 3.0)] * 6, 1.0, 3.0),
    ("then a moving average", [(41, 2.0, 4.0)], 1.2, 3.2),
    ("a first token after the hold teaches nothing of it", [(41, 5.0, 4.0)], 1.2, 3.2),
]


def test_the_first_byte_expectation_learns_from_finished_answers() -> None:
    answers, hold_s = cold(sim_backend("m", 1, sim=ENGINE))
    for step, ended, stream_s, whole_s in LEARNING:
        for tokens, ttft_s, held_s in ended:
            answers.observe(tokens, None, ttft_s=ttft_s, held_s=held_s)
        got = (first_byte_s(answers, True, None, lambda: hold_s),
               first_byte_s(answers, False, None, lambda: hold_s))
        assert got == pytest.approx((stream_s, whole_s)), step
    assert predict_ttft_s(0.01, 2.0, 0.3) == pytest.approx(2.31)
    assert predict_ttft_s(-1.0, 2.0, 0.3) == pytest.approx(2.3)  # clocks out of order


def measured(tokens: int, answers: int) -> AnswerModel:
    model, _ = cold(REAL)
    for _ in range(answers):
        model.observe(tokens, None)
    return model


@pytest.mark.parametrize(("model", "max_tokens", "expected"), [
    (cold(REAL)[0], None, OUTPUT_PRIOR),  # nothing known: the prior
    (cold(REAL)[0], 100, 100),  # or a lower cap
    (cold(REAL)[0], 1000, OUTPUT_PRIOR),
    (cold(sim_backend("m", 1, sim=ENGINE))[0], None, 101),  # the engine's length
    (cold(sim_backend("m", 1, sim=ENGINE))[0], 1000, 101),
    (cold(sim_backend("m", 1, sim=ENGINE))[0], 51, 51),
    (cold({**REAL, "rates": RATES})[0], None, 21),  # the hinted one
    (cold({**REAL, "rates": RATES})[0], 8, 8),
    (measured(40, 3), None, 40),  # measured (at once, without a hint)
    (measured(40, 3), 1000, 40),
    (measured(40, 3), 30, 30),
])
def test_an_options_expected_output(model: AnswerModel, max_tokens: int | None,
                                    expected: int) -> None:
    assert expected_output(model, max_tokens) == expected


def test_the_expected_length_is_rebuilt_once_a_share_of_the_window_is_new() -> None:
    """Each prediction asks for it: a full window's is kept until 1/32 of it (8 of 256
    answers) is new, a short window's is rebuilt at every answer."""
    model = measured(40, 3)
    assert model.expected_tokens(None) == 40
    model.observe(100, None)
    assert model.expected_tokens(None) == 55  # short: at once
    model = measured(40, WINDOW)
    assert model.expected_tokens(None) == 40
    for _ in range(7):
        model.observe(100, None)
    assert model.expected_tokens(None) == 40  # 7 new of 256: remembered
    # a cap not asked before: from the window as it is
    assert model.expected_tokens(1000) == pytest.approx((249 * 40 + 7 * 100) / 256)
    model.observe(100, None)  # the 8th
    assert model.expected_tokens(None) == pytest.approx((248 * 40 + 8 * 100) / 256)
    hinted, _ = cold(sim_backend("m", 1, sim=ENGINE))
    assert hinted.expected_tokens(None) == 101
    hinted.configure(hints(config_of({**REAL, "rates": RATES})))  # a reload's new hint
    assert hinted.expected_tokens(None) == pytest.approx(21.3, abs=0.1)


def _write(path: Path, slo: dict[str, Any] | None, route_slo: dict[str, Any] | None) -> None:
    route: dict[str, Any] = {"primary": "big"}
    if route_slo is not None:
        route["slo"] = route_slo
    raw: dict[str, Any] = {"backends": {"big": sim_backend("m", slots=2)},
                           "routes": {"chat": route}, "logging": {"access": False}}
    if slo is not None:
        raw["slo"] = slo
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")


async def test_a_reload_changes_the_objectives_of_new_requests(
    sdk: SdkClients, tmp_path: Path
) -> None:
    path = tmp_path / "gateway.yaml"
    _write(path, None, None)
    gw = await start_gateway(load_config(path), "127.0.0.1", 0, config_path=str(path))
    try:
        client = sdk(gw)
        await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert gw.gateway.recent[-1].slo_ttft_ms == 5000.0
        _write(path, {"standard": {"ttft_s": 3}}, None)

        assert await reload_file(gw.gateway, path) == ["slo changed"]
        await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert gw.gateway.recent[-1].slo_ttft_ms == 3000.0
        _write(path, {"standard": {"ttft_s": 3}}, {"standard": {"ttft_s": 0.75}})
        assert await reload_file(gw.gateway, path) == ["routes changed"]
        await client.chat.completions.create(
            model="chat", messages=MESSAGES, extra_headers={"x-slotgate-priority": "sheddable"})
        await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert [(r.priority, r.slo_ttft_ms) for r in list(gw.gateway.recent)[-2:]] == [
            ("sheddable", 20000.0), ("standard", 750.0)]
        _write(path, {"standard": {"ttft_s": 0}}, None)  # refused: the old one kept
        with pytest.raises(ReloadRefused, match=r"slo\.standard\.ttft_s"):
            await reload_file(gw.gateway, path)
        await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert gw.gateway.recent[-1].slo_ttft_ms == 750.0
        await assert_idle(gw)
    finally:
        await gw.close()
