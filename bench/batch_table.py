"""The batch bench's table (bench/batch_share.py): the figures of one run, each target's
beside it, and how each figure is made."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from batch_gateway import PRIMARY
from batch_traffic import Stream
from load import percentile

if TYPE_CHECKING:
    from batch_share import Results


def _ttfts(streams: Sequence[Stream]) -> list[float]:
    return [s.ttft_s for s in streams if s.ttft_s is not None]


def _waits(streams: Sequence[Stream], waits: dict[str, float]) -> list[float]:
    """The gateway's queue waits (ms, from its ledger) of the streams that reached the 70B."""
    return [waits[s.request_id] * 1000 for s in streams if s.request_id in waits]


def _ratio(after: float, before: float) -> str:
    return f"x{after / before:.2f}" if before > 0 else "-"


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _head(r: Results) -> list[str]:
    e = r.engine
    return [
        f"#32 batch bench: config.yaml's {PRIMARY} ({e.slots} slots, first token "
        f"{e.ttft_s:g} s, {e.tokens_per_s:g} tokens/s, answers {e.shortest}-{e.longest} "
        f"tokens), auth {'on (one key)' if r.auth else 'off (as shipped)'}",
        f"capacity {e.slots} / {e.mean_hold_s:.2f} s mean hold = {e.capacity_per_s:.3f} "
        f"requests/s (measured hold, alone: {r.hold_alone_s:.2f} s); interactive: Poisson "
        f"{r.rate:.3f}/s (0.6x) for {r.scale.window_s:g} s, streamed, hard prompts",
        "two gateways at once, the same arrivals and lengths; one of them also runs a "
        "2,000-line batch on the same route",
        "",
    ]


def _interactive(r: Results) -> list[str]:
    a, b = r.alone, r.shared
    ta, tb = _ttfts(a), _ttfts(b)
    p95a, p95b = percentile(ta, 95), percentile(tb, 95)
    refused_a, refused_b = sum(s.refused for s in a), sum(s.refused for s in b)
    small_a = sum(s.backend != PRIMARY for s in a)
    small_b = sum(s.backend != PRIMARY for s in b)
    rows = [
        f"{'interactive (' + str(len(a)) + ' streams each)':<40}{'alone':>10}{'with batch':>12}"
        f"{'ratio':>8}  target",
        f"{'  time to first token p50 (s)':<40}{percentile(ta, 50):>10.3f}"
        f"{percentile(tb, 50):>12.3f}{_ratio(percentile(tb, 50), percentile(ta, 50)):>8}",
        f"{'  time to first token p95 (s)':<40}{p95a:>10.3f}{p95b:>12.3f}"
        f"{_ratio(p95b, p95a):>8}  <= x1.10: {_verdict(p95b <= 1.10 * p95a)}",
        f"{'  gateway queue wait p95 (ms, ledger)':<40}"
        f"{percentile(_waits(a, r.waits_alone), 95):>10.1f}"
        f"{percentile(_waits(b, r.waits_shared), 95):>12.1f}",
        f"{'  refused (429/503, or an error event)':<40}{refused_a:>10}{refused_b:>12}"
        f"{'':>8}  none more: {_verdict(refused_b <= refused_a)}",
        f"{'  served elsewhere than ' + PRIMARY:<40}{small_a:>10}{small_b:>12}",
        "",
    ]
    return rows


def _slots(r: Results) -> list[str]:
    e, led = r.engine_slots, r.ledger_slots
    cells = [("  held by interactive requests", e.interactive, led.interactive),
             ("  left idle by them", e.idle, led.idle),
             ("  held by batch lines", e.batch, led.batch),
             ("    of which by lines cut (their work lost)", e.cut, led.cut)]
    width = 52
    title = (f"slot-seconds of {PRIMARY} with the batch ({r.engine.slots} x "
             f"{r.scale.window_s:g} s = {e.capacity:.0f})")
    rows = [f"{title:<{width}}{'engine':>11}{'ledger':>10}"]
    for label, mine, theirs in cells:
        rows.append(f"{label:<{width}}{mine:>11.1f}{theirs:>10.1f}")
    rows += [f"{'  batch share of the idle':<{width}}{e.share:>11.1%}{led.share:>10.1%}"
             f"  >= 90%: {_verdict(e.share >= 0.9)}",
             f"{'  the same, lines answered only':<{width}}{e.kept_share:>11.1%}"
             f"{led.kept_share:>10.1%}",
             f"  batch lines in the window: {r.lines[0]} answered, {r.lines[1]} cut; "
             f"preemptions in the whole run: {r.preempted}",
             f"  batch lines that took a slot while an interactive request waited for one: "
             f"{r.taken_while_waiting}",
             "  engine: each request's [arrival, end] in the simulated engine's records; "
             "ledger: each row's",
             "  slot time, ending where its total time ends; both clipped to the window. "
             "Idle = slots x window",
             "  - interactive; batch lines are known by their request id (<job>-<line>) on the",
             "  engine, by the ledger's batch mark in the ledger.",
             ""]
    return rows


