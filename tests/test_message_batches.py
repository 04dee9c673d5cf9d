"""Anthropic's Message Batches API through the gateway with the official SDK: a batch's
requests run through the live /v1/messages endpoint and come back as results in the
requests' order (succeeded, errored, canceled, expired); the requests are checked whole at
creation; an interactive request takes a running request's slot; cancel, list pages,
delete; each tenant sees only its own batches."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from router.app import RunningGateway
from tests.support import SdkClients, StartGateway, assert_idle, engine
from tests.support.batch_jobs import KEYS, config

Claude = Callable[..., anthropic.AsyncAnthropic]


def request(custom_id: str, **params: Any) -> Any:
    params = {"model": "chat", "max_tokens": 4,
              "messages": [{"role": "user", "content": f"hi {custom_id}"}], **params}
    return {"custom_id": custom_id, "params": params}


async def ended(client: anthropic.AsyncAnthropic, batch_id: str, within_s: float = 20) -> Any:
    """The batch once it has ended (the API offers no signal; a client polls it too)."""
    async with asyncio.timeout(within_s):
        while True:
            batch = await client.messages.batches.retrieve(batch_id)
            if batch.processing_status == "ended":
                return batch
            await asyncio.sleep(0.02)


async def results(client: anthropic.AsyncAnthropic, batch_id: str) -> list[Any]:
    return [line async for line in await client.messages.batches.results(batch_id)]


def counts(batch: Any) -> tuple[int, int, int, int, int]:
    c = batch.request_counts
    return c.processing, c.succeeded, c.errored, c.canceled, c.expired


async def test_a_batch_runs_and_its_results_keep_the_requests_order(
        claude: Claude, start: StartGateway, tmp_path: Path) -> None:
    gw = await start(config(tmp_path))
    alice = claude(gw, api_key=KEYS["alice"])
    batch = await alice.messages.batches.create(
        requests=[request(f"q{i}") for i in range(5)])
    assert batch.id.startswith("msgbatch_") and batch.type == "message_batch"
    assert batch.processing_status == "in_progress" and batch.ended_at is None
    assert sum(counts(batch)) == 5 and batch.results_url is None
    assert batch.expires_at > batch.created_at
    done = await ended(alice, batch.id)
    assert counts(done) == (0, 5, 0, 0, 0)
    assert done.ended_at is not None and done.results_url is not None
    lines = await results(alice, batch.id)
    assert [line.custom_id for line in lines] == [f"q{i}" for i in range(5)]
    for line in lines:
        assert line.result.type == "succeeded"
        assert line.result.message.type == "message" and line.result.message.model == "chat"
        assert line.result.message.content[0].type == "text"
    assert engine(gw).stats()["requests"] == 5
    assert [b.id async for b in alice.messages.batches.list()] == [batch.id]
    await assert_idle(gw)


async def test_a_request_the_engine_refuses_comes_back_errored(
        claude: Claude, start: StartGateway, tmp_path: Path) -> None:
    gw = await start(config(tmp_path, max_model_len=256))
    alice = claude(gw, api_key=KEYS["alice"])
    batch = await alice.messages.batches.create(requests=[
        request("fits"), request("too-long", max_tokens=4096), request("fits-too")])
    done = await ended(alice, batch.id)
    assert counts(done) == (0, 2, 1, 0, 0)
    lines = await results(alice, batch.id)
    assert [(x.custom_id, x.result.type) for x in lines] == [
        ("fits", "succeeded"), ("too-long", "errored"), ("fits-too", "succeeded")]
    error = lines[1].result.error
    assert error.type == "error" and error.error.type == "invalid_request_error"
    assert error.error.message
    await assert_idle(gw)


@pytest.mark.parametrize(("requests", "says"), [
    ([request("a b")], "requests[0].custom_id: 1 to 64 letters"),
    ([request("x" * 65)], "requests[0].custom_id: 1 to 64 letters"),
    ([request("a"), request("a")], "requests[1].custom_id: 'a' is used more than once"),
    ([request("a"), request("b", stream=True)], "requests[1].params.stream: streaming"),
    ([request("a", model="nope")], "the model 'nope' does not exist"),
    ([request("a"), request("b", model="other")],
     "requests[1].params.model: 'other' differs from requests[0]'s 'chat'"),
    ([request("a", messages=[])], "requests[0].params: "),
    ([request("a", max_tokens="many")], "requests[0].params: "),
    ([{"custom_id": "a"}], "requests[0].params: a Messages request object"),
    ([], "requests: a list of one or more"),
])
async def test_the_requests_are_checked_whole_at_creation(
        claude: Claude, start: StartGateway, tmp_path: Path, requests: list[Any],
        says: str) -> None:
    raw = config(tmp_path)
    raw["routes"]["other"] = {"primary": "big"}
    gw = await start(raw)
    alice = claude(gw, api_key=KEYS["alice"])
    with pytest.raises(anthropic.BadRequestError) as refused:
        await alice.messages.batches.create(requests=requests)
    body = refused.value.body
    assert body["type"] == "error"  # type: ignore[index]
    assert body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert says in body["error"]["message"]  # type: ignore[index]
    assert [b async for b in alice.messages.batches.list()] == []
    assert engine(gw).stats()["requests"] == 0


async def test_a_body_that_is_not_a_batch_is_refused_in_anthropics_shape(
        claude: Claude, start: StartGateway, tmp_path: Path) -> None:
    gw = await start(config(tmp_path))
    url = gw.url + "/v1/messages/batches"
    async with aiohttp.ClientSession(headers={"x-api-key": KEYS["alice"]}) as http:
        for body in (b"{", b"[1]", b'{"requests": "all"}'):
            async with http.post(url, data=body) as resp:
                assert resp.status == 400
                answer = await resp.json()
            assert answer["type"] == "error"
            assert answer["error"]["type"] == "invalid_request_error"
        async with http.get(url, headers={"x-api-key": "sk-wrong"}) as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["type"] == "authentication_error"
        async with http.get(url + "/msgbatch_nope/results") as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["type"] == "not_found_error"


async def test_a_canceled_batch_runs_no_more_requests(
        claude: Claude, start: StartGateway, tmp_path: Path) -> None:
    gw: RunningGateway = await start(config(tmp_path, slots=1))
    alice = claude(gw, api_key=KEYS["alice"])
    sim = engine(gw)
    sim.hold()
    batch = await alice.messages.batches.create(
        requests=[request(f"q{i}") for i in range(4)])
    await sim.wait_until(lambda e: e.active == 1)  # the first request runs
    with pytest.raises(anthropic.BadRequestError):  # still processing
        await alice.messages.batches.delete(batch.id)
    canceling = await alice.messages.batches.cancel(batch.id)
    assert canceling.processing_status == "canceling"
    assert canceling.cancel_initiated_at is not None
    again = await alice.messages.batches.cancel(batch.id)
    assert again.processing_status in ("canceling", "ended")
    sim.release()
    done = await ended(alice, batch.id)
    assert counts(done) == (0, 1, 0, 3, 0)
    lines = await results(alice, batch.id)
    assert [(x.custom_id, x.result.type) for x in lines] == [
        ("q0", "succeeded"), ("q1", "canceled"), ("q2", "canceled"), ("q3", "canceled")]
    assert sim.stats()["requests"] == 1  # the other three never ran
    with pytest.raises(anthropic.BadRequestError):  # ended: nothing left to cancel
        await alice.messages.batches.cancel(batch.id)
    await assert_idle(gw)


async def test_a_batch_past_its_window_ends_with_its_other_requests_expired(
        claude: Claude, start: StartGateway, tmp_path: Path) -> None:
    gw: RunningGateway = await start(config(tmp_path, slots=1))
    alice = claude(gw, api_key=KEYS["alice"])
    sim = engine(gw)
    sim.hold()
    batch = await alice.messages.batches.create(requests=[request(f"q{i}") for i in range(3)])
    await sim.wait_until(lambda e: e.active == 1)  # the first request runs
    jobs = gw.gateway.jobs
    assert jobs is not None
    await jobs.store.run("UPDATE batches SET expires_at = 0 WHERE id = ?", (batch.id,))
    jobs.changed.set()  # (its window passed: the look the runner takes every poll_s, now)
    sim.release()
    done = await ended(alice, batch.id)
    assert counts(done) == (0, 1, 0, 0, 2)
    assert [(x.custom_id, x.result.type) for x in await results(alice, batch.id)] == [
        ("q0", "succeeded"), ("q1", "expired"), ("q2", "expired")]
    assert sim.stats()["requests"] == 1
    await assert_idle(gw)


async def test_an_interactive_request_takes_a_batch_requests_slot(
        claude: Claude, start: StartGateway, tmp_path: Path) -> None:
    gw: RunningGateway = await start(config(tmp_path, slots=1))
    alice = claude(gw, api_key=KEYS["alice"])
    sim = engine(gw)
    sim.hold()
    batch = await alice.messages.batches.create(requests=[request("q0"), request("q1")])
    await sim.wait_until(lambda e: e.active == 1)  # the first request holds the only slot
    asked = asyncio.create_task(alice.messages.create(
        model="chat", max_tokens=4, messages=[{"role": "user", "content": "now"}]))
    # the batch's request is cut (its engine request aborted) and the interactive one runs
    await sim.wait_until(lambda e: e.stats()["aborted"] == 1 and e.active == 1)
    assert gw.gateway.batch_lines.preempted == 1
    sim.release()
    assert (await asked).content[0].type == "text"
    done = await ended(alice, batch.id)
    assert counts(done) == (0, 2, 0, 0, 0)  # the cut request ran again, whole
    assert [(x.custom_id, x.result.type) for x in await results(alice, batch.id)] == [
        ("q0", "succeeded"), ("q1", "succeeded")]
    await assert_idle(gw)


async def test_batches_are_listed_newest_first_in_pages(
        claude: Claude, sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    gw = await start(config(tmp_path))
    alice = claude(gw, api_key=KEYS["alice"])
    made = [(await alice.messages.batches.create(
        requests=[request(f"b{i}")])).id for i in range(3)]
    newest = made[::-1]
    assert [b.id async for b in alice.messages.batches.list(limit=2)] == newest  # 2 pages
    first = await alice.messages.batches.list(limit=2)
    assert ([b.id for b in first.data], first.has_more) == (newest[:2], True)
    assert (first.first_id, first.last_id) == (newest[0], newest[1])
    rest = await alice.messages.batches.list(limit=2, after_id=newest[1])
    assert ([b.id for b in rest.data], rest.has_more) == (newest[2:], False)
    before = await alice.messages.batches.list(limit=1, before_id=newest[2])
    assert ([b.id for b in before.data], before.has_more) == ([newest[1]], True)
    before = await alice.messages.batches.list(limit=5, before_id=newest[2])
    assert ([b.id for b in before.data], before.has_more) == (newest[:2], False)
    with pytest.raises(anthropic.BadRequestError):
        await alice.messages.batches.list(limit=1001)
    # OpenAI's Batches API lists OpenAI's jobs only
    assert [b async for b in sdk(gw, api_key=KEYS["alice"]).batches.list()] == []
    for batch_id in made:
        await ended(alice, batch_id)
    await assert_idle(gw)


async def test_an_ended_batch_is_deleted_with_its_results(
        claude: Claude, sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    gw = await start(config(tmp_path))
    alice = claude(gw, api_key=KEYS["alice"])
    batch = await alice.messages.batches.create(requests=[request("a")])
    await ended(alice, batch.id)
    files = sdk(gw, api_key=KEYS["alice"]).files
    assert [f.filename async for f in files.list()] == [f"{batch.id}_results.jsonl"]
    deleted = await alice.messages.batches.delete(batch.id)
    assert (deleted.id, deleted.type) == (batch.id, "message_batch_deleted")
    for call in (alice.messages.batches.retrieve(batch.id),
                 alice.messages.batches.delete(batch.id)):
        with pytest.raises(anthropic.NotFoundError):
            await call
    assert [b async for b in alice.messages.batches.list()] == []
    assert [f async for f in files.list()] == []
    await assert_idle(gw)


async def test_a_tenant_sees_only_its_own_batches(
        claude: Claude, sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    gw = await start(config(tmp_path))
    alice, bob = claude(gw, api_key=KEYS["alice"]), claude(gw, api_key=KEYS["bob"])
    batch = await alice.messages.batches.create(requests=[request("a")])
    await ended(alice, batch.id)
    for call in (bob.messages.batches.retrieve(batch.id), bob.messages.batches.cancel(batch.id),
                 bob.messages.batches.delete(batch.id),
                 bob.get(f"/v1/messages/batches/{batch.id}/results", cast_to=object)):
        with pytest.raises(anthropic.NotFoundError) as refused:
            await call
        assert refused.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert [b async for b in bob.messages.batches.list()] == []
    with pytest.raises(anthropic.NotFoundError):  # another tenant's batch as a page mark
        await bob.messages.batches.list(after_id=batch.id)
    # an OpenAI job's id is no Message Batch's
    made = await sdk(gw, api_key=KEYS["alice"]).files.create(file=("in.jsonl", orjson.dumps(
        {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {
            "model": "chat", "messages": [{"role": "user", "content": "hi"}]}})),
        purpose="batch")
    job = await sdk(gw, api_key=KEYS["alice"]).batches.create(
        input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(anthropic.NotFoundError):
        await alice.messages.batches.retrieve(job.id)
    assert [b.id async for b in alice.messages.batches.list()] == [batch.id]
    async with asyncio.timeout(20):  # (the OpenAI job ends before the gateway is checked)
        while True:
            if (await sdk(gw, api_key=KEYS["alice"]).batches.retrieve(job.id)).status == (
                    "completed"):
                break
            await asyncio.sleep(0.02)
    await assert_idle(gw)
