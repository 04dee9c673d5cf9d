"""The queue page and the dashboard in a real headless Chromium (Debian's, driven by Playwright).

Waits are DOM conditions (`wait_for_function`) and pool states (`wait_pools`), never sleeps.
Screenshots go to pytest's tmp_path, and to docs/ when SLOTGATE_SCREENSHOTS=1.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai
import pytest

from router.app import RunningGateway
from router.common.record import Phase
from router.upstream.simulated.engine import FaultMode
from tests.support import (
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    sim_backend,
    wait_pools,
)

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

DOCS = Path(__file__).resolve().parent.parent / "docs"
VIEWPORT = {"width": 900, "height": 760}




def keep_screenshot(path: Path) -> None:
    """Screenshots are test artifacts; SLOTGATE_SCREENSHOTS=1 also refreshes docs/."""
    assert path.stat().st_size > 0
    if os.environ.get("SLOTGATE_SCREENSHOTS") == "1":
        shutil.copyfile(path, DOCS / path.name)


async def open_page(browser: Browser, gw: RunningGateway) -> Page:
    page = await browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.set_default_timeout(10_000)
    await page.goto(gw.url + "/")
    await page.wait_for_function(
        "() => document.getElementById('model').value === 'llama-70b'")
    assert errors == []
    return page


async def submit(page: Page, prompt: str) -> None:
    await page.get_by_label("Prompt").fill(prompt)
    await page.get_by_role("button", name="Send").click()


def two_models(primary: dict[str, Any], fallback: dict[str, Any]) -> dict[str, Any]:
    """The README's shape: a 70B primary that overflows to an 8B fallback, one public name."""
    return {"backends": {"llama-70b": primary, "llama-8b": fallback},
            "routes": {"llama-70b": {"primary": "llama-70b", "fallbacks": ["llama-8b"],
                                     "overflow": "fallback"}}}


def primary_is(active: int, queued: int) -> Callable[[dict[str, tuple[int, int]]], bool]:
    return lambda state: state["llama-70b"] == (active, queued)


def answer(max_tokens: int) -> dict[str, Any]:
    return {"model": "llama-70b", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "keep a slot busy"}]}


async def test_queue_panel_counts_down_then_streams_the_answer(
    sdk: SdkClients, start: StartGateway, browser: Browser, tmp_path: Path
) -> None:
    # ~20 tokens/s: a request of n tokens holds its slot for about (n - 1) / 20 s
    timed = {"ttft_s": 0, "tokens_per_s": 20, "output_tokens": 20}
    gw = await start(two_models(
        sim_backend("meta-llama/Llama-3.1-70B-Instruct", slots=3, queue_limit=5, sim=timed),
        sim_backend("meta-llama/Llama-3.1-8B-Instruct", slots=8),
    ))
    sim = engine(gw, "llama-70b")
    sim.hold()  # nothing drains until the page is in line
    client = sdk(gw)
    background: list[asyncio.Task[Any]] = []
    # three busy slots that end one after another, then three queued requests ahead of us
    for tokens in (6, 14, 22, 30, 30, 30):
        background.append(asyncio.create_task(client.chat.completions.create(**answer(tokens))))
        n = len(background)
        await wait_pools(gw, primary_is(min(n, 3), max(0, n - 3)))

    page = await open_page(browser, gw)
    await page.evaluate("""() => {
        window.seen = [];  // every position and bar width the page showed, in order
        const pos = document.getElementById('queue-position');
        const bar = document.getElementById('queue-bar');
        const note = () => window.seen.push([pos.textContent, parseFloat(bar.style.width) || 0]);
        new MutationObserver(note).observe(pos, {childList: true, characterData: true,
                                                 subtree: true});
    }""")
    await submit(page, "How do slot pools work?")
    await wait_pools(gw, lambda s: s["llama-70b"] == (3, 4))
    await page.wait_for_function("""() => {
        const q = document.getElementById('queue');
        return !q.hidden && document.getElementById('queue-position').textContent === '4';
    }""")
    panel = page.locator("#queue")
    assert await panel.get_attribute("aria-labelledby") == "queue-title"
    assert await page.locator("#queue-live").get_attribute("aria-live") == "polite"
    assert await page.text_content("#queue-ahead") == "3"
    assert "queue: llama-70b" in (await page.text_content("#queue-pool") or "")
    # the ETA comes from the gateway's queue_status event and counts down between events
    await page.wait_for_function(
        "() => /^about \\d|any moment/.test(document.getElementById('queue-eta').textContent)")
    width_at_4 = await page.evaluate(
        "parseFloat(document.getElementById('queue-bar').style.width) || 0")
    shot = tmp_path / "queue-panel.png"
    await page.screenshot(path=str(shot), full_page=True)
    keep_screenshot(shot)

    sim.release()  # the busy slots end ~0.4 s apart: the page moves up 4 -> 3 -> 2 -> 1
    await page.wait_for_function(
        """(w0) => {
            const p = Number(document.getElementById('queue-position').textContent);
            const w = parseFloat(document.getElementById('queue-bar').style.width) || 0;
            return p <= 2 && w > w0;
        }""", arg=width_at_4)
    await page.wait_for_function(
        "() => document.getElementById('status').textContent.startsWith('Done')")

    seen = await page.evaluate("window.seen")
    positions = [int(p) for p, _ in seen if p.isdigit()]
    widths = [w for _, w in seen]
    assert positions[0] == 4 and positions == sorted(positions, reverse=True), seen
    assert min(positions) <= 2
    assert widths == sorted(widths), seen  # the bar only ever grows
    assert await page.is_hidden("#queue")
    text = await page.text_content("#answer") or ""
    assert text.startswith("the quick brown fox") and len(text.split()) == 20
    assert await page.text_content(".backend") == "llama-70b"
    assert await page.text_content(".reason") == "primary"
    assert "in the queue" in (await page.text_content("#route") or "")
    assert await page.is_hidden("#error")
    await page.close()
    await asyncio.gather(*background)
    await assert_idle(gw)


