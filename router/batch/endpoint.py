"""What every Files and Batches handler does first: the caller's key checked, the feature
there (it needs a ledger), and an ApiError answered in its API's shape (OpenAI's, or
Anthropic's for the Message Batches)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from router.apis.dialect import OPENAI, Dialect
from router.common.errors import ApiError
from router.gateway import GATEWAY, Gateway
from router.request.auth import Caller

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TenantHandler = Callable[[web.Request, Gateway, Caller | None], Awaitable[web.StreamResponse]]


def tenant_api(handler: TenantHandler, dialect: Dialect = OPENAI) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        gw: Gateway = request.app[GATEWAY]
        if (refused := gw.guard(request, None, dialect)) is not None:
            return refused
        try:
            if gw.files is None or gw.jobs is None:
                raise ApiError(404, "The Files and Batches APIs need a ledger (ledger.path "
                               "or ledger.url in the gateway's config).",
                               code="files_disabled")
            return await handler(request, gw, gw.keyring.caller(request))
        except ApiError as err:
            return dialect.error_response(err, gw.config.server.retry_after_min_s)

    return handle


def tenant_of(caller: Caller | None) -> str:
    """Whose files and jobs: the key's tenant ("" with auth off: one tenant for all)."""
    return caller.tenant if caller is not None else ""
