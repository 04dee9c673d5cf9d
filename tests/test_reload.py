"""Config reload: a valid config is swapped in without dropping anything; an invalid one is
refused with its problems and the running config kept."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from router.app import RunningGateway, start_gateway
from router.cli import main
from router.config import load_config
from tests.support import (
    MESSAGES,
    GatewayProcess,
    SdkClients,
    assert_idle,
    engine,
    sim_backend,
    wait_pools,
)


def write(path: Path, slots: int, queue_limit: int = 8, **route: Any) -> None:
    raw = {"backends": {"big": sim_backend("m", slots=slots, queue_limit=queue_limit,
                                           sim={"max_num_seqs": 8, "tokens_per_s": 2000,
                                                "output_tokens": 4})},
           "routes": {"chat": {"primary": "big", "overflow": "reject", **route}},
           "logging": {"access": False}}
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")


async def started(path: Path) -> RunningGateway:
    return await start_gateway(load_config(path), "127.0.0.1", 0, config_path=str(path))


async def post_reload(gw: RunningGateway) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/admin/reload") as resp:
            return resp.status, await resp.json()


async def test_a_valid_config_applies_to_new_admissions(sdk: SdkClients, tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    write(path, slots=1)
    gw = await started(path)
    try:
        sim = engine(gw)
        sim.hold()
        first = asyncio.create_task(sdk(gw).chat.completions.create(model="chat",
                                                                    messages=MESSAGES))
        second = asyncio.create_task(sdk(gw).chat.completions.create(model="chat",
                                                                     messages=MESSAGES))
        await wait_pools(gw, lambda s: s["big"] == (1, 1))
        write(path, slots=2)
        status, body = await post_reload(gw)
        assert (status, body["changes"]) == (200, ["backend big changed"])
        await sim.wait_until(lambda e: e.active == 2)  # the waiter got the new slot
        assert gw.gateway.config.backends["big"].slots == 2
        sim.release()
        assert all(r.choices for r in await asyncio.gather(first, second))
        await assert_idle(gw)
    finally:
        await gw.close()


async def test_an_invalid_config_is_refused_and_the_old_one_kept(
    sdk: SdkClients, tmp_path: Path
) -> None:
    path = tmp_path / "gateway.yaml"
    write(path, slots=1)
    gw = await started(path)
    try:
        before = gw.gateway.config
        path.write_text("backends:\n  big: {model: m, slots: 0}\nroutes: {}\n")
        status, body = await post_reload(gw)
        assert status == 400 and body["error"]["code"] == "reload_refused"
        assert "slots" in body["error"]["message"]
        write(path, slots=1)
        raw = yaml.safe_load(path.read_text())
        raw["server"] = {"port": 1}  # valid, but only a restart can change it
        path.write_text(yaml.safe_dump(raw))
        status, body = await post_reload(gw)
        assert status == 400 and "restart" in body["error"]["message"]
        assert gw.gateway.config is before
        assert (await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)).choices
    finally:
        await gw.close()


async def test_a_changed_backend_and_its_replicas_keep_their_new_breakers(
    tmp_path: Path,
) -> None:
    """The request path counts on the breakers a backend and its group's replicas keep; a
    reload that changes the backend starts them anew, the same ones the health checks and
    the scheduler watch by name."""
    path = tmp_path / "gateway.yaml"
    sim = {"max_num_seqs": 2, "ttft_s": 0, "tokens_per_s": 0, "output_tokens": 4}
    raw: dict[str, Any] = {
        "backends": {"big": {"model": "m", "queue_limit": 4,
                             "endpoints": [{"simulated": sim, "slots": 2}] * 2}},
        "routes": {"chat": {"primary": "big"}}, "logging": {"access": False}}
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    gw = await started(path)
    try:
        backend, health = gw.gateway.backends["big"], gw.gateway.health
        before = [backend.breaker, *(r.breaker for r in backend.replicas.values())]
        raw["backends"]["big"]["queue_limit"] = 8
        path.write_text(yaml.safe_dump(raw), encoding="utf-8")
        assert (await post_reload(gw))[1]["changes"] == ["backend big changed"]
        assert backend.breaker is health.breakers["big"] and backend.breaker is not before[0]
        for replica, old in zip(backend.replicas.values(), before[1:], strict=True):
            assert replica.breaker is not None and replica.breaker is not old
            for _ in range(replica.breaker.failures_to_open):
                replica.breaker.failure()
            assert not gw.gateway.replica_health.healthy("big", replica.name)
        assert health.is_open("big")  # no replica left: the group's own breaker opened
    finally:
        await gw.close()


async def test_twenty_reloads_under_load_fail_no_request(sdk: SdkClients, tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    write(path, slots=2, queue_limit=64)
    gw = await started(path)
    outcomes: list[object] = []
    done = asyncio.Event()

    async def client() -> None:
        while not done.is_set():
            try:
                reply = await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
                outcomes.append(reply.choices[0].finish_reason)
            except Exception as exc:  # any failure is what this test counts
                outcomes.append(exc)

    try:
        clients = [asyncio.create_task(client()) for _ in range(12)]
        for i in range(20):
            write(path, slots=2 + i % 3, queue_limit=64 - i)  # limits move under the load
            status, _ = await post_reload(gw)
            assert status == 200
            count = len(outcomes)
            while len(outcomes) < count + 5:  # some requests complete between reloads
                await gw.gateway.backends["big"].pool.next_change()
        done.set()
        await asyncio.gather(*clients)
        failures = [o for o in outcomes if isinstance(o, Exception)]
        assert not failures and len(outcomes) >= 100, (len(outcomes), failures[:3])
        await assert_idle(gw)
    finally:
        await gw.close()


async def test_sighup_and_the_reload_command(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    write(path, slots=1)
    gateway = await GatewayProcess.start(path)
    try:
        write(path, slots=3)
        gateway.proc.send_signal(signal.SIGHUP)
        await gateway.said(b"config reloaded: backend big changed")
        path.write_text("routes: {}\n")
        code = await asyncio.to_thread(main, ["reload", "--url", gateway.url])
        assert code == 1  # refused: the running config is kept
        gateway.proc.send_signal(signal.SIGHUP)
        await gateway.said(b"config reload refused")
        assert (await gateway.client().chat.completions.create(
            model="chat", messages=MESSAGES)).choices
        write(path, slots=2)
        assert await asyncio.to_thread(main, ["reload", "--url", gateway.url]) == 0
    finally:
        assert await gateway.stop() == 0