async def test_cancel_leaves_the_queue_and_the_dashboard_shows_busy_slots(
    sdk: SdkClients, start: StartGateway, browser: Browser, tmp_path: Path
) -> None:
    gw = await start(two_models(
        sim_backend("meta-llama/Llama-3.1-70B-Instruct", slots=3, queue_limit=2),
        sim_backend("meta-llama/Llama-3.1-8B-Instruct", slots=2),
    ))
    big, small = engine(gw, "llama-70b"), engine(gw, "llama-8b")
    big.hold()
    small.hold()
    client = sdk(gw)
    busy = []
    for n in range(1, 5):  # three running, one waiting
        busy.append(asyncio.create_task(client.chat.completions.create(**answer(8))))
        await wait_pools(gw, primary_is(min(n, 3), max(0, n - 3)))

    page = await open_page(browser, gw)
    await submit(page, "Please wait in line for me")
    await wait_pools(gw, lambda s: s["llama-70b"] == (3, 2))  # the page's ticket: queue now full
    await page.wait_for_function("""() => !document.getElementById('queue').hidden &&
        document.getElementById('queue-position').textContent === '2'""")

    # the queue is full: two overflow to the small model, the next one is refused
    overflow = [asyncio.create_task(client.chat.completions.create(**answer(8)))
                for _ in range(2)]
    await wait_pools(gw, lambda s: s["llama-8b"] == (2, 0))
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(**answer(8))
    small.release()
    await asyncio.gather(*overflow)

    dash = await browser.new_page(viewport={"width": 1100, "height": 620})
    await dash.goto(gw.url + "/dashboard")
    await dash.wait_for_function("""() => {
        const card = document.querySelector('[data-pool="llama-70b"]');
        if (!card) return false;
        const t = card.textContent;
        return t.includes('3 / 3') && t.includes('2 / 2') &&
            document.getElementById('total-rejected').textContent === '1' &&
            document.getElementById('total-fallback').textContent === '2';
    }""")
    assert await dash.locator('[data-pool="llama-70b"] .slot.busy').count() == 3
    assert await dash.locator('[data-pool="llama-8b"] .slot.busy').count() == 0
    shot = tmp_path / "dashboard.png"
    await dash.screenshot(path=str(shot), full_page=True)
    keep_screenshot(shot)

    await page.get_by_role("button", name="Cancel").click()
    await wait_pools(gw, lambda s: s["llama-70b"] == (3, 1))  # the page's ticket left at once
    await page.wait_for_function(
        "() => document.getElementById('status').textContent.startsWith('Cancelled')")
    assert await page.is_hidden("#queue")
    assert await page.is_enabled("#send")
    assert await page.is_hidden("#error")
    # the dashboard follows the pool on its own
    await dash.wait_for_function("""() =>
        document.querySelector('[data-pool="llama-70b"]').textContent.includes('1 / 2')""")

    big.release()
    await asyncio.gather(*busy)
    await dash.wait_for_function(
        "() => document.getElementById('total-busy').textContent === '0 / 5'")
    await dash.close()
    await page.close()
    gone = [r for r in gw.gateway.recent if r.disconnect is not None]
    assert [r.disconnect for r in gone] == [Phase.QUEUED]  # the page's request, and only it
    await assert_idle(gw)


