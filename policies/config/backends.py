"""The `backends` section: one engine (or a simulated one), its slots, timeouts and price.

Pure data and validation: no YAML, no files, no environment lookups.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, HttpUrl, model_validator

from policies.config.base import PositiveSeconds, StrictModel


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


NonNegativeMoney = Annotated[float, Field(ge=0, le=1_000_000)]


class PriceConfig(StrictModel):
    """Per token (hosted APIs) or per GPU time (self-hosted engines), in `Config.currency`.

    GPU time becomes a slot-second price: gpu_hour x gpus / 3600 / slots.
    """

    input_per_mtok: NonNegativeMoney | None = None
    output_per_mtok: NonNegativeMoney | None = None
    gpu_hour: NonNegativeMoney | None = None
    gpus: float | None = Field(default=None, gt=0, le=100_000)

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


def target_problem(url: object, simulated: object) -> str | None:
    """A backend is either a real engine at `url` or an in-process simulated one."""
    if (url is None) == (simulated is None):
        return "give exactly one of 'url' or 'simulated'"
    if isinstance(url, HttpUrl) and (url.username or url.password):
        return "no credentials in 'url': put the key in the environment (api_key_env)"
    return None


class BackendConfig(StrictModel):
    url: HttpUrl | None = None
    simulated: SimulatedSpec | None = None
    model: str = Field(min_length=1, max_length=256)
    slots: int = Field(ge=1, le=100_000)
    queue_limit: int = Field(default=0, ge=0, le=100_000)
    queue_timeout_s: PositiveSeconds = 60.0
    context_window: int | None = Field(default=None, ge=1)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    connect_timeout_s: PositiveSeconds = 5.0
    first_byte_timeout_s: PositiveSeconds = 60.0
    idle_timeout_s: PositiveSeconds = 60.0
    initial_hold_s: PositiveSeconds = 10.0  # slot holding time assumed before any is measured
    breaker_failures: int = Field(default=5, ge=1, le=1000)  # consecutive, to stop using it
    breaker_open_s: PositiveSeconds = 30.0  # then one probe request per period
    # A non-streaming request whose client left: close the upstream connection and free the
    # slot at once ("abort"), or keep the slot and read the answer to its end ("drain", for
    # engines that finish such work anyway). A cut stream is always closed upstream.
    on_disconnect: Literal["abort", "drain"] = "abort"
    price: PriceConfig | None = None  # None: the ledger counts this backend as free

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        if problem := target_problem(self.url, self.simulated):
            raise ValueError(problem)
        return self
