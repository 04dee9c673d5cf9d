"""The `backends` section: a group of engine replicas (or simulated ones) serving one
model behind one queue, their slots, how a replica is picked, timeouts and price.

Pure data and validation: no YAML, no files, no environment lookups.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal, Self

from pydantic import Field, HttpUrl, field_validator, model_validator

from policies.apis import DEFAULT_APIS, SIMULATED_APIS, Api
from policies.config.base import PositiveSeconds, StrictModel
from policies.config.fleet import BackendScalingConfig, DiscoveryConfig
from policies.scheduler.capabilities import Ability, Capability
from policies.scheduler.pick import EPSILON, PickMode
from policies.scheduler.prefix import BLOCK_BYTES

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
ENDPOINT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"  # a metric label and a header value


class SimulatedSpec(StrictModel):
    """An in-process simulated engine standing in for a real backend."""

    max_num_seqs: int = Field(default=4, ge=1, le=4096)
    ttft_s: float = Field(default=0.2, ge=0, le=600)
    prefill_s_per_token: float = Field(default=0.0, ge=0, le=1)
    tokens_per_s: float = Field(default=30.0, ge=0, le=1_000_000)  # 0 = no decode delay
    # decode slows by this fraction per extra sequence in the batch
    batch_slowdown: float = Field(default=0.0, ge=0, le=10)
    output_tokens: int = Field(default=64, ge=1, le=1_000_000)  # mean length when max_tokens allows
    output_tokens_spread: float = Field(default=0.0, ge=0, le=1)  # uniform +/- fraction of the mean
    seed: int | None = None
    # A prefix cache of this many tokens (0: none): a prompt's blocks found in it skip prefill.
    # Tokens are counted at 4 bytes of the rendered prompt each, as `policies.scheduler.prefix`
    # hashes it.
    prefix_cache_tokens: int = Field(default=0, ge=0, le=100_000_000)
    cache_block_tokens: int = Field(default=16, ge=1, le=65_536)  # tokens per cached block
    # The context window (prompt and max_tokens together), None: unbounded. Beyond it the
    # engine answers 400 in vLLM's words, as vLLM does with --max-model-len.
    max_model_len: int | None = Field(default=None, ge=16, le=100_000_000)
    # auto: call an offered tool like a model in an agent's loop; never: answer in text
    # whatever is offered (a prompt that needs no tool).
    tool_calls: Literal["auto", "never"] = "auto"


class RatesHint(StrictModel):
    """An engine's nominal speed, for the queue forecast before any answer is measured
    (each measured figure then replaces its hint)."""

    ttft_s: float | None = Field(default=None, ge=0, le=600)  # to the first token
    tokens_per_s: float | None = Field(default=None, gt=0, le=1_000_000)  # per stream
    output_tokens: int | None = Field(default=None, ge=1, le=1_000_000)  # a typical answer
    # prompt tokens prefilled per second (what a prefix-cache hit saves: the replica pick)
    prefill_tokens_per_s: float | None = Field(default=None, gt=0, le=100_000_000)


NonNegativeMoney = Annotated[float, Field(ge=0, le=1_000_000)]


class PriceConfig(StrictModel):
    """Per token (hosted APIs) or per GPU time (self-hosted engines), in `Config.currency`.

    GPU time becomes a slot-second price: gpu_hour x gpus / 3600 / slots. A batch line
    (router/batch) pays `batch_discount` less, of either kind.
    """

    input_per_mtok: NonNegativeMoney | None = None
    output_per_mtok: NonNegativeMoney | None = None
    gpu_hour: NonNegativeMoney | None = None
    gpus: float | None = Field(default=None, gt=0, le=100_000)
    batch_discount: float = Field(default=0.5, ge=0, le=1)  # OpenAI's and Anthropic's half

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        per_token = (self.input_per_mtok, self.output_per_mtok)
        per_gpu = (self.gpu_hour, self.gpus)
        if any(v is not None for v in per_token) and any(v is not None for v in per_gpu):
            raise ValueError("give per-token prices (input_per_mtok, output_per_mtok) "
                             "or GPU time (gpu_hour, gpus), not both")
        if any(v is not None for v in per_token):
            if None in per_token:
                raise ValueError("per-token pricing needs both input_per_mtok and "
                                 "output_per_mtok")
        elif None in per_gpu:
            raise ValueError("give input_per_mtok and output_per_mtok, "
                             "or gpu_hour and gpus")
        return self


def target_problem(url: object, simulated: object, endpoints: object = None,
                   discover: object = None) -> str | None:
    """A backend is real engines at `url`, `endpoints` or found by `discover`, or an
    in-process simulated one."""
    given = [k for k, v in (("url", url), ("simulated", simulated), ("endpoints", endpoints),
                            ("discover", discover)) if v is not None]
    if len(given) != 1:
        return ("give exactly one of 'url' or 'simulated'" if endpoints is None
                and discover is None and not {"endpoints", "discover"} & set(given) else
                "give exactly one of 'url', 'simulated', 'endpoints' or 'discover'")
    if isinstance(url, HttpUrl) and (url.username or url.password):
        return "no credentials in 'url': put the key in the environment (api_key_env)"
    return None


class EndpointConfig(StrictModel):
    """One engine replica of a backend: where it answers and how many sequences it runs."""

    name: str | None = Field(default=None, pattern=ENDPOINT_NAME)  # default <backend>-<i>
    url: HttpUrl | None = None
    simulated: SimulatedSpec | None = None
    slots: int = Field(ge=1, le=100_000)
    api_key_env: str | None = Field(default=None, pattern=ENV_NAME)  # default: the backend's

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        if problem := target_problem(self.url, self.simulated):
            raise ValueError(problem)
        return self


class AffinityConfig(StrictModel):
    """Prefix affinity: prompts hashed in blocks; a bounded table of block -> replica."""

    block_bytes: int = Field(default=BLOCK_BYTES, ge=16, le=65_536)
    table_size: int = Field(default=100_000, ge=1, le=10_000_000)  # ~130 bytes per entry
    # A replica may run (1 + load_bound) x the group's mean token load before affinity yields.
    load_bound: float = Field(default=EPSILON, ge=0, le=10)
    # A slot freed on a replica may go to one of the first `look_ahead` waiters whose prefix
    # it holds, none passed over more than `max_bypass` times (0: first come, first served;
    # local pools only: a shared Redis line stays FIFO).
    look_ahead: int = Field(default=0, ge=0, le=64)
    max_bypass: int = Field(default=2, ge=0, le=100)


class SignalsConfig(StrictModel):
    """Engine metrics as a soft hint: each replica's Prometheus page read in the background;
    its KV-cache pressure weighs the replica's load in the pick. A stale or failing read is
    ignored; the gateway's own counts always decide who has a free slot."""

    scrape: bool = False
    path: str = Field(default="/metrics", pattern=r"^/[!-~]*$")  # at the engine's origin
    every_s: PositiveSeconds = 5.0
    stale_after_s: PositiveSeconds = 15.0  # an older reading counts as none


