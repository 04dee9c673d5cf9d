"""deploy/examples: one config per engine, each valid, each agreeing with the engine command
line in its comments (slots = the engine's own concurrency flag), each in docs/engines.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from router.config import load_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "deploy" / "examples"
ENGINES_DOC = ROOT / "docs" / "engines.md"

# example file -> the engine flag, in its command-line comment, that slots must equal
SLOTS_FLAG = {
    "vllm.yaml": r"--max-num-seqs (\d+)",
    "llama-cpp.yaml": r"-np (\d+)",
    "llama-cpp-python.yaml": None,  # one sequence at a time: slots 1
    "ollama.yaml": r"OLLAMA_NUM_PARALLEL=(\d+)",
    "tgi.yaml": r"--max-concurrent-requests (\d+)",
    "serverless-fallback.yaml": r"--max-num-seqs (\d+)",  # its self-hosted primary
    "vllm-replicas.yaml": r"--max-num-seqs (\d+)",  # on every replica
    "k8s-headless-replicas.yaml": r"--max-num-seqs (\d+)",
    "k8s-discovered-replicas.yaml": r"--max-num-seqs (\d+)",  # each pod found
}
FILES = sorted(EXAMPLES.glob("*.yaml"))


def test_one_example_per_engine() -> None:
    assert {p.name for p in FILES} == set(SLOTS_FLAG)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_example_is_a_valid_config(path: Path) -> None:
    config = load_config(path)  # the gateway's own loader: every problem by key path
    for name, backend in config.backends.items():
        for replica in backend.replicas(name):
            assert replica.url is not None, f"{name}: an example points at real engines"
            assert str(replica.url).endswith("/v1"), "the OpenAI base URL ends in /v1"
        assert backend.simulated is None
        assert backend.context_window is not None, f"{name}: say the engine's context"
        assert backend.queue_limit > 0, f"{name}: waiting belongs in slotgate's queue"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_slots_match_the_engine_flag(path: Path) -> None:
    config = load_config(path)
    name, first = next(iter(config.backends.items()))  # the self-hosted engine comes first
    slots = {replica.slots for replica in first.replicas(name)}  # on every replica
    if first.discover is not None:  # the replicas found, each with the same slots
        slots = {first.discover.slots}
    flag = SLOTS_FLAG[path.name]
    if flag is None:
        assert slots == {1}
        return
    found = re.search(flag, path.read_text(encoding="utf-8"))
    assert found, f"{path.name}: the engine's command line should show {flag}"
    assert slots == {int(found.group(1))}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_keys_come_from_the_environment(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"(?i)\b(sk|key)-[A-Za-z0-9]{8,}", text), "a key in an example"
    config = load_config(path)
    for backend in config.backends.values():
        hosted = [r for r in backend.replicas("b") if r.url is not None and r.url.scheme == "https"]
        if hosted:
            assert backend.api_key_env, "a hosted provider needs its key, from the environment"


def test_the_engines_guide_covers_every_example() -> None:
    guide = ENGINES_DOC.read_text(encoding="utf-8")
    for path in FILES:
        assert f"deploy/examples/{path.name}" in guide
    assert "on_disconnect" in guide
