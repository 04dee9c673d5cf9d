"""The shadow bench's table (bench/shadow_share.py): the figures of one run, each target's
beside it, and how each figure is made."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from batch_gateway import PRIMARY
from batch_traffic import Stream
from load import percentile
from shadow_clock import Holds, eta_errors
from shadow_figures import Calls, Counts, slot_sum

if TYPE_CHECKING:
    from shadow_share import Results

TARGET = 1.05  # shadows on / off, interactive TTFT p95
HAND_OFF_S = 0.05  # a wait this short beside a shadow is the preemption's hand-off


def _ttfts(streams: Sequence[Stream], backend: str | None = None) -> list[float]:
    return [s.ttft_s for s in streams
            if s.ttft_s is not None and (backend is None or s.backend == backend)]


def _ratio(after: float, before: float) -> str:
    return f"x{after / before:.2f}" if before > 0 else "-"


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _streams(r: Results) -> tuple[list[Stream], list[Stream]]:
    """Every pair's streams: shadows off, on."""
    return [s for m in r.pairs for s in m.off], [s for m in r.pairs for s in m.on]


def _head(r: Results) -> list[str]:
    e = r.engine
    off = _streams(r)[0]
    simple = sum(m.simple for m in r.pairs)
    return [
        f"#33 shadow bench: config.yaml's {PRIMARY} ({e.slots} slots, first token "
        f"{e.ttft_s:g} s, {e.tokens_per_s:g} tokens/s, answers {e.shortest}-{e.longest} "
        "tokens)",
        f"capacity {e.slots} / {e.mean_hold_s:.2f} s mean hold = {e.capacity_per_s:.3f} "
        f"requests/s; interactive: Poisson {r.rate:.3f}/s (0.8x) for {r.scale.window_s:g} s, "
        f"streamed, {simple} of {len(off)} the demo's simple prompts, the rest hard",
        f"{len(r.pairs)} pairs of gateways at once, each pair given its own arrivals; in a "
        f"pair, one replays every request the route",
        f"moves on {PRIMARY} and judges it there (quality.shadow_rate 1.0), the other none "
        "(0); figures pool the pairs",
        "",
    ]


def _row(label: str, off: float, on: float, fmt: str, target: str = "",
         ratio: bool = True) -> str:
    shown = _ratio(on, off) if ratio else ""
    return (f"{label:<44}{format(off, fmt):>12}{format(on, fmt):>12}{shown:>8}  "
            f"{target}").rstrip()


def _interactive(r: Results) -> list[str]:
    off, on = _streams(r)
    moved = sum(m.moved[0] for m in r.pairs), sum(m.moved[1] for m in r.pairs)
    p95 = percentile(_ttfts(off), 95), percentile(_ttfts(on), 95)
    big = percentile(_ttfts(off, PRIMARY), 95), percentile(_ttfts(on, PRIMARY), 95)
    refused = sum(s.refused for s in off), sum(s.refused for s in on)
    elsewhere = sum(s.backend != PRIMARY for s in off), sum(s.backend != PRIMARY for s in on)
    return [
        f"{'interactive (' + str(len(off)) + ' streams each)':<44}{'shadows off':>12}"
        f"{'shadows on':>12}{'ratio':>8}  target",
        _row("  time to first token p50 (s)", percentile(_ttfts(off), 50),
             percentile(_ttfts(on), 50), ".3f"),
        _row("  time to first token p95 (s)", *p95, ".3f",
             f"<= x{TARGET:.2f}: {_verdict(p95[1] <= TARGET * p95[0])}"),
        _row(f"  the same, streams served by {PRIMARY} (s)", *big, ".3f"),
        f"{'  refused (429/503, or an error event)':<44}{refused[0]:>12}{refused[1]:>12}"
        f"{'':>8}  none more: {_verdict(refused[1] <= refused[0])}",
        f"{'  moved by the classifier (ledger)':<44}{moved[0]:>12}{moved[1]:>12}",
        f"{'  served elsewhere than ' + PRIMARY:<44}{elsewhere[0]:>12}{elsewhere[1]:>12}",
        *_paired(r),
        "",
    ]


def _paired(r: Results) -> list[str]:
    """Each request against itself: the streams that ran on the same backend in both."""
    off, on = _streams(r)
    by_id = {s.request_id: s for s in off}
    deltas: dict[str, float] = {}
    apart = 0
    for s in on:
        twin = by_id.get(s.request_id)
        if twin is None or s.ttft_s is None or twin.ttft_s is None:
            continue
        if s.backend != twin.backend:
            apart += 1
            continue
        deltas[s.request_id] = (s.ttft_s - twin.ttft_s) * 1000
    if not deltas:
        return ["  paired: no request ran on the same backend in both"]
    took = [deltas[i] for m in r.pairs for i in m.preemptors if i in deltas]
    return [f"  paired, on - off, the same request on the same backend ({len(deltas)}; "
            f"{apart} ran on different ones):",
            f"    TTFT difference {_spread(list(deltas.values()))}",
            f"    of those that took a cut shadow call's slot ({len(took)}): {_spread(took)}"]


def _spread(ms: list[float]) -> str:
    if not ms:
        return "-"
    return (f"p50 {percentile(ms, 50):+.1f} ms, p95 {percentile(ms, 95):+.1f} ms, "
            f"max {max(ms):+.1f} ms")


