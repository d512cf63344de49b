#!/usr/bin/env python3
"""Does jit_ahead's presence slow serving? Warm cache with and without jit_ahead, interleaved.

One cold arm (no jit_ahead) fills a Triton cache; then arms ``warm`` (no jit_ahead) and ``warm-jit``
(jit_ahead session, planning and helpers, nothing left to build) run alternately in fresh processes of
``scripts/gpu/serving_loop.py`` on that cache, in ABBA order, ``--pairs`` times. Per process: the median
and worst request of the 40-request loop; the summary compares the two arms' medians, run by run, so the
host's drift between processes shows next to any difference.

    python scripts/gpu/serving_ab.py --out results/<date>-h200-serving-ab --model qwen3-liger --pairs 2
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_arm(model: str, arm: str, cache: str) -> dict:
    proc = subprocess.run([sys.executable, os.path.join(HERE, "serving_loop.py"), "--arm", arm, "--model", model],
                          env=dict(os.environ, TRITON_CACHE_DIR=cache), capture_output=True, text=True, timeout=590)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("ARM ")), None)
    if line is None:
        raise RuntimeError(f"{arm} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(line[4:])
    return {"arm": arm, "median_request_s": statistics.median(result["request_s"]),
            "worst_request_s": result["worst_request_s"], "end_s": result["end_s"],
            "executor_compiles_serving": result["executor_compiles_serving"]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="a results/<date>-<what> folder")
    parser.add_argument("--model", default="qwen3-liger")
    parser.add_argument("--pairs", type=int, default=2, help="ABBA blocks (each runs both arms twice)")
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    from serving_loop import versions

    runs = []
    with tempfile.TemporaryDirectory() as cache:
        runs.append(run_arm(args.model, "cold", cache))
        for _ in range(args.pairs):
            for arm in ("warm", "warm-jit", "warm-jit", "warm"):
                runs.append(run_arm(args.model, arm, cache))
                print(json.dumps(runs[-1]), flush=True)
    medians = {arm: [r["median_request_s"] for r in runs if r["arm"] == arm] for arm in ("warm", "warm-jit")}
    ratio = statistics.mean(medians["warm-jit"]) / statistics.mean(medians["warm"])
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": versions(), "model": args.model, "runs": runs, "median_ratio": ratio}
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"serving_ab_{args.model}")
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=1)
    lines = [f"# Serving with and without jit_ahead on a warm cache, interleaved ({report['date']})", "",
             f"`python scripts/gpu/serving_ab.py --model {args.model} --pairs {args.pairs}`; "
             + ", ".join(f"{k} {v}" for k, v in report["versions"].items()), "",
             "| # | arm | median request s | worst request s | end s | executor compiles in serving |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {i} | {r['arm']} | {r['median_request_s']:.4f} | {r['worst_request_s']:.4f} | {r['end_s']:.1f} | "
              f"{r['executor_compiles_serving']} |" for i, r in enumerate(runs)]
    lines += ["", f"Mean of the per-process medians, warm-jit / warm: **{ratio:.3f}** "
              f"(warm {', '.join(f'{m:.4f}' for m in medians['warm'])}; "
              f"warm-jit {', '.join(f'{m:.4f}' for m in medians['warm-jit'])})."]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
