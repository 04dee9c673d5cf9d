"""Python function calls per request made by the gateway, two revisions side by side, on
each path of bench/call_paths.py (a free slot, a stream, a wait in line): a request
path's cost counted, not timed, so that a noisy box cannot hide a change.

    .venv/bin/python bench/request_calls.py [--base REV] [--after REV] [--requests 300]
        [--top 15]

Each revision is checked out in a worktree of its own (`--after` omitted: this working
tree) and measured by this tree's bench/call_paths.py in a process of its own: the
gateway alone on the main thread, its engines and client on another. Prints, per path,
the calls per request of each side and their ratio, and the functions whose counts moved
most.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ab import checkout
from call_paths import PATHS

PATHS_SCRIPT = Path(__file__).resolve().parent / "call_paths.py"


def count(tree: Path, requests: int) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(PATHS_SCRIPT), "--tree", str(tree),
                           "--requests", str(requests), "--json"],
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--after", default=None)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--top", type=int, default=15, help="functions whose counts moved most")
    args = parser.parse_args()
    with checkout(args.base) as base_tree, checkout(args.after) as after_tree:
        base, later = count(base_tree, args.requests), count(after_tree, args.requests)
    for path in PATHS:
        was, now = base["where"][path], later["where"][path]
        moved = sorted(((now.get(k, 0.0) - was.get(k, 0.0), k) for k in {*was, *now}),
                       key=lambda item: -abs(item[0]))
        print(f"{path}:")
        for delta, name in moved[:args.top]:
            if abs(delta) >= 0.5:
                print(f"  {delta:+6.1f}  {name}")
    print(f"\ncalls per request made by the gateway ({args.requests} requests per path)")
    for path in PATHS:
        before, after = base["calls"][path], later["calls"][path]
        print(f"  {path:9} before {before:7,.0f}  after {after:7,.0f}  "
              f"x{after / before:.3f} ({after - before:+,.0f})")


if __name__ == "__main__":
    main()
