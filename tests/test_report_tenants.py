"""The report's tenants per backend (router/report/tenants.py): figures, Jain's index
weighted or not, the fold beyond TENANT_ROWS, and the four renderings."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import orjson
import pytest

from policies.config import ApiKeyConfig
from router.config import config_from_dict
from router.ledger.base import LedgerRow
from router.report.build import build_report
from router.report.render import render_csv, render_html, render_json, render_text
from router.report.tenants import MORE, TENANT_ROWS, tenant_weights
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    gateway_config,
    hand_ledger,
    row,
    rows_of,
    sim_backend,
)
from tests.support.tenants import KEYS, with_tenants

WEIGHTS = {"acme": 2.0, "beta": 1.0}


async def test_a_gateways_ledger_reports_its_tenants(
    start: StartGateway, sdk: SdkClients, tmp_path: Path
) -> None:
    raw = with_tenants(gateway_config(sim_backend("m", slots=2)))
    raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite3")}
    gw = await start(raw)
    served = {"acme": 0, "beta": 0}
    for tenant in ("acme", "acme", "beta"):
        answer = await sdk(gw, api_key=KEYS[tenant]).chat.completions.create(
            model="chat", messages=MESSAGES)
        assert answer.usage is not None
        served[tenant] += answer.usage.total_tokens
    rows = await rows_of(gw, raw["ledger"]["path"])
    weights = tenant_weights(config_from_dict(raw).auth.keys)
    assert weights == WEIGHTS
    (big,) = build_report(rows, weights=weights)["tenants"]
    assert big["backend"] == "big"
    assert {t["tenant"]: (t["requests"], t["tokens"]) for t in big["tenants"]} == {
        "acme": (2, served["acme"]), "beta": (1, served["beta"])}
    x = [served["acme"] / 2, served["beta"] / 1]
    assert big["fairness"] == {"jain": pytest.approx(sum(x) ** 2 / (2 * (x[0] ** 2 + x[1] ** 2))),
                               "weighted": True, "tenants": 2}


def of(tenant: str | None, key: str, backend: str | None, status: int = 200, *,
       tokens: tuple[int, int] = (0, 0), wait: float = 0.0,
       error: str | None = None) -> LedgerRow:
    return row(key, len(key), None, backend, status, tokens=tokens, wait=wait,
               error=error)._replace(tenant=tenant)


def tenant_rows() -> list[LedgerRow]:
    """big: acme 400 tokens, beta 200, no tenant 100; small: gamma 20."""
    return [
        of("acme", "a1", "big", tokens=(100, 200)),
        of("acme", "a2", "big", tokens=(50, 50), wait=100),
        of("acme", "a3", "big", 429, error="queue_full"),  # refused at once: no wait
        of("beta", "b1", "big", tokens=(50, 150), wait=200),
        of("beta", "b2", None, 429, error="queue_full"),  # its route's primary: big
        of(None, "n1", "big", tokens=(50, 50)),
        of("gamma", "g1", "small", tokens=(10, 10)),
    ]


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["backend"]: b for b in report["tenants"]}


def test_each_backends_tenants() -> None:
    big = by_name(build_report(tenant_rows(), weights=WEIGHTS))["big"]
    assert big["tokens"] == 700
    tenants = {t["tenant"]: t for t in big["tenants"]}
    assert [t["tenant"] for t in big["tenants"]] == ["acme", "beta", "(none)"]  # most first
    acme, beta = tenants["acme"], tenants["beta"]
    assert (acme["requests"], acme["tokens"], acme["status_429"]) == (3, 400, 1)
    assert acme["token_share"] == pytest.approx(400 / 700)
    assert (acme["queue_wait_p50_ms"], acme["queue_wait_p95_ms"]) == (50.0, 95.0)
    assert (beta["requests"], beta["tokens"], beta["status_429"]) == (2, 200, 1)
    assert (beta["queue_wait_p50_ms"], beta["queue_wait_p95_ms"]) == (200.0, 200.0)
    assert (acme["weight"], beta["weight"], tenants["(none)"]["weight"]) == (2.0, 1.0, None)
    # x = 400 / 2 and 200 / 1: served in proportion to their weights
    assert big["fairness"] == {"jain": pytest.approx(1.0), "weighted": True, "tenants": 2}


def test_jain_is_unweighted_unless_every_weight_is_known() -> None:
    backends = by_name(build_report(tenant_rows()))
    # 600^2 / (2 * (400^2 + 200^2)); the row without a tenant is no tenant
    assert backends["big"]["fairness"] == {"jain": pytest.approx(0.9), "weighted": False,
                                           "tenants": 2}
    weighted = by_name(build_report(tenant_rows(), weights=WEIGHTS))
    assert weighted["small"]["fairness"] == {"jain": 1.0, "weighted": False, "tenants": 1}


def test_tenants_beyond_the_table_are_folded() -> None:
    rows = [of(f"t{i:02d}", f"r{i}", "big", tokens=(i + 1, 0)) for i in range(TENANT_ROWS + 5)]
    big = by_name(build_report(rows))["big"]
    names = [t["tenant"] for t in big["tenants"]]
    assert len(names) == TENANT_ROWS + 1 and names[-1] == MORE
    assert names[0] == f"t{TENANT_ROWS + 4:02d}"  # the most tokens first
    more = big["tenants"][-1]
    assert (more["requests"], more["tokens"]) == (5, 1 + 2 + 3 + 4 + 5)
    assert big["fairness"]["tenants"] == TENANT_ROWS + 5  # every tenant counts


def test_no_tenant_no_table() -> None:
    report = build_report(hand_ledger())
    assert "tenants" not in report
    assert "tenant" not in render_csv(report).splitlines()[0]
    assert "Tenants" not in render_text(report) + render_html(report)


def test_weights_come_from_the_keys() -> None:
    def key(name: str, tenant: str, weight: float) -> ApiKeyConfig:
        return ApiKeyConfig(id=name, tenant=tenant, sha256="0" * 64, weight=weight)

    keys = [key("a1", "acme", 2), key("a2", "acme", 2), key("b1", "beta", 1),
            key("b2", "beta", 3), key("c", "gamma", 0.5)]
    assert tenant_weights(keys) == {"acme": 2.0, "gamma": 0.5}  # beta's keys disagree


def test_text_csv_json_and_html() -> None:
    rows = [*tenant_rows(), of("<b>evil</b>", "e1", "small", tokens=(1, 0))]
    report = build_report(rows, weights=WEIGHTS)
    text = render_text(report)
    assert "big  Jain's fairness index 1.000 over 2 tenants (tokens / weight)" in text
    # small: 21^2 / (2 * (20^2 + 1^2)), gamma's weight unknown
    assert ("small  Jain's fairness index 0.550 over 2 tenants (tokens; weights not all "
            "known)") in text
    acme = next(line for line in text.splitlines() if line.strip().startswith("acme"))
    assert acme.split()[1:] == ["2", "3", "400", "57.1%", "50.0", "95.0", "1"]
    assert max(len(line) for line in text.splitlines()) <= 100

    lines = list(csv.DictReader(io.StringIO(render_csv(report))))
    tenants = {(r["backend"], r["tenant"]): r for r in lines if r["scope"] == "tenant"}
    assert set(tenants) == {("big", "acme"), ("big", "beta"), ("big", "(none)"),
                            ("small", "gamma"), ("small", "<b>evil</b>")}
    acme_line = tenants[("big", "acme")]
    assert (acme_line["tokens"], acme_line["weight"], acme_line["requests"]) == (
        "400", "2.0", "3")
    assert float(acme_line["token_share"]) == pytest.approx(400 / 700)
    assert (float(acme_line["jain"]), acme_line["jain_weighted"]) == (1.0, "True")
    assert all(r["tenant"] == "" for r in lines if r["scope"] != "tenant")

    assert orjson.loads(render_json(report))["tenants"] == orjson.loads(
        orjson.dumps(report["tenants"]))

    page = render_html(report)
    assert "Tenants per backend" in page and "<td>acme</td>" in page
    assert "&lt;b&gt;evil&lt;/b&gt;" in page and "<b>evil</b>" not in page
