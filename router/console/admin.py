"""Operator endpoints under /admin. `GET /admin/report` is `slotgate report --json`."""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp import web

from router.common.errors import ApiError
from router.fleet import drain
from router.gateway import GATEWAY
from router.ledger.base import RowFilter

_MAX_TEXT = 256


def setup(app: web.Application) -> None:
    app.router.add_get("/admin/report", report)
    app.router.add_post("/admin/reload", reload)
    app.router.add_get("/admin/scaling", scaling)
    app.router.add_post("/admin/replicas/{name}/drain", replica)
    app.router.add_get("/admin/replicas/{name}", replica)


async def replica(request: web.Request) -> web.Response:
    """POST .../drain: take the replica out of its group, running out what it holds; GET:
    how many requests it still holds (router/fleet/drain.py)."""
    gw, name = request.app[GATEWAY], request.match_info["name"]
    try:
        admin(request)
        standing = await (drain.drain(gw, name) if request.method == "POST"
                          else drain.state(gw, name))
    except ApiError as err:
        return err.response()
    return web.Response(body=orjson.dumps(standing), content_type="application/json")


async def scaling(request: web.Request) -> web.Response:
    """Each scaled backend's desired replica count and what it was computed from (KEDA's
    metrics-api scaler reads `backends.<name>.desired`): docs/autoscaling.md."""
    gw = request.app[GATEWAY]
    try:
        admin(request)
        if gw.fleet is None or all(b.scaling is None for b in gw.config.backends.values()):
            raise ApiError(404, "No backend has `scaling` in the config.",
                           code="scaling_disabled")
    except ApiError as err:
        return err.response()
    return web.Response(body=orjson.dumps(gw.fleet.as_json()),
                        content_type="application/json")


async def reload(request: web.Request) -> web.Response:
    """Re-read the config file: 200 with what changed, or 400 with every problem (the
    running config is kept)."""
    from router.reload import ReloadRefused, reload_file

    gw = request.app[GATEWAY]
    try:
        admin(request)
        try:
            changes = await reload_file(gw, gw.config_path)
        except ReloadRefused as exc:
            raise ApiError(400, "The config was not reloaded: " + "; ".join(exc.problems),
                           code="reload_refused") from None
    except ApiError as err:
        return err.response()
    return web.Response(body=orjson.dumps({"reloaded": True, "changes": changes}),
                        content_type="application/json")


async def report(request: web.Request) -> web.Response:
    """The cost report over the ledger, filtered by ?since=&until=&experiment=&route=,
    compared against ?baseline= (an arm). Rows still buffered are written first."""
    try:
        admin(request)
        return await _report(request)
    except ApiError as err:
        return err.response()


def admin(request: web.Request) -> None:
    """Only an admin key passes (auth on); a refusal is counted like every auth failure."""
    gw = request.app[GATEWAY]
    try:
        gw.keyring.admin(request)
    except ApiError as err:
        gw.metrics.auth_failures.add((err.code or "",))
        raise


async def _report(request: web.Request) -> web.Response:
    from router.report.build import build_report, parse_when  # numpy: only when asked
    from router.report.quality import load as load_quality
    from router.report.tenants import tenant_weights

    gw = request.app[GATEWAY]
    if gw.ledger is None:
        raise ApiError(404, "No ledger is configured (ledger.path or ledger.url).",
                       code="ledger_off")
    query = request.query
    for key, value in query.items():
        if len(value) > _MAX_TEXT:
            raise ApiError(400, f"'{key}' is longer than {_MAX_TEXT} characters.", param=key)
    now = time.time()
    try:
        where = RowFilter(
            since=parse_when(query["since"], now) if "since" in query else None,
            until=parse_when(query["until"], now) if "until" in query else None,
            experiment=query.get("experiment"), route=query.get("route"))
    except ValueError as exc:
        raise ApiError(400, str(exc), code="invalid_time") from None
    await gw.ledger.flush()
    rows = await gw.ledger.store.fetch(where)
    if not rows:
        raise ApiError(404, "The ledger has no rows for this filter.", code="no_rows")
    quality = await load_quality(gw.ledger.store, gw.config, where)
    try:
        body = await asyncio.to_thread(  # the bootstrap is CPU work: off the event loop
            build_report, rows, currency=gw.config.currency, baseline=query.get("baseline"),
            weights=tenant_weights(gw.config.auth.keys),
            slots={n: b.slots for n, b in gw.config.backends.items()}, quality=quality)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="baseline") from None
    return web.Response(body=orjson.dumps(body), content_type="application/json")
