#!/usr/bin/env python3
"""CPU politeness: how much a CPU-bound executor thread slows down while helpers build beside it.

The executor thread runs a fixed pure-Python task over and over (the host-side work of a serving loop:
scheduling, tokenizing, launching) and times each round. Arms, side by side in one process:
  alone      no helpers
  helpers    a pool of N helpers (default: the usable CPUs minus one, jit_ahead's default) building real
             Liger-Kernel and fla variants at nice 19; only rounds while builds are in flight count
  alone      again, to show drift
The pool's own threads live in this process (they read the helpers' pipes), so their share of the GIL
is part of what is measured. Writes cpu_politeness.json and .md to --out.

    python scripts/bench/cpu_politeness.py --out docs/bench [--workers N] [--every K]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
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
    return {"rounds_s": rounds, "build_wall_s": wall, "variants": len(tickets),
            "failed": sum(1 for t in tickets if not t.result.ok)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=max(1, len(os.sched_getaffinity(0)) - 1))
    parser.add_argument("--every", type=int, default=1, help="use every K-th planned variant")
    args = parser.parse_args()
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(os.path.abspath(args.out), ".politeness-cache"))

    from build_throughput import planned_variants, versions

    requests = planned_variants(args.every)
    before = alone(5.0)
    helpers = with_helpers(requests, args.workers)
    after = alone(5.0)
    result = {"versions": versions(), "workers": args.workers, "round_work": "400k-iteration Python loop",
              "alone_before_s": before, "with_helpers": helpers, "alone_after_s": after}
    print(write_report(args.out, result))
    return 1 if helpers["failed"] else 0


def summary(result: dict) -> dict:
    """Median and 90th-percentile round times and the slowdown with helpers against alone (both runs)."""
    alone_rounds = result["alone_before_s"] + result["alone_after_s"]
    busy = result["with_helpers"]["rounds_s"]

    def p90(xs):
        return statistics.quantiles(xs, n=10)[-1] if len(xs) >= 10 else max(xs)

    return {"alone_median_ms": statistics.median(alone_rounds) * 1e3, "alone_p90_ms": p90(alone_rounds) * 1e3,
            "helpers_median_ms": statistics.median(busy) * 1e3, "helpers_p90_ms": p90(busy) * 1e3,
            "slowdown_median": statistics.median(busy) / statistics.median(alone_rounds),
            "drift": statistics.median(result["alone_after_s"]) / statistics.median(result["alone_before_s"]),
            "rounds_with_helpers": len(busy)}


def write_report(out: str, result: dict) -> str:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "cpu_politeness.json"), "w") as f:
        json.dump(result, f, indent=1)
    s, v, h = summary(result), result["versions"], result["with_helpers"]
    lines = [f"# CPU politeness ({v['date']})", "",
             f"`python scripts/bench/cpu_politeness.py --out <dir>`; Python {v['python']}, torch {v['torch']}, "
             f"Triton {v['triton']}; {v.get('gpu', 'no GPU')}; {v['cpu']}, {v['cpus_usable']} usable CPUs.", "",
             f"An executor thread repeats a {result['round_work']}; {result['workers']} helper(s) at nice 19 build "
             f"{h['variants']} variants beside it in {h['build_wall_s']:.1f} s.", "",
             "| arm | round median ms | round p90 ms |", "|---|---|---|",
             f"| alone (before and after) | {s['alone_median_ms']:.2f} | {s['alone_p90_ms']:.2f} |",
             f"| {result['workers']} helpers building | {s['helpers_median_ms']:.2f} | {s['helpers_p90_ms']:.2f} |", "",
             f"Slowdown of the executor thread (median round): {s['slowdown_median']:.3f}x over "
             f"{s['rounds_with_helpers']} rounds; drift between the two alone runs {s['drift']:.3f}x.", "",
             "Raw rounds: `cpu_politeness.json` beside this file."]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "cpu_politeness.md"), "w") as f:
        f.write(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
