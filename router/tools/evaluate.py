"""`slotgate evaluate PROMPTS.jsonl --route R`: qualify a small model or a threshold offline
(#33). Each prompt goes to the route's small model, is replayed on its primary and judged
in both orders by the code of the live shadows (router.quality.evaluation), then the
verdicts per intent and language and the table "if min_confidence were X" are printed.

By default into a gateway started in this process from the config (no ledger, no auth, a
direct route added for each backend that lacks one); with --url, into a running gateway
serving that config. Exit status: 0 done, 1 bad config, no gateway or not one prompt
compared, 2 bad usage or a bad prompt file.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import aiohttp
import orjson

from policies.config import AuthConfig, Config, LedgerConfig
from policies.config.quality import RouteQualityConfig
from router.common.config_error import ConfigError
from router.config import load_config
from router.quality.evaluation import (
    EvaluateError,
    Judged,
    Outcome,
    Plan,
    backends_of,
    evaluate,
    plan_for,
    with_direct_routes,
)
from router.quality.prompt_file import EvalPrompt, PromptFileError, read_prompts
from router.tools.evaluate_report import figures, text_lines
from router.tools.run import loop_factory


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`slotgate evaluate`'s flags, on its sub-command or on `evaluate_main`'s parser."""
    p.description = __doc__
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("prompts", metavar="PROMPTS.jsonl",
                   help='one JSON object a line: {"messages": [...]} (a chat request) or '
                        '{"prompt": "text"}, with an optional "intent" label')
    p.add_argument("--route", required=True, help="the route whose downgrade is evaluated")
    p.add_argument("--config", help="YAML config (default: the embedded config.yaml)")
    p.add_argument("--small", metavar="BACKEND",
                   help="the small backend (default: the route's first fallback)")
    p.add_argument("--url", help="a running gateway serving the config (default: start one "
                                 "in this process)")
    p.add_argument("--key-env", default="SLOTGATE_API_KEY", metavar="VAR",
                   help="environment variable holding the API key sent to --url, when set "
                        "(default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--concurrency", type=int, default=4, metavar="N",
                   help="prompts in flight at once (default %(default)s)")
    p.add_argument("--limit", type=int, metavar="N", help="only the file's first N prompts")
    p.set_defaults(func=_run, parser=p)


def evaluate_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="slotgate evaluate")
    add_arguments(p)
    return _run(p.parse_args(argv))


def _run(args: argparse.Namespace) -> int:
    p: argparse.ArgumentParser = args.parser
    if args.concurrency < 1 or (args.limit is not None and args.limit < 1):
        p.error("--concurrency and --limit must be at least 1")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        prompts = read_prompts(Path(args.prompts), args.limit)
        if args.url is None:
            config = embedded(config, args.route, args.small)
        plan = plan_for(config, args.route, args.small)
    except (PromptFileError, EvaluateError) as exc:
        print(f"slotgate evaluate: {exc}", file=sys.stderr)
        return 2
    key = os.environ.get(args.key_env) if args.url is not None else None
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            results = runner.run(_drive(args.url, key, config, plan, prompts,
                                        args.concurrency, sys.stderr))
    except (OSError, aiohttp.ClientError, TimeoutError) as exc:
        print(f"slotgate evaluate: {args.url or 'the gateway'}: "
              f"{exc or type(exc).__name__}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    found = figures(config, plan, results)
    if args.json:
        sys.stdout.write(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print("\n".join(text_lines(found, args.prompts)))
    compared = sum(r.outcome in (Outcome.JUDGED, Outcome.NO_VERDICT) for r in results)
    return 0 if compared else 1


def embedded(config: Config, route: str, small: str | None) -> Config:
    """What the in-process gateway serves: `config` with a direct route for each backend
    compared, without a ledger, auth or shadows of its own. Raises EvaluateError."""
    served = with_direct_routes(config, backends_of(config, route, small))
    quiet = {name: r.model_copy(update={"quality": RouteQualityConfig()})
             for name, r in served.routes.items()}
    return served.model_copy(update={"routes": quiet, "ledger": LedgerConfig(),
                                     "auth": AuthConfig()})


async def _drive(url: str | None, key: str | None, config: Config, plan: Plan,
                 prompts: list[EvalPrompt], concurrency: int, err: TextIO) -> list[Judged]:
    """Start the in-process gateway unless `url` (else make sure it answers), evaluate,
    close the gateway."""
    running = None
    try:
        if url is None:
            from router.app import start_gateway

            running = await start_gateway(config, "127.0.0.1", 0)
            url = running.url
        else:
            await _reachable(url)
        from classifier.model import load_default  # scikit-learn's numpy: only when run

        return await evaluate(url, key, config, plan, prompts, load_default(), concurrency,
                              _progress(len(prompts), err))
    finally:
        if running is not None:
            await running.close()


async def _reachable(url: str) -> None:
    base = url.rstrip("/").removesuffix("/v1")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async with session.get(base + "/healthz") as resp:
            resp.raise_for_status()


def _progress(total: int, err: TextIO) -> Callable[[int], None] | None:
    """A count redrawn on a terminal; nothing elsewhere."""
    def done(n: int) -> None:
        err.write(f"\r{n}/{total} prompts\x1b[K" + ("\n" if n == total else ""))
        err.flush()

    return done if err.isatty() else None