def _ms(values: Sequence[float]) -> str:
    if not values:
        return f"{'-':>9}{'-':>9}{0:>5}"
    return (f"{percentile(values, 50) * 1000:>9.2f}{percentile(values, 99) * 1000:>9.2f}"
            f"{len(values):>5}")


def _preemption(r: Results) -> list[str]:
    probes = [p for p in r.probes.probes if not p.simple]
    simple = [p for p in r.probes.probes if p.simple]
    queue = [r.waits_shared[p.stream.request_id] for p in probes
             if p.stream.request_id in r.waits_shared]
    reached = [p.reached_s for p in probes if p.reached_s is not None]
    slot = [p.slot_s for p in probes if p.slot_s is not None]
    cut = [p.cut_end_s for p in probes if p.cut_end_s is not None]
    ttft = [p.stream.ttft_s for p in probes if p.stream.ttft_s is not None]
    width = 60
    rows = [f"{'preemption: arrivals while batch lines held every slot':<{width}}"
            f"{'p50 ms':>9}{'p99 ms':>9}{'n':>5}",
            f"{'  in line -> slot, the gateway (its queue wait, ledger)':<{width}}"
            f"{_ms(queue)}",
            f"{'  arrival -> it reaches the engine':<{width}}{_ms(reached)}",
            f"{'  arrival -> its sequence starts on the engine':<{width}}{_ms(slot)}",
            f"{'  arrival -> the cut line ends on the engine':<{width}}{_ms(cut)}",
            f"{'  arrival -> first token, the client (TTFT included)':<{width}}"
            f"{_ms(ttft)}",
            "baselines, same run (the gateway without the batch)",
            f"{'  arrival -> sequence starts, a slot free':<{width}}{_ms(r.free_slot)}",
            f"{'  hand-off, interactive to interactive (end -> start)':<{width}}"
            f"{_ms(r.hand_offs)}",
            f"{'  engine abort (client closes -> engine request ends)':<{width}}"
            f"{_ms(r.aborts)}"]
    if r.probes.misses and not probes:
        rows.append(f"  no probe: the batch never held every slot within "
                    f"{r.probes.misses} waits (at most {r.probes.most_held} of "
                    f"{r.engine.slots})")
    elif queue and slot and r.hand_offs and r.aborts and r.free_slot:
        rows += _preemption_target(queue, slot, r)
    if simple:
        moved = sum(p.stream.backend != PRIMARY for p in simple)
        rows.append(f"  simple prompts sent then: {len(simple)}, served elsewhere than "
                    f"{PRIMARY} (steered, no preemption): {moved}")
    return rows


def _preemption_target(queue: list[float], slot: list[float], r: Results) -> list[str]:
    budget = percentile(r.hand_offs, 99) + percentile(r.aborts, 99)
    worst, free = percentile(queue, 99), percentile(r.free_slot, 99)
    engine = percentile(slot, 99)
    return [f"  target: the gateway's slot, p99 {worst * 1000:.2f} ms <= hand-off p99 + abort "
            f"p99 = {budget * 1000:.2f} ms: {_verdict(worst <= budget)}",
            f"  on the engine: p99 {engine * 1000:.2f} ms, a free slot's {free * 1000:.2f} ms: "
            f"{(engine - free) * 1000:+.2f} ms; within one hand-off + abort of it: "
            f"{_verdict(engine - free <= budget)}"]


def print_table(r: Results) -> None:
    print("\n".join(_head(r) + _interactive(r) + _slots(r) + _preemption(r)))
