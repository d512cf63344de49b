#!/usr/bin/env python3
"""Issue 44 item 4, side by side: every model and limit set of the ready-starts runs, cold then warm, with and
without jit_ahead, read from the runs' own ``engine_starts.json`` (nothing typed by hand).

    python scripts/gpu/ready_table.py results/*/*/engine_starts.json > table.md

Per model and limits, from the newest run that has both cold arms (named in the last column): process time and
time to ready to serve (warmup and tune-ahead done) of each cold arm, executor compiles and autotune runs
after ready, the ready line's figures, the longest wait and its cause, the worst request; then the warm arms'
process times (medians where a run has several). An arm that did not finish says so.
"""
from __future__ import annotations

import json
import os
import statistics
import sys


def _cold(results: list[dict], kind: str) -> dict | None:
    return next((r for r in results if r.get("arm") == f"{kind}-cold"), None)


def _warm(results: list[dict], kind: str) -> list[float]:
    return [r["process_s"] for r in results if r.get("arm") == f"{kind}-warm" and "error" not in r]


def _cell(run: dict | None, text) -> str:
    if run is None:
        return "-"
    if "error" in run:
        return f"not finished ({run['error']}, {run['process_s']:.0f} s)"
    return text(run)


def _ready_line(run: dict) -> str:
    line = run.get("ready_line") or {}
    if not line:
        return "-"
    return (f"plan {'done' if line.get('planning_done') else 'not done'}, {line.get('listed')} listed, "
            f"{line.get('built')} built, {line.get('pending')} pending")


def rows(paths: list[str]) -> list[str]:
    chosen: dict[tuple[str, str], tuple[str, str, list[dict]]] = {}
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        by_cell: dict[tuple[str, str], list[dict]] = {}
        for r in report["results"]:
            by_cell.setdefault((r.get("model"), r.get("set")), []).append(r)
        for cell, results in by_cell.items():
            if _cold(results, "jit") and _cold(results, "plain"):
                date = report.get("date", "")
                if cell not in chosen or date > chosen[cell][0]:
                    chosen[cell] = (date, path, results)
    out = ["| model | limits | cold process s, jit / plain | ratio | ready to serve s, jit / plain | compiles + "
           "autotune runs after ready, jit / plain | ready line (jit) | longest wait s (jit) | worst request s, "
           "jit / plain | warm process s, jit / plain (runs) | run |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (model, set_name), (_, path, results) in sorted(chosen.items()):
        jit, plain = _cold(results, "jit"), _cold(results, "plain")
        both = "error" not in jit and "error" not in plain
        ratio = f"{jit['process_s'] / plain['process_s']:.3f}" if both else "-"
        process = " / ".join(_cell(r, lambda r: f"{r['process_s']:.1f}") for r in (jit, plain))
        ready = " / ".join(_cell(r, lambda r: f"{r['warmup_end_s'] + r['tune_ahead_s']:.1f}") for r in (jit, plain))
        after = " / ".join(_cell(r, lambda r: f"{r['executor_compiles_serving']} + {r['autotune_runs_serving']}")
                           for r in (jit, plain))
        wait = _cell(jit, lambda r: f"{r.get('longest_wait_s', 0):.2f}" + (f" ({r['longest_wait']})" if r.get("longest_wait") else ""))
        worst = " / ".join(_cell(r, lambda r: f"{r['worst_request_s']:.2f}") for r in (jit, plain))
        warm_jit, warm_plain = _warm(results, "jit"), _warm(results, "plain")
        warm = (f"{statistics.median(warm_jit):.2f} / {statistics.median(warm_plain):.2f} ({len(warm_jit)}, {len(warm_plain)})"
                if warm_jit and warm_plain else "-")
        folder = os.path.relpath(os.path.dirname(path))
        out.append(f"| {model} | {set_name} | {process} | {ratio} | {ready} | {after} | {_cell(jit, _ready_line)} | "
                   f"{wait} | {worst} | {warm} | `{folder}` |")
    return out


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    print("\n".join(rows(sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
