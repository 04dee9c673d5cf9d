"""`slotgate demo --batch`: a batch fills the primary's slots between interactive bursts.

Prints a line a second (the primary's slots held by interactive requests and by batch
lines, its waiting requests, the batch's progress and preemptions), then a summary. Counts
and times only, never prompts or answers. The embedded gateway keeps its ledger and the
batch's files in a temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import TextIO

from router.tools import demo
from router.tools.batch_bursts import FILL_WITHIN_S, BatchDemo, BatchPlan, Sample, run_batch_demo
from router.tools.demo import State
from router.tools.run import loop_factory

SLOT = {"interactive": "I", "batch": "B", "idle": "."}


def header(result: BatchDemo) -> str:
    return (f"{'t':>4}  {result.primary + ' slots':<16} {'queue':>5}  {'batch done':>10} "
            f"{'left':>5}  {'preempted':>9}  interactive sent/answered"
            "   (I interactive, B batch line, . idle)")


def timeline_line(sample: Sample, result: BatchDemo) -> str:
    slots = (SLOT["interactive"] * sample.interactive + SLOT["batch"] * sample.batch
             + SLOT["idle"] * sample.idle)
    rows = result.rows()
    answered = sum(row.state is State.DONE for row in rows)
    left = max(0, result.plan.lines - sample.done - sample.batch)
    return (f"{sample.at:>3.0f}s  {'[' + slots + ']':<16} {sample.queued:>5}  "
            f"{sample.done:>10} {left:>5}  {sample.preempted:>9}  {len(rows):>5}/{answered}")


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile (`p` in 0..1) of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p * len(ordered)) - 1))]


def shares(samples: list[Sample]) -> dict[str, float]:
    """The primary's slot-seconds from the first sample to the last, by holder."""
    held = dict.fromkeys(SLOT, 0.0)
    for before, after in itertools.pairwise(samples):
        span = after.at - before.at
        held["interactive"] += before.interactive * span
        held["batch"] += before.batch * span
        held["idle"] += before.idle * span
    total = sum(held.values())
    return {holder: held[holder] / total for holder in SLOT} if total else {}


def summary_lines(result: BatchDemo) -> list[str]:
    plan, rows = result.plan, result.rows()
    counts = result.job.get("request_counts") or {}
    done, failed = int(counts.get("completed", 0)), int(counts.get("failed", 0))
    ended = "all done" if result.job.get("status") == "completed" else (
        f"{plan.lines - done - failed} left when the demo stopped (cancelled)")
    lines = [f"batch of {plan.lines} lines on {result.primary}: {done} done, {failed} failed, "
             f"{ended}"]
    answered = [row for row in rows if row.state is State.DONE]
    where = Counter(row.backend or "?" for row in answered)
    size = len(result.bursts[0].rows) if result.bursts else 0
    text = (f"interactive: {len(rows)} requests in {len(result.bursts)} bursts of {size}, "
            f"{len(answered)} answered (" + ", ".join(
                f"{n} on {backend}" for backend, n in where.most_common()) + ")")
    if ttfts := [row.ttft_s for row in answered if row.ttft_s is not None]:
        text += (f", TTFT p50 {percentile(ttfts, 0.5):.2f} s, "
                 f"p95 {percentile(ttfts, 0.95):.2f} s")
    lines.append(text)
    missed = Counter(row.state.value for row in rows if row.state is not State.DONE)
    if missed:
        lines.append("not answered: " + ", ".join(
            f"{n} {state}" for state, n in missed.most_common()))
    preempted = result.samples[-1].preempted if result.samples else 0
    lines.append(f"preemptions: {preempted} batch line" + (
        " gave its slot" if preempted == 1 else "s gave their slot")
        + " to an interactive request and ran again later")
    if spent := shares(result.samples):
        lines.append(f"{result.primary}'s slot-seconds: " + ", ".join(
            f"{spent[holder]:.0%} {holder}" for holder in SLOT))
    return lines


async def _main(args: argparse.Namespace, out: TextIO) -> int:
    plan = BatchPlan(args.model, args.lines, args.seconds, args.every, args.burst,
                     args.max_tokens, args.line_tokens)

    def second(sample: Sample, result: BatchDemo) -> None:
        if sample is result.samples[0]:
            print(header(result), file=out)
        print(timeline_line(sample, result), file=out, flush=True)

    with tempfile.TemporaryDirectory(prefix="slotgate-demo-") as scratch:
        running = None
        url: str | None = args.url
        if url is None:
            from router.app import start_gateway
            from router.tools.loadtest import embedded_config

            config = embedded_config(None, args.model, Path(scratch) / "ledger.sqlite3", False)
            running = await start_gateway(config, "127.0.0.1", 0)
            url = running.url
        try:
            result = await run_batch_demo(url, plan, None if args.no_live else second)
        except (TimeoutError, RuntimeError) as exc:  # no slot in time; an API's refusal
            print("slotgate demo --batch: " + (str(exc) or "the batch did not take every "
                  f"slot of its primary within {FILL_WITHIN_S:g} s"), file=sys.stderr)
            return 1
        finally:
            if running is not None:
                await running.close()
    if not args.no_live:
        print(file=out)
    print("\n".join(summary_lines(result)), file=out)
    return 1 if any(row.state is State.ERROR for row in result.rows()) else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`slotgate demo`'s flags: the demo's own, and those of `--batch`."""
    demo.add_arguments(parser)
    batch = parser.add_argument_group("batch jobs", "--batch: a batch job in the gaps between "
                                      "interactive bursts (--model, --max-tokens, --url apply)")
    batch.add_argument("--batch", dest="func", action="store_const", const=_run,
                       help="run a batch on the primary and send interactive bursts")
    batch.add_argument("--lines", type=int, default=200, help="requests in the batch")
    batch.add_argument("--seconds", type=float, default=40.0,
                       help="how long bursts are sent for (the demo ends once they are "
                       "answered)")
    batch.add_argument("--every", type=float, default=10.0, help="seconds between bursts")
    batch.add_argument("--burst", type=int, help="requests per burst (default: twice the "
                       "primary's slots)")
    batch.add_argument("--line-tokens", type=int, default=16,
                       help="max_tokens of a batch line")


def _run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    if min(args.lines, args.max_tokens, args.line_tokens, args.burst or 1) < 1 or min(
            args.seconds, args.every) <= 0:
        args.parser.error("--lines, --burst and the token counts must be at least 1; "
                          "--seconds and --every above 0")
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(_main(args, out or sys.stdout))
    except KeyboardInterrupt:
        return 130

