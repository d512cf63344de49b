#!/usr/bin/env python3
"""GPU time of the kernels the autotuners chose ahead against the kernels they choose while serving.

jit_ahead's tune-ahead lets each autotuner benchmark its configs before serving, on inputs of the planned
shapes (random values since 7a01651, zeros before); without it the autotuner benchmarks them on the first request's own data. Both are
the autotuner's own choice, but the inputs differ, and so may the choice. This measures what that costs
a request, per model, in one process:

  ahead     jit_ahead plans the model, helpers build every variant, warmup, then mark_serving() runs the
            tune-ahead: the choices every autotuner holds when serving starts
  serving   every autotuner's choices dropped (and its disk cache of timings, ``cache_results``, turned off
            for the rest of the process), then warmup and a request mix (seed S1) served as a server without
            jit_ahead serves them from an empty cache: the autotuners choose on warmup's and the requests' data
  serving2  the same again on another mix (seed S2): a second start's choices, the spread the autotuners'
            own choice has from one start to the next

A fourth mix (seed S3, the timed mix) is then served once under each set of choices, untimed (a key a set
lacks is tuned there, on that mix's data, as a server would; the tune-ahead set must need none), and then
REPS times under each set in a shuffled order, each pass under the torch profiler: the GPU time of every
kernel, summed per kernel name over the whole mix. Reported per set: GPU time of all kernels and of the
autotuned kernels per forward step, with the ratio ahead / serving against serving2 / serving (the noise
floor), and per autotuned kernel. Request shapes are drawn at random across the whole limits (batch 1..max,
half the prompts long, 1-4 decode steps, every third batch padded), with new seeds each run.

    python scripts/gpu/tune_choice_timing.py --out results/<date>-tune-choice-timing [--models ...]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_starts import SETS, AutotuneCounter, autotuners, build, request_mix, run_child, write_report  # noqa: E402
from serving_loop import versions  # noqa: E402

REPS = 3
SETS_TIMED = ("ahead", "serving", "serving2")


def snapshot(tuners: dict) -> dict:
    return {name: dict(tuner.cache) for name, tuner in tuners.items()}


def restore(tuners: dict, choices: dict) -> None:
    for name, tuner in tuners.items():
        tuner.cache = dict(choices.get(name, {}))


def serve_mix(model, shapes, seed: int) -> float:
    import torch

    from jit_ahead import demo_models

    t0 = time.perf_counter()
    for i, (batch, prompt, new_tokens, padded) in enumerate(shapes):
        lengths = demo_models.prompt_lengths(batch, prompt, seed=seed + i) if padded else None
        demo_models.serve(model, batch, prompt, new_tokens, device="cuda", seed=i, lengths=lengths)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def kernel_times(model, shapes, seed: int) -> tuple[dict, float]:
    """GPU microseconds per kernel name over one pass of the mix, under the torch profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        wall = serve_mix(model, shapes, seed)
    out: dict[str, float] = {}
    for event in prof.events():  # the GPU's own activities (kernels, copies), not the CPU ops that launched them
        if event.device_type == DeviceType.CUDA:
            out[event.name] = out.get(event.name, 0.0) + event.time_range.elapsed_us()
    return out, wall


def run_model(model_name: str, set_name: str, seeds: tuple[int, int, int]) -> dict:
    import torch

    import jit_ahead
    from jit_ahead import demo_models
    from jit_ahead.core.planning.limits import EngineLimits
    from jit_ahead.core.priority import Priority

    limits = EngineLimits(**SETS[set_name], cuda_graph_batch_sizes=(1, 2, 4, 8, 16))
    tuning = AutotuneCounter()
    session = jit_ahead.start()
    torch.manual_seed(0)
    model = build(model_name, "cuda")
    session.plan_model(model, limits)
    ready = session.wait_ready(timeout=900, priority=Priority.BACKGROUND)
    demo_models.warmup(model, limits, "cuda")
    session.mark_serving()  # tune-ahead
    torch.cuda.synchronize()
    tuners = autotuners()
    choices = {"ahead": snapshot(tuners)}
    for tuner in tuners.values():  # from here on every choice is made on data, not read from Triton's disk cache
        tuner.cache_results = False
    mixes = [request_mix(SETS[set_name], seed) for seed in seeds]
    for name, shapes, seed in (("serving", mixes[0], seeds[0]), ("serving2", mixes[1], seeds[1])):
        restore(tuners, {})
        demo_models.warmup(model, limits, "cuda")
        serve_mix(model, shapes, seed)
        choices[name] = snapshot(tuners)
    timed, seed = mixes[2], seeds[2]
    filled = {}
    for name in SETS_TIMED:  # untimed pass: every launch loaded once, keys a set lacks tuned on this mix
        restore(tuners, choices[name])
        before = tuning.runs["warmup"]
        serve_mix(model, timed, seed)
        filled[name] = tuning.runs["warmup"] - before
        choices[name] = snapshot(tuners)
    rng = random.Random(seed)
    order = [name for _ in range(REPS) for name in rng.sample(SETS_TIMED, len(SETS_TIMED))]
    passes = {name: [] for name in SETS_TIMED}
    for name in order:
        restore(tuners, choices[name])
        before = tuning.runs["warmup"]
        kernels, wall = kernel_times(model, timed, seed)
        if tuning.runs["warmup"] != before:
            raise RuntimeError(f"an autotuner benchmarked during a timed pass under {name}")
        passes[name].append({"kernels": kernels, "wall_s": wall})
    session.close()
    tuned_kernels = {tuner.base_fn.__name__ for tuner in tuners.values()}
    steps = sum(1 + new_tokens for _, _, new_tokens, _ in timed)

    def per_step_us(name: str, only_tuned: bool) -> float:
        totals = [sum(us for kernel, us in p["kernels"].items() if not only_tuned or kernel in tuned_kernels)
                  for p in passes[name]]
        return statistics.median(totals) / steps

    keys = {name: {f"{tuner} {list(key)}": str(config) for tuner, cache in sets.items() for key, config in cache.items()}
            for name, sets in choices.items()}
    per_kernel = {}
    for kernel in sorted(tuned_kernels):
        row = {name: statistics.median(p["kernels"].get(kernel, 0.0) for p in passes[name]) / steps for name in SETS_TIMED}
        if any(row.values()):
            per_kernel[kernel] = {k: round(v, 3) for k, v in row.items()}
    shared = sorted(set(keys["ahead"]) & set(keys["serving"]))
    return {"model": model_name, "set": set_name, "seeds": list(seeds), "ready": ready, "forward_steps": steps,
            "requests": len(timed), "autotune_runs_filling": filled,
            "keys": {name: len(v) for name, v in keys.items()},
            "keys_agree_ahead_serving": sum(keys["ahead"][k] == keys["serving"][k] for k in shared),
            "keys_shared_ahead_serving": len(shared),
            "keys_agree_serving_serving2": sum(keys["serving"][k] == keys["serving2"].get(k) for k in keys["serving"]),
            "all_us_per_step": {name: round(per_step_us(name, False), 3) for name in SETS_TIMED},
            "tuned_us_per_step": {name: round(per_step_us(name, True), 3) for name in SETS_TIMED},
            "wall_s": {name: [round(p["wall_s"], 3) for p in passes[name]] for name in SETS_TIMED},
            "per_kernel_us_per_step": per_kernel, "order": order, "choices": keys}


