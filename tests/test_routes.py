"""The app's router (router/server/no_route.py): its one-dict lookup of a plain path finds
what aiohttp's own walk of the resources finds, for every method and path it serves and
for near misses; what matches nothing goes to the catch-all route. The server's handler
(router/server/app_handler.py) gives a routed request what aiohttp's own gives it."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from router.app import create_app
from router.config import load_config
from router.server.app_handler import app_handler
from router.server.no_route import Routes, no_route


@pytest.fixture(scope="module")
def app() -> web.Application:
    made = create_app(load_config())
    made.router.freeze()
    return made


def _targets(app: web.Application) -> list[tuple[str, str]]:
    served = [(route.method, route.resource.canonical) for route in app.router.routes()
              if route.resource is not None and route.method != "*"]
    near = [(method, variant) for method, path in served
            for variant in (path + "/", path.upper(), path + "%20", path.replace("/", "//", 1))]
    wrong = [("DELETE", path) for _, path in served] + [("GET", "/v1/chat/completions")]
    return served + near + wrong


async def test_the_exact_lookup_finds_what_aiohttps_walk_finds(app: web.Application) -> None:
    router = app.router
    assert isinstance(router, Routes) and len(router.exact) >= 20  # the API's paths
    served = {(route.method, route.resource.canonical) for route in router.routes()
              if isinstance(route.resource, web.PlainResource)}
    assert set(router.exact) == served  # each looked up in one step
    for method, path in _targets(app):
        request = make_mocked_request(method, path, app=app)
        ours = await router.resolve(request)
        theirs = await web.UrlDispatcher.resolve(router, request)
        if isinstance(theirs, web.HTTPException) or theirs.http_exception is not None:
            assert ours.route is router.fallback, (method, path)  # (405s, 404s: no_route)
        else:
            assert ours.route is theirs.route and dict(ours) == dict(theirs), (method, path)


async def test_a_known_path_and_method_resolves_to_its_handler(app: web.Application) -> None:
    request = make_mocked_request("POST", "/v1/chat/completions", app=app)
    match = await app.router.resolve(request)
    assert match.route.method == "POST" and match.route.handler is not no_route
    assert match.route.resource is not None
    assert match.route.resource.canonical == "/v1/chat/completions"


def _echo_app(middlewares: tuple[object, ...] = ()) -> web.Application:
    """An app routed as the gateway's, whose handlers tell what aiohttp gave them."""
    async def echo(request: web.Request) -> web.Response:
        resource = request.match_info.route.resource
        assert resource is not None
        return web.json_response({"route": resource.canonical,
                                  "app": request.app is made,
                                  "frozen": request.match_info.apps == (made,)})

    made = web.Application(middlewares=middlewares)  # type: ignore[arg-type]
    made.router.__class__ = Routes  # as add_fallback makes it
    made.router.add_post("/v1/chat/completions", echo)
    made.router.add_get("/v1/items/{id}", echo)  # not a plain path: aiohttp's own way
    return made


async def test_the_servers_handler_gives_a_routed_request_what_aiohttps_gives(
        aiohttp_client: Any) -> None:
    app = _echo_app()
    client = await aiohttp_client(app)
    server = client.server.runner.server
    assert server is not None
    server.request_handler = app_handler(app)
    assert server.request_handler != app._handle  # the short way is taken
    for headers in ({}, {"Expect": "100-continue"}):  # (the second, aiohttp's own way)
        resp = await client.post("/v1/chat/completions", json={}, headers=headers)
        assert await resp.json() == {"route": "/v1/chat/completions", "app": True,
                                     "frozen": True}
    resp = await client.get("/v1/items/7")
    assert await resp.json() == {"route": "/v1/items/{id}", "app": True, "frozen": True}
    resp = await client.get("/v1/chat/completions")  # no route at all: aiohttp's 405
    assert resp.status == 405


async def test_an_app_with_a_middleware_keeps_aiohttps_own_handler() -> None:
    @web.middleware
    async def passing(request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        return response

    app = _echo_app((passing,))
    app.freeze()
    assert app_handler(app) == app._handle
    unfrozen = _echo_app()
    assert app_handler(unfrozen) == unfrozen._handle
