"""Client API keys: who is calling, for which tenant, and whether they may administer.

Keys are kept only as SHA-256 digests (from the config, or hashed once at startup from an
environment variable). A presented key is hashed and looked up; the digests are then
compared in constant time. No key, and no part of one, is ever logged. A key comes as
`Authorization: Bearer KEY` or (Anthropic clients) `x-api-key: KEY`. A request with more
than one key header, or two that differ, is refused (400), never read as "the first wins".
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, replace

from aiohttp import web

from policies.config import AuthConfig, KeyScope, Priority, Public
from router.common.config_error import ConfigError, ConfigProblem
from router.common.errors import ApiError


@dataclass(frozen=True, slots=True)
class Caller:
    key_id: str
    tenant: str
    admin: bool
    digest: bytes
    priority: Priority = Priority.STANDARD
    weight: float = 1.0  # its tenant's share of a `fair` line
    metrics: bool = False  # a scrape key: sees every tenant's series (as an admin key)
    batch: bool = False  # a batch line the runner sends for this key (router/batch)


# The codes of the key check's refusals, counted in slotgate_auth_failures_total by code
# (a closed set): no or a wrong key, two keys, and a non-admin key on /admin/*.
AUTH_FAILURES = frozenset({"invalid_api_key", "duplicate_authorization",
                           "insufficient_permissions"})


_CLASSES = frozenset(Priority)  # the values a client may name in x-slotgate-priority
BATCH_KEY_HEADER = "x-slotgate-batch-key"  # the job's key id, on the runner's lines
# A batch line of a gateway without auth: its job has no key and the one tenant "".
ANONYMOUS_BATCH_LINE = Caller("", "", admin=False, digest=b"", batch=True)


def presented_key(request: web.BaseRequest) -> str:
    """The key a request presents: `Authorization: Bearer KEY` (OpenAI's) or `x-api-key:
    KEY` (Anthropic's); "" for none. Keys that differ are refused, never read as "the
    first wins": two headers of one name are a 400, the two names with different keys a
    401 naming both (the same key in both is that key)."""
    given = request.headers.getall("Authorization", ())
    other = request.headers.getall("x-api-key", ())
    if len(given) > 1 or len(other) > 1:  # two proxies or clients may disagree on which
        raise ApiError(400, "More than one Authorization header was sent; send one.",
                       code="duplicate_authorization")
    auth = given[0] if given else ""
    bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    if not other:
        return bearer
    key = other[0].strip()
    if given and bearer != key:  # agreeing, the two are one key (some clients send both)
        raise ApiError(401, "The 'Authorization: Bearer' and 'x-api-key' headers carry "
                       "different keys; send one key (in either header, or the same in "
                       "both).", code="duplicate_authorization")
    return key


class Keyring:
    def __init__(self, config: AuthConfig) -> None:
        self.enabled = config.enabled
        self.public = config.public
        self._by_digest: dict[bytes, Caller] = {}
        self._by_id: dict[str, Caller] = {}
        # This process's batch runner presents it, with the job's key id in
        # `x-slotgate-batch-key` (router/batch/runner.py): never configured, never logged.
        self.batch_secret = secrets.token_urlsafe(32)
        self._batch_digest = hashlib.sha256(self.batch_secret.encode()).digest()
        for i, key in enumerate(config.keys):
            if key.sha256 is not None:
                digest = bytes.fromhex(key.sha256)
            else:
                assert key.key_env is not None
                secret = os.environ.get(key.key_env)
                if not secret:
                    raise ConfigError([ConfigProblem(
                        f"auth.keys[{i}].key_env", f"environment variable {key.key_env} is "
                        "not set", None)], "environment")
                digest = hashlib.sha256(secret.encode()).digest()
            found = Caller(key.id, key.tenant, key.admin, digest, key.priority, key.weight,
                           KeyScope.METRICS in key.scopes)
            self._by_digest[digest] = self._by_id[key.id] = found

    def caller(self, request: web.Request) -> Caller | None:
        """The caller of a request; raises a 401 when auth is on and the key is wrong.
        With auth off: None, but for the batch runner's lines (they still give their slot
        up to interactive requests, and stay on their route's primary)."""
        if not self.enabled:
            if BATCH_KEY_HEADER in request.headers and hmac.compare_digest(
                    hashlib.sha256(presented_key(request).encode(errors="replace")).digest(),
                    self._batch_digest):
                return ANONYMOUS_BATCH_LINE
            return None
        presented = presented_key(request)
        digest = hashlib.sha256(presented.encode(errors="replace")).digest()
        found = self._by_digest.get(digest)
        if found is None and hmac.compare_digest(digest, self._batch_digest):
            key_id = request.headers.get(BATCH_KEY_HEADER, "")
            if not key_id:  # the gateway's own work (a shadow comparison), of no key
                return ANONYMOUS_BATCH_LINE
            found = self._by_id.get(key_id)
            if found is not None:
                return replace(found, batch=True)  # a batch line, run for its job's key
        if not presented or found is None or not hmac.compare_digest(found.digest, digest):
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
        return found

    def check(self, request: web.Request, what: Public) -> None:
        """Endpoints other than the API's: a key is needed unless `what` is public."""
        if self.enabled and what not in self.public:
            self.caller(request)

    def tenants_seen(self, request: web.Request, what: Public) -> str | None:
        """Whose per-tenant series and rows a caller of `what` (metrics, pages) may see,
        once it may read `what` at all: None for every tenant's (auth off, an admin or
        `metrics` key, or `auth.public: [tenants]`), else its own tenant's ("" for none:
        no key, on a public endpoint; a wrong key there is as none)."""
        if not self.enabled or Public.TENANTS in self.public:
            return None
        try:
            if what in self.public and not presented_key(request):
                return ""
            caller = self.caller(request)
        except ApiError:
            if what in self.public:
                return ""
            raise
        assert caller is not None
        return None if caller.admin or caller.metrics else caller.tenant

    @staticmethod
    def priority(caller: Caller | None, request: web.Request) -> Priority:
        """The key's class; a client may lower its own (`x-slotgate-priority: sheddable`,
        e.g. for batch work), never raise it."""
        own = caller.priority if caller is not None else Priority.STANDARD
        asked = request.headers.get("x-slotgate-priority")
        if asked is None:  # the usual case
            return own
        asked = asked.strip().lower()
        if asked in _CLASSES:
            wanted = Priority(asked)
            if wanted.rank > own.rank:
                return wanted
        return own

    def admin(self, request: web.Request) -> None:
        """Admin endpoints: with auth on, only an admin key (401 for none, 403 for others)."""
        caller = self.caller(request)
        if caller is not None and not caller.admin:
            raise ApiError(403, "This key may not call admin endpoints.",
                           code="insufficient_permissions")
