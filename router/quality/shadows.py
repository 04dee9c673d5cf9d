"""Shadow comparisons (#33): what a downgrade costs in quality, measured on idle slots.

A sample of the requests a route moved to its small model (`routes.X.quality.shadow_rate`)
is kept with the small model's answer (router.upstream.capture) and replayed on the
route's primary, then judged: the judge route is asked which answer serves the user
better, in both orders (policies.quality.judging). The verdict, with the request's intent,
language, confidence and size and the cost the downgrade saved, goes into the ledger's
`verdicts` table, and `slotgate report` reads it.

Every replay and judgement is the gateway's own work, sent to itself as a batch line of
no key (router.batch.runner's secret): it runs only in a free slot that nobody waits for,
on the route's primary, and an interactive request takes that slot back at once (a cut
replay waits for the next idle slot). Nothing of it reaches a client. The answers live in
memory until the judge has spoken, never logged, and stored only with `quality.keep_texts`.

`slotgate evaluate` drives the same comparison (`judged`) over a prompt file, its calls
a key's interactive requests (router.quality.evaluation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from classifier.text import request_text
from policies.config import Config
from policies.pricing.costs import request_cost
from policies.quality.judging import Verdict, combine, judge_messages, language, parse_pick
from policies.slots.base import SlotPool
from router.batch.runner import SECRET_HEADER
from router.common.parsed import Endpoint
from router.common.record import RequestRecord
from router.ledger.base import Store
from router.quality.budget import HourlyTokens
from router.quality.verdicts import VerdictRecord, record
from router.upstream.answers import answer_text
from router.upstream.capture import Capture

log = logging.getLogger("slotgate.quality")
STEERED = "fallback:simple:"  # the reason of a request the classifier moved
REPLAYED = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS})  # answers a judge can read
CALL_TIMEOUT_S = 600.0  # one replay or judgement, in all
JUDGE_MAX_TOKENS = 8  # "A", "B" or "TIE"


@dataclass(slots=True)
class Shadow:
    """One downgraded request, kept for its comparison: its record (read once the request
    has ended: its route, backend, tenant, intent, confidence, tokens and cost), the path
    and body to replay, and the small model's answer."""

    rec: RequestRecord
    endpoint: str  # /v1/chat/completions or /v1/completions
    body: dict[str, Any]  # the request, as the gateway parsed it
    capture: Capture
    since: float = 0.0  # monotonic, when it was kept
    # Its progress, kept when a call is cut (it resumes at the call that was cut): the
    # primary's answer and what the downgrade saved, then the judge's picks in order.
    primary: str | None = None
    saved: float = 0.0
    picks: list[str | None] = field(default_factory=list)

    @property
    def route(self) -> str:
        return self.rec.route or ""


