"""A group found in a file of URLs (#34): a line added serves once its engine passes the
health check, a drained replica stays out while the file still lists it, and one that
leaves the file and comes back (a pod made anew under its name) serves again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from policies.config import SimulatedSpec
from router.app import RunningGateway
from router.upstream.simulated.app import RunningSim, start_simulator
from tests.support import MESSAGES, SdkClients, StartGateway, assert_idle, poll_until

SPEC = SimulatedSpec(max_num_seqs=2, ttft_s=0, tokens_per_s=0, output_tokens=4)


@pytest.fixture
async def sims() -> AsyncIterator[list[RunningSim]]:
    running = [await start_simulator(SPEC, "m") for _ in range(2)]
    yield running
    for sim in running:
        await sim.close()


def ready(gw: RunningGateway) -> set[str]:
    return {s.name for s in gw.gateway.backends["big"].pool.seats() if s.healthy and s.slots}


async def refreshed(gw: RunningGateway, looks: int = 2) -> None:
    """Until discovery has looked at the file `looks` more times."""
    discovery = gw.gateway.discovery
    assert discovery is not None
    for _ in range(looks):
        await discovery.refreshed.wait()


async def test_a_file_of_urls_drives_the_group(
        tmp_path: Path, sims: list[RunningSim], start: StartGateway, sdk: SdkClients,
        http: aiohttp.ClientSession) -> None:
    urls = tmp_path / "replicas"
    lines = [f"{sim.url}/v1 e{i}" for i, sim in enumerate(sims)]
    urls.write_text(lines[0] + "\n")
    gw = await start({"backends": {"big": {"model": "m", "queue_limit": 8, "discover": {
        "file": str(urls), "slots": 2, "refresh_s": 0.05, "check_s": 0.05}}},
        "routes": {"chat": {"primary": "big", "overflow": "reject"}}})
    await poll_until(lambda: ready(gw) == {"e0"})
    urls.write_text("\n".join(lines) + "\n")
    await poll_until(lambda: ready(gw) == {"e0", "e1"})
    async with http.post(f"{gw.url}/admin/replicas/e0/drain") as resp:
        assert resp.status == 200
    await refreshed(gw)
    assert ready(gw) == {"e1"}  # listed still, drained all the same
    client = sdk(gw)
    for _ in range(4):
        await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert len(sims[0].engine.records) == 0 and len(sims[1].engine.records) == 4
    urls.write_text(lines[1] + "\n")  # the drained one goes
    await poll_until(lambda: not gw.gateway.backends["big"].drained)
    urls.write_text("\n".join(lines) + "\n")  # and comes back under its name
    await poll_until(lambda: ready(gw) == {"e0", "e1"})
    await assert_idle(gw)
