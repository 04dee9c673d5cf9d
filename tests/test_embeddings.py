"""POST /v1/embeddings through a real gateway over simulated engines, with the official SDK:
vectors, batches, formats, validation, the API check, the queue, 429s and disconnects."""

from __future__ import annotations

import asyncio
import base64
import math
from array import array
from typing import Any

import openai
import pytest

from router.app import RunningGateway
from router.common.record import Phase, RequestRecord
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    send_in_order,
    sim_backend,
    wait_pools,
)

EMBED = {"ttft_s": 0}  # the fast simulated engine: an answer as soon as it has a sequence


def embed_config(slots: int = 2, queue_limit: int = 4, **extra: Any) -> dict[str, Any]:
    """`chat` routes to `big`, an embedding backend (simulated, embeddings only)."""
    return gateway_config(sim_backend("bge-small", slots=slots, queue_limit=queue_limit,
                                      apis=["embeddings"], **extra))


def record(gw: RunningGateway, request_id: str) -> RequestRecord | None:
    return next((r for r in gw.gateway.recent if r.request_id == request_id), None)


async def embed(client: openai.AsyncOpenAI, request_id: str) -> Any:
    return await client.embeddings.create(model="chat", input=["one", "two"],
                                    extra_headers={"X-Request-Id": request_id})


async def test_one_input_and_a_batch_get_deterministic_unit_vectors(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(embed_config())
    client = sdk(gw)
    one = await client.embeddings.create(model="chat", input="hello world")
    assert len(one.data) == 1 and len(one.data[0].embedding) == 384  # the default size
    squares = math.fsum(v * v for v in one.data[0].embedding)
    assert math.isclose(squares, 1.0, rel_tol=1e-6)  # a unit vector, sent as float32
    assert one.usage.prompt_tokens == one.usage.total_tokens > 0
    batch = await client.embeddings.create(model="chat", input=["hi", "hello world", "hi"],
                                           dimensions=64)
    assert [d.index for d in batch.data] == [0, 1, 2]
    assert all(len(d.embedding) == 64 for d in batch.data)
    assert batch.data[0].embedding == batch.data[2].embedding  # the same input, the same vector
    assert batch.data[0].embedding != batch.data[1].embedding
    again = await client.embeddings.create(model="chat", input="hello world")
    assert again.data[0].embedding == one.data[0].embedding
    tokens = await client.embeddings.create(model="chat", input=[[1, 2, 3], [4, 5]])
    assert len(tokens.data) == 2 and tokens.usage.prompt_tokens == 5
    assert len(engine(gw).records) == 4  # a batch is one request upstream
    rec = record(gw, one._request_id or "")
    assert rec is not None and rec.api == "embeddings" and rec.prompt_tokens is not None
    await assert_idle(gw)


async def test_base64_is_the_float32_vector(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(embed_config())
    client = sdk(gw)
    floats = await client.embeddings.create(model="chat", input="abc", dimensions=16,
                                            encoding_format="float")
    # The SDK decodes base64 itself when it asked for it: ask for the raw answer instead.
    raw = await client.embeddings.with_raw_response.create(
        model="chat", input="abc", dimensions=16, encoding_format="base64")
    packed = raw.http_response.json()["data"][0]["embedding"]
    assert isinstance(packed, str)
    decoded = array("f", base64.b64decode(packed)).tolist()
    assert decoded == pytest.approx(floats.data[0].embedding, rel=1e-6)
    await assert_idle(gw)


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "stream": True}, "stream"),
    ({"input": "x", "stream": False}, "stream"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["a", 3]}, "input"),
    ({"input": [[1, 2], []]}, "input"),
    ({"input": [-1]}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "encoding_format": {}}, "encoding_format"),  # unhashable: found by fuzzing
    ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x", "dimensions": True}, "dimensions"),
    ({"input": "x", "user": 7}, "user"),
    ({}, "input"),
])
async def test_bad_fields_are_400_with_their_param(
    sdk: SdkClients, start: StartGateway, body: dict[str, Any], param: str
) -> None:
    gw = await start(embed_config())
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(gw).post("/embeddings", body={"model": "chat", **body},
                           cast_to=object)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert engine(gw).records == {}  # refused before any slot
    await assert_idle(gw)


