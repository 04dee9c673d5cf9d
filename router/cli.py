"""The `slotgate` command: serve | demo | simulate | loadtest | report | classifier | config."""

from __future__ import annotations

import argparse
import os
import sys

from pydantic import ValidationError

from policies.config import SimulatedSpec
from router.config import ConfigError, check_main, load_config
from router.telemetry import logs
from router.tools.run import Closable, run_until_signal


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="slotgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
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
    sub.add_parser("simulate", help="run a standalone simulated engine", add_help=False)
    sub.add_parser("demo", help="ten people, three slots", add_help=False)
    sub.add_parser("loadtest", help="drive a mixed workload (A/B: fallback off vs on)",
                   add_help=False)
    sub.add_parser("report", help="cost and wait report from the ledger", add_help=False)
    reload = sub.add_parser("reload", help="make a running gateway re-read its config file "
                            "(as SIGHUP does); prints what changed, or every problem")
    reload.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway")
    reload.add_argument("--key-env", default="SLOTGATE_ADMIN_KEY", metavar="VAR",
                        help="environment variable holding an admin API key, sent when set "
                        "(needed when auth is on; default %(default)s)")
    sub.add_parser("classifier", help="train | eval the intent classifier", add_help=False)
    config = sub.add_parser("config", help="config tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    config_sub.add_parser("check", help="validate a config file", add_help=False)

    # Subcommands that own their flags get the rest of the line untouched.
    if argv[:1] == ["simulate"]:
        return simulate_main(argv[1:])
    if argv[:1] == ["demo"]:
        from router.tools.demo import demo_main

        return demo_main(argv[1:])
    if argv[:1] == ["loadtest"]:
        from router.tools.loadtest import loadtest_main

        return loadtest_main(argv[1:])
    if argv[:1] == ["report"]:
        from router.report.cli import report_main

        return report_main(argv[1:])
    if argv[:1] == ["classifier"]:
        from classifier import classifier_main

        return classifier_main(argv[1:])
    if argv[:2] == ["config", "check"]:
        return check_main(argv[2:])

    args = parser.parse_args(argv)
    if args.command == "reload":
        return _reload(args.url, os.environ.get(args.key_env))
    if args.command == "serve":
        return _serve(args.config, args.host, args.port, args.log_level, args.workers)
    parser.print_help()
    return 2


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
}


def simulate_main(argv: list[str] | None = None) -> int:
    """`slotgate simulate`: a standalone simulated engine, until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(prog="slotgate simulate",
                                     description="Serve a simulated OpenAI-compatible engine.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="simulated")
    for flag, (dest, kind) in _SPEC_FLAGS.items():
        parser.add_argument(flag, dest=dest, type=kind)
    args = parser.parse_args(argv)
    try:
        spec = SimulatedSpec(**{dest: getattr(args, dest) for dest, _ in _SPEC_FLAGS.values()
                                if getattr(args, dest) is not None})
    except ValidationError as exc:
        print(f"slotgate simulate: {exc}", file=sys.stderr)
        return 2

    async def start() -> Closable:
        from router.upstream.simulated import start_simulator

        sim = await start_simulator(spec, args.model, args.host, args.port)
        print(f"slotgate simulate: {args.model} with {spec.max_num_seqs} seqs on {sim.url}",
              flush=True)
        return sim

    return run_until_signal(start, f"{args.host}:{args.port}")
