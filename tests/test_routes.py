"""The app's router (router/server/no_route.py): its one-dict lookup of a plain path finds
what aiohttp's own walk of the resources finds, for every method and path it serves and
for near misses; what matches nothing goes to the catch-all route."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from router.app import create_app
from router.config import load_config
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
    assert isinstance(router, Routes) and len(router._exact) >= 20  # the API's paths
    served = {(route.method, route.resource.canonical) for route in router.routes()
              if isinstance(route.resource, web.PlainResource)}
    assert set(router._exact) == served  # each looked up in one step
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
