"""What is known of one request: its record (logged and kept for the ledger, never its
content), where it was when it ended, and who sent it."""

from __future__ import annotations

import enum
import hashlib
import os
import random
import re
import time
from dataclasses import dataclass

from aiohttp import web

from router.common.parsed import ParsedRequest

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Request ids need to be unique, not secret: a generator seeded once from the OS, rather
# than a getrandom() system call per request.
_IDS = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _IDS.seed(os.urandom(32)))  # never shared
_MAX_SUBJECT = 512


class Phase(enum.StrEnum):
    """Where a request was when it ended; names the disconnect phase."""

    ADMISSION = "admission"
    QUEUED = "queued"
    BEFORE_FIRST_BYTE = "before_first_byte"
    STREAMING = "streaming"
    DONE = "done"


@dataclass(slots=True)
class RequestRecord:
    """The facts of one request: logged, and kept for the ledger (never content)."""

    request_id: str
    endpoint: str
    started_at: float  # time.perf_counter(): durations, not deadlines (uvloop's clock is in ms)
    ts: float  # time.time() on arrival
    row_id: str  # the ledger's key: ours, unique even when clients reuse request ids
    api: str = "chat"  # the client API (policies.apis.Api), from the endpoint it came on
    route: str | None = None
    primary: str | None = None  # the route's primary: the counterfactual's backend
    experiment: str | None = None
    arm: str | None = None
    tenant: str | None = None  # the key's tenant (auth on), else a hash prefix of the key
    key_id: str | None = None  # the configured key's id (auth on)
    priority: str = "standard"
    batch: bool = False  # a batch line (router/batch): priced less its backend's discount
    quota_held: bool = False  # counted in by the key's limits: its settle is owed
    backend: str | None = None
    replica: str | None = None  # the endpoint of the backend's group that served it
    pick: str | None = None  # why that replica (a group of more than one)
    prefix_blocks: int | None = None  # of its prompt, known to the affinity table (looked up)
    reason: str | None = None
    stream: bool = False
    status: int = 0
    error: str | None = None
    param: str | None = None  # the request field a refusal names
    queue_wait_ms: float = 0.0
    slot_at: float | None = None  # perf_counter when the slot was granted
    slot_ms: float = 0.0  # how long the slot was held
    ttft_ms: float | None = None
    slo_ttft_ms: float | None = None  # its class's TTFT objective (set once its route is known)
    predicted_ttft_ms: float | None = None  # the TTFT forecast when it was first admitted
    slo_met: bool | None = None  # judged at its first token or its end (None: not judged)
    total_ms: float = 0.0
    intent: str | None = None
    p_simple: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # of its prompt, the engine's prefix cache spared (reported)
    tokens_estimated: bool = False  # the backend reported no usage; the gateway counted
    usage_rejected: bool = False  # the backend's usage was out of bounds: estimated instead
    phase: Phase = Phase.ADMISSION
    disconnect: Phase | None = None
    dropped_tools: str | None = None  # hosted tools a Responses translation left out


def new_id() -> str:
    """The gateway's own request id: 32 hex digits, a UUID version 7's (RFC 9562: the
    milliseconds since the epoch, then 74 random bits). Time-ordered, so the ledger's
    key index grows at its end: a random key lands each row on a different page of it,
    and at a few hundred thousand rows that costs SQLite 2-3x the CPU per row."""
    bits = _IDS.getrandbits(74)
    return f"{time.time_ns() // 1_000_000 << 80 | _UUID7 | bits >> 62 << 64 | bits & _LOW62:032x}"


_UUID7 = 0x7 << 76 | 0b10 << 62  # the version (7) and the variant (RFC 9562's) bits
_LOW62 = (1 << 62) - 1


def request_id(request: web.Request, own: str) -> str:
    given = request.headers.get("X-Request-Id")
    if given and _REQUEST_ID.match(given):
        return given
    return own


def key_id(request: web.Request) -> str | None:
    """Who is calling, for the ledger and sticky arms: a hash prefix of the bearer key."""
    auth = request.headers.get("Authorization")
    if auth and auth[:7].lower() == "bearer ":
        presented = auth[7:].strip()
    elif (presented := request.headers.get("x-api-key", "").strip()) == "":  # Anthropic's
        return None
    return hashlib.sha256(presented.encode(errors="replace")).hexdigest()[:12]


def subject(parsed: ParsedRequest, tenant: str | None, request: web.Request) -> str | None:
    """Whose arm: the OpenAI `user` field, else the API key id, else x-slotgate-subject."""
    user = parsed.body.get("user")
    if isinstance(user, str) and 0 < len(user) <= _MAX_SUBJECT:
        return "user:" + user
    if tenant is not None:
        return "key:" + tenant
    given = request.headers.get("X-Slotgate-Subject")
    if given and len(given) <= _MAX_SUBJECT:
        return "subject:" + given
    return None
