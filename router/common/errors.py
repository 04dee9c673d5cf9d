"""The errors the gateway answers itself, in OpenAI's shape: {"error": {message, type, param,
code}}, with the status and an `x-should-retry` header for the official SDKs.

    ApiError                    status, type and code given per case:
      400 invalid_request_error bad JSON, missing or malformed fields (`invalid`)
      404 invalid_request_error unknown model (code model_not_found); no such path (`not_found`)
      408 invalid_request_error the body did not arrive in time (code request_timeout)
      413 invalid_request_error body over the limit (code request_too_large, `too_large`)
      415 invalid_request_error a body that is not JSON (code unsupported_media_type)
      429 rate_limit_error      every pool and queue full (code queue_full)
      502 / 503 / 504           upstream unreachable, queue timeout, upstream timeout

Other client APIs render the same error in their own shape (`router.apis.dialect`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

# `x-should-retry` by status: false where no retry can help, true where one will (a 429 or
# 503 also says when, in Retry-After). 408 and 409 are left to the client's own rule.
_SHOULD_RETRY = {status: "false" for status in (400, 401, 403, 404, 405, 406, 411, 413, 415,
                                                 422, 426, 431, 501)}
_SHOULD_RETRY.update({429: "true", 503: "true"})


@dataclass(eq=False)
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False  # close the connection after this answer
    model: str | None = None  # the model the refused request named, once read (the log's)

    def __post_init__(self) -> None:
        # The official SDKs (and the agents on them) retry 401s, 404s... unless told not
        # to: a wrong key otherwise keeps a client retrying for minutes.
        should_retry = _SHOULD_RETRY.get(self.status)
        if should_retry is not None and "x-should-retry" not in self.headers:
            self.headers["x-should-retry"] = should_retry

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        response = web.Response(
            status=self.status,
            body=orjson.dumps(self.body()),
            content_type="application/json",
            headers=self.headers,
        )
        if self.close:
            response.force_close()
        return response

    def sse_event(self) -> bytes:
        """The in-band form, once a stream's 200 has already been sent."""
        return b"data: " + orjson.dumps(self.body()) + b"\n\n"


def not_found(request: web.BaseRequest) -> web.Response:
    return ApiError(404, f"Not Found: {request.method} {request.path}",
                    code="not_found").response()


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"Request body exceeds the limit of {limit} bytes.", code="request_too_large"
    )
