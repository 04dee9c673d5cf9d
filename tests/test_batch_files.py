"""OpenAI's Files API (purpose `batch`) through the gateway with the official SDK: upload,
retrieve, list, content and delete, on a SQLite and a PostgreSQL ledger; each tenant sees
only its own files; every bad upload is refused in OpenAI's shape and leaves nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from router.app import RunningGateway
from tests.support import (
    SdkClients,
    StartGateway,
    assert_openai_error,
    gateway_config,
    sim_backend,
)

KEYS = {"alice": "sk-alice-0123456789", "bob": "sk-bob-0123456789"}


def line(custom_id: str, **body: Any) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "chat", "messages": [{"role": "user",
                                                                 "content": "hi"}], **body}})


JSONL = b"\n".join(line(f"req-{i}") for i in range(3)) + b"\n"


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == "sqlite":
        return {"path": str(tmp_path / "ledger.sqlite3")}
    return {"url": request.getfixturevalue("postgres_url")}


def config(ledger: dict[str, Any], tmp_path: Path, **batch: Any) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=1))
    raw["ledger"] = ledger
    raw["batch"] = {"files_dir": str(tmp_path / "files"), **batch}
    raw["auth"] = {"enabled": True, "keys": [
        {"id": name, "tenant": name, "sha256": hashlib.sha256(key.encode()).hexdigest()}
        for name, key in KEYS.items()]}
    return raw


def kept(tmp_path: Path) -> list[Path]:
    """What the files folder holds (it is made at the first upload)."""
    folder = tmp_path / "files"
    return list(folder.iterdir()) if folder.exists() else []


def client(sdk: SdkClients, gw: RunningGateway, who: str) -> openai.AsyncOpenAI:
    return sdk(gw, api_key=KEYS[who])


async def test_a_file_round_trip(sdk: SdkClients, start: StartGateway, ledger: dict[str, Any],
                                 tmp_path: Path) -> None:
    gw = await start(config(ledger, tmp_path))
    alice = client(sdk, gw, "alice")
    made = await alice.files.create(file=("input.jsonl", JSONL), purpose="batch")
    assert (made.object, made.bytes, made.filename, made.purpose, made.status) == (
        "file", len(JSONL), "input.jsonl", "batch", "processed")
    assert made.id.startswith("file-")
    again = await alice.files.retrieve(made.id)
    assert again.model_dump() == made.model_dump()
    content = await alice.files.content(made.id)
    assert content.read() == JSONL
    assert (tmp_path / "files" / made.id).read_bytes() == JSONL
    second = await alice.files.create(file=("two.jsonl", JSONL), purpose="batch")
    listed = [f.id async for f in alice.files.list()]
    assert listed == [second.id, made.id]  # newest first, as OpenAI lists them
    oldest = await alice.files.list(order="asc", limit=1)
    assert [f.id for f in oldest.data] == [made.id] and oldest.has_more
    gone = await alice.files.delete(made.id)
    assert (gone.id, gone.deleted) == (made.id, True)
    assert not (tmp_path / "files" / made.id).exists()
    with pytest.raises(openai.NotFoundError) as missing:
        await alice.files.retrieve(made.id)
    assert missing.value.body["code"] == "file_not_found"  # type: ignore[index]


async def test_a_tenant_sees_only_its_own_files(sdk: SdkClients, start: StartGateway,
                                                ledger: dict[str, Any], tmp_path: Path) -> None:
    gw = await start(config(ledger, tmp_path))
    alice, bob = client(sdk, gw, "alice"), client(sdk, gw, "bob")
    made = await alice.files.create(file=("input.jsonl", JSONL), purpose="batch")
    for call in (bob.files.retrieve(made.id), bob.files.content(made.id),
                 bob.files.delete(made.id)):
        with pytest.raises(openai.NotFoundError):  # not "forbidden": nothing leaks
            await call
    assert [f.id async for f in bob.files.list()] == []
    assert [f.id async for f in alice.files.list()] == [made.id]  # still there
    with pytest.raises(openai.AuthenticationError):
        await sdk(gw, api_key="sk-nobody-0123456789").files.list()


BAD_FILES = [
    (b"not json\n", "Line 1 is not valid JSON"),
    (b"[1, 2]\n", "Line 1 is not a JSON object"),
    (line("a") + b"\n" + line("a") + b"\n", "Line 2: the custom_id 'a' is used more than once"),
    (orjson.dumps({"custom_id": "a", "method": "GET", "url": "/v1/chat/completions",
                   "body": {}}) + b"\n", "'method' must be"),
    (orjson.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                   "body": []}) + b"\n", "'body' must be a JSON object"),
    (orjson.dumps({"method": "POST", "url": "/v1/chat/completions", "body": {}}) + b"\n",
     "'custom_id' must be"),
    (b"\n\n", "holds no requests"),
]


@pytest.mark.parametrize(("content", "says"), BAD_FILES)
async def test_a_bad_input_file_is_refused_with_its_line(
        sdk: SdkClients, start: StartGateway, tmp_path: Path, content: bytes,
        says: str) -> None:
    gw = await start(config({"path": str(tmp_path / "l.sqlite3")}, tmp_path))
    alice = client(sdk, gw, "alice")
    with pytest.raises(openai.BadRequestError) as refused:
        await alice.files.create(file=("bad.jsonl", content), purpose="batch")
    assert says in refused.value.body["message"]  # type: ignore[index]
    assert refused.value.body["code"] == "invalid_file"  # type: ignore[index]
    assert [f async for f in alice.files.list()] == []
    assert kept(tmp_path) == []  # no bytes left behind


@pytest.mark.parametrize(("batch", "content", "status", "code"), [
    ({"max_file_bytes": 100}, JSONL, 413, "file_too_large"),
    ({"max_lines": 2}, JSONL, 400, "invalid_file"),
    ({"max_line_bytes": 50}, JSONL, 400, "invalid_file"),
])
async def test_the_bounds_hold(sdk: SdkClients, start: StartGateway, tmp_path: Path,
                               batch: dict[str, int], content: bytes, status: int,
                               code: str) -> None:
    gw = await start(config({"path": str(tmp_path / "l.sqlite3")}, tmp_path, **batch))
    alice = client(sdk, gw, "alice")
    with pytest.raises(openai.APIStatusError) as refused:
        await alice.files.create(file=("big.jsonl", content), purpose="batch")
    assert refused.value.status_code == status
    assert refused.value.body["code"] == code  # type: ignore[index]
    assert kept(tmp_path) == []


async def test_other_purposes_and_shapes_are_refused(
        sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    gw = await start(config({"path": str(tmp_path / "l.sqlite3")}, tmp_path))
    alice = client(sdk, gw, "alice")
    with pytest.raises(openai.BadRequestError) as refused:
        await alice.files.create(file=("x.jsonl", JSONL), purpose="fine-tune")
    assert refused.value.body["code"] == "invalid_purpose"  # type: ignore[index]
    headers = {"Authorization": f"Bearer {KEYS['alice']}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/files", data=b"{}", headers={
                **headers, "Content-Type": "application/json"}) as resp:
            assert resp.status == 400
            assert_openai_error(await resp.json(), "invalid_request_error",
                                "invalid_content_type")
        form = aiohttp.FormData(default_to_multipart=True)
        form.add_field("purpose", "batch")
        async with http.post(gw.url + "/v1/files", data=form, headers=headers) as resp:
            assert resp.status == 400
            assert_openai_error(await resp.json(), "invalid_request_error", "missing_file")
        async with http.get(gw.url + "/v1/files?limit=0", headers=headers) as resp:
            assert resp.status == 400
    assert kept(tmp_path) == []


async def test_without_a_ledger_the_files_api_says_so(sdk: SdkClients,
                                                      start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    with pytest.raises(openai.NotFoundError) as off:
        await sdk(gw).files.list()
    assert off.value.body["code"] == "files_disabled"  # type: ignore[index]
