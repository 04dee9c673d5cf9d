"""The `slotgate` command: serve | demo | simulate | loadtest | report | evaluate | classifier |
config."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from policies.config import SimulatedSpec
from router.common.config_error import ConfigError
from router.config import add_check_arguments, load_config
from router.telemetry import logs
from router.tools.run import Closable, run_until_signal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slotgate", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    _add_serve(commands)
    _add_simulate(commands)
    # The tools and the classifier declare their flags in their own modules, imported on use.
    commands.add_parser("demo", help="ten people, three slots (--batch: a batch in the gaps)",
                        declare=_demo, own_errors=True)
    commands.add_parser("loadtest", help="drive a mixed workload (A/B: fallback off vs on)",
                        declare=_loadtest, own_errors=True)
    commands.add_parser("report", help="cost and wait report from the ledger",
                        declare=_report, own_errors=True)
    commands.add_parser("evaluate", help="qualify a small model offline: a prompt file "
                        "through it, the primary and the judge", declare=_evaluate,
                        own_errors=True)
    _add_reload(commands)
    commands.add_parser("classifier", help="train | eval the intent classifier",
                        declare=_classifier, own_errors=True)
    _add_config(commands)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    run: Callable[[argparse.Namespace], int] = args.func
    return run(args)


class CommandParser(argparse.ArgumentParser):
    """A command's parser. With `declare`, its flags come from the command's own module,
    imported only when that command is parsed (`slotgate serve` loads neither the tools nor
    the classifier); with `own_errors`, it refuses unknown arguments with its own usage, as
    the command run alone (`demo_main`, ...) does, rather than with the top-level usage."""

    def __init__(self, *args: Any, declare: Callable[[argparse.ArgumentParser], None] | None = None,
                 own_errors: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._declare = declare
        self._own_errors = own_errors

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        if self._declare is not None:
            declare, self._declare = self._declare, None
            declare(self)
        namespace, extras = super().parse_known_args(*args, **kwargs)
        if extras and self._own_errors:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def _demo(parser: argparse.ArgumentParser) -> None:
    from router.tools.demo_batch import add_arguments  # the demo's flags and --batch's

    add_arguments(parser)


def _loadtest(parser: argparse.ArgumentParser) -> None:
    from router.tools.loadtest import add_arguments

    add_arguments(parser)


def _report(parser: argparse.ArgumentParser) -> None:
    from router.report.cli import add_arguments

    add_arguments(parser)


def _evaluate(parser: argparse.ArgumentParser) -> None:
    from router.tools.evaluate import add_arguments

    add_arguments(parser)


def _classifier(parser: argparse.ArgumentParser) -> None:
    from classifier.cli import add_arguments

    add_arguments(parser)


def _add_serve(commands: argparse._SubParsersAction[CommandParser]) -> None:
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="YAML config (default: the embedded config.yaml)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--log-level", default="INFO")
    serve.add_argument(
        "--workers", type=_worker_count, default=1, metavar="N",
        help="N gateway processes on one port (SO_REUSEPORT), to use N cores; N > 1 needs "
             "coordination.mode: redis so the workers share their slot pools. A worker that "
             "dies stops the others: workers are not restarted (leave that to systemd or "
             "Kubernetes)")
    serve.set_defaults(func=lambda args: _serve(args.config, args.host, args.port,
                                                args.log_level, args.workers))


def _add_reload(commands: argparse._SubParsersAction[CommandParser]) -> None:
    reload = commands.add_parser("reload", help="make a running gateway re-read its config file "
                                 "(as SIGHUP does); prints what changed, or every problem")
    reload.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway")
    reload.add_argument("--key-env", default="SLOTGATE_ADMIN_KEY", metavar="VAR",
                        help="environment variable holding an admin API key, sent when set "
                        "(needed when auth is on; default %(default)s)")
    reload.set_defaults(func=lambda args: _reload(args.url, os.environ.get(args.key_env)))


def _add_config(commands: argparse._SubParsersAction[CommandParser]) -> None:
    config = commands.add_parser("config", help="config tools")
    checks = config.add_subparsers(dest="config_command", required=True)
    # `config check` reads its words itself: every one, even "--help", is a file name.
    check = checks.add_parser("check", help="validate a config file", add_help=False,
                              prefix_chars="\0")
    add_check_arguments(check)


def _worker_count(text: str) -> int:
    count = int(text)
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {count}")
    return count


def _serve(path: str | None, host: str | None, port: int | None, level: str,
           workers: int = 1) -> int:
    logs.setup(level)
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    if workers > 1:
        from router.tools.workers import serve_workers

        return serve_workers(config, host, port, level, workers, path)

    async def start() -> Closable:
        from router.app import start_gateway

        return await start_gateway(config, host, port, config_path=path)

    return run_until_signal(start, f"{host or config.server.host}:{port or config.server.port}")


def _reload(url: str, key: str | None = None) -> int:
    """POST /admin/reload: 0 reloaded, 1 refused (the running config is kept) or no answer.
    The admin key goes in the Authorization header (never on the command line: `ps`)."""
    import urllib.error
    import urllib.request

    import orjson

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(url.rstrip("/") + "/admin/reload", method="POST",
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            changes = orjson.loads(resp.read())["changes"]
    except urllib.error.HTTPError as exc:
        print(f"slotgate reload: {orjson.loads(exc.read())['error']['message']}",
              file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"slotgate reload: {url}: {exc}", file=sys.stderr)
        return 1
    print("reloaded: " + ("; ".join(changes) or "no change"))
    return 0


# CLI flag -> SimulatedSpec field; flags left out keep the spec's defaults.
_SPEC_FLAGS = {
    "--slots": ("max_num_seqs", int), "--ttft-s": ("ttft_s", float),
    "--tokens-per-s": ("tokens_per_s", float), "--batch-slowdown": ("batch_slowdown", float),
    "--prefill-s-per-token": ("prefill_s_per_token", float),
    "--output-tokens": ("output_tokens", int), "--seed": ("seed", int),
    "--output-tokens-spread": ("output_tokens_spread", float),
    "--prefix-cache-tokens": ("prefix_cache_tokens", int),
    "--cache-block-tokens": ("cache_block_tokens", int),
    "--max-model-len": ("max_model_len", int),
}


def _add_simulate(commands: argparse._SubParsersAction[CommandParser]) -> None:
    simulate = commands.add_parser("simulate", help="run a standalone simulated engine",
                                   own_errors=True)
    _simulate_arguments(simulate)


def _simulate_arguments(parser: argparse.ArgumentParser) -> None:
    """`slotgate simulate`'s flags, on its sub-command or on `simulate_main`'s parser."""
    parser.description = "Serve a simulated OpenAI-compatible engine."
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="simulated")
    for flag, (dest, kind) in _SPEC_FLAGS.items():
        parser.add_argument(flag, dest=dest, type=kind)
    parser.set_defaults(func=_simulate)


def simulate_main(argv: list[str] | None = None) -> int:
    """`slotgate simulate`: a standalone simulated engine, until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(prog="slotgate simulate")
    _simulate_arguments(parser)
    return _simulate(parser.parse_args(argv))


def _simulate(args: argparse.Namespace) -> int:
    try:
        spec = SimulatedSpec(**{dest: getattr(args, dest) for dest, _ in _SPEC_FLAGS.values()
                                if getattr(args, dest) is not None})
    except ValidationError as exc:
        print(f"slotgate simulate: {exc}", file=sys.stderr)
        return 2

    async def start() -> Closable:
        from router.upstream.simulated.app import start_simulator

        sim = await start_simulator(spec, args.model, args.host, args.port)
        print(f"slotgate simulate: {args.model} with {spec.max_num_seqs} seqs on {sim.url}",
              flush=True)
        return sim

    return run_until_signal(start, f"{args.host}:{args.port}")
