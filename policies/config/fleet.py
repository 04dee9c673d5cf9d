"""A backend's `scaling` and `discover` sections and the `fleet` section: the desired
replica count the gateway computes for an autoscaler (policies/fleet/desired.py), and a
group's replicas found in DNS or a file, with the warm-up of a group that has none ready
(router/fleet/discovery.py). Pure data and validation."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, HttpUrl, model_validator

from policies.config.base import PositiveSeconds, StrictModel

HOSTNAME = r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_-]{1,63})*\.?$"


class BackendScalingConfig(StrictModel):
    floor: int = Field(default=1, ge=0, le=10_000)  # 0: the backend may scale to zero
    ceiling: int = Field(default=8, ge=1, le=10_000)
    # Of a replica's slots the arriving work may fill on average (headroom for bursts).
    utilization: float = Field(default=0.8, gt=0, le=1)
    # A smaller count is asked for only after this long of wanting no more.
    cooldown_s: float = Field(default=300.0, ge=0, le=86_400)

    @model_validator(mode="after")
    def _floor_below_ceiling(self) -> Self:
        if self.floor > self.ceiling:
            raise ValueError(f"floor ({self.floor}) is above ceiling ({self.ceiling})")
        return self


class FleetConfig(StrictModel):
    refresh_s: float = Field(default=15.0, gt=0, le=3600)  # how often the counts are computed


class DiscoveryConfig(StrictModel):
    """A group's replicas, found again every `refresh_s`: each address of a DNS name (a
    headless Service's A/AAAA records, or SRV records with their ports), or each line of a
    file of URLs. A replica found is health-checked (GET /v1/models) every `check_s`
    until it answers, and only then given slots; one no longer found takes no new work
    and runs out what it holds. While none is ready the group is cold: its line keeps
    admitting, with an ETA of `warmup_s`, wakes `wake_url` (once per cold spell), and
    its waiters are answered 503 only after `warmup_timeout_s`."""

    dns: str | None = Field(default=None, max_length=253, pattern=HOSTNAME)
    file: str | None = Field(default=None, min_length=1, max_length=4096)
    record: Literal["A", "AAAA", "SRV"] = "A"
    port: int = Field(default=8000, ge=1, le=65_535)  # A/AAAA: the engines' port
    scheme: Literal["http", "https"] = "http"
    path: str = Field(default="/v1", pattern=r"^/[!-~]*$")  # the OpenAI base path
    # "127.0.0.1" or "127.0.0.1:5353" ([::1]:53 for IPv6); none: the system's resolver
    nameservers: tuple[str, ...] = Field(default=(), max_length=8)
    slots: int = Field(ge=1, le=100_000)  # each replica's
    max_replicas: int = Field(default=256, ge=1, le=4096)  # more found: the first kept
    refresh_s: PositiveSeconds = 10.0
    check_s: PositiveSeconds = 1.0  # a replica found is checked this often until ready
    warmup_s: float = Field(default=60.0, ge=0, le=86_400)  # a replica's expected start
    warmup_timeout_s: PositiveSeconds = 300.0  # a cold group's waiters give up after it
    wake_url: HttpUrl | None = None  # POSTed once per cold spell: {"backend", "queued"}

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.dns is None) == (self.file is None):
            raise ValueError("give exactly one of 'dns' or 'file'")
        for server in self.nameservers:
            if not _nameserver_ok(server):
                raise ValueError(f"nameserver {server!r} is not an IP address, "
                                 "IP:port or [IPv6]:port")
        if self.warmup_timeout_s < self.warmup_s:
            raise ValueError(f"warmup_timeout_s ({self.warmup_timeout_s}) is below "
                             f"warmup_s ({self.warmup_s})")
        return self


def _nameserver_ok(server: str) -> bool:
    import ipaddress

    host, port = split_nameserver(server)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return 1 <= port <= 65_535


def split_nameserver(server: str) -> tuple[str, int]:
    """("127.0.0.1", 5353) of "127.0.0.1:5353"; port 53 when none is given."""
    if server.startswith("["):
        host, _, port = server[1:].partition("]:")
        return host, int(port) if port.isdigit() else -1
    if server.count(":") == 1:
        host, _, port = server.partition(":")
        return host, int(port) if port.isdigit() else -1
    return server, 53
