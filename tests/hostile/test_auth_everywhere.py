"""With auth on, every endpoint but /healthz and /readyz needs a key; `auth.public` opens
exactly what it names; two Authorization headers are refused with 400; the page shells
load without a key but carry no data, and a person enters the key in the page."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import pytest

from policies.config import Public
from router.app import RunningGateway
from router.common.config_error import ConfigError
from router.config import config_from_dict
from router.console.pages import PAGES
from tests.hostile.keys import ADMIN_KEY, KEY, bearer, scrape, value, with_auth
from tests.support import StartGateway, assert_idle, sim_backend

if TYPE_CHECKING:
    from playwright.async_api import Browser, Request

# Names an unauthenticated caller must not learn: route, backend and upstream model id.
ROUTE, BACKEND, MODEL = "zebra-route", "okapi-backend", "org/quokka-model-7b"
CHAT = {"model": ROUTE, "messages": [{"role": "user", "content": "hi"}]}

# Each endpoint: method, path, JSON body, the key it needs, its status once past auth.
ENDPOINTS: list[tuple[str, str, Any, str, int]] = [
    ("POST", "/v1/chat/completions", CHAT, KEY, 200),
    ("POST", "/v1/completions", {"model": ROUTE, "prompt": "hi"}, KEY, 200),
    ("GET", "/v1/models", None, KEY, 200),
    ("GET", "/metrics", None, KEY, 200),
    ("GET", "/openapi.json", None, KEY, 200),
    ("GET", "/dashboard/events", None, KEY, 200),
    ("GET", "/admin/report", None, ADMIN_KEY, 200),
    ("POST", "/admin/reload", None, ADMIN_KEY, 400),  # the embedded config: not reloadable
    ("GET", "/no/such/path", None, KEY, 404),
    ("DELETE", "/v1/models", None, KEY, 405),
]
PUBLIC_PATHS = {Public.METRICS: "/metrics", Public.MODELS: "/v1/models",
                Public.OPENAPI: "/openapi.json", Public.PAGES: "/dashboard/events"}
SHELLS = ["/", "/dashboard", "/static/app.js", "/static/dashboard.js", "/static/key.js",
          "/static/sse.js", "/static/style.css"]


def config(tmp_path: Path | None = None, **auth: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "backends": {BACKEND: sim_backend(MODEL, slots=2)},
        "routes": {ROUTE: {"primary": BACKEND}},
    }
    if tmp_path is not None:
        raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite3")}
    return with_auth(raw, **auth)


async def call(http: aiohttp.ClientSession, gw: RunningGateway, method: str, path: str,
               body: Any, headers: dict[str, str]) -> tuple[int, bytes]:
    async with http.request(method, gw.url + path, json=body, headers=headers) as resp:
        if path == "/dashboard/events" and resp.status == 200:
            return resp.status, await resp.content.readuntil(b"\n\n")  # a stream: one event
        return resp.status, await resp.read()


async def test_every_endpoint_but_the_probes_needs_a_key(
    start: StartGateway, tmp_path: Path
) -> None:
    gw = await start(config(tmp_path))
    async with aiohttp.ClientSession() as http:
        for method, path, body, key, past_auth in ENDPOINTS:
            for headers in ({}, bearer("sk-wrong")):
                status, data = await call(http, gw, method, path, body, headers)
                assert status == 401, (method, path, status)
                error = orjson.loads(data)["error"]
                assert error["code"] == "invalid_api_key" and set(error) == {
                    "message", "type", "param", "code"}
                for name in (ROUTE, BACKEND, MODEL):
                    assert name.encode() not in data
            status, data = await call(http, gw, method, path, body, bearer(key))
            assert status == past_auth, (method, path, status, data[:200])
        for probe in ("/healthz", "/readyz"):
            async with http.get(gw.url + probe) as resp:
                assert resp.status == 200
        # the page shells and their files load without a key, and say nothing of the config
        for shell in SHELLS:
            async with http.get(gw.url + shell) as resp:
                assert resp.status == 200, shell
                data = await resp.read()
            for name in (ROUTE, BACKEND, MODEL):
                assert name.encode() not in data, (shell, name)
    samples = await scrape(gw)
    assert value(samples, "slotgate_auth_failures_total",
                 code="invalid_api_key") == 2 * len(ENDPOINTS)
    await assert_idle(gw)


@pytest.mark.parametrize("opened", list(Public))
async def test_auth_public_opens_exactly_what_it_names(
    start: StartGateway, opened: Public
) -> None:
    gw = await start(config(public=[opened.value]))
    async with aiohttp.ClientSession() as http:
        for what, path in PUBLIC_PATHS.items():
            status, _ = await call(http, gw, "GET", path, None, {})
            assert status == (200 if what is opened else 401), (opened, path)
        status, _ = await call(http, gw, "POST", "/v1/chat/completions", CHAT, {})
        assert status == 401  # the API itself is never public
    await assert_idle(gw)


def test_auth_public_is_a_closed_set() -> None:
    assert config_from_dict(config(public=["metrics", "pages"])).auth.public == {
        Public.METRICS, Public.PAGES}
    with pytest.raises(ConfigError, match="public"):
        config_from_dict(config(public=["admin"]))


async def raw_request(gw: RunningGateway, head: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request on its own connection, exactly as written; (status, body)."""
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.read()  # Connection: close: until EOF
    finally:
        writer.close()
    status = int(answer.split(b" ", 2)[1])
    return status, answer.partition(b"\r\n\r\n")[2]


