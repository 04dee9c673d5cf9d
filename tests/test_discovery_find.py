"""Finding a group's replicas (router/fleet/discovery.py): A, AAAA and SRV records from a
DNS server on loopback, a file of URLs, and what a failed lookup, an empty answer or a bad
line give; the `discover` config's checks; a cold group's warm-up (policies/fleet/warmup)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from policies.config import BackendConfig
from policies.config.fleet import DiscoveryConfig
from policies.fleet.warmup import Warmup, cold_line
from router.fleet.discovery import Found, find
from tests.support.dns_zone import Zone, serving


@pytest.fixture
async def zone() -> AsyncIterator[Zone]:
    with serving(Zone()) as served:
        yield served


def by_dns(zone: Zone, **more: Any) -> DiscoveryConfig:
    return DiscoveryConfig(dns="llm.test", nameservers=(zone.nameserver,), slots=4, **more)


async def test_a_records_at_the_port(zone: Zone) -> None:
    zone.set_a("llm.test", "10.0.0.7", "10.0.0.5")
    assert await find(by_dns(zone, port=9000)) == [
        Found("10.0.0.5", "http://10.0.0.5:9000/v1"), Found("10.0.0.7", "http://10.0.0.7:9000/v1")]


async def test_aaaa_records_are_bracketed(zone: Zone) -> None:
    zone.set_aaaa("llm.test", "fd00::5")
    assert await find(by_dns(zone, record="AAAA", scheme="https", path="/api/v1/")) == [
        Found("fd00--5", "https://[fd00::5]:8000/api/v1")]


async def test_srv_records_give_each_replica_its_port_and_name(zone: Zone) -> None:
    zone.set_srv("llm.test", ("vllm-1.llm.test", 8001), ("vllm-0.llm.test", 8000))
    zone.set_a("vllm-0.llm.test", "10.0.0.1")
    zone.set_a("vllm-1.llm.test", "10.0.0.2")
    assert await find(by_dns(zone, record="SRV")) == [
        Found("vllm-0", "http://10.0.0.1:8000/v1"), Found("vllm-1", "http://10.0.0.2:8001/v1")]


async def test_no_address_is_a_group_of_none_and_a_failure_keeps_what_was_found(
        zone: Zone) -> None:
    assert await find(by_dns(zone)) == []  # NXDOMAIN: scaled to zero
    zone.set_a("other.test", "10.0.0.1")
    zone.set_a("llm.test", "10.0.0.1")
    zone.failing = True
    assert await find(by_dns(zone)) is None  # SERVFAIL: keep the replicas found before


async def test_at_most_max_replicas(zone: Zone) -> None:
    zone.set_a("llm.test", *(f"10.0.0.{i}" for i in range(1, 6)))
    found = await find(by_dns(zone, max_replicas=3))
    assert found is not None and [f.name for f in found] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


async def test_a_file_of_urls(tmp_path: Path) -> None:
    urls = tmp_path / "urls"
    urls.write_text("# the fleet\n"
                    "http://10.0.0.1:8000/v1 gpu-0\n"
                    "  https://engine.example:8443/v1/   # a comment\n"
                    "\n"
                    "ftp://10.0.0.3/v1\n"  # not http(s): skipped
                    "http://user:secret@10.0.0.4/v1\n"  # credentials: skipped
                    "http://10.0.0.5:8000/v1 bad/name\n"  # not a name: skipped
                    "http://10.0.0.6:8000/v1 gpu-0\n")  # a name taken: the first kept
    config = DiscoveryConfig(file=str(urls), slots=2)
    assert await find(config) == [Found("gpu-0", "http://10.0.0.1:8000/v1"),
                                  Found("engine.example-8443", "https://engine.example:8443/v1")]
    urls.write_text("")
    assert await find(config) == []  # an empty file: scaled to zero
    urls.unlink()
    assert await find(config) is None  # unreadable: keep what was found


@pytest.mark.parametrize(("discover", "problem"), [
    ({"slots": 4}, "exactly one of 'dns' or 'file'"),
    ({"dns": "a.test", "file": "/x", "slots": 4}, "exactly one of 'dns' or 'file'"),
    ({"dns": "a.test", "slots": 4, "nameservers": ["resolver"]}, "nameserver 'resolver'"),
    ({"dns": "a.test", "slots": 4, "warmup_s": 90, "warmup_timeout_s": 30},
     "below warmup_s"),
    ({"dns": "not a host", "slots": 4}, "should match pattern"),
    ({"dns": "a.test"}, "slots"),
])
def test_bad_discover_sections_are_refused(discover: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        BackendConfig.model_validate({"model": "m", "discover": discover})


def test_a_discovered_backend_is_one_kind_and_its_slots_are_one_replicas() -> None:
    with pytest.raises(ValidationError, match="'endpoints' or 'discover'"):
        BackendConfig.model_validate({"model": "m", "discover": {"dns": "a.test", "slots": 4},
                                      "url": "http://a/v1"})
    with pytest.raises(ValidationError, match="give 'slots' in it"):
        BackendConfig.model_validate({"model": "m", "discover": {"dns": "a.test", "slots": 4},
                                      "slots": 8})
    backend = BackendConfig.model_validate({"model": "m",
                                            "discover": {"dns": "a.test", "slots": 4}})
    assert backend.slots == 4 and backend.replicas("b") == ()


def test_a_cold_groups_warm_up() -> None:
    warmup = Warmup(warmup_s=30, timeout_s=120, slots=4)
    assert warmup.left_s(100.0) == 30  # not woken: all of it
    assert warmup.wake(100.0) and not warmup.wake(101.0)  # once per cold spell
    assert warmup.left_s(110.0) == 20 and warmup.left_s(200.0) == 0
    assert cold_line(0, warmup, 110.0) == (4, 20)  # one replica's line, after the warm-up
    assert cold_line(8, warmup, 110.0) == (8, 0)  # warm: as it is
    assert cold_line(0, None, 110.0) == (0, 0)
    warmup.warmed()
    assert warmup.wake(300.0)  # the next cold spell wakes anew
