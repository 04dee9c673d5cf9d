"""Where a profiled gateway spends its time: py-spy's raw (collapsed) stacks, summarised.

    .venv/bin/python bench/suite_profile.py bench/.work/profile-c64.txt

Each line of a raw profile is `frame;frame;...;leaf COUNT`, a frame `function (file)`
(py-spy --nolineno); with --threads the first frame is `thread (TID): NAME`. Only the
main thread (the event loop: every request's path) is summarised; other threads (the
ledger's SQLite writer) are counted apart. Reported, as shares of the main thread's
samples (py-spy leaves idle samples out):
- per function of slotgate's own code (router/, policies/, classifier/): *inclusive* (the
  function is anywhere on the stack) and *own* (it is the deepest slotgate frame: its own
  lines plus the library calls it makes, without the slotgate functions it calls);
- per (deepest slotgate function, the frame it called): what that own time was spent on;
- per library, the leaf frames (where the CPU actually was).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_OWN = re.compile(r"(?:^|/)((?:router|policies|classifier)/[\w/]+\.py)$")
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*)\)$")
_LIBRARIES = ("aiohttp", "asyncio", "uvloop", "logging", "json", "prometheus_client",
              "sqlite3", "multidict", "yarl", "orjson", "numpy", "sklearn", "ssl", "socket",
              "selectors", "concurrent", "threading", "redis", "propcache")


@dataclass
class Profile:
    samples: int = 0  # of the main thread (all samples when the profile has no threads)
    threads: Counter[str] = field(default_factory=Counter)  # samples per thread name
    inclusive: Counter[str] = field(default_factory=Counter)
    own: Counter[str] = field(default_factory=Counter)
    own_callee: Counter[str] = field(default_factory=Counter)  # deepest own -> next frame
    leaf_library: Counter[str] = field(default_factory=Counter)
    leaf: Counter[str] = field(default_factory=Counter)

    def share(self, count: int) -> float:
        return count / self.samples if self.samples else 0.0


def _split(frame: str) -> tuple[str, str]:
    match = _FRAME.match(frame.strip())
    return (match["func"], match["file"]) if match else (frame.strip(), "")


def library_of(file: str) -> str:
    own = _OWN.search(file)
    if own:
        return own.group(1).split("/")[0] + "/"
    parts = re.split(r"[/\\.]", file)
    for name in _LIBRARIES:
        if name in parts:
            return name
    return "other" if file else "native"


_PASS_THROUGH = ("asyncio/runners.py", "asyncio/base_events.py", "uvloop/__init__.py")


def _callee(frames: list[tuple[str, str]], at: int) -> str:
    """The first frame from `at` on that is not the event loop's own run machinery."""
    while at + 1 < len(frames) and frames[at][1].endswith(_PASS_THROUGH):
        at += 1
    return f"{frames[at][1]}:{frames[at][0]}" if at < len(frames) else "(its own lines)"


def parse(text: str) -> Profile:
    profile = Profile()
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        parts = stack.split(";")
        if parts[0].startswith("thread ("):
            thread = parts.pop(0).partition(": ")[2] or "?"
            idle = parts[-1].startswith("_worker (concurrent/futures/thread.py)")
            profile.threads[thread + (" (idle pool worker)" if idle else "")] += count
            if thread != "MainThread":
                continue
        frames = [_split(f) for f in parts]
        profile.samples += count
        seen: set[str] = set()
        deepest: str | None = None
        callee = "(its own lines)"
        for i, (func, file) in enumerate(frames):
            own = _OWN.search(file)
            if own:
                name = f"{own.group(1)}:{func}"
                deepest = name
                callee = _callee(frames, i + 1)
                if name not in seen:
                    seen.add(name)
                    profile.inclusive[name] += count
        if deepest is not None:
            profile.own[deepest] += count
            profile.own_callee[f"{deepest} -> {callee}"] += count
        leaf_func, leaf_file = frames[-1]
        profile.leaf_library[library_of(leaf_file)] += count
        profile.leaf[f"{leaf_file}:{leaf_func}"] += count
    return profile


def summary(profile: Profile, top: int = 15) -> dict[str, object]:
    def rows(counter: Counter[str]) -> list[dict[str, object]]:
        return [{"function": name, "samples": n, "share": round(profile.share(n), 4)}
                for name, n in counter.most_common(top)]

    return {"samples": profile.samples, "own_inclusive": rows(profile.inclusive),
            "own_exclusive": rows(profile.own), "own_callee": rows(profile.own_callee),
            "leaf_by_library": rows(profile.leaf_library),
            "leaf": rows(profile.leaf), "threads": dict(profile.threads.most_common()),
            "own_code_on_stack": round(profile.share(sum(profile.own.values())), 4)}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    result = summary(parse(Path(argv[0]).read_text()))
    print(f"{result['samples']} samples; slotgate code on the stack in "
          f"{float(str(result['own_code_on_stack'])) * 100:.1f}%")
    for key in ("own_inclusive", "own_exclusive", "own_callee", "leaf_by_library", "leaf"):
        print(f"\n{key}:")
        rows = result[key]
        assert isinstance(rows, list)
        for row in rows:
            print(f"  {row['share'] * 100:5.1f}%  {row['function']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
