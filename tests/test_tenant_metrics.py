"""Each tenant's served tokens and queue wait per backend in /metrics: the configured
keys' tenants, anything else `other`, nothing without keys; a reload changes the set."""

from __future__ import annotations

import asyncio

from router.config import config_from_dict
from router.reload import apply
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
    wait_pools,
)
from tests.support.scrape import scrape, value
from tests.support.tenants import KEYS, with_tenants

TOKENS = "slotgate_tenant_tokens_total"
WAITS = "slotgate_tenant_queue_wait_seconds"


async def test_two_tenants_tokens_and_waits(start: StartGateway, sdk: SdkClients) -> None:
    gw = await start(with_tenants(gateway_config(sim_backend("m", slots=1, queue_limit=4))))
    before = await scrape(gw)
    for tenant in ("acme", "beta", "other"):  # every configured tenant from the start
        assert (TOKENS, (("backend", "big"), ("tenant", tenant))) in before
    sim = engine(gw)
    sim.hold()
    acme, beta = sdk(gw, api_key=KEYS["acme"]), sdk(gw, api_key=KEYS["beta"])
    first = asyncio.create_task(acme.chat.completions.create(model="chat", messages=MESSAGES))
    await wait_pools(gw, lambda s: s["big"] == (1, 0))  # acme's runs at once
    waiting = [asyncio.create_task(c.chat.completions.create(model="chat", messages=MESSAGES))
               for c in (beta, beta, acme)]
    await wait_pools(gw, lambda s: s["big"] == (1, 3))
    sim.release()
    answers = await asyncio.gather(first, *waiting)
    await assert_idle(gw)

    after = await scrape(gw)
    served = {"acme": 0, "beta": 0}
    for answer, tenant in zip(answers, ("acme", "beta", "beta", "acme"), strict=True):
        assert answer.usage is not None
        served[tenant] += answer.usage.prompt_tokens + answer.usage.completion_tokens
    for tenant, tokens in served.items():
        assert value(after, TOKENS, backend="big", tenant=tenant) == tokens > 0
        assert value(after, WAITS + "_count", backend="big", tenant=tenant) == 2
    assert value(after, TOKENS, backend="big", tenant="other") == 0
    waited = {r.tenant: r.queue_wait_ms for r in gw.gateway.recent if r.queue_wait_ms}
    assert set(waited) == {"acme", "beta"}  # acme's first ran at once: observed as 0 s
    assert value(after, WAITS + "_bucket", backend="big", tenant="acme", le="0.01") >= 1
    recs = list(gw.gateway.recent)
    for tenant in ("acme", "beta"):
        expected = sum(r.queue_wait_ms for r in recs if r.tenant == tenant) / 1000
        assert abs(value(after, WAITS + "_sum", backend="big", tenant=tenant)
                   - expected) < 1e-9


async def test_a_tenant_of_no_configured_key_is_other(
    start: StartGateway, sdk: SdkClients
) -> None:
    """Auth off, keys listed: a request's tenant is a hash of its key, never a label."""
    gw = await start(with_tenants(gateway_config(sim_backend("m", slots=2)), enabled=False))
    for key in (KEYS["acme"], "sk-stranger"):
        answer = await sdk(gw, api_key=key).chat.completions.create(model="chat",
                                                                    messages=MESSAGES)
        assert answer.usage is not None
    await assert_idle(gw)
    samples = await scrape(gw)
    tenants = {dict(labels)["tenant"] for name, labels in samples if name == TOKENS}
    assert tenants == {"other"}
    assert value(samples, WAITS + "_count", backend="big", tenant="other") == 2
    assert value(samples, TOKENS, backend="big", tenant="other") == sum(
        (r.prompt_tokens or 0) + (r.completion_tokens or 0) for r in gw.gateway.recent)


async def test_no_keys_no_tenant_series(start: StartGateway, sdk: SdkClients) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=2)))
    await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
    await assert_idle(gw)
    samples = await scrape(gw)
    assert not [name for name, _ in samples if name.startswith("slotgate_tenant_")]


async def test_a_reload_changes_the_tenants(start: StartGateway, sdk: SdkClients) -> None:
    raw = with_tenants(gateway_config(sim_backend("m", slots=2)))
    gw = await start(raw)
    await sdk(gw, api_key=KEYS["beta"]).chat.completions.create(model="chat",
                                                                messages=MESSAGES)
    kept = raw["auth"]["keys"][0]  # acme's key stays; beta's goes, gamma comes
    raw["auth"]["keys"] = [kept, {**kept, "id": "gamma-key", "tenant": "gamma",
                                  "sha256": "0" * 64}]
    assert "auth changed" in await apply(gw.gateway, config_from_dict(raw))
    await sdk(gw, api_key=KEYS["acme"]).chat.completions.create(model="chat",
                                                                messages=MESSAGES)
    await assert_idle(gw)
    samples = await scrape(gw)
    assert value(samples, TOKENS, backend="big", tenant="beta") > 0  # its count is kept
    assert value(samples, TOKENS, backend="big", tenant="acme") > 0
    assert (TOKENS, (("backend", "big"), ("tenant", "gamma"))) in samples  # its zero
    assert value(samples, WAITS + "_count", backend="big", tenant="other") == 0