async def test_the_dashboard_draws_a_groups_replicas(
    sdk: SdkClients, start: StartGateway, browser: Browser
) -> None:
    fast = {"ttft_s": 0, "tokens_per_s": 0, "output_tokens": 8, "max_num_seqs": 8}
    gw = await start(two_models(
        {"model": "m", "pick": "least_loaded", "endpoints": [{"simulated": fast, "slots": 2},
                                                             {"simulated": fast, "slots": 1}]},
        sim_backend("meta-llama/Llama-3.1-8B-Instruct", slots=2)))
    engines = [engine(gw, "llama-70b", name) for name in ("llama-70b-0", "llama-70b-1")]
    for sim in engines:
        sim.hold()
    client = sdk(gw)
    busy = [asyncio.create_task(client.chat.completions.create(**answer(4))) for _ in range(3)]
    await wait_pools(gw, primary_is(3, 0))
    dash = await browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
    await dash.goto(gw.url + "/dashboard")
    await dash.wait_for_function("""() => {
        const rows = document.querySelectorAll('[data-pool="llama-70b"] .replica');
        return rows.length === 2 &&
            rows[0].dataset.replica === 'llama-70b-0' && rows[0].textContent.includes('2 / 2') &&
            rows[1].dataset.replica === 'llama-70b-1' && rows[1].textContent.includes('1 / 1');
    }""")
    assert await dash.locator('[data-pool="llama-70b"] .replica [role="meter"]').count() == 2
    assert await dash.locator('[data-pool="llama-8b"] .replica').count() == 0  # a group of one
    gw.gateway.backends["llama-70b"].pool.set_healthy("llama-70b-1", False)
    await dash.wait_for_function("""() => document.querySelector(
        '[data-replica="llama-70b-1"]').classList.contains('down')""")
    gw.gateway.backends["llama-70b"].pool.set_healthy("llama-70b-1", True)
    for sim in engines:
        sim.release()
    await asyncio.gather(*busy)
    await dash.wait_for_function("""() => [...document.querySelectorAll(
        '[data-pool="llama-70b"] .replica')].every((r) => r.textContent.includes('0 / '))""")
    await dash.close()
    await assert_idle(gw)


async def test_errors_are_shown_as_text(
    sdk: SdkClients, start: StartGateway, browser: Browser
) -> None:
    gw = await start(two_models(
        sim_backend("meta-llama/Llama-3.1-70B-Instruct", slots=1),
        sim_backend("meta-llama/Llama-3.1-8B-Instruct", slots=1),
    ))
    big, small = engine(gw, "llama-70b"), engine(gw, "llama-8b")
    page = await open_page(browser, gw)

    # a dropped upstream mid-stream: the partial answer stays, the in-band error is text
    big.inject_fault(FaultMode.DROP)
    await submit(page, "<img src=x onerror=alert(1)>")
    await page.wait_for_function("() => !document.getElementById('error').hidden")
    assert await page.text_content("#answer") == "the "
    assert await page.locator("#error *").count() == 0  # text, never markup
    assert await page.locator("#answer *").count() == 0
    await wait_pools(gw, lambda s: s["llama-70b"] == (0, 0))

    # everything full: a plain 429 with Retry-After, rendered from its JSON message
    big.hold()
    small.hold()
    client = sdk(gw)
    busy = [asyncio.create_task(client.chat.completions.create(**answer(4))) for _ in range(2)]
    await wait_pools(gw, lambda s: s["llama-70b"] == (1, 0) and s["llama-8b"] == (1, 0))
    await submit(page, "anyone there?")
    await page.wait_for_function(
        "() => document.getElementById('error').textContent.includes('full')")
    message = await page.text_content("#error") or ""
    assert message.startswith("All slots and queues for this model are full")
    assert "Try again in" in message
    assert await page.is_enabled("#send")
    big.release()
    small.release()
    await asyncio.gather(*busy)
    await page.close()
    await assert_idle(gw)


async def test_sse_parser_handles_events_split_anywhere(
    start: StartGateway, browser: Browser
) -> None:
    gw = await start(two_models(sim_backend("a", slots=1), sim_backend("b", slots=1)))
    page = await open_page(browser, gw)
    stream = (": queue position=2 ahead=1 eta_s=3.0\r\n\r\n"
              'event: queue_status\r\ndata: {"position": 1, "ahead": 0}\r\n\r\n'
              'event: start\ndata: {"backend": "b",\ndata:  "reason": "x"}\n\n'
              'data: {"choices":[{"delta":{"content":"hé"}}]}\r\r'
              "data: [DONE]\n\n")
    results = await page.evaluate("""async (text) => {
        const { SSEParser } = await import('/static/sse.js');
        const out = [];
        for (let cut = 0; cut <= text.length; cut++) {
            for (let cut2 = cut; cut2 <= text.length; cut2 += 7) {
                const p = new SSEParser();
                const events = [...p.feed(text.slice(0, cut)), ...p.feed(text.slice(cut, cut2)),
                                ...p.feed(text.slice(cut2)), ...p.end()];
                out.push(JSON.stringify(events));
            }
        }
        return [...new Set(out)];
    }""", stream)
    assert len(results) == 1, results[:3]  # the same events wherever the reads were cut
    events = json.loads(results[0])
    assert [(e["event"], e["data"]) for e in events] == [
        ("message", ""),
        ("queue_status", '{"position": 1, "ahead": 0}'),
        ("start", '{"backend": "b",\n "reason": "x"}'),
        ("message", '{"choices":[{"delta":{"content":"hé"}}]}'),
        ("message", "[DONE]"),
    ]
    assert events[0]["comments"] == ["queue position=2 ahead=1 eta_s=3.0"]
    await page.close()
    await assert_idle(gw)
