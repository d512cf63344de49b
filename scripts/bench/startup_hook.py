#!/usr/bin/env python3
"""What the JIT_AHEAD=1 start-up hook costs a process that never imports Triton.

Starts ``python -c pass`` (and ``python -c "import json"``) REPEATS times each with JIT_AHEAD unset and
with JIT_AHEAD=1, interleaved, and reports the median and the quartiles of the wall time per start.
Needs jit_ahead installed with ``pip install .`` (the hook is ``jit_ahead.pth`` in site-packages).

    python scripts/bench/startup_hook.py --out results/<date>-<host>-startup-hook [--repeats 40]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_throughput import versions  # noqa: E402


def start_time(code: str, env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="a results/<date>-<what> folder")
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    pth = os.path.join(sysconfig.get_paths()["purelib"], "jit_ahead.pth")
    if not os.path.exists(pth):
        print(f"{pth} is missing: install jit_ahead with `pip install .`", file=sys.stderr)
        return 2
    base = {k: v for k, v in os.environ.items() if not k.startswith("JIT_AHEAD")}
    arms = {"unset": base, "JIT_AHEAD=1": {**base, "JIT_AHEAD": "1"}}
    rows = []
    for code in ("pass", "import json"):
        times = {arm: [] for arm in arms}
        for _ in range(args.repeats):
            for arm, env in arms.items():  # interleaved, so drift hits both arms alike
                times[arm].append(start_time(code, env))
        for arm, values in times.items():
            q = statistics.quantiles(values, n=4)
            rows.append({"code": code, "arm": arm, "median_ms": 1e3 * statistics.median(values),
                         "q1_ms": 1e3 * q[0], "q3_ms": 1e3 * q[2]})
    info = versions()
    with open(os.path.join(args.out, "startup_hook.json"), "w") as f:
        json.dump({**info, "repeats": args.repeats, "rows": rows}, f, indent=1)
    lines = [f"# Start-up hook cost ({info['date']})", "",
             f"`python scripts/bench/startup_hook.py --repeats {args.repeats}`; Python {info['python']}, "
             f"{info['cpu']}, {info['cpus_usable']} CPUs. Wall time of one interpreter start, median "
             "[quartiles], arms interleaved.", "", "| code | JIT_AHEAD | median ms | q1-q3 ms |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['code']}` | {r['arm']} | {r['median_ms']:.1f} | {r['q1_ms']:.1f}-{r['q3_ms']:.1f} |")
    with open(os.path.join(args.out, "startup_hook.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
