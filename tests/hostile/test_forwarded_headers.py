"""Headers to the engine come from an allow-list: the gateway's own (Content-Type,
Accept-Encoding, X-Request-Id, the backend's key), a short list of safe client headers
(plus `server.forward_headers`), and `Forwarded` / `X-Forwarded-*` written from the TCP
peer. A client's own client-address headers are kept only from `server.trusted_proxies`;
`x-slotgate-*`, credentials of any spelling and unknown headers never reach an engine."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from router.common.config_error import ConfigError
from router.config import config_from_dict
from tests.hostile.conftest import Recorder
from tests.support import StartGateway, assert_idle

HOSTILE = {
    "Forwarded": "for=6.6.6.6;proto=https", "X-Forwarded-For": "6.6.6.6",
    "X-Forwarded-Proto": "https", "X-Forwarded-Host": "admin.internal",
    "X-Real-IP": "6.6.6.6", "X-Slotgate-Queue-Events": "true", "X-Slotgate-Arm": "b",
    "X-Goog-Api-Key": "goog-secret", "Anthropic-Api-Key": "anth-secret",
    "X-Auth-Token": "tok-secret", "Cookie": "session=1", "Api-Key": "azure-secret",
    "Idempotency-Key": "k1", "OpenAI-Organization": "org-1", "X-Custom": "custom",
    "Content-Encoding": "identity",
    "Traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "Tracestate": "vendor=1", "Baggage": "tenant=acme", "OpenAI-Beta": "assistants=v2",
    "User-Agent": "hostile/1.0", "Accept": "application/json",
}
ALLOWED = {"traceparent", "tracestate", "baggage", "openai-beta", "user-agent", "accept"}
GATEWAY_SET = {"host", "content-length", "content-type", "accept-encoding", "x-request-id",
               "forwarded", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"}


def config(url: str, **server: Any) -> dict[str, Any]:
    backend = {"url": url + "/v1", "model": "m", "slots": 2}
    return {"server": server, "backends": {"big": backend},
            "routes": {"chat": {"primary": "big"}}}


async def send(gw: Any, headers: dict[str, str]) -> None:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as http, http.post(
            gw.url + "/v1/chat/completions", json=body, headers=headers) as reply:
        assert reply.status == 200, await reply.text()
        await reply.read()


async def test_only_the_allow_list_and_the_gateways_own_reach_the_engine(
    start: StartGateway, recorder: tuple[Recorder, str]
) -> None:
    rec, url = recorder
    gw = await start(config(url))
    await send(gw, HOSTILE)
    seen = rec.last_headers
    names = {k.lower() for k in seen}
    assert names - GATEWAY_SET == ALLOWED
    for secret in ("goog-secret", "anth-secret", "tok-secret", "azure-secret", "6.6.6.6",
                   "admin.internal", "org-1", "custom", "session=1"):
        assert not any(secret in v for v in seen.values()), secret
    assert not any(k.lower().startswith("x-slotgate-") for k in seen)
    assert "Content-Encoding" not in seen
    # The client's address as the gateway saw it, from the connection.
    port = gw.url.rsplit(":", 1)[1]
    assert seen.getall("X-Forwarded-For") == ["127.0.0.1"]
    assert seen.getall("X-Forwarded-Proto") == ["http"]
    assert seen.getall("X-Forwarded-Host") == [f"127.0.0.1:{port}"]
    assert seen.getall("Forwarded") == [f'for=127.0.0.1;proto=http;host="127.0.0.1:{port}"']
    assert seen["Traceparent"] == HOSTILE["Traceparent"]
    assert seen["User-Agent"] == "hostile/1.0"
    await assert_idle(gw)


async def test_a_trusted_proxys_client_address_is_kept_and_appended(
    start: StartGateway, recorder: tuple[Recorder, str]
) -> None:
    rec, url = recorder
    gw = await start(config(url, trusted_proxies=["127.0.0.0/8", "::1"]))
    await send(gw, {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https",
                    "X-Forwarded-Host": "api.example.com",
                    "Forwarded": 'for=203.0.113.9;proto=https;host="api.example.com"'})
    seen = rec.last_headers
    assert seen.getall("X-Forwarded-For") == ["203.0.113.9, 127.0.0.1"]
    assert seen["X-Forwarded-Proto"] == "https"
    assert seen["X-Forwarded-Host"] == "api.example.com"
    assert seen["Forwarded"].startswith(
        'for=203.0.113.9;proto=https;host="api.example.com", for=127.0.0.1;proto=http')
    await assert_idle(gw)


async def test_an_untrusted_peer_cannot_claim_an_address(
    start: StartGateway, recorder: tuple[Recorder, str]
) -> None:
    rec, url = recorder
    gw = await start(config(url, trusted_proxies=["10.0.0.0/8"]))  # not loopback
    await send(gw, {"X-Forwarded-For": "10.9.9.9", "Forwarded": "for=10.9.9.9"})
    seen = rec.last_headers
    assert seen.getall("X-Forwarded-For") == ["127.0.0.1"]
    assert seen["Forwarded"].startswith("for=127.0.0.1;")
    await assert_idle(gw)


async def test_the_operator_extends_the_allow_list(
    start: StartGateway, recorder: tuple[Recorder, str]
) -> None:
    rec, url = recorder
    gw = await start(config(url, forward_headers=["X-Custom", "X-Tenant-Region"]))
    await send(gw, {"X-Custom": "custom", "X-Tenant-Region": "eu", "X-Other": "no"})
    seen = rec.last_headers
    assert seen["X-Custom"] == "custom" and seen["X-Tenant-Region"] == "eu"
    assert "X-Other" not in seen
    await assert_idle(gw)


@pytest.mark.parametrize("server", [
    {"forward_headers": ["Authorization"]}, {"forward_headers": ["cookie"]},
    {"forward_headers": ["X-Slotgate-Backend"]}, {"forward_headers": ["Connection"]},
    {"forward_headers": ["X-Forwarded-For"]}, {"forward_headers": ["X-Goog-Api-Key"]},
    {"forward_headers": ["X-Auth-Token"]}, {"forward_headers": ["bad name"]},
    {"forward_headers": ["x-a"] * 65}, {"trusted_proxies": ["10.0.0.0/33"]},
    {"trusted_proxies": ["proxy.internal"]},
])
def test_unsafe_forwarding_settings_are_refused(server: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        config_from_dict(config("http://engine:8000", **server))
