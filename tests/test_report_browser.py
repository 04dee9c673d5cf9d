"""The HTML cost report in a real headless Chromium: it opens offline and its charts render.

Every request other than the page file itself is aborted and recorded; none may be made.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from router.report.build import build_report
from router.report.render import render_html
from tests.support import hand_ledger

if TYPE_CHECKING:
    from playwright.async_api import Browser, Request, Route


async def test_html_report_renders_offline(browser: Browser, tmp_path: Path) -> None:
    report = build_report(hand_ledger(), currency="EUR", buckets=4, resamples=200)
    page_file = tmp_path / "report.html"
    page_file.write_text(render_html(report), encoding="utf-8")
    url = page_file.as_uri()

    context = await browser.new_context(viewport={"width": 1000, "height": 800})
    attempted: list[str] = []
    errors: list[str] = []

    async def only_the_file(route: Route) -> None:
        if route.request.url == url:
            await route.continue_()
        else:
            attempted.append(route.request.url)
            await route.abort()

    await context.route("**/*", only_the_file)
    page = await context.new_page()

    def record(request: Request) -> None:
        if request.url != url:
            attempted.append(request.url)

    page.on("request", record)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.set_default_timeout(10_000)
    await page.goto(url, wait_until="load")

    charts = page.locator("svg.chart")
    assert await charts.count() == 3
    for i in range(3):
        chart = charts.nth(i)
        assert await chart.get_attribute("aria-label")
        assert await chart.locator("title").count() >= 1
        box = await chart.bounding_box()
        assert box is not None and box["width"] > 0 and box["height"] > 0
        marks = chart.locator(".mark")
        assert await marks.count() > 0
        sizes = []
        for j in range(await marks.count()):
            mark_box = await marks.nth(j).bounding_box()
            assert mark_box is not None
            sizes.append((mark_box["width"], mark_box["height"]))
        assert all(w > 0 or h > 0 for w, h in sizes), sizes  # a flat line has no height
        assert any(w > 0 and h > 0 for w, h in sizes), sizes

    # the bars: two per arm, the cost and its all-primary counterfactual
    assert await charts.nth(0).locator("rect.mark").count() == 6

    text = await page.inner_text("body")
    for name in ("off", "on", "(none)"):
        assert name in text
    for total in ("0.6000", "0.3800", "0.0200", "1.0000"):  # off, on, (none), all arms
        assert total in text
    assert "EUR" in text
    # nothing that could reach out, even where a Content-Security-Policy would have blocked it
    assert await page.locator("script, link, iframe, [src], [href]").count() == 0
    assert attempted == []
    assert errors == []
    await context.close()
