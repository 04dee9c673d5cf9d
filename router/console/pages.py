"""The browser side: the queue page, the dashboard and the dashboard's live SSE feed.

Static files come only from router/console/web (a list taken at startup: no path traversal).
They carry no data (no route, backend or model name), so they load without a key: a
person enters one in the page. The data they show comes from endpoints that need the key
when auth is on (`/v1/models`; the feed unless `auth.public` names `pages`).
The feed reads pool snapshots, recent records and the fleet's desired replica counts; it
never changes gateway state.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiohttp import web

from policies.config import Public
from policies.scheduler.admission import RejectReason
from router.common.errors import not_found
from router.common.sse import SSE_HEADERS
from router.console.shares import tenant_shares
from router.fleet.signals import FleetSignals
from router.gateway import GATEWAY, Gateway

WEB_DIR = Path(__file__).with_name("web")
MAX_SUBSCRIBERS = 100  # dashboards connected at once; the next one gets 503
SUBSCRIBER_RETRY_S = 10.0  # a dashboard's Retry-After when there is no room (then clamped)
COALESCE_S = 0.2  # at most one pools event per subscriber in this window
HEARTBEAT_S = 15.0  # a comment line keeps idle proxies from closing the stream
WINDOW_S = 60.0  # 429s and fallbacks are counted over this last stretch of time

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # no inline script or style, nothing from another origin (no CDN, no fonts)
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
}


@dataclass
class Pages:
    """The served files and the connected dashboards (one wake-up event each)."""

    files: dict[str, Path]
    max_subscribers: int = MAX_SUBSCRIBERS
    subscribers: set[asyncio.Event] = field(default_factory=set)
    closing: bool = False
    _moved: asyncio.Event = field(default_factory=asyncio.Event)

    def join(self, wake: asyncio.Event) -> None:
        self.subscribers.add(wake)
        self._notify()

    def leave(self, wake: asyncio.Event) -> None:
        self.subscribers.discard(wake)
        self._notify()

    async def wait_subscribers(self, count: int, within_s: float = 10.0) -> None:
        """Until exactly `count` dashboards are connected (for tests: no polling)."""
        async with asyncio.timeout(within_s):
            while len(self.subscribers) != count:
                await self._moved.wait()

    def _notify(self) -> None:
        self._moved.set()
        self._moved = asyncio.Event()


PAGES = web.AppKey("pages", Pages)


def setup(app: web.Application) -> None:
    """Add `/`, `/dashboard`, `/dashboard/events` and `/static/{name}` to the app."""
    files = {p.name: p for p in sorted(WEB_DIR.iterdir())
             if p.is_file() and p.suffix in _TYPES}
    app[PAGES] = Pages(files)
    app.router.add_get("/", _index)
    app.router.add_get("/dashboard", _dashboard)
    app.router.add_get("/dashboard/events", _events, allow_head=False)
    app.router.add_get("/static/{name}", _static)
    app.on_shutdown.append(_close_feeds)


async def _index(request: web.Request) -> web.StreamResponse:
    return _file(request, "index.html")


async def _dashboard(request: web.Request) -> web.StreamResponse:
    return _file(request, "dashboard.html")


async def _static(request: web.Request) -> web.StreamResponse:
    return _file(request, request.match_info["name"])


def _file(request: web.Request, name: str) -> web.StreamResponse:
    path = request.app[PAGES].files.get(name)  # only names listed at startup: no "..", no "/"
    if path is None:
        return not_found(request)
    return web.FileResponse(path, headers={**_HEADERS, "Content-Type": _TYPES[path.suffix]})


async def _events(request: web.Request) -> web.StreamResponse:
    """`event: pools` at once, then after every change (coalesced), plus a heartbeat."""
    gw, pages = request.app[GATEWAY], request.app[PAGES]
    if (refused := gw.guard(request, Public.PAGES)) is not None:
        return refused
    seen = gw.keyring.tenants_seen(request, Public.PAGES)  # whose rows this feed shows
    if len(pages.subscribers) >= pages.max_subscribers or pages.closing:
        return gw.refuse(RejectReason.SUBSCRIBERS, SUBSCRIBER_RETRY_S).response()
    wake = asyncio.Event()
    unwatch: list[Callable[[], None]] = []
    pages.join(wake)
    loop = asyncio.get_running_loop()
    response = web.StreamResponse(headers=SSE_HEADERS)
    looks = asyncio.create_task(follow_looks(gw.fleet, wake), name="feed-looks")
    try:
        unwatch.extend(b.pool.watch(lambda _pool: wake.set()) for b in gw.backends.values())
        await response.prepare(request)
        await response.write(pools_event(gw, seen))
        sent_at = loop.time()
        while not pages.closing:
            try:
                async with asyncio.timeout(HEARTBEAT_S):
                    await wake.wait()
            except TimeoutError:
                await response.write(b": heartbeat\n\n")
                continue
            delay = sent_at + COALESCE_S - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # a burst of changes becomes one event
            if pages.closing:
                break
            wake.clear()
            await response.write(pools_event(gw, seen))
            sent_at = loop.time()
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
    except ConnectionResetError:
        pass  # the dashboard went away; its handler ends here
    finally:
        looks.cancel()
        for stop in unwatch:
            stop()
        pages.leave(wake)
    return response


async def _close_feeds(app: web.Application) -> None:
    """On shutdown, end every dashboard stream so the server need not wait for them."""
    pages = app[PAGES]
    pages.closing = True
    for wake in pages.subscribers:
        wake.set()


def pools_event(gw: Gateway, tenant: str | None = None) -> bytes:
    return b"event: pools\ndata: " + orjson.dumps(pool_rows(gw, tenant=tenant)) + b"\n\n"


def pool_rows(gw: Gateway, now: float | None = None, tenant: str | None = None
              ) -> list[dict[str, object]]:
    """One row per pool: slots, queue, next-slot ETA, 429s and fallbacks in the last minute,
    and its replicas' slots; with keys configured, a pool with a queue has its tenants'
    tokens served in the last minute and their waiting requests (with `tenant`, only that
    tenant's row: "" for none)."""
    now = time.perf_counter() if now is None else now
    rejected, fallback = _recent_counts(gw, now)
    snaps = {name: backend.pool.snapshot() for name, backend in gw.backends.items()}
    busy = {name: gw.backends[name].pool for name, snap in snaps.items() if snap.queued}
    shares = (tenant_shares(gw.recent, busy, gw.metrics.tenant_label, now - WINDOW_S)
              if busy and gw.config.auth.keys and tenant != "" else {})
    if tenant:
        label = gw.metrics.tenant_label(tenant)
        shares = {name: [row for row in rows if row["tenant"] == label]
                  for name, rows in shares.items()}
    rows: list[dict[str, object]] = []
    for name, backend in gw.backends.items():
        pool = backend.pool
        snap = snaps[name]
        full = snap.active >= snap.capacity
        rows.append({
            "name": name,
            "model": backend.config.model,
            "capacity": snap.capacity,
            "active": snap.active,
            "queued": snap.queued,
            "queue_limit": snap.queue_limit,
            "mean_hold_s": round(snap.mean_hold_s, 3),
            # when the next slot frees, from the ages of the running requests
            "eta_s": round(pool.forecast(1), 3) if full else 0.0,
            "rejected_1m": rejected.get(name, 0),
            "fallback_1m": fallback.get(name, 0),
            # each replica of its group (one for a plain backend)
            "replicas": [{"name": s.name, "slots": s.slots, "active": s.active,
                          "healthy": s.healthy} for s in pool.seats()],
            "tenants": shares.get(name, []),
            **replica_counts(gw, name),
        })
    return rows


def replica_counts(gw: Gateway, name: str) -> dict[str, int]:
    """A backend's replicas `ready` (in service and healthy) and `draining` (taken out by a
    reload or a drain, still holding requests, or drained and not listed again by a
    reload), and, when it has `scaling`, the `desired` count of the fleet's latest look."""
    backend = gw.backends[name]
    seats = {s.name: s for s in backend.pool.seats()}
    ready = draining = 0
    for replica_name, replica in backend.replicas.items():
        seat = seats.get(replica_name)
        if not replica.retired:
            ready += seat is not None and seat.healthy
        elif (seat is not None and seat.active > 0) or replica_name in backend.drained:
            draining += 1
    counts = {"ready": ready, "draining": draining}
    reading = gw.fleet.readings.get(name) if gw.fleet is not None else None
    if reading is not None and backend.config.scaling is not None:
        counts["desired"] = reading.desired
    return counts


async def follow_looks(fleet: FleetSignals | None, wake: asyncio.Event) -> None:
    """Wake a feed after each look of the fleet that moved a desired count (the pools'
    own changes wake it through their watchers)."""
    if fleet is None:
        return
    shown = {name: r.desired for name, r in fleet.readings.items()}
    while True:
        await fleet.looked.wait()  # a fresh event after each look
        now = {name: r.desired for name, r in fleet.readings.items()}
        if now != shown:
            shown = now
            wake.set()


def _recent_counts(gw: Gateway, now: float) -> tuple[dict[str, int], dict[str, int]]:
    """429s per pool the route would have used, fallbacks per pool that took the request."""
    rejected: dict[str, int] = {}
    fallback: dict[str, int] = {}
    since = now - WINDOW_S
    for rec in reversed(gw.recent):  # appended as requests end: newest last
        if rec.started_at + rec.total_ms / 1000 < since:
            break
        if rec.status == 429:
            route = gw.config.routes.get(rec.route or "")
            pool = rec.backend or (route.primary if route is not None else None)
            if pool is not None:
                rejected[pool] = rejected.get(pool, 0) + 1
        elif rec.reason is not None and rec.reason.startswith("fallback:") and rec.backend:
            fallback[rec.backend] = fallback.get(rec.backend, 0) + 1
    return rejected, fallback