async def test_too_many_inputs_are_refused(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start({**embed_config(), "server": {"max_embedding_inputs": 3}})
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(gw).embeddings.create(model="chat", input=["a", "b", "c", "d"])
    assert "max_embedding_inputs" in str(caught.value)
    assert len((await sdk(gw).embeddings.create(model="chat", input=[1, 2, 3, 4])).data) == 1


async def test_an_api_the_primary_does_not_serve_is_refused(
    sdk: SdkClients, start: StartGateway
) -> None:
    raw = embed_config()
    raw["backends"]["llm"] = sim_backend("llm-8b", slots=1, apis=["chat", "completions"])
    raw["routes"]["llm"] = {"primary": "llm"}
    gw = await start(raw)
    client = sdk(gw)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.embeddings.create(model="llm", input="x")
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "unsupported_api"
    assert body["param"] == "model" and "/v1/embeddings" in body["message"]
    with pytest.raises(openai.BadRequestError) as chat:
        await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert isinstance(chat.value.body, dict) and chat.value.body["code"] == "unsupported_api"
    assert engine(gw).records == {} and engine(gw, "llm").records == {}
    await assert_idle(gw)


async def test_overflow_never_sends_embeddings_where_they_are_not_served(
    sdk: SdkClients, start: StartGateway
) -> None:
    """The primary full: a fallback that serves chat only is passed over (429), one that
    embeds takes the request."""
    raw = gateway_config(sim_backend("emb", slots=1, apis=["embeddings", "chat"]),
                         sim_backend("llm", slots=1, apis=["chat"]), overflow="fallback")
    raw["backends"]["also"] = sim_backend("emb-2", slots=1, apis=["embeddings"])
    gw = await start(raw)
    big = engine(gw)
    big.hold()
    holder = asyncio.create_task(embed(sdk(gw), "holder"))
    await big.wait_until(lambda e: e.held == 1)
    with pytest.raises(openai.RateLimitError):
        await sdk(gw).embeddings.create(model="chat", input="x")
    assert engine(gw, "small").records == {}
    raw["routes"]["chat"]["fallbacks"] = ["small", "also"]
    big.release()
    await holder
    await gw.close()
    gw = await start(raw)
    engine(gw).hold()
    holder = asyncio.create_task(embed(sdk(gw), "holder"))
    await engine(gw).wait_until(lambda e: e.held == 1)
    moved = await sdk(gw).embeddings.with_raw_response.create(model="chat", input="x")
    assert moved.headers["x-slotgate-backend"] == "also"
    assert engine(gw, "small").records == {}
    engine(gw).release()
    await holder
    await assert_idle(gw)


async def test_queued_embeddings_get_their_slots_in_order_then_429(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(embed_config(slots=2, queue_limit=3))
    sim = engine(gw)
    sim.hold()
    tasks, rejected = await send_in_order(sdk(gw), gw, 7, send=embed)
    assert gw.gateway.backends["big"].pool.queued == 3
    assert len(rejected) == 2
    for err in rejected:
        assert isinstance(err, openai.RateLimitError)
        assert int(err.response.headers["retry-after"]) >= 1
    sim.release()
    answers = await asyncio.gather(*tasks[:5])
    assert all(len(a.data) == 2 for a in answers)
    assert sim.peak == 2  # the engine never saw more than its slots
    served = sorted((r for r in gw.gateway.recent if r.slot_at), key=lambda r: r.slot_at or 0)
    assert [r.request_id for r in served] == [f"req-{i}" for i in range(5)]  # FIFO
    await assert_idle(gw)


@pytest.mark.parametrize("where", [Phase.QUEUED, Phase.BEFORE_FIRST_BYTE])
async def test_a_client_that_leaves_frees_its_place(
    sdk: SdkClients, start: StartGateway, where: Phase
) -> None:
    gw = await start(embed_config(slots=1, queue_limit=2))
    sim = engine(gw)
    sim.hold()
    first = asyncio.create_task(embed(sdk(gw), "first"))
    await sim.wait_until(lambda e: e.held == 1)
    if where is Phase.QUEUED:
        leaver = asyncio.create_task(embed(sdk(gw), "leaver"))
        await wait_pools(gw, lambda state: state["big"] == (1, 1))
        leaver.cancel()
    else:
        first.cancel()  # in flight: the engine sees the abort
        await sim.wait_until(lambda e: e.records["first"].aborted)
    if where is Phase.BEFORE_FIRST_BYTE:
        await assert_idle(gw)  # while the engine would still be embedding
    else:
        await wait_pools(gw, lambda state: state["big"] == (1, 0))
    sim.release()
    if where is Phase.QUEUED:
        await first
        assert "leaver" not in sim.records  # never reached the engine
    after = await sdk(gw).embeddings.create(model="chat", input="still served")
    assert len(after.data) == 1
    gone = record(gw, "leaver" if where is Phase.QUEUED else "first")
    assert gone is not None and gone.disconnect is where and gone.api == "embeddings"
    await assert_idle(gw)


async def test_a_sheddable_embedding_waits_behind_a_standard_one(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(embed_config(slots=1, queue_limit=4))
    sim = engine(gw)
    sim.hold()
    holder = asyncio.create_task(embed(sdk(gw), "holder"))
    await sim.wait_until(lambda e: e.held == 1)
    batch = asyncio.create_task(sdk(gw).embeddings.create(
        model="chat", input="later", extra_headers={"X-Request-Id": "batch",
                                                    "X-Slotgate-Priority": "sheddable"}))
    await wait_pools(gw, lambda state: state["big"] == (1, 1))
    normal = asyncio.create_task(embed(sdk(gw), "normal"))
    await wait_pools(gw, lambda state: state["big"] == (1, 2))
    sim.release()
    await asyncio.gather(holder, batch, normal)
    served = sorted((r for r in gw.gateway.recent if r.slot_at), key=lambda r: r.slot_at or 0)
    assert [r.request_id for r in served] == ["holder", "normal", "batch"]
    assert [r.priority for r in served] == ["standard", "standard", "sheddable"]
    await assert_idle(gw)


async def test_embeddings_are_never_steered_by_intent(
    sdk: SdkClients, start: StartGateway
) -> None:
    """A route that steers every simple chat request (`when: always`) to a fallback that
    embeds too: an embedding stays on the primary, and the classifier never runs for it."""
    raw = gateway_config(sim_backend("both", slots=2), sim_backend("small", slots=2))
    raw["routes"]["chat"]["fallback"] = {"when": "always", "min_confidence": 0.0}
    gw = await start(raw)
    client = sdk(gw)
    for i in range(3):
        await client.embeddings.create(model="chat", input="hello, how are you?",
                                       extra_headers={"X-Request-Id": f"e{i}"})
    chat = await client.chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES, extra_headers={"X-Request-Id": "c"})
    assert chat.headers["x-slotgate-backend"] == "small"  # the route does steer chat
    for i in range(3):
        rec = record(gw, f"e{i}")
        assert rec is not None and (rec.backend, rec.reason, rec.intent) == (
            "big", "primary", None)
    assert engine(gw, "small").records.keys() == {"c"}
    await assert_idle(gw)
