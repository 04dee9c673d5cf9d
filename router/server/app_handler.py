"""The application's handler as aiohttp's server calls it, shorter for the usual request.

aiohttp's `Application._handle` runs, per request: a debug-mode check of the loop, the
router's `resolve` coroutine, the match info made and frozen, `Expect` handled, the
middleware chain built (cached) when there is one, then the route's handler. For a
request whose method and path one plain route serves (the router's dict,
`Routes.exact`), `app_handler`'s handler makes the same match info and awaits the
route's handler at once: the app has no middleware (else aiohttp's own handler is used),
and a request with `Expect` goes through aiohttp's, as does everything the dict lacks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web
from aiohttp.web_urldispatcher import UrlMappingMatchInfo

from router.server.no_route import Routes

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def app_handler(app: web.Application) -> Handler:
    """The handler of `app`'s requests (`app` frozen: its routes and middlewares known)."""
    whole: Handler = app._handle  # type: ignore[assignment]  # (takes its Request)
    router = app.router
    if not isinstance(router, Routes) or app._run_middlewares or not app.frozen:
        return whole
    exact = router.exact

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        route = exact.get((request.method, request.rel_url.path_safe))
        if route is None or request.headers.get(hdrs.EXPECT):
            return await whole(request)
        match_info = UrlMappingMatchInfo({}, route)
        match_info.add_app(app)
        match_info.freeze()
        request._match_info = match_info  # type: ignore[attr-defined]  # (a Request's)
        return await route.handler(request)  # type: ignore[arg-type]

    return handle
