#!/usr/bin/env python3
"""CPU politeness: how much a CPU-bound executor thread slows down while helpers build beside it.

The executor thread runs a fixed pure-Python task over and over (the host-side work of a serving loop:
scheduling, tokenizing, launching) and times each round. Arms, side by side in one process:
  alone      no helpers
  helpers    a pool of N helpers building real Liger-Kernel and fla variants at nice 19, for each N
             asked (default: jit_ahead's helper count before serving, CPUs minus one, and its count once
             serving has started, JIT_AHEAD_SERVING_WORKERS); only rounds while builds are in flight count
  alone      again, to show drift
The pool's own threads live in this process (they read the helpers' pipes), so their share of the GIL
is part of what is measured. Writes cpu_politeness.json and .md to --out.

    python scripts/bench/cpu_politeness.py --out results/<date>-<host>-cpu-politeness [--workers N,M] [--every K]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def one_round() -> float:
    t0 = time.perf_counter()
    total = 0
    for i in range(400_000):
        total += (i * i) % 7
    return time.perf_counter() - t0


def spin_while(keep_going) -> list[float]:
    rounds = []
    while keep_going():
        rounds.append(one_round())
    return rounds


def alone(seconds: float) -> list[float]:
    end = time.perf_counter() + seconds
    return spin_while(lambda: time.perf_counter() < end)


def with_helpers(requests, workers: int) -> dict:
    from build_throughput import build_all, ready_pool

    pool, _, _, _ = ready_pool(requests, workers, "fork")
    finished = threading.Event()
    tickets: list = []

    def build() -> None:
        tickets.extend(build_all(pool, requests))
        finished.set()

    builder = threading.Thread(target=build)
    t0 = time.perf_counter()
    builder.start()
    rounds = spin_while(lambda: not finished.is_set())
    wall = time.perf_counter() - t0
    builder.join()
    pool.close()
    return {"workers": workers, "rounds_s": rounds, "build_wall_s": wall, "variants": len(tickets),
            "failed": sum(1 for t in tickets if not t.result.ok)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", help="comma-separated helper counts (default: before and during serving)")
    parser.add_argument("--every", type=int, default=1, help="use every K-th planned variant")
    args = parser.parse_args()
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="jit_ahead_politeness_"))

    from build_throughput import planned_variants, versions

    from jit_ahead.core import knobs

    counts = ([int(n) for n in args.workers.split(",")] if args.workers else
              sorted({knobs.default_worker_count(), knobs.serving_worker_count()}, reverse=True))
    requests = planned_variants(args.every)
    before = alone(5.0)
    arms = [with_helpers(requests, n) for n in counts]
    after = alone(5.0)
    result = {"versions": versions(), "round_work": "400k-iteration Python loop",
              "alone_before_s": before, "arms": arms, "alone_after_s": after}
    print(write_report(args.out, result))
    return 1 if any(arm["failed"] for arm in arms) else 0


def _arms(result: dict) -> list[dict]:
    # runs before 2026-12-01T08 measured one count: {"workers": N, "with_helpers": {...}}
    return result.get("arms") or [dict(result["with_helpers"], workers=result["workers"])]


def _p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10)[-1] if len(xs) >= 10 else max(xs)


def summary(result: dict) -> dict:
    """Median and 90th-percentile round times alone and beside each helper count, and the slowdowns."""
    alone_rounds = result["alone_before_s"] + result["alone_after_s"]
    alone_median = statistics.median(alone_rounds)
    return {"alone_median_ms": alone_median * 1e3, "alone_p90_ms": _p90(alone_rounds) * 1e3,
            "drift": statistics.median(result["alone_after_s"]) / statistics.median(result["alone_before_s"]),
            "arms": [{"workers": arm["workers"], "median_ms": statistics.median(arm["rounds_s"]) * 1e3,
                      "p90_ms": _p90(arm["rounds_s"]) * 1e3, "rounds": len(arm["rounds_s"]),
                      "slowdown_median": statistics.median(arm["rounds_s"]) / alone_median,
                      "variants": arm["variants"], "build_wall_s": arm["build_wall_s"]} for arm in _arms(result)]}


def write_report(out: str, result: dict, name: str = "cpu_politeness") -> str:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    s, v = summary(result), result["versions"]
    lines = [f"# CPU politeness ({v['date']})", "",
             f"`python scripts/bench/cpu_politeness.py --out <dir>`; Python {v['python']}, torch {v['torch']}, "
             f"Triton {v['triton']}; {v.get('gpu', 'no GPU')}; {v['cpu']}, {v['cpus_usable']} usable CPUs.", "",
             f"An executor thread repeats a {result['round_work']} alone, then while helpers at nice 19 build "
             "Liger-Kernel and fla variants beside it (only rounds while builds are in flight count).", "",
             "| arm | variants built | round median ms | round p90 ms | slowdown (median) |", "|---|---|---|---|---|",
             f"| alone (before and after; drift {s['drift']:.3f}x) | | {s['alone_median_ms']:.2f} | "
             f"{s['alone_p90_ms']:.2f} | |"]
    for arm in s["arms"]:
        lines.append(f"| {arm['workers']} helper(s) building | {arm['variants']} in {arm['build_wall_s']:.1f} s | "
                     f"{arm['median_ms']:.2f} | {arm['p90_ms']:.2f} | {arm['slowdown_median']:.3f}x over "
                     f"{arm['rounds']} rounds |")
    lines += ["", f"Raw rounds: `{name}.json` beside this file."]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
