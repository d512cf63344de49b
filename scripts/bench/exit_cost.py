#!/usr/bin/env python3
"""Exit cost: how long a process takes to end after its work, with jit_ahead planning and building at that
moment against the same process without jit_ahead, interleaved in one run.

Each round runs ``tests.exit_probe`` twice, each into its own empty Triton cache: ``plain`` (builds the
GatedDeltaNet demo model, prints WORK_DONE, returns) and ``return`` (the same with jit_ahead: planning in
forked planners and builds in helpers still running at WORK_DONE). Per run: seconds from WORK_DONE to the
end of jit_ahead's exit handler (the probe's JIT_AHEAD_CLOSED line) and to the process's end. Writes
exit_cost.json and exit_cost.md to --out.

    python scripts/bench/exit_cost.py --out results/<folder> [--rounds 4]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def versions() -> dict:
    import torch
    import triton

    tree = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "tree": tree.stdout.strip(), "python": platform.python_version(), "torch": torch.__version__,
            "triton": triton.__version__, "cpus": os.cpu_count()}


def run_once(mode: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache, PYTHONPATH=str(REPO), JIT_AHEAD_PLANNERS="1")
        proc = subprocess.Popen([sys.executable, "-m", "tests.exit_probe", mode], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        marks: dict[str, float] = {}

        def read() -> None:
            for line in proc.stdout:
                marks.setdefault(line.split()[0], time.monotonic())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        proc.wait(timeout=600)
        ended = time.monotonic()
        reader.join(timeout=5)
    done = marks["WORK_DONE"]
    closed = marks.get("JIT_AHEAD_CLOSED")
    return {"mode": mode, "status": proc.returncode, "exit_s": ended - done,
            "handler_s": None if closed is None else closed - done}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    runs = []
    for round_ in range(args.rounds):
        for mode in ("plain", "return"):
            result = {"round": round_, **run_once(mode)}
            print(json.dumps(result), flush=True)
            runs.append(result)
    plain = [r["exit_s"] for r in runs if r["mode"] == "plain"]
    jit = [r["exit_s"] for r in runs if r["mode"] == "return"]
    handler = [r["handler_s"] for r in runs if r["mode"] == "return" and r["handler_s"] is not None]
    summary = {"plain_exit_s_median": statistics.median(plain), "jit_exit_s_median": statistics.median(jit),
               "ratio_of_medians": statistics.median(jit) / statistics.median(plain),
               "handler_s_max": max(handler) if handler else None, "plain_exit_s": plain, "jit_exit_s": jit}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "exit_cost.json").write_text(json.dumps({"versions": versions(), "runs": runs, "summary": summary},
                                                   indent=1))
    lines = ["| round | without jit_ahead: exit s | with: exit s | with: exit handler done s |", "|---|---|---|---|"]
    for round_ in range(args.rounds):
        p, j = (next(r for r in runs if r["round"] == round_ and r["mode"] == m) for m in ("plain", "return"))
        lines.append(f"| {round_} | {p['exit_s']:.2f} | {j['exit_s']:.2f} | {j['handler_s']:.2f} |")
    lines.append(f"\nmedian {summary['jit_exit_s_median']:.2f} s against {summary['plain_exit_s_median']:.2f} s "
                 f"({summary['ratio_of_medians']:.2f}x); exit handler at most {summary['handler_s_max']:.2f} s")
    (out / "exit_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
