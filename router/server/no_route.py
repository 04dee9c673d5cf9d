"""What no route takes, answered in OpenAI's shape: 404 for an unknown path, 405 (with
`Allow`) for a known path asked with another method, 501 for a method served nowhere
(CONNECT, and a target no path can match such as CONNECT's `host:port` or `OPTIONS *`,
which aiohttp's router answered in plain text). The 405s and 501s are written to the
access log (the 404s, as before, are not). Only unmatched requests come here; a matched
one pays one more call frame and a type test in the router's resolve.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import orjson
from aiohttp import web
from aiohttp.web_urldispatcher import (
    MatchedSubAppResource,
    MatchInfoError,
    PlainResource,
    UrlMappingMatchInfo,
)

from router.common.errors import ApiError, not_found
from router.common.record import new_id, request_id
from router.gateway import GATEWAY

access = logging.getLogger("slotgate.access")
_SHOWN = 256  # characters of a method or path written to the log


class Routes(web.UrlDispatcher):
    """The app's router: a request whose target matches no path (not even the catch-all
    route's, as `host:443` or `*`) goes to the catch-all route too. A method and path that
    one plain resource serves are looked up in one dict (`exact`, made when the router
    freezes at startup), as aiohttp's own walk would find them: its first candidate is
    the plain resource of the whole path, which has one route per method."""

    fallback: web.AbstractRoute | None = None
    exact: Mapping[tuple[str, str], web.AbstractRoute] = MappingProxyType({})

    def freeze(self) -> None:
        super().freeze()
        resources = self.resources()
        if not any(isinstance(r, MatchedSubAppResource) for r in resources):  # (else first)
            self.exact = {(route.method, resource.canonical): route
                           for resource in resources if isinstance(resource, PlainResource)
                           for route in resource}

    async def resolve(self, request: web.Request) -> UrlMappingMatchInfo:
        route = self.exact.get((request.method, request.rel_url.path_safe))
        if route is not None:
            return UrlMappingMatchInfo({}, route)
        match = await super().resolve(request)
        if isinstance(match, MatchInfoError) and self.fallback is not None:
            return UrlMappingMatchInfo({"path": ""}, self.fallback)
        return match


def add_fallback(app: web.Application) -> None:
    """Registers `no_route` last, for every method and every path."""
    router = app.router
    router.__class__ = Routes  # the same router; only unmatched requests differ
    assert isinstance(router, Routes)
    router.fallback = router.add_route("*", "/{path:.*}", no_route)


async def no_route(request: web.Request) -> web.Response:
    """With auth on, a caller without a key learns nothing of the paths: 401 first."""
    gw = request.app[GATEWAY]
    if gw.keyring.enabled and (refused := gw.guard(request, None)) is not None:
        return refused
    method = request.method
    allowed: set[str] = set()
    this = request.match_info.route.resource
    for resource in request.app.router.resources():
        if resource is not this:
            _, methods = await resource.resolve(request)
            allowed |= methods
    if allowed:
        error = ApiError(405, f"Method Not Allowed: {method} {request.path}",
                         code="method_not_allowed", headers={"Allow": ", ".join(sorted(allowed))})
        response = error.response()
    elif all(route.method != method for route in request.app.router.routes()):
        response = ApiError(501, f"The method {method} is not implemented by this server.",
                            "server_error", code="method_not_implemented").response()
    else:
        response = not_found(request)
    if response.status != 404 and gw.config.logging.access and access.isEnabledFor(logging.INFO):
        log_unrouted(request_id(request, new_id()), method, request.raw_path.split("?")[0],
                     response.status)
    return response


def log_unrouted(request_id: str, method: str, path: str, status: int, **extra: Any) -> None:
    """The access line of a request no route took (never its query: it may hold a secret)."""
    line = {"request_id": request_id, "ts": time.time(), "method": method[:_SHOWN],
            "path": path[:_SHOWN], "status": status, **extra}
    access.info(orjson.dumps(line).decode())