def report_lines(report: dict) -> list[str]:
    lines = [f"# Kernels chosen ahead against chosen while serving ({report['date']})", "",
             f"`{report['command']}`; " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()), "",
             "| model | limits | forward steps | keys ahead / serving / serving2 | agree ahead-serving | agree serving-serving2 "
             "| autotuned kernels, us per step: ahead / serving / serving2 | ahead / serving | serving2 / serving "
             "| all kernels, us per step: ahead / serving / serving2 | ahead / serving | serving2 / serving |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['set']} | error: {r['error'][-200:]!r} |" + " |" * 9)
            continue
        t, a = r["tuned_us_per_step"], r["all_us_per_step"]
        lines.append(f"| {r['model']} | {r['set']} | {r['forward_steps']} | {r['keys']['ahead']} / {r['keys']['serving']} / "
                     f"{r['keys']['serving2']} | {r['keys_agree_ahead_serving']} of {r['keys_shared_ahead_serving']} | "
                     f"{r['keys_agree_serving_serving2']} of {r['keys']['serving']} | "
                     f"{t['ahead']} / {t['serving']} / {t['serving2']} | {t['ahead'] / t['serving']:.3f} | "
                     f"{t['serving2'] / t['serving']:.3f} | {a['ahead']} / {a['serving']} / {a['serving2']} | "
                     f"{a['ahead'] / a['serving']:.3f} | {a['serving2'] / a['serving']:.3f} |")
    for r in report["results"]:
        if "error" in r:
            continue
        lines += ["", f"{r['model']} {r['set']}: seeds (serving, serving2, timed) {r['seeds']}; autotune runs while "
                  f"filling keys a set lacked on the timed mix: {r['autotune_runs_filling']}; timed passes (wall s): "
                  f"{r['wall_s']}", "", "| autotuned kernel | us per step: ahead | serving | serving2 | ahead / serving |",
                  "|---|---|---|---|---|"]
        for kernel, row in r["per_kernel_us_per_step"].items():
            ratio = f"{row['ahead'] / row['serving']:.3f}" if row["serving"] else ""
            lines.append(f"| {kernel} | {row['ahead']} | {row['serving']} | {row['serving2']} | {ratio} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--models", default="gated-deltanet,qwen35-hybrid")
    parser.add_argument("--sets", default="engine")
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("--one", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--report", metavar="JSON", help="print the markdown of a saved tune_choice_timing.json")
    args = parser.parse_args()
    if args.report:
        with open(args.report) as f:
            print("\n".join(report_lines(json.load(f))))
        return 0
    if args.one:
        model, set_name, *seeds = args.one
        print("RESULT " + json.dumps(run_model(model, set_name, tuple(int(s) for s in seeds))), flush=True)
        return 0
    if not args.out:
        parser.error("--out is required")
    os.makedirs(args.out, exist_ok=True)
    results = []
    for set_name in args.sets.split(","):
        for model in args.models.split(","):
            seeds = [random.randrange(2**31) for _ in range(3)]
            print(f"{model} {set_name}: seeds {seeds}", flush=True)
            with tempfile.TemporaryDirectory() as scratch:  # an empty Triton cache and plan folder, no records
                env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(scratch, "cache"),
                           JIT_AHEAD_PLAN_DIR=os.path.join(scratch, "plans"))
                env.pop("JIT_AHEAD_RECORD_DIR", None)
                result = run_child([__file__, "--one", model, set_name, *map(str, seeds)], env, args.timeout,
                                   "RESULT ", {"model": model, "set": set_name})
            results.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "choices"}), flush=True)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": versions(), "command": " ".join(sys.argv), "reps": REPS, "results": results}
    write_report(args.out, "tune_choice_timing", report, report_lines(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
