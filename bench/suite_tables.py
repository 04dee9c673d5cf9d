"""The suite's tables and text blocks: number formatting, the markdown tables (per target,
ratios, slotgate alone), the profile summary and the machine lines, shared by the terminal
report and docs/BENCHMARKS.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from suite_figures import ROWS, redis_figures

Result = dict[str, Any]


def num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value * 100:.0f}%"
    a = abs(value)
    if a >= 1000:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if a >= 0.1 else f"{value:.3f}"


def cell(s: Result | None, unit: str = "", signed: bool = False) -> str:
    if not s:
        return "-"
    sign = "+" if signed and s["median"] >= 0 else ""
    main = sign + num(s["median"], unit)
    if s["n"] <= 1:
        return main
    return f"{main} ({num(s['min'], unit)} to {num(s['max'], unit)})"


def ratio_cell(s: Result | None) -> str:
    if not s:
        return "-"
    if s["n"] <= 1:
        return f"x{_rnum(s['median'])}"
    return f"x{_rnum(s['median'])} ({_rnum(s['min'])}-{_rnum(s['max'])})"


def _rnum(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if value >= 0.01 else f"{value:.4f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def _units(unit: str) -> str:
    return {"ms": " (ms)", "us": " (us)", "/s": "", "x": ""}.get(unit, "")


def per_target_table(result: Result, fig: Result) -> list[str]:
    targets = fig["targets"]
    rows = []
    for label, _phase, _key, unit in ROWS:
        name = label.removeprefix("+ ")
        rows.append([name + _units(unit)] + [
            cell(fig["per_target"][label][t], unit, signed=label.startswith("+"))
            for t in targets])
    peak = result.get("peak_rss_mib", {})
    rows.append(["peak RSS, VmHWM (MiB)"] + [num(peak.get(t)) for t in targets])
    return table(["figure", *targets], rows)


def ratio_table(fig: Result) -> list[str]:
    rows = [[label] + [ratio_cell(fig["ratios"][label][p]) for p in fig["pairs"]]
            for label in fig["ratios"]]
    return table(["figure", *fig["pairs"]], rows)


def slotgate_table(result: Result) -> list[str]:
    rows: list[list[str]] = []
    sat = result.get("saturation") or {}
    q = sat.get("queue_memory")
    if q:
        short = (f"; **only {q['queued']:,} of {q['wanted']:,} were in the queue when the "
                 f"{q['time_limit_s']:g} s allowed ran out**"
                 if q["queued"] < q["wanted"] else "")
        rows.append([f"memory per queued streaming request ({q['queued']:,} queued)",
                     f"**{num(q['kib_per_request'])} KiB**",
                     f"VmRSS {num(q['rss_before_mib'])} -> {num(q['rss_after_mib'])} MiB; "
                     f"clients connected for {q['seconds_to_queue']:.1f} s "
                     f"({q['queued'] / q['seconds_to_queue']:,.0f} queued/s){short}"])
    h = sat.get("handoff")
    if h:
        rows.append(["slot hand-off under saturation, p50 / p99 (ms)",
                     f"**{num(h['gateway_ms']['p50'])} / {num(h['gateway_ms']['p99'])}**",
                     f"direct client turnaround {num(h['direct_ms']['p50'])} / "
                     f"{num(h['direct_ms']['p99'])}; added {h['added_p50_ms']:+.2f} / "
                     f"{h['added_p99_ms']:+.2f}; {h['requests']:,} requests, 1 slot, "
                     f"20 clients; engine overlaps {h['engine_overlaps']}"])
    for size, c in (result.get("classifier") or {}).items():
        if c:
            rows.append([f"classifier predict, {size}-char prompt, p50 / p99 (us)",
                         f"**{num(c['p50_us'])} / {num(c['p99_us'])}**",
                         "bench/classifier_latency.py, in-process"])
    r = redis_figures(result.get("redis"))
    if r:
        rows.append(["Redis coordination, requests/s c=64: 1 process",
                     f"**{cell(r['rps_1'])}**", f"CPU per request {cell(r['cpu_1'])} us; "
                     "unpinned: the workers, wrk, the mock and Redis share the 2 cores"])
        ratio = f"x{r['ratio']:.2f} of 1 process" if r["ratio"] else ""
        rows.append(["Redis coordination, requests/s c=64: 2 processes (`--workers 2`)",
                     f"**{cell(r['rps_2'])}**",
                     f"{ratio}; CPU per request {cell(r['cpu_2'])} us (both workers)"])
    return table(["figure", "value", "detail"], rows)


def profile_lines(profile: Result | None) -> list[str]:
    if not profile:
        return ["No profile this run (py-spy or wrk missing: see the notes)."]
    ticks = profile["seconds"] * profile.get("rate_hz", 250)
    others = "; ".join(f"{name} {n:,}" for name, n in profile.get("threads", {}).items()
                       if name != "MainThread")
    out = [f"py-spy (`record --threads --nolineno --rate 250`) on `slotgate serve` for "
           f"{profile['seconds']} s under wrk at c=64: the main thread (the event loop, "
           f"every request's path) was active in {profile['samples']:,} of ~{ticks:,} "
           f"sampling ticks ({profile['samples'] / ticks * 100:.0f}%); the shares below are "
           f"of those samples. slotgate's own code (router/, policies/, classifier/) is on "
           f"the stack in {profile['own_code_on_stack'] * 100:.0f}% of them. Other threads' "
           f"samples: {others or 'none'}. Raw stacks: `{profile['raw_file']}` (not "
           f"committed; `.venv/bin/python bench/suite_profile.py FILE` summarises it).", ""]
    inclusive = {r["function"]: r["share"] for r in profile["own_inclusive"]}
    rows = [[f"`{r['function']}`", f"{r['share'] * 100:.1f}%",
             f"{inclusive[r['function']] * 100:.1f}%" if r["function"] in inclusive else "-"]
            for r in profile["own_exclusive"][:15]]
    out += ["Hot spots: the deepest slotgate frame of each sample (*own*: the function's "
            "lines and the library code it calls, without the slotgate functions it calls; "
            "`run.py:run_until_signal` is the event loop and aiohttp's protocol code outside "
            "any handler). *Inclusive*: on the stack anywhere (top 15 only).", ""]
    out += table(["slotgate function", "own", "inclusive"], rows)
    out += ["", "The same own time split by what each function was calling (the frame below "
            "the deepest slotgate frame):", ""]
    out += table(["slotgate function -> callee", "share"],
                 [[f"`{r['function']}`", f"{r['share'] * 100:.1f}%"]
                  for r in profile.get("own_callee", [])[:15]])
    out += ["", "Where the main thread was (leaf frames), by library, and the top leaves:", ""]
    out += table(["library", "share"], [[r["function"], f"{r['share'] * 100:.1f}%"]
                                         for r in profile["leaf_by_library"][:10]])
    leaves = [[f"`{r['function']}`", f"{r['share'] * 100:.1f}%"] for r in profile["leaf"][:12]]
    out += ["", *table(["leaf frame", "share"], leaves)]
    return out


def machine_lines(result: Result) -> list[str]:
    m = result["machine"]
    return [
        f"- {m['nproc']} CPUs (`nproc`), `{m['cpu_model']}`, {m['memory_gib']} GiB RAM, "
        f"kernel {m['kernel']}; shared with other people's work (load average "
        f"{m['loadavg'][0]:.2f} at the start, {m['loadavg_end'][0]:.2f} at the end)",
        f"- Python {m['python']}, aiohttp {m['aiohttp']}, uvloop {m['uvloop']}; "
        f"LiteLLM {m['litellm'] or 'not run'}; {m['nginx'] or 'nginx not run'}; "
        f"{m['wrk'] or 'wrk missing'}; {m['redis'] or 'redis-server missing'}",
    ]



def _times(s: Result | None) -> str:
    """A ratio to `off` with three decimals (a target's bound is x1.03)."""
    if not s:
        return "-"
    if s["n"] <= 1:
        return f"x{s['median']:.3f}"
    return f"x{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})"


def tracing_table(arms: Result) -> list[str]:
    """The tracing arms (bench/tracing_arms.py's summary): raw figures' medians and the
    per-round ratios to off, with the issue's targets."""
    rows = []
    for arm, a in arms.items():
        target = "-" if a["target"] is None else f"<= x{a['target']:.2f}"
        met = "-" if a["met"] is None else ("met" if a["met"] else "**not met**")
        rows.append([a["label"] + (f" ({a['errors']:,} errors)" if a["errors"] else ""),
                     cell(a["rps"]), cell(a["cpu_us"]),
                     "x1" if arm == "off" else _times(a["cpu_ratio"]),
                     "x1" if arm == "off" or a.get("cpu_best_ratio") is None
                     else f"x{a['cpu_best_ratio']:.3f}",
                     "x1" if arm == "off" else _times(a["rps_ratio"]), target, met])
    return table(["arm", "requests/s", "CPU per request (us)", "CPU vs off",
                  "CPU vs off, best rounds", "requests/s vs off", "target (CPU)", "met"], rows)
