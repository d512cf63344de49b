#!/usr/bin/env python3
"""Short-process cost: a process that imports Triton and exits, with and without ``JIT_AHEAD=1``,
interleaved in one run.

Arms: ``plain`` (no JIT_AHEAD), and ``JIT_AHEAD=1`` with 0, 1, 2 and 6 Triton helpers configured, each
running ``-c "import triton"`` and nothing else; and the pair ``torch plain`` / ``torch workers 2`` with
``import torch, triton`` (a server imports torch anyway; each is compared with its own plain arm). Each
round runs every arm once, in a shuffled order, in a fresh interpreter from the installed package (the
start-up hook needs a regular install): the process never plans and never misses, so jit_ahead has
nothing to do and must cost nothing. Per run: wall seconds from
start to exit, and whether any helper or fork server was started (they would show in the stats log).
Writes short_process.json and short_process.md to --out.

    python scripts/bench/short_process.py --out results/<folder> [--rounds 10]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# arm -> (JIT_AHEAD_TRITON_WORKERS or None for no JIT_AHEAD, the process's code); the torch pair is what a
# server's own imports look like, where the session's share is smaller
ARMS = {"plain": (None, "import triton"), "workers 0": ("0", "import triton"), "workers 1": ("1", "import triton"),
        "workers 2": ("2", "import triton"), "workers 6": ("6", "import triton"),
        "torch plain": (None, "import torch, triton"), "torch workers 2": ("2", "import torch, triton")}


def versions() -> dict:
    import torch
    import triton

    tree = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "tree": tree.stdout.strip(), "python": platform.python_version(), "torch": torch.__version__,
            "triton": triton.__version__, "cpus": os.cpu_count()}


def run_once(arm: str) -> dict:
    with tempfile.TemporaryDirectory() as work:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JIT_AHEAD")}
        env["TRITON_CACHE_DIR"] = os.path.join(work, "cache")
        stats = os.path.join(work, "stats.jsonl")
        workers, code = ARMS[arm]
        if workers is not None:
            env.update(JIT_AHEAD="1", JIT_AHEAD_TRITON_WORKERS=workers, JIT_AHEAD_STATS=stats)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True,
                              text=True, timeout=300)
        wall = time.perf_counter() - t0
        events = []
        if os.path.exists(stats):
            events = [json.loads(line)["event"] for line in open(stats) if line.strip()]
    started = sum(e in ("helper_ready", "forkserver_ready") for e in events)
    return {"arm": arm, "status": proc.returncode, "wall_s": wall, "processes_started": started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None, help="order of the arms (default: a new one each run)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    rng = random.Random(seed)
    runs = []
    for _ in range(args.rounds):
        order = list(ARMS)
        rng.shuffle(order)
        runs.extend(run_once(arm) for arm in order)
    def median_of(arm: str) -> float:
        return statistics.median(r["wall_s"] for r in runs if r["arm"] == arm)

    rows = []
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        median = median_of(arm)
        plain = median_of("torch plain" if arm.startswith("torch") else "plain")
        rows.append({"arm": arm, "median_s": median, "max_s": max(r["wall_s"] for r in mine),
                     "ratio_to_plain": median / plain, "failed": sum(r["status"] != 0 for r in mine),
                     "processes_started": sum(r["processes_started"] for r in mine)})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "short_process.json").write_text(json.dumps({"versions": versions(), "seed": seed, "rounds": args.rounds,
                                                        "summary": rows, "runs": runs}, indent=1))
    lines = ["| arm | median s | max s | median / its plain arm | failed runs | helpers or fork servers started |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['arm']} | {r['median_s']:.3f} | {r['max_s']:.3f} | {r['ratio_to_plain']:.2f}x | {r['failed']} | "
              f"{r['processes_started']} |" for r in rows]
    (out / "short_process.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
