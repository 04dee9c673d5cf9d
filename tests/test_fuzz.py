"""Fuzzing the gateway's own API from its OpenAPI description (schemathesis), against a
real `slotgate serve` process: no 5xx and no hang, whatever valid or invalid input comes."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, settings

from router.config import config_from_dict
from router.console.openapi import openapi
from tests.support import SLOTGATE

CONFIG: dict[str, Any] = {
    "backends": {"big": {"simulated": {"max_num_seqs": 64, "ttft_s": 0, "tokens_per_s": 0,
                                       "output_tokens": 8},
                         "model": "m", "slots": 64, "queue_limit": 64}},
    "routes": {"chat": {"primary": "big", "overflow": "reject"}},
    "logging": {"access": False},
}
schema = schemathesis.openapi.from_dict(openapi(config_from_dict(CONFIG)))
# valid input and input that breaks the description on purpose (wrong types, missing fields)
schema.config.generation.update(modes=list(schemathesis.GenerationMode), deterministic=True)


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "gateway.yaml").write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
    proc = subprocess.Popen([SLOTGATE, "serve", "--config", "gateway.yaml", "--port", "0"],
                            cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    for line in proc.stdout:
        if b"listening on" in line:
            break
    else:
        pytest.fail("slotgate serve did not start")
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe empty
    try:
        yield line.decode().split("listening on ")[1].split()[0]
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_the_description_is_served(gateway_url: str) -> None:
    import urllib.request

    with urllib.request.urlopen(gateway_url + "/openapi.json", timeout=10) as resp:
        served = yaml.safe_load(resp.read())
    assert served == openapi(config_from_dict(CONFIG))


@schema.parametrize()
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_no_server_error_and_no_hang(case: schemathesis.Case[Any], gateway_url: str) -> None:
    response = case.call(base_url=gateway_url, timeout=10)  # a hang fails the call
    assert response.status_code < 500, (response.status_code, response.text[:300])
