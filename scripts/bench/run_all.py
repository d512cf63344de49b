#!/usr/bin/env python3
"""Every benchmark of the project in one run on the GPU machine; writes a run folder and its summary.

Sections, each in fresh processes and each figure measured side by side within its section:
  cold-start   scripts/gpu/serving_loop.py: a Qwen3-style model patched with Liger-Kernel and an fla
               GatedDeltaNet model, arms cold (no jit_ahead, empty cache), cold-jit (jit_ahead, empty
               cache), warm (no jit_ahead, the cache the cold arm left: the lower bound); with --replay
               also cold-jit-replay (jit_ahead, empty cache, the records of cold-jit)
  throughput   scripts/bench/build_throughput.py: N forked helpers against serial in-process compiles of
               every 8th planned variant, N = 1, 4 and the default worker count, and the time from start
               to the first build
  overhead     scripts/bench/executor_overhead.py: launch latency with and without jit_ahead
  politeness   scripts/bench/cpu_politeness.py: an executor thread's slowdown while helpers build, at
               the helper counts before and during serving

Raw JSON and each section's own table go to the run folder (``--run-folder``; else a new
``<UTC start>/`` under ``--runs``); ``--out`` is the summary with targets, date, versions and machine.
Keep a run as one folder of ``results/`` (add its README: script, tree, versions; docs/benchmarks.md
quotes the figures and links the folder):

    F=results/<date>-h200-run-all-<tree>
    python scripts/bench/run_all.py --run-folder $F --out $F/benchmarks.md
        [--sections cold-start,throughput,overhead,politeness] [--replay] [--tree SHA]
    python scripts/bench/run_all.py --render $F --out $F/benchmarks.md   # the summary again, no runs
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECTIONS = ("cold-start", "throughput", "overhead", "politeness")
TARGETS = {"cold_over_warm": 1.15, "worst_over_warm": 1.1}


def section_commands(name: str, out: str, replay: bool = False) -> list[list[str]]:
    from jit_ahead.core import knobs

    py = sys.executable
    default_workers = knobs.default_worker_count()  # what a session starts with on this machine
    if name == "cold-start":
        arms = "cold,cold-jit,cold-jit-replay,warm" if replay else "cold,cold-jit,warm"
        return [[py, "scripts/gpu/serving_loop.py", "--out", out, "--arms", arms]]
    if name == "throughput":
        counts = sorted({n for n in (1, 4) if n < default_workers} | {default_workers})
        return [[py, "scripts/bench/build_throughput.py", "--out", out, "--every", "8", "--no-second-serial",
                 "--workers", ",".join(map(str, counts))]]
    if name == "overhead":
        return [[py, "scripts/bench/executor_overhead.py", "--out", out]]
    if name == "politeness":
        # every 2nd variant: build windows of several seconds at both helper counts (every 4th gave 3-4 s)
        return [[py, "scripts/bench/cpu_politeness.py", "--out", out, "--every", "2"]]
    raise ValueError(f"unknown section {name!r}; known: {', '.join(SECTIONS)}")


def run_sections(names: list[str], folder: str, replay: bool = False) -> dict[str, dict]:
    timings = {}
    for name in names:
        t0 = time.perf_counter()
        codes = []
        for command in section_commands(name, folder, replay):
            print(f"== {name}: {' '.join(command[1:])}", flush=True)
            codes.append(subprocess.run(command, cwd=REPO).returncode)
        timings[name] = {"seconds": round(time.perf_counter() - t0, 1), "exit_codes": codes}
        print(f"== {name}: {timings[name]['seconds']} s, exit {codes}", flush=True)
    return timings


def _load(folder: str, name: str) -> dict | None:
    try:
        with open(os.path.join(folder, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _section_text(folder: str, name: str) -> str | None:
    """A section script's own markdown, its title dropped (the summary gives each section a heading)."""
    try:
        with open(os.path.join(folder, name)) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    return "\n".join(lines[1:]).strip()


def _rerun_heading(folder: str, name: str) -> str:
    """A heading for a section rerun beside the run's own table: its file and the title it was written with."""
    with open(os.path.join(folder, name)) as f:
        title = f.readline().lstrip("# ").strip()
    return f"### `{name}`: {title}\n\n"


def cold_start_rows(report: dict) -> list[str]:
    rows = ["| model | arm | warmup end s | end s | end / warm | executor compiles warmup / serving | "
            "worst request s | worst / warm |", "|---|---|---|---|---|---|---|---|"]
    results = [r for r in report["results"] if "error" not in r]
    for r in report["results"]:
        if "error" in r:
            rows.append(f"| {r['model']} | {r['arm']} | error: {r['error'][:80]} | | | | | |")
    for r in results:
        warm = next((w for w in results if w["model"] == r["model"] and w["arm"] == "warm"), None)
        end_ratio = r["end_s"] / warm["end_s"] if warm else None
        worst_ratio = r["worst_request_s"] / warm["worst_request_s"] if warm else None

        def mark(ratio, target):
            if ratio is None or r["arm"] == "warm":
                return ""
            verdict = " (meets)" if ratio <= target else " (misses)" if r["arm"].startswith("cold-jit") else ""
            return f"{ratio:.2f}{verdict}"

        rows.append(f"| {r['model']} | {r['arm']} | {r['warmup_end_s']:.1f} | {r['end_s']:.1f} | "
                    f"{mark(end_ratio, TARGETS['cold_over_warm'])} | {r['executor_compiles_warmup']} / "
                    f"{r['executor_compiles_serving']} | {r['worst_request_s']:.2f} | "
                    f"{mark(worst_ratio, TARGETS['worst_over_warm'])} |")
    return rows


