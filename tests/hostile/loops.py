"""Running a test module's async tests on both event loops (asyncio and uvloop, which
`slotgate serve` uses), and raw connections to a gateway. A module opts in with
`pytestmark = BOTH_LOOPS` and by importing `event_loop_policy`."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from router.app import RunningGateway

# Overriding pytest-asyncio's `event_loop_policy` fixture (deprecated): its replacement
# hook would apply to the whole folder, not to these files' tests alone.
BOTH_LOOPS = pytest.mark.filterwarnings(
    "ignore:Overriding the \"event_loop_policy\" fixture:DeprecationWarning")


@pytest.fixture(params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Every test here runs on both loops: `slotgate serve` uses uvloop, tests asyncio."""
    if request.param == "uvloop":
        return uvloop.EventLoopPolicy()  # type: ignore[no-any-return]
    return asyncio.DefaultEventLoopPolicy()


def address(gw: RunningGateway) -> tuple[str, int]:
    host, port = gw.url.removeprefix("http://").split(":")
    return host, int(port)


async def connect(gw: RunningGateway, source: str = "127.0.0.1"
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*address(gw), local_addr=(source, 0))