def _shadows(r: Results) -> list[str]:
    c = sum((m.counts for m in r.pairs), Counts({}, {}, 0.0))
    out = c.outcomes
    verdicts = ", ".join(f"{v} {int(c.verdicts.get(v, 0))}"
                         for v in ("better", "tie", "worse", "none"))
    ledger: dict[str, int] = {}
    for m in r.pairs:
        for v, n in m.verdicts_kept.items():
            ledger[v] = ledger.get(v, 0) + n
    kept = ", ".join(f"{v} {n}" for v, n in sorted(ledger.items())) or "none"
    drained = (f"after {r.drained_s:.1f} s" if r.drained_s < r.scale.drain_s
               else f"still busy after {r.scale.drain_s:g} s")
    return [
        f"shadows (slotgate_shadows_total, _verdicts_total of the shadow gateways; their "
        f"runners idle {drained})",
        f"  kept {int(out.get('kept', 0))}, skipped {c.skipped()}, cut {int(out.get('cut', 0))} "
        f"(an interactive request took the slot: it waits again), failed "
        f"{int(out.get('failed', 0))}, replay failed {int(out.get('replay_failed', 0))}, "
        f"still waiting {int(c.waiting)}",
        f"  judged {c.judged}: the 8B's answer {verdicts}",
        f"  verdicts in the ledger: {kept}",
        "",
    ]


def _slots(r: Results) -> list[str]:
    e, led = slot_sum(m.slots for m in r.pairs), slot_sum(m.ledger_slots for m in r.pairs)
    calls = sum((m.calls for m in r.pairs), Calls(0, 0, 0, 0.0, 0.0, 0.0))
    took = sum(m.took_slot_while_waiting for m in r.pairs)
    waited = sum(m.waited_beside_shadow for m in r.pairs)
    width = 52
    title = (f"slot-seconds of {PRIMARY}, shadows on ({len(r.pairs)} x {r.engine.slots} x "
             f"{r.scale.window_s:g} s = {e.capacity:.0f})")
    rows = [f"{title:<{width}}{'engine':>11}{'ledger':>10}"]
    for label, mine, theirs in (("  held by interactive requests", e.interactive,
                                 led.interactive),
                                ("  left idle by them", e.idle, led.idle),
                                ("  held by shadow calls", e.batch, led.batch),
                                ("    of which by calls cut", e.cut, led.cut)):
        rows.append(f"{label:<{width}}{mine:>11.1f}{theirs:>10.1f}")
    must = _verdict(took == 0 and waited == 0)
    rows += [
        f"{'  shadow share of the idle':<{width}}{e.share:>11.1%}{led.share:>10.1%}",
        f"  shadow calls on the engine, whole run: {calls.replays} replays ({calls.replay_s:.1f}"
        f" s), {calls.judges} judgements ({calls.judge_s:.1f} s), {calls.cut} cut "
        f"({calls.cut_s:.1f} s): {calls.seconds:.1f} slot-s",
        f"  ledger rows of {PRIMARY} marked batch (the shadows' calls): "
        f"{sum(m.shadow_rows for m in r.pairs)}; calls cut for an interactive request: "
        f"{sum(m.preempted for m in r.pairs)}",
        f"  shadow calls that took a slot while an interactive request waited: {took}",
        f"  interactive requests that waited > {HAND_OFF_S * 1000:g} ms while a shadow call "
        f"held a slot: {waited}   both 0: {must}",
        "  engine: each request's [arrival, end] in the simulated engine's records, shadow "
        "calls known by",
        "  an id the gateway made; ledger: each row's slot time, ending where its total "
        "time ends, shadow",
        "  calls known by the batch mark; both clipped to the window. Idle = slots x window "
        "- interactive.",
    ]
    return rows


def _clock(r: Results) -> list[str]:
    off = sum((m.holds[0] for m in r.pairs), Holds())
    on = sum((m.holds[1] for m in r.pairs), Holds())
    errors = [eta_errors(side, HAND_OFF_S) for side in _streams(r)]
    width = 44
    title = f"{PRIMARY}'s hold model, each second"
    rows = [f"{title:<{width}}"
            f"{'shadows off':>12}{'shadows on':>12}{'ratio':>8}",
            _row("  mean hold its wait forecasts use (s)", _mean(off.forecast),
                 _mean(on.forecast), ".2f"),
            _row("  its running mean hold (s)", _mean(off.running), _mean(on.running), ".2f"),
            f"  wait forecast to streams in its line (> {HAND_OFF_S * 1000:g} ms), forecast "
            f"- actual (s), n {len(errors[0])} / {len(errors[1])}:"]
    for label, q in (("p50", 50), ("p5 (the most optimistic)", 5)):
        rows.append(_row(f"    {label}", percentile(errors[0], q), percentile(errors[1], q),
                         "+.2f", ratio=False))
    rows += ["  a shadow's call teaches the hold model nothing (no interactive request waits "
             "for one):",
             "  the two gateways' models should read alike."]
    return rows


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def print_table(r: Results) -> None:
    print("\n".join(_head(r) + _interactive(r) + _shadows(r) + _slots(r) + [""]
                    + _clock(r)))
