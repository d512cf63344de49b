#!/usr/bin/env python3
"""Warm start on the CPU machine: what jit_ahead adds to a start whose every variant is already on disk
(issue 35 item 3), phase by phase, with and without it, interleaved in one run.

Once, a cold process with jit_ahead plans the model within the limits, builds every variant and saves the
plan, the records and the autotune choices. Then ROUNDS rounds each start, in a shuffled order, a fresh
process per arm on that cache:
  plain  import torch and Triton, build the model, warm up, serve the requests
  jit    the same with ``jit_ahead.start()`` first, ``plan_model`` (the saved plan) and ``wait_ready()``
         after the build, ``mark_serving()`` after warmup
Launches run on meta tensors with Triton's stand-in driver: each first launch of a variant loads it
from the disk cache through Triton (and jit_ahead's hook), and nothing runs, so the figures are the
host's share of a warm start, the part jit_ahead can add to. Requests: REQUESTS drawn at random across
the whole limits with a new seed per run (batch 1 to the limit, prompts up to what the batch allows, 1-4
decode steps, every third left-padded). Per arm: wall seconds per phase, from the process's start to
exit, medians and ratios. Writes warm_start.json and warm_start.md to --out.

    python scripts/bench/warm_start.py --out results/<date>-cpu-warm-start [--model qwen35-hybrid] [--rounds 8]
        [--limits mid|limits] [--keep FOLDER]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_throughput import versions  # noqa: E402
REQUESTS = 24
SETS = {"mid": dict(max_num_tokens=16384, max_batch_size=64, max_seq_len=8192),
        "limits": dict(max_num_tokens=32768, max_batch_size=256, max_seq_len=32768)}
LIMITS = dict(SETS[os.environ.get("WARM_START_LIMITS", "mid")], cuda_graph_batch_sizes=(1, 2, 4, 8, 16))
PHASES = ("imports", "session", "model", "ready", "warmup", "serving_mark", "serving", "exit")


def child(model_name: str, arm: str, seed: int, cold: bool) -> dict:
    t0 = time.perf_counter()
    marks = {}
    tree = os.environ.get("WARM_START_TREE")
    if tree:  # --tree: before this checkout, which build_throughput put first on sys.path
        sys.path.insert(0, tree)
    import torch  # noqa: F401
    import triton  # noqa: F401

    from jit_ahead import demo_models
    from jit_ahead.core.planning.limits import EngineLimits
    from jit_ahead.core.priority import Priority
    from jit_ahead.triton.standin import ensure_driver

    ensure_driver()
    marks["imports"] = time.perf_counter()
    session = None
    if arm == "jit":
        import jit_ahead

        session = jit_ahead.start()
    marks["session"] = time.perf_counter()
    model = getattr(demo_models, model_name.replace("-", "_"))("meta")
    marks["model"] = time.perf_counter()
    limits = EngineLimits(**LIMITS)
    run = None
    if session is not None:
        run = session.plan_model(model, limits)
        ok = session.wait_ready(timeout=3600, priority=Priority.BACKGROUND if cold else None)
        assert ok, "not ready"
    marks["ready"] = time.perf_counter()
    demo_models.warmup(model, limits, "meta")
    marks["warmup"] = time.perf_counter()
    own = None
    if session is not None:
        session.mark_serving(tune_ahead=cold)
        try:
            from jit_ahead.core.observing import own_cpu
        except ImportError:  # a --tree from before jit_ahead counted its own CPU
            own_cpu = None
        if own_cpu is not None:
            own = {"own_s": own_cpu.total(), "by_where": own_cpu.seconds()}  # jit_ahead's CPU in this process
    marks["serving_mark"] = time.perf_counter()
    cpu_before_serving = time.process_time()
    rng = random.Random(seed)
    for i in range(REQUESTS):
        batch = rng.randint(1, limits.max_batch_size)
        prompt = rng.randint(1, min(limits.max_seq_len, limits.max_num_tokens // batch))
        lengths = demo_models.prompt_lengths(batch, prompt, seed=seed + i) if i % 3 == 2 else None
        demo_models.serve(model, batch, prompt, rng.randint(1, 4), device="meta", lengths=lengths)
    marks["serving"] = time.perf_counter()
    result = {"arm": arm, "seed": seed, "marks": {k: round(v - t0, 4) for k, v in marks.items()}, "own_cpu": own,
              "process_cpu_before_serving_s": round(cpu_before_serving, 3)}
    result["jit_ahead"] = os.path.dirname(sys.modules["jit_ahead"].__file__)  # which tree's (--tree)
    if run is not None:
        result.update(variants=sum(run.variants.values()), plan_loaded=bool(run.read_saved),
                      queued=len(run.tickets))
    if session is not None:
        session.close()
    return result


def run_child(model: str, arm: str, seed: int, env: dict, cold: bool = False) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", model, arm, str(seed), "cold" if cold else "warm"],
                          env=env, capture_output=True, text=True, timeout=7200)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{arm} failed: {proc.stderr[-3000:]}")
    line = next(l for l in proc.stdout.splitlines() if l.startswith("WARM "))
    result = json.loads(line[5:])
    result["process_s"] = round(wall, 4)
    marks = result["marks"]
    edges = [0.0] + [marks[p] for p in PHASES[:-1]] + [wall]
    result["phases"] = {p: round(b - a, 4) for p, a, b in zip(PHASES, edges, edges[1:])}
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--model", default="qwen35-hybrid")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--limits", choices=sorted(SETS), default="mid",
                        help="mid: EngineLimits(16384, 64, 8192); limits: (32768, 256, 32768)")
    parser.add_argument("--tree", metavar="FOLDER", default=None,
                        help="the children import jit_ahead from FOLDER (a git worktree of another commit: a "
                             "change's before), not from this checkout")
    parser.add_argument("--keep", metavar="FOLDER", default=None,
                        help="keep the cold start's cache, plans, records and choices in FOLDER, and reuse them "
                             "when they are there (no cold start): compare trees on one cache")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, arm, seed, kind = args.child
        print("WARM " + json.dumps(child(model, arm, int(seed), kind == "cold")), flush=True)
        return 0
    if not args.out:
        parser.error("--out is required")
    seed = random.randrange(2**31)
    os.environ["WARM_START_LIMITS"] = args.limits  # the children's limits
    with (contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory()) as scratch:
        reuse = os.path.isdir(os.path.join(scratch, "plans"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JIT_AHEAD", "TRITON_CACHE_DIR"))}
        env.update(TRITON_CACHE_DIR=os.path.join(scratch, "cache"), JIT_AHEAD_PLAN_DIR=os.path.join(scratch, "plans"),
                   JIT_AHEAD_RECORD_DIR=os.path.join(scratch, "records"),
                   JIT_AHEAD_TUNING_DIR=os.path.join(scratch, "tuning"),
                   PYTHONPATH=os.pathsep.join(p for p in (args.tree, str(REPO), os.environ.get("PYTHONPATH", "")) if p))
        if args.tree:
            env["WARM_START_TREE"] = args.tree
        if reuse:  # the cold start of an earlier run
            with open(os.path.join(scratch, "cold.json")) as f:
                cold = json.load(f)
            print(f"reusing {scratch} ({cold.get('variants')} variants)", flush=True)
        else:
            cold = run_child(args.model, "jit", seed, env, cold=True)
            with open(os.path.join(scratch, "cold.json"), "w") as f:
                json.dump(cold, f)
            print(f"cold start with jit_ahead: {cold['process_s']:.1f} s, {cold.get('variants')} variants", flush=True)
        results = []
        rng = random.Random(seed)
        for round_ in range(args.rounds):
            arms = ["plain", "jit"]
            rng.shuffle(arms)
            for arm in arms:
                r = run_child(args.model, arm, seed + 1 + round_, env)
                r["round"] = round_
                results.append(r)
                print(json.dumps({k: r[k] for k in ("arm", "round", "process_s")}), flush=True)
    by_arm = {arm: [r for r in results if r["arm"] == arm] for arm in ("plain", "jit")}
    med = {arm: {p: statistics.median(r["phases"][p] for r in rs) for p in PHASES} | {
        "process": statistics.median(r["process_s"] for r in rs)} for arm, rs in by_arm.items()}
    pair_ratios = [j["process_s"] / p["process_s"] for j, p in
                   ((next(r for r in by_arm["jit"] if r["round"] == i), next(r for r in by_arm["plain"] if r["round"] == i))
                    for i in range(args.rounds))]
    info = versions()
    lines = [f"# Warm start on this machine, with / without jit_ahead ({args.model}, limits {SETS[args.limits]})", "",
             f"`{' '.join(sys.argv)}`; seed {seed}; {args.rounds} rounds, arms shuffled per round; "
             + ", ".join(f"{k} {v}" for k, v in info.items()), "",
             f"Cold start with jit_ahead (once, to fill the cache): {cold['process_s']:.1f} s, {cold.get('variants')} variants.", "",
             "| phase | plain median s | jit median s | jit - plain s |", "|---|---|---|---|"]
    for p in PHASES + ("process",):
        lines.append(f"| {p} | {med['plain'][p]:.3f} | {med['jit'][p]:.3f} | {med['jit'][p] - med['plain'][p]:+.3f} |")
    lines += ["", f"Process time with / without, median of the rounds' ratios: {statistics.median(pair_ratios):.3f} "
              f"(rounds: {', '.join(f'{x:.3f}' for x in pair_ratios)})"]
    owns = [r["own_cpu"] for r in by_arm["jit"] if r.get("own_cpu")]
    if owns:  # what of the jit arms' CPU was jit_ahead's own, which the host's noise does not blur
        cpu = {arm: statistics.median(r["process_cpu_before_serving_s"] for r in rs) for arm, rs in by_arm.items()}
        where = sorted({w for o in owns for w in o["by_where"]}, key=lambda w: -statistics.median(
            o["by_where"].get(w, 0.0) for o in owns))
        lines += ["", f"jit_ahead's own CPU in the jit processes before serving, median: "
                  f"{statistics.median(o['own_s'] for o in owns):.3f} s; process CPU before serving, median "
                  f"plain {cpu['plain']:.2f} s, jit {cpu['jit']:.2f} s. By where (median s): "
                  + ", ".join(f"{w} {statistics.median(o['by_where'].get(w, 0.0) for o in owns):.3f}" for w in where)]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "warm_start.json"), "w") as f:
        json.dump({"seed": seed, "model": args.model, "limits": SETS[args.limits], "reused_cache": reuse, "requests": REQUESTS, "versions": info,
                   "cold": cold, "results": results}, f, indent=1)
    with open(os.path.join(args.out, "warm_start.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
