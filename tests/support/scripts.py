"""Lua scripts on a private redis-server for a model test module: the server started and
stopped around it, a client, and the scripts registered with that client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import redis

from tests.support import RedisServer, closed_port, require_program


@contextlib.contextmanager
def scripts_on_redis(scripts: Mapping[str, str]
                     ) -> Iterator[tuple[redis.Redis, dict[str, Any]]]:
    """(client, name -> registered script), on a redis-server of its own."""
    server = RedisServer(require_program("redis-server"), closed_port())
    loop = asyncio.new_event_loop()  # only to start and stop the server
    loop.run_until_complete(server.start())
    client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
    try:
        yield client, {name: client.register_script(text) for name, text in scripts.items()}
    finally:
        client.close()
        loop.run_until_complete(server.stop(kill=True))
        loop.close()