async def test_two_authorization_headers_are_refused(start: StartGateway) -> None:
    gw = await start(config())
    chat = orjson.dumps(CHAT)
    for keys in ((KEY, KEY), (KEY, "sk-other"), ("sk-other", KEY)):
        auth = "".join(f"Authorization: Bearer {k}\n" for k in keys)
        for method, path, body in (("POST", "/v1/chat/completions", chat),
                                   ("GET", "/v1/models", b""), ("GET", "/metrics", b""),
                                   ("GET", "/dashboard/events", b""),
                                   ("GET", "/admin/report", b""), ("GET", "/nowhere", b"")):
            head = (f"{method} {path} HTTP/1.1\nHost: gw\nConnection: close\n{auth}"
                    f"Content-Type: application/json\nContent-Length: {len(body)}\n")
            status, data = await raw_request(gw, head, body)
            assert status == 400, (keys, path)
            error = orjson.loads(data)["error"]
            assert error["code"] == "duplicate_authorization"
            assert error["type"] == "invalid_request_error"
    samples = await scrape(gw)
    assert value(samples, "slotgate_auth_failures_total", code="duplicate_authorization") == 18
    await assert_idle(gw)


async def test_with_auth_off_everything_answers_as_before(start: StartGateway) -> None:
    raw = config()
    del raw["auth"]
    gw = await start(raw)
    async with aiohttp.ClientSession() as http:
        for method, path, body, _, _ in ENDPOINTS:
            status, _ = await call(http, gw, method, path, body, {})
            assert status == {"/admin/report": 404, "/admin/reload": 400, "/no/such/path": 404,
                              }.get(path, 405 if method == "DELETE" else 200), path
    await assert_idle(gw)


async def test_a_person_enters_the_key_in_the_chat_page(
    start: StartGateway, browser: Browser
) -> None:
    gw = await start(config())
    page = await browser.new_page()
    urls: list[str] = []
    authorized: list[str] = []

    def seen(request: Request) -> None:
        urls.append(request.url)
        if request.headers.get("authorization") == f"Bearer {KEY}":
            authorized.append(request.url.removeprefix(gw.url))

    page.on("request", seen)
    page.set_default_timeout(10_000)
    await page.goto(gw.url + "/")
    # without a key the page loads, but the model list is refused and the page says why
    await page.wait_for_function(
        "() => document.getElementById('error').textContent.includes('API key')")
    assert await page.locator("#model option").all_text_contents() == ["Enter an API key"]
    await page.get_by_label("API key").fill(KEY)
    await page.get_by_role("button", name="Use key").click()
    await page.wait_for_function(
        f"() => document.getElementById('model').value === {orjson.dumps(ROUTE).decode()}")
    assert await page.is_hidden("#error")
    await page.get_by_label("Prompt").fill("hello there")
    await page.get_by_role("button", name="Send").click()
    await page.wait_for_function(
        "() => document.getElementById('status').textContent.startsWith('Done')")
    assert (await page.text_content("#answer") or "").startswith("the quick brown fox")
    assert authorized == ["/v1/models", "/v1/chat/completions"]
    # kept in this tab's session only, and never in a URL
    assert await page.evaluate("sessionStorage.getItem('slotgate.key')") == KEY
    assert await page.evaluate(
        f"Object.values(localStorage).some(v => v.includes({orjson.dumps(KEY).decode()}))"
    ) is False
    assert not any(KEY in url for url in urls)
    await page.reload()  # the same tab keeps it
    await page.wait_for_function(
        f"() => document.getElementById('model').value === {orjson.dumps(ROUTE).decode()}")
    await page.get_by_role("button", name="Forget").click()
    assert await page.evaluate("sessionStorage.getItem('slotgate.key')") is None
    await page.close()
    await assert_idle(gw)


async def test_the_dashboard_feed_sends_the_key_as_a_header(
    start: StartGateway, browser: Browser
) -> None:
    gw = await start(config())
    page = await browser.new_page()
    feeds: list[Request] = []
    page.on("request", lambda r: feeds.append(r) if "/dashboard/events" in r.url else None)
    page.set_default_timeout(10_000)
    await page.goto(gw.url + "/dashboard")
    await page.wait_for_function(
        "() => document.getElementById('conn').textContent.includes('API key')")
    assert await page.locator(".pool").count() == 0  # no data without a key
    await page.get_by_label("API key").fill(KEY)
    await page.get_by_role("button", name="Use key").click()
    await page.wait_for_function(f"""() => {{
        const card = document.querySelector('[data-pool={orjson.dumps(BACKEND).decode()}]');
        return card !== null && card.textContent.includes('0 / 2') &&
            document.getElementById('conn').dataset.state === 'live';
    }}""")
    assert feeds[-1].headers.get("authorization") == f"Bearer {KEY}"
    assert all(KEY not in r.url for r in feeds)
    await page.close()
    await gw.app[PAGES].wait_subscribers(0)  # the feed's handler ended with the page
    await assert_idle(gw)


async def test_with_auth_off_the_pages_ask_for_no_key(
    start: StartGateway, browser: Browser
) -> None:
    raw = config()
    del raw["auth"]
    gw = await start(raw)
    page = await browser.new_page()
    page.set_default_timeout(10_000)
    await page.goto(gw.url + "/")
    await page.wait_for_function(
        f"() => document.getElementById('model').value === {orjson.dumps(ROUTE).decode()}")
    assert await page.is_hidden("#key-form")
    await page.goto(gw.url + "/dashboard")
    await page.wait_for_function("() => document.getElementById('conn').dataset.state === 'live'")
    assert await page.is_hidden("#key-form")
    await page.close()
    await gw.app[PAGES].wait_subscribers(0)
    await assert_idle(gw)