def render(folder: str, out_md: str, tree: str | None, timings: dict | None) -> str:
    meta = _load(folder, "run_all.json") or {}
    tree = tree or meta.get("tree")
    timings = timings or meta.get("sections", {})
    serving = _load(folder, "serving_loop.json")
    versions = next((found["versions"] for name in ("serving_loop.json", "build_throughput.json",
                                                    "cpu_politeness.json", "executor_overhead.json")
                     if (found := _load(folder, name)) and found.get("versions")), {})
    rel = os.path.relpath(folder, os.path.dirname(os.path.abspath(out_md)))
    lines = ["# Benchmarks", "",
             f"Run started {meta.get('started', '?')} on {versions.get('gpu', 'no GPU')}, "
             f"{versions.get('cpus', versions.get('cpus_usable', '?'))} CPUs; tree {tree or 'unknown'}; "
             + ", ".join(f"{k} {v}" for k, v in versions.items() if k not in ("gpu", "cpus", "cpus_usable", "date"))
             + ".",
             f"One command: `python scripts/bench/run_all.py` ({sum(t['seconds'] for t in timings.values()):.0f} s "
             "for the sections below: " + ", ".join(f"{k} {t['seconds']:.0f} s" for k, t in timings.items())
             + f"). Raw JSON and each section's table: [`{rel}/`]({rel}/).", ""]
    reading = _section_text(folder, "reading.md")  # written by hand after looking at the run
    if reading:
        lines += ["## Reading", "", reading, ""]
    if serving:
        lines += ["## Cold start", "",
                  f"Targets: jit_ahead cold end within {TARGETS['cold_over_warm']}x of warm; zero executor compiles "
                  f"after warmup; worst request within {TARGETS['worst_over_warm']}x of warm. {serving['requests']} "
                  f"random requests (prefill + {serving['new_tokens']} decode steps) after warmup; limits "
                  f"{json.dumps(serving['limits'])}.", ""] + cold_start_rows(serving) + [""]
    for title, stem in (("Build throughput", "build_throughput"), ("Executor overhead", "executor_overhead"),
                        ("CPU politeness", "cpu_politeness")):
        # a section rerun on its own (e.g. another helper count) sits beside it as <stem>_<what>.md
        names = sorted(n for n in os.listdir(folder) if n.startswith(stem) and n.endswith(".md"))
        texts = [_rerun_heading(folder, name) + text if name != f"{stem}.md" else text
                 for name in names if (text := _section_text(folder, name))]
        if texts:
            lines += [f"## {title}", ""] + [part for text in texts for part in (text, "")]
    text = "\n".join(lines)
    with open(out_md, "w") as f:
        f.write(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--replay", action="store_true",
                        help="cold start: also the arm cold-jit-replay (a second start with the first one's records)")
    parser.add_argument("--out", help="where the summary goes (default: benchmarks.md in the run's folder)")
    parser.add_argument("--runs", default=os.path.join(REPO, "results"),
                        help="a new run's folder is made here (its date and time as the name)")
    parser.add_argument("--tree", help="the commit being measured (a copied tree may lack its .git)")
    parser.add_argument("--render", metavar="RUN_FOLDER", help="write the summary of an earlier run only")
    parser.add_argument("--run-folder", help="add the sections to this earlier run's folder (a run split over "
                                             "machine sessions) instead of a new one")
    args = parser.parse_args()
    if args.render:
        print(render(args.render, args.out or os.path.join(args.render, "benchmarks.md"), args.tree, None))
        return 0
    started = datetime.datetime.now(datetime.timezone.utc)
    folder = args.run_folder or os.path.join(args.runs, started.strftime("%Y-%m-%dT%H%M%SZ"))
    os.makedirs(folder, exist_ok=True)
    meta = _load(folder, "run_all.json") or {"started": started.isoformat(timespec="seconds"), "sections": {}}
    tree = args.tree or _git_head()
    if meta.get("tree") not in (None, tree):
        meta["tree"] = f"{meta['tree']} (and {tree} for {args.sections})"
    else:
        meta["tree"] = tree
    timings = run_sections(args.sections.split(","), folder, args.replay)
    meta["sections"].update(timings)
    with open(os.path.join(folder, "run_all.json"), "w") as f:
        json.dump(meta, f, indent=1)
    timings = meta["sections"]
    tree = meta["tree"]
    print(render(folder, args.out or os.path.join(folder, "benchmarks.md"), tree, timings))
    return 1 if any(code for t in timings.values() for code in t["exit_codes"]) else 0


def _git_head() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    sys.exit(main())