class SystemMessages(enum.StrEnum):
    """Where a chat request's system messages reach the engine."""

    KEEP = "keep"  # each at its place in the conversation (most chat templates allow it)
    FOLD = "fold"  # one leading system message: later ones appended to it, in order


class QueueOrder(enum.StrEnum):
    """Who among the waiters of one priority class is served next."""

    FIFO = "fifo"  # first come, first served
    FAIR = "fair"  # the tenant with the least weighted tokens served (FIFO within a tenant)


class BackendConfig(StrictModel):
    url: HttpUrl | None = None
    simulated: SimulatedSpec | None = None
    endpoints: tuple[EndpointConfig, ...] | None = Field(default=None, max_length=256)
    # Its replicas found in DNS or a file, again and again (router/fleet/discovery.py).
    discover: DiscoveryConfig | None = None
    pick: PickMode = PickMode.AFFINITY  # which replica of the group takes a request
    affinity: AffinityConfig = AffinityConfig()
    signals: SignalsConfig = SignalsConfig()
    model: str = Field(min_length=1, max_length=256)
    slots: int = Field(ge=1, le=1_000_000)  # with `endpoints`: their sum, not given
    queue_limit: int = Field(default=0, ge=0, le=100_000)
    queue_timeout_s: PositiveSeconds = 60.0
    queue_order: QueueOrder = QueueOrder.FIFO  # within a priority class
    context_window: int | None = Field(default=None, ge=1)
    # What the model serves beyond plain chat; a request needing one it lacks is never
    # moved here (steering, overflow, failover). Default: all, as before the key existed.
    capabilities: tuple[Capability, ...] = Field(default=tuple(Capability), max_length=16)
    # The client APIs its engines serve natively; a request for another is never sent here.
    # Default: chat and completions (a simulated backend: embeddings too).
    apis: tuple[Api, ...] | None = Field(default=None, min_length=1, max_length=16)
    api_key_env: str | None = Field(default=None, pattern=ENV_NAME)
    connect_timeout_s: PositiveSeconds = 5.0
    first_byte_timeout_s: PositiveSeconds = 60.0
    idle_timeout_s: PositiveSeconds = 60.0
    initial_hold_s: PositiveSeconds = 10.0  # slot holding time assumed before any is measured
    rates: RatesHint | None = None  # the engine's nominal speed, until answers are measured
    breaker_failures: int = Field(default=5, ge=1, le=1000)  # consecutive, to stop using it
    breaker_open_s: PositiveSeconds = 30.0  # then one probe request per period
    # A non-streaming request whose client left: close the upstream connection and free the
    # slot at once ("abort"), or keep the slot and read the answer to its end ("drain", for
    # engines that finish such work anyway). A cut stream is always closed upstream.
    on_disconnect: Literal["abort", "drain"] = "abort"
    # For engines whose chat template takes one system message, at the start only.
    system_messages: SystemMessages = SystemMessages.KEEP
    price: PriceConfig | None = None  # None: the ledger counts this backend as free
    # The desired replica count computed for an autoscaler (None: none computed).
    scaling: BackendScalingConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _group_slots(cls, data: Any) -> Any:
        """With `endpoints`, the backend's slots are theirs, summed; with `discover`, one
        replica's (the group's change as replicas come and go)."""
        if isinstance(data, dict) and isinstance(data.get("discover"), dict):
            if "slots" in data:
                raise ValueError("with 'discover', give 'slots' in it (each replica's)")
            slots = data["discover"].get("slots")
            return {**data, "slots": slots if isinstance(slots, int) and slots >= 1 else 1}
        if not isinstance(data, dict) or data.get("endpoints") is None:
            return data
        if "slots" in data:
            raise ValueError("with 'endpoints', give 'slots' per endpoint (the backend's "
                             "are their sum)")
        endpoints = data["endpoints"]
        counts = [e.get("slots") for e in endpoints if isinstance(e, dict)] \
            if isinstance(endpoints, list | tuple) else []
        valid = [c for c in counts if isinstance(c, int) and c >= 1]
        # An endpoint's bad slots are reported at its own key; the sum stays valid meanwhile.
        return {**data, "slots": max(1, sum(valid))}

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        if problem := target_problem(self.url, self.simulated, self.endpoints,
                                     self.discover):
            raise ValueError(problem)
        if self.endpoints == ():
            raise ValueError("'endpoints' lists no endpoint")
        names = [e.name for e in self.endpoints or () if e.name is not None]
        if len(names) != len(set(names)):
            raise ValueError("endpoint names must be unique within a backend")
        return self

    @field_validator("apis")
    @classmethod
    def _apis_once(cls, apis: tuple[Api, ...] | None) -> tuple[Api, ...] | None:
        if apis is not None and len(apis) != len(set(apis)):
            raise ValueError("each API is listed once")
        return apis

    @property
    def served_apis(self) -> frozenset[Api]:
        """The APIs it serves: as configured, else the default for its kind."""
        if self.apis is not None:
            return frozenset(self.apis)
        simulated = self.simulated is not None or (
            bool(self.endpoints) and all(e.simulated is not None for e in self.endpoints or ()))
        return SIMULATED_APIS if simulated else DEFAULT_APIS

    @property
    def ability(self) -> Ability:
        """What this backend serves, as `policies.scheduler.capabilities` reads it."""
        return Ability(frozenset(self.capabilities), self.context_window, self.served_apis)

    def replicas(self, backend: str) -> tuple[EndpointConfig, ...]:
        """The group's endpoints with their names; `url` or `simulated` alone is a group of
        one named for the backend; `discover`: none before they are found."""
        if self.discover is not None and self.endpoints is None:
            return ()
        if self.endpoints is None:
            return (EndpointConfig(name=backend, url=self.url, simulated=self.simulated,
                                   slots=self.slots, api_key_env=self.api_key_env),)
        return tuple(
            e.model_copy(update={"name": e.name or f"{backend}-{i}",
                                 "api_key_env": e.api_key_env or self.api_key_env})
            for i, e in enumerate(self.endpoints))