class ShadowRunner:
    def __init__(self, config: Callable[[], Config], url: str, key: str | None,
                 pool: Callable[[str], SlotPool | None], store: Store | None, *,
                 own: bool = True) -> None:
        """`key`: what its calls present. `own`: the process's batch secret, each call the
        gateway's own batch line of no key (on the route's primary, in a free slot); else
        an API key or None (`slotgate evaluate`): each call that key's interactive request
        at the lowest class. `pool`: a route's primary's pool; `store`: the ledger's (None:
        verdicts are counted, not kept)."""
        self.config, self.url, self.pool, self.store = config, url, pool, store
        self.headers = {"Content-Type": "application/json",
                        "x-slotgate-priority": "sheddable"}
        if key is not None:
            self.headers["Authorization"] = f"Bearer {key}"
        if own:
            assert key is not None, "the gateway's own calls present its batch secret"
            self.headers[SECRET_HEADER] = ""
        self.pending: deque[Shadow] = deque()
        self.tokens = HourlyTokens()
        self.counts: Counter[str] = Counter()  # kept, skipped:<why>, cut, verdict:<v>...
        self.wake = asyncio.Event()
        self.busy: set[str] = set()  # pools a shadow's call is in flight on (one each)
        self.settled = asyncio.Event()  # none waits and none runs
        self.running: set[asyncio.Task[None]] = set()  # comparisons under way
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._unwatch: list[Callable[[], None]] = []

    # -- on the request path: two calls for a sampled request, one for others ----------

    def sample(self, rec: RequestRecord, endpoint: Endpoint) -> Capture | None:
        """A Capture for this request's answer if it is to be compared; None for most."""
        reason, route = rec.reason, rec.route
        if reason is None or not reason.startswith(STEERED) or endpoint not in REPLAYED:
            return None
        config = self.config()
        found = config.routes.get(route or "")
        rate = found.quality.shadow_rate if found is not None else 0.0
        if rate <= 0.0 or random.random() >= rate:
            return None
        why = self._refusal(config, rec.tenant)
        if why is not None:
            self.counts["skipped:" + why] += 1
            return None
        return Capture()

    def _refusal(self, config: Config, tenant: str | None) -> str | None:
        quality = config.quality
        if tenant and tenant in quality.opt_out_tenants:
            return "opted_out"
        if len(self.pending) >= quality.max_pending:
            return "pending_full"
        if self.tokens.spent(None) >= quality.max_tokens_per_hour:
            return "tokens_per_hour"
        if tenant and self.tokens.spent(tenant) >= quality.max_tenant_tokens_per_hour:
            return "tenant_tokens_per_hour"
        return None

    def keep(self, rec: RequestRecord, endpoint: Endpoint, body: dict[str, Any],
             capture: Capture) -> None:
        """The small model's answer has ended: compare it when a slot is idle."""
        self.pending.append(Shadow(rec, endpoint.value, body, capture, since=time.monotonic()))
        self.counts["kept"] += 1
        self.wake.set()

    # -- the runner -----------------------------------------------------------------------

    async def start(self) -> None:
        self.open()
        self._task = asyncio.create_task(self._loop(), name="shadows")

    def open(self) -> None:
        """The client its calls use (`start` opens it too; `close` closes it)."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S))

    async def close(self) -> None:
        for unwatch in self._unwatch:
            unwatch()
        tasks = [*self.running, *([self._task] if self._task is not None else [])]
        for task in tasks:  # a call in flight is cut: its slot is released as a client's
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _loop(self) -> None:
        while True:
            self.wake.clear()
            self._expire()
            for shadow in list(self.pending):
                pool = self.pool(self._next(shadow))
                if pool is not None and self._idle(pool):
                    self.pending.remove(shadow)
                    self.busy.add(pool.name)
                    task = asyncio.create_task(self._compare(shadow, pool.name))
                    self.running.add(task)
                    task.add_done_callback(self.running.discard)
            self._watch()
            if self.pending or self.busy:
                self.settled.clear()
            else:
                self.settled.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config().quality.max_wait_s):
                    await self.wake.wait()

    def _next(self, shadow: Shadow) -> str:
        """The route its next call goes to: its own (the replay), then the judge's."""
        if shadow.primary is None:
            return shadow.route
        return self.config().quality.judge_route or shadow.route

    def _idle(self, pool: SlotPool) -> bool:
        """A free slot on `pool`, nobody waiting for one, and none of ours in flight."""
        return (pool.name not in self.busy and not pool.queued
                and pool.active < pool.capacity)

    def _watch(self) -> None:
        """Be woken by the pools' changes while shadows wait (none: no callback at all)."""
        if self.pending and not self._unwatch:
            pools = {p.name: p for s in self.pending
                     if (p := self.pool(self._next(s))) is not None}
            self._unwatch = [p.watch(lambda _: self.wake.set()) for p in pools.values()]
        elif not self.pending:
            for unwatch in self._unwatch:
                unwatch()
            self._unwatch = []

    def _expire(self) -> None:
        deadline = time.monotonic() - self.config().quality.max_wait_s
        while self.pending and self.pending[0].since < deadline:
            self.pending.popleft()
            self.counts["skipped:waited_too_long"] += 1

    async def _compare(self, shadow: Shadow, pool: str) -> None:
        """Replay, judge both ways, record; a cut call puts the shadow back in line. The
        pool counts as busy until the verdict is written (`settled` then means recorded)."""
        try:
            verdict = await self.judged(shadow)
            if verdict is not None:
                await self._record(shadow, *verdict)
        except Cut:
            self.counts["cut"] += 1
            self.pending.appendleft(shadow)
            return
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.counts["failed"] += 1
            log.warning("shadow %s: a call failed (%s)", shadow.rec.request_id,
                        type(exc).__name__)
            return
        finally:
            self.busy.discard(pool)
            self.wake.set()

    async def judged(self, shadow: Shadow) -> tuple[Verdict | None, float] | None:
        """(the verdict, None if the judge's replies could not be read; the cost the
        downgrade saved); None: the replay failed (an error answer: nothing to compare).
        Raises Cut when a call's slot was taken: its progress is kept for the next try."""
        config, tenant = self.config(), shadow.rec.tenant
        if shadow.primary is None:
            replay = {**shadow.body, "model": shadow.route, "stream": False}
            replay.pop("stream_options", None)
            started = time.monotonic()
            status, answer = await self.call(shadow.endpoint, replay, tenant)
            if status != 200 or not isinstance(answer, dict):
                self.counts["replay_failed"] += 1
                return None
            shadow.saved = self._saved(config, shadow, answer, time.monotonic() - started)
            shadow.primary = answer_text(answer)
        small, question = shadow.capture.text(), request_text(shadow.body)
        orders = ((small, shadow.primary), (shadow.primary, small))
        while len(shadow.picks) < len(orders):
            first, second = orders[len(shadow.picks)]
            status, said = await self.call("/v1/chat/completions", {
                "model": self._next(shadow), "max_tokens": JUDGE_MAX_TOKENS,
                "temperature": 0, "messages": judge_messages(question, first, second)}, tenant)
            shadow.picks.append(parse_pick(answer_text(said)) if status == 200
                                and isinstance(said, dict) else None)
        verdict = combine(*shadow.picks)
        self.counts["verdict:" + (verdict.value if verdict is not None else "none")] += 1
        return verdict, shadow.saved

    async def call(self, path: str, body: dict[str, Any], tenant: str | None
                   ) -> tuple[int, Any]:
        """One call through the gateway's endpoint, identified by `headers` (the gateway's
        own batch line of no key, or a key's request). Raises Cut when it was refused for
        want of a slot or cut for an interactive request."""
        assert self._session is not None
        try:
            async with self._session.post(self.url + path, data=orjson.dumps(body),
                                          headers=self.headers) as resp:
                raw = await resp.read()
                reason = resp.headers.get("x-slotgate-reject-reason")
        except aiohttp.ServerDisconnectedError:  # an interactive request took the slot
            raise Cut from None
        if resp.status in (429, 503) and reason in (None, "queue_full"):
            raise Cut
        with contextlib.suppress(orjson.JSONDecodeError):
            parsed = orjson.loads(raw)
            usage = parsed.get("usage") if isinstance(parsed, dict) else None
            if isinstance(usage, dict):
                self.tokens.spend(tenant, int(usage.get("total_tokens") or 0))
            return resp.status, parsed
        return resp.status, None

    def _saved(self, config: Config, shadow: Shadow, answer: dict[str, Any],
               slot_s: float) -> float:
        """What the downgrade saved: the primary's replay at its price, less the small
        model's answer at its own."""
        rec = shadow.rec
        primary = config.backends[config.routes[shadow.route].primary]
        small = config.backends.get(rec.backend or "")
        usage = answer.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        prompt = rec.prompt_tokens or 0
        on_primary = request_cost(primary.price, primary.slots,
                                  int(usage.get("prompt_tokens") or prompt),
                                  int(usage.get("completion_tokens") or 0), slot_s)
        on_small = 0.0 if small is None else request_cost(
            small.price, small.slots, prompt, rec.completion_tokens or 0, rec.slot_ms / 1000)
        return on_primary - on_small

    async def _record(self, shadow: Shadow, verdict: Verdict | None, saved: float) -> None:
        if self.store is None:
            return
        config = self.config()
        rec, route, question = shadow.rec, config.routes.get(shadow.route), request_text(
            shadow.body)
        texts = ((question, shadow.capture.text(), shadow.primary or "")
                 if config.quality.keep_texts else None)
        try:
            await record(self.store, VerdictRecord(
                rec.request_id, rec.tenant, shadow.route, rec.intent, language(question),
                rec.p_simple, rec.prompt_tokens or 0, rec.backend or "",
                route.primary if route else "", verdict, saved, texts=texts),
                config.ledger.retention_days)
        except Exception:  # a database blip loses this verdict, not the runner
            log.exception("shadow %s: its verdict could not be written", rec.request_id)


class Cut(Exception):
    """An interactive request took the call's slot (or it found none free after all, or
    no room in the line of an interactive call)."""
