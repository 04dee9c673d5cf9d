"""The `slotgate` command: serve | demo | simulate | classifier | config check."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable

from policies.config import Config
from router.config import ConfigError, check_main, load_config


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="slotgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="YAML config (default: the embedded config.yaml)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--log-level", default="INFO")
    sub.add_parser("simulate", help="run a standalone simulated engine", add_help=False)
    sub.add_parser("demo", help="ten people, three slots", add_help=False)
    sub.add_parser("classifier", help="train | eval the intent classifier", add_help=False)
    config = sub.add_parser("config", help="config tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    config_sub.add_parser("check", help="validate a config file", add_help=False)

    # Subcommands that own their flags get the rest of the line untouched.
    if argv[:1] == ["simulate"]:
        from router.simulated import simulate_main

        return simulate_main(argv[1:])
    if argv[:1] == ["demo"]:
        from router.demo import demo_main

        return demo_main(argv[1:])
    if argv[:1] == ["classifier"]:
        from classifier import classifier_main

        return classifier_main(argv[1:])
    if argv[:2] == ["config", "check"]:
        return check_main(argv[2:])

    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args.config, args.host, args.port, args.log_level)
    parser.print_help()
    return 2


def _serve(path: str | None, host: str | None, port: int | None, level: str) -> int:
    logging.basicConfig(level=level.upper(), format="%(message)s")
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(_serve_forever(config, host, port))
    return 0


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when installed (faster sockets), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _serve_forever(config: Config, host: str | None, port: int | None) -> None:
    from router.app import start_gateway

    running = await start_gateway(config, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await running.close()
