"""What a finished job's files hold, line by line in the input's order: OpenAI's output and
error lines, or Anthropic's result lines for a Message Batch. Lines that never ran (their
job was cancelled or expired first) are written too: in OpenAI's error file with
`batch_cancelled` / `batch_expired`, as Anthropic's `canceled` / `expired` results. Plain
data in and out: no I/O.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from router.apis.anthropic import error_type
from router.batch.jobs import MESSAGES, UNRUN

# (code, message) of an OpenAI error line for a line that never ran, by its state
_UNRUN_ERRORS = {
    "cancelled": ("batch_cancelled", "The batch was cancelled before this request ran."),
    "expired": ("batch_expired", "The request could not run before the batch's completion "
                "window ended."),
}
_UNRUN_RESULTS = {"cancelled": "canceled", "expired": "expired"}  # Anthropic's spelling

Row = tuple[str, str, str | None]  # (custom_id, state, the runner's record of its answer)


def written(endpoint: str, rows: list[Row]) -> dict[str, list[str]]:
    """The lines of each file a job with `rows` (in the input's order) leaves, by kind:
    `output` and `errors` (OpenAI's), or `results` (a Message Batch's)."""
    if endpoint == MESSAGES:
        return {"results": [orjson.dumps(_result(*row)).decode() for row in rows]}
    files: dict[str, list[str]] = {"output": [], "errors": []}
    for custom_id, state, answer in rows:
        if state in UNRUN:
            code, message = _UNRUN_ERRORS[state]
            files["errors"].append(orjson.dumps({
                "id": "batch_req_" + os.urandom(12).hex(), "custom_id": custom_id,
                "response": None, "error": {"code": code, "message": message}}).decode())
        elif answer is not None:
            files["output" if state == "done" else "errors"].append(answer)
    return files


def _result(custom_id: str, state: str, answer: str | None) -> dict[str, Any]:
    """One line of a Message Batch's results."""
    if state in UNRUN:
        return {"custom_id": custom_id, "result": {"type": _UNRUN_RESULTS[state]}}
    response: dict[str, Any] = orjson.loads(answer)["response"] if answer is not None else {
        "status_code": 500, "body": None}  # (a line ends with its answer: not reached)
    body = response["body"]
    if state == "done":
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": body}}
    return {"custom_id": custom_id, "result": {"type": "errored", "error": _error(
        response["status_code"], body, response.get("request_id"))}}


def _error(status: int, body: Any, request_id: str | None) -> dict[str, Any]:
    """Anthropic's error response: as the endpoint answered it, or (an answer in another
    shape: the runner's own, when the line could not be sent) made from its message."""
    if isinstance(body, dict) and body.get("type") == "error" and isinstance(
            body.get("error"), dict):
        return {**body, "request_id": request_id}
    inner = body.get("error") if isinstance(body, dict) else None
    message = inner.get("message") if isinstance(inner, dict) else None
    return {"type": "error", "request_id": request_id, "error": {
        "type": error_type(status),
        "message": message if isinstance(message, str) else "The request failed."}}
