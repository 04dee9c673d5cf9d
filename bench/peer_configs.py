"""The config files of the servers the benchmark suite starts: slotgate (production-like),
LiteLLM's proxy and nginx, each pointed at the mock engine."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from harness import HOST

MOCK_MODEL = "mock"


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def slotgate_yaml(port: int, backends: Mapping[str, str], *, ledger: Path,
                  key: str, extra_backends: str = "", extra_routes: str = "",
                  coordination: str = "", connections: int | None = None) -> str:
    """The production-like config: auth (one key), access log, ledger (SQLite), metrics
    (always on), and a route whose simple requests may go to a second backend while the
    primary is saturated (`fallback.when: saturated`: the classifier is loaded and runs
    for every request that would wait). Slots are not the limit (1024). `connections`:
    the open connections allowed, in all and from one client (the load comes from one
    address), where a phase holds more than the defaults (10,000 and 256)."""
    primary, small = backends["primary"], backends["small"]
    price = "price: {input_per_mtok: 1.0, output_per_mtok: 2.0}"
    limits = ("" if connections is None else
              f", max_connections: {connections}, max_connections_per_client: {connections}")
    return f"""server: {{host: {HOST}, port: {port}, shutdown_timeout_s: 2{limits}}}
logging: {{access: true}}
auth:
  enabled: true
  keys:
    - {{id: bench, sha256: {key_sha256(key)}, tenant: bench}}
ledger: {{path: "{ledger}"}}
{coordination}backends:
  mock: {{url: "{primary}/v1", model: {MOCK_MODEL}, slots: 1024, queue_limit: 1024, {price}}}
  mock-small: {{url: "{small}/v1", model: {MOCK_MODEL}, slots: 1024, queue_limit: 1024,
               {price}}}
{extra_backends}routes:
  mock:
    primary: mock
    fallbacks: [mock-small]
    overflow: fallback
    fallback: {{when: saturated, min_confidence: 0.8}}
{extra_routes}"""


def litellm_yaml(mock_url: str, key: str) -> str:
    return f"""model_list:
  - model_name: {MOCK_MODEL}
    litellm_params:
      model: openai/{MOCK_MODEL}
      api_base: {mock_url}/v1
      api_key: sk-mock-unused
general_settings:
  master_key: {key}
litellm_settings:
  telemetry: false
"""


def nginx_conf(port: int, mock_url: str, root: Path) -> str:
    upstream = mock_url.removeprefix("http://")
    return f"""daemon off;
master_process on;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log {root}/access.log combined buffer=64k flush=1s;
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    upstream mock {{
        server {upstream};
        keepalive 128;
    }}
    server {{
        listen {HOST}:{port} reuseport backlog=4096;
        keepalive_requests 100000;
        location / {{
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 120s;
        }}
    }}
}}
"""
