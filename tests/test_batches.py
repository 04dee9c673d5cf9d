"""OpenAI's Batches API through the gateway with the official SDK: a job's lines run in
the primary's free slots through the live request path, its output in the input's order;
the input checked whole at creation; cancel; each tenant sees only its own jobs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import orjson
import pytest
from prometheus_client import generate_latest

from router.app import RunningGateway
from tests.support import SdkClients, StartGateway, assert_idle, engine, sim_backend
from tests.support.batch_jobs import KEYS, config, ended, jsonl, line, submit


async def unrun(client: openai.AsyncOpenAI, error_file_id: str | None) -> list[tuple[str, str]]:
    """(custom_id, error code) of each line of an error file, checked to be in OpenAI's
    form for a request that never ran."""
    assert error_file_id is not None
    lines = [orjson.loads(x) for x in (await client.files.content(error_file_id)).read(
        ).splitlines()]
    assert all(x["id"].startswith("batch_req_") and x["response"] is None
               and x["error"]["message"] for x in lines)
    return [(x["custom_id"], x["error"]["code"]) for x in lines]


async def test_a_batch_runs_and_its_output_keeps_the_input_order(
        sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    gw = await start(config(tmp_path))
    alice = sdk(gw, api_key=KEYS["alice"])
    job = await submit(alice, jsonl(*(line(f"q{i}") for i in range(5))),
                       metadata={"run": "nightly"})
    assert (job.object, job.status, job.metadata) == ("batch", "in_progress",
                                                      {"run": "nightly"})
    done = await ended(alice, job.id)
    assert done.status == "completed" and done.error_file_id is None
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (5, 5, 0)
    output = (await alice.files.content(done.output_file_id)).read().splitlines()
    results = [orjson.loads(x) for x in output]
    assert [r["custom_id"] for r in results] == [f"q{i}" for i in range(5)]
    assert all(r["response"]["status_code"] == 200 and r["error"] is None
               and r["response"]["body"]["object"] == "chat.completion" for r in results)
    assert engine(gw).stats()["requests"] == 5
    listed = [b.id async for b in alice.batches.list()]
    assert listed == [job.id]
    await assert_idle(gw)


async def test_a_tenant_sees_only_its_own_batches(sdk: SdkClients, start: StartGateway,
                                                  tmp_path: Path) -> None:
    gw = await start(config(tmp_path))
    alice, bob = sdk(gw, api_key=KEYS["alice"]), sdk(gw, api_key=KEYS["bob"])
    job = await submit(alice, jsonl(line("a")))
    for call in (bob.batches.retrieve(job.id), bob.batches.cancel(job.id)):
        with pytest.raises(openai.NotFoundError):
            await call
    assert [b async for b in bob.batches.list()] == []
    mine = await alice.files.create(file=("in.jsonl", jsonl(line("b"))), purpose="batch")
    with pytest.raises(openai.NotFoundError):  # another tenant's input file
        await bob.batches.create(input_file_id=mine.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")
    await ended(alice, job.id)
    await assert_idle(gw)


@pytest.mark.parametrize(("content", "says"), [
    (jsonl(line("a"), line("b", url="/v1/embeddings")), "Line 2 of the input file: its url"),
    (jsonl(line("a"), line("b", model="other")), "Line 2 of the input file: its model"),
    (jsonl(line("a", model="nope")), "the model 'nope' does not exist"),
    (jsonl(line("a", stream=True)), "'stream' is not available"),
    (jsonl(line("a", messages=[])), "Line 1 of the input file: "),
])
async def test_the_input_is_checked_whole_at_creation(
        sdk: SdkClients, start: StartGateway, tmp_path: Path, content: bytes,
        says: str) -> None:
    gw = await start(config(tmp_path))
    alice = sdk(gw, api_key=KEYS["alice"])
    with pytest.raises(openai.BadRequestError) as refused:
        await submit(alice, content)
    assert says in refused.value.body["message"]  # type: ignore[index]
    assert refused.value.body["code"] == "invalid_batch_input"  # type: ignore[index]
    assert [b async for b in alice.batches.list()] == []
    assert engine(gw).stats()["requests"] == 0


async def test_bad_requests_are_refused(sdk: SdkClients, start: StartGateway,
                                        tmp_path: Path) -> None:
    gw = await start(config(tmp_path))
    alice = sdk(gw, api_key=KEYS["alice"])
    made = await alice.files.create(file=("in.jsonl", jsonl(line("a"))), purpose="batch")
    for kwargs, param in (({"endpoint": "/v1/images", "completion_window": "24h"},
                           "endpoint"),
                          ({"endpoint": "/v1/chat/completions", "completion_window": "1h"},
                           "completion_window"),
                          ({"endpoint": "/v1/chat/completions", "completion_window": "24h",
                            "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata")):
        with pytest.raises(openai.BadRequestError) as refused:
            await alice.batches.create(input_file_id=made.id, **kwargs)
        assert refused.value.body["param"] == param  # type: ignore[index]


async def test_a_cancelled_batch_runs_no_more_lines(sdk: SdkClients, start: StartGateway,
                                                   tmp_path: Path) -> None:
    gw: RunningGateway = await start(config(tmp_path, slots=1))
    alice = sdk(gw, api_key=KEYS["alice"])
    sim = engine(gw)
    sim.hold()
    job = await submit(alice, jsonl(*(line(f"q{i}") for i in range(4))))
    await sim.wait_until(lambda e: e.active == 1)  # the first line runs
    cancelling = await alice.batches.cancel(job.id)
    assert cancelling.status == "cancelling"
    sim.release()
    done = await ended(alice, job.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    # the three that never ran are in the error file, in the input's order
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 3)
    assert sim.stats()["requests"] == 1  # the other three never ran
    assert await unrun(alice, done.error_file_id) == [
        (f"q{i}", "batch_cancelled") for i in (1, 2, 3)]
    with pytest.raises(openai.ConflictError):
        await alice.batches.cancel(job.id)
    await assert_idle(gw)


async def test_an_interactive_request_takes_a_batch_lines_slot(
        sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    gw: RunningGateway = await start(config(tmp_path, slots=1))
    alice = sdk(gw, api_key=KEYS["alice"])
    sim = engine(gw)
    sim.hold()
    job = await submit(alice, jsonl(*(line(f"q{i}") for i in range(3))))
    await sim.wait_until(lambda e: e.active == 1)  # the first line holds the only slot
    asked = asyncio.create_task(alice.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "now"}], max_tokens=4))
    # the line is cut (its engine request aborted) and the interactive request runs
    await sim.wait_until(lambda e: e.stats()["aborted"] == 1 and e.active == 1)
    assert gw.gateway.batch_lines.preempted == 1
    sim.release()
    answer = await asked
    assert answer.choices[0].message.content
    done = await ended(alice, job.id)
    assert (done.status, done.request_counts.completed, done.request_counts.failed) == (
        "completed", 3, 0)
    output = (await alice.files.content(done.output_file_id)).read().splitlines()
    assert [orjson.loads(x)["custom_id"] for x in output] == ["q0", "q1", "q2"]
    # the three lines and the interactive request (the cut line's record, kept by its
    # request id, is its second run's)
    assert sim.stats()["completed"] == 4
    scraped = generate_latest(gw.gateway.metrics.registry).decode()
    for series in ('slotgate_batch_preemptions_total{backend="big"} 1.0',
                   'slotgate_batch_lines_total{backend="big",outcome="done"} 3.0',
                   'slotgate_batch_lines_total{backend="big",outcome="requeued"} 1.0',
                   'slotgate_batch_lines_running{backend="big"} 0.0'):
        assert series in scraped
    await assert_idle(gw)


async def test_the_classifier_never_moves_a_batch_line(sdk: SdkClients, start: StartGateway,
                                                       tmp_path: Path) -> None:
    raw = config(tmp_path)
    raw["backends"]["small"] = sim_backend("small", slots=2, queue_limit=4)
    raw["routes"]["chat"] |= {"fallbacks": ["small"], "overflow": "fallback",
                              "fallback": {"when": "always", "min_confidence": 0.0}}
    gw = await start(raw)
    alice = sdk(gw, api_key=KEYS["alice"])
    asked = await alice.chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": "hi q0"}], max_tokens=4)
    assert asked.headers["x-slotgate-backend"] == "small"  # the route steers this prompt
    job = await submit(alice, jsonl(*(line(f"q{i}") for i in range(3))))
    done = await ended(alice, job.id)
    assert (done.status, done.request_counts.completed) == ("completed", 3)
    assert engine(gw).stats()["completed"] == 3  # every line on the primary
    assert engine(gw, "small").stats()["completed"] == 1  # the interactive request alone
    await assert_idle(gw)


async def test_a_batch_past_its_window_expires_with_what_it_finished(
        sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    gw: RunningGateway = await start(config(tmp_path, slots=1))
    alice = sdk(gw, api_key=KEYS["alice"])
    sim = engine(gw)
    sim.hold()
    job = await submit(alice, jsonl(*(line(f"q{i}") for i in range(3))))
    await sim.wait_until(lambda e: e.active == 1)  # the first line runs
    jobs = gw.gateway.jobs
    assert jobs is not None
    await jobs.store.run("UPDATE batches SET expires_at = 0 WHERE id = ?", (job.id,))
    jobs.changed.set()  # (its window passed: the look the runner takes every poll_s, now)
    sim.release()
    done = await ended(alice, job.id)
    assert done.status == "expired" and done.expired_at is not None
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (3, 1, 2)
    output = (await alice.files.content(done.output_file_id)).read().splitlines()
    assert [orjson.loads(x)["custom_id"] for x in output] == ["q0"]
    assert await unrun(alice, done.error_file_id) == [("q1", "batch_expired"),
                                                      ("q2", "batch_expired")]
    assert sim.stats()["requests"] == 1
    await assert_idle(gw)


async def test_without_auth_a_batch_line_still_gives_its_slot_back(
        sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    raw = config(tmp_path, slots=1)
    del raw["auth"]  # as the embedded config: no keys, every client one tenant
    gw: RunningGateway = await start(raw)
    client = sdk(gw, api_key="unused")
    sim = engine(gw)
    sim.hold()
    job = await submit(client, jsonl(*(line(f"q{i}") for i in range(2))))
    await sim.wait_until(lambda e: e.active == 1)  # the first line holds the only slot
    assert gw.gateway.batch_lines.count("big") == 1
    asked = asyncio.create_task(client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "now"}], max_tokens=4))
    await sim.wait_until(lambda e: e.stats()["aborted"] == 1 and e.active == 1)
    assert gw.gateway.batch_lines.preempted == 1
    sim.release()
    assert (await asked).choices[0].message.content
    done = await ended(client, job.id)
    assert (done.status, done.request_counts.completed) == ("completed", 2)
    await assert_idle(gw)
