"""A serving-like loop on the GPU: cold start with jit_ahead against warm and cold starts without it.

For each model (a small Qwen3-style transformers model patched with Liger-Kernel; a small fla
GatedDeltaNet model; random weights, no downloads), these arms, each a fresh process:
  cold              empty Triton cache, no jit_ahead          (what users suffer today)
  warm              the cache the cold arm left, no jit_ahead (the lower bound)
  cold-jit          empty Triton cache, jit_ahead: the model is planned at construction within the
                    limits, built by CPU-only helpers; the server waits for WARMUP variants, warms up,
                    serves. With cold-jit-replay in the run it also records (JIT_AHEAD_RECORD_DIR).
  cold-jit-replay   empty Triton cache again, jit_ahead with cold-jit's record folder: a deployment's
                    second start on a fresh machine (variants and autotune choices replayed)
  cold-jit-early    as cold-jit, but warmup starts once planning has queued every WARMUP launch
                    (Session.wait_planned), without waiting for the builds: each warmup launch waits for
                    its own variant, and fla's autotuner benchmarks configs while helpers build others
                    (until f0f19bc an arm cold-jit-overlap waited for all planning instead)
  warm-jit          jit_ahead on a warm cache (nothing left to build): what jit_ahead's presence costs
                    (scripts/gpu/serving_ab.py runs it against warm, interleaved)
An arm listed twice runs twice, a cold one from an empty cache each time (until 97ea84f only
cold-jit-replay did). Each arm: construct the model on CUDA, warm up (decode at the CUDA-graph batch
sizes, one full prefill), mark serving, then REQUESTS random requests (batch size, prompt length within
the limits; prefill plus NEW_TOKENS decode steps). ``--padded``: as ``generate`` serves a batch of
prompts, each request's prompts have random lengths, padded on the left, with an attention mask at
every step (fla then runs its varlen kernels). Triton's compilation listener counts compile() calls with
cache_hit False (executor compiles) in warmup and in serving. Writes serving_loop.json and .md to
--out, the whole stderr of an arm that failed, and with --stats-logs each jit_ahead arm's stats log
(gzipped JSON lines: every build's helper, priority, start and finish). SERVING_LOOP_WAIT_ALL=1 makes the
jit_ahead arms wait for all planning, not only WARMUP's, before warmup (a diagnosis: no planning left
while the model runs).

    python scripts/gpu/serving_loop.py --out results/<date>-h200-serving-loop
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

T_START = time.perf_counter()
T_START_WALL = time.time()

LIMITS = {"qwen3-liger": dict(max_num_tokens=1024, max_batch_size=8, max_seq_len=512, cuda_graph_batch_sizes=(1, 2, 4, 8)),
          "gated-deltanet": dict(max_num_tokens=512, max_batch_size=4, max_seq_len=256, cuda_graph_batch_sizes=(1, 2, 4))}
REQUESTS = 40
NEW_TOKENS = 4


def run_arm(model_name: str, arm: str, padded: bool = False) -> dict:
    import torch

    from jit_ahead import demo_models
    from jit_ahead.core.planning.limits import EngineLimits

    limits = EngineLimits(**LIMITS[model_name])
    counter = demo_models.CompileCounter().install()  # before the session: jit_ahead chains to it
    compiles = counter.compiled
    warnings = _collect_warnings()
    session = None
    timeline: list[tuple] = []  # (event, s since start, helper, priority, label, seconds) from the stats
    gc_pauses = _time_gc(counter)
    host_builds = _time_host_builds(counter)
    misses: list[dict] = []  # jit_ahead's executor misses in serving: what a slow request waited for
    if arm.startswith("cold-jit") or arm == "warm-jit":
        from jit_ahead.session import Session

        from jit_ahead.providers.fla import FlaGatedDeltaNetProvider
        from jit_ahead.providers.liger import LigerProvider

        # the engine knows its kernel libraries: helpers import them while the server builds the model
        provider = LigerProvider if model_name == "qwen3-liger" else FlaGatedDeltaNetProvider
        session = Session(triton={"preload": provider.modules})
        session.stats.subscribe(lambda e: timeline.append((e["event"], round(e["time"] - T_START_WALL, 2),
                                                            e.get("helper"), e.get("priority"), e.get("label"),
                                                            e.get("seconds"))))

        def note_serving_miss(e: dict) -> None:
            if e["event"] == "executor_miss" and counter.phase == "serving":
                misses.append({k: e.get(k) for k in ("time", "outcome", "label", "seconds")})

        session.stats.subscribe(note_serving_miss)
        session.start()
    make = demo_models.liger_qwen3 if model_name == "qwen3-liger" else demo_models.fla_gated_deltanet
    torch.manual_seed(0)
    model = make(device="cuda")
    t_model = time.perf_counter() - T_START
    if session is not None:
        run = session.plan_model(model, limits)
        if arm == "cold-jit-early":
            session.wait_planned(timeout=600)
        elif os.environ.get("SERVING_LOOP_WAIT_ALL") == "1":  # diagnosis: no planning left during warmup
            from jit_ahead.core.priority import Priority

            session.wait_ready(timeout=600, priority=Priority.BACKGROUND)
        else:
            session.wait_ready(timeout=600)
    t_ready = time.perf_counter() - T_START
    shapes = demo_models.request_shapes(limits, REQUESTS, seed=1)
    try:
        demo_models.warmup(model, limits, "cuda", padded=padded)
        torch.cuda.synchronize()
        t_warm = time.perf_counter() - T_START
        counter.phase = "serving"
        if session is not None:
            session.mark_serving()
        latencies, cpu_times = [], []
        profiler = _profiler()
        for i, (batch, prompt) in enumerate(shapes):
            t0, c0 = time.perf_counter(), time.thread_time()
            lengths = demo_models.prompt_lengths(batch, prompt, seed=i) if padded else None
            demo_models.serve(model, batch, prompt, NEW_TOKENS, device="cuda", seed=i, lengths=lengths)
            torch.cuda.synchronize()
            latencies.append(time.perf_counter() - t0)
            cpu_times.append(time.thread_time() - c0)  # this thread's own CPU: more work, or more waiting?
    except Exception as exc:  # a failed arm still says when it failed, next to jit_ahead's milestones
        failure = {"model": model_name, "arm": arm, "padded": padded, "error": f"{type(exc).__name__}: {exc}"[:400],
                   "failed_at_s": round(time.perf_counter() - T_START, 2), "phase": counter.phase,
                   "ready_s": t_ready, "milestones": _milestones(timeline)}
        print("ARM " + json.dumps(failure), flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # a CUDA error is sticky: no teardown
    t_end = time.perf_counter() - T_START
    result = {"model": model_name, "arm": arm, "padded": padded, "model_built_s": t_model, "ready_s": t_ready,
              "warmup_end_s": t_warm, "end_s": t_end, "worst_request_s": max(latencies),
              "median_request_s": sorted(latencies)[len(latencies) // 2],
              "executor_compiles_warmup": len(compiles["warmup"]),
              "executor_compiles_serving": len(compiles["serving"]),
              "serving_compiled_kernels": sorted(set(compiles["serving"])), "jit_ahead_warnings": warnings,
              "request_s": [round(t, 4) for t in latencies], "request_shapes": [list(s) for s in shapes],
              "request_thread_cpu_s": [round(t, 4) for t in cpu_times],
              "process_threads_serving": threading.active_count(),
              "gc_gen2_serving_s": [round(t, 4) for t in gc_pauses["serving"]],
              "host_gcc_builds_s": {phase: [round(t, 3) for t in times] for phase, times in host_builds.items()},
              "serving_misses": [dict(m, time=round(m["time"] - T_START_WALL, 3)) for m in misses]}
    if profiler is not None:
        result["profile_top"] = _profile_top(profiler)
    if session is not None:
        tickets = run.tickets
        result.update(planned_variants=sum(run.variants.values()), planning_s=run.seconds,
                      queued=len(tickets), built=sum(1 for t in tickets if t.result and t.result.ok),
                      helpers=session.families["triton"].pool.workers, planning_errors=run.errors,
                      milestones=_milestones(timeline))
        session.close()
    return result


def _profiler():
    """SERVING_LOOP_PROFILE=1: cProfile the request loop (it slows Python down; compare arms, not times)."""
    if os.environ.get("SERVING_LOOP_PROFILE") != "1":
        return None
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


def _profile_top(profiler, count: int = 25) -> list[list]:
    """The functions with the most own time in the request loop: [file:line(function), calls, own s, cum s]."""
    import pstats

    profiler.disable()
    stats = pstats.Stats(profiler).stats
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:count]
    return [[f"{os.path.basename(f)}:{line}({name})", calls, round(own, 4), round(cum, 4)]
            for (f, line, name), (_, calls, own, cum, _) in rows]


def _time_gc(counter) -> dict[str, list[float]]:
    """Seconds of each full (generation 2) garbage collection, by phase: a suspect for slow requests."""
    import gc

    pauses: dict[str, list[float]] = {"warmup": [], "serving": []}
    started = [0.0]

    def on_gc(phase, info):
        if info.get("generation") != 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.setdefault(counter.phase, []).append(time.perf_counter() - started[0])

    gc.callbacks.append(on_gc)
    return pauses


def _time_host_builds(counter) -> dict[str, list[float]]:
    """Seconds of each gcc build of a host module (Triton 3.6's per-signature launcher, cuda_utils) in
    this process, by phase: work no compile listener sees."""
    from triton.runtime import build

    builds: dict[str, list[float]] = {"warmup": [], "serving": []}
    original = build._build

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            builds.setdefault(counter.phase, []).append(time.perf_counter() - t0)

    build._build = timed
    return builds


def _milestones(timeline: list[tuple]) -> dict:
    """Where a cold start with jit_ahead spends its time: helpers ready, preloaded, builds finished."""
    def times(event: str) -> list[float]:
        return sorted(t for name, t, *_ in timeline if name == event)

    out = {}
    for event in ("forkserver_ready", "forkserver_preloaded", "helper_ready", "helper_preloaded", "build_finish",
                  "planned"):
        found = times(event)
        if found:
            out[event] = {"first_s": found[0], "last_s": found[-1], "count": len(found)}
    # builds by priority (a helper builds one at a time: its build_finish is for its last build_start):
    # whether readiness waited for WARMUP's last build or for something queued later
    building: dict = {}
    by_priority: dict[str, list[float]] = {}
    builds = []
    for name, t, helper, priority, label, seconds in timeline:
        if name == "build_start":
            building[helper] = priority
        elif name == "build_finish" and building.get(helper):
            priority = building.pop(helper)
            by_priority.setdefault(priority, []).append(t)
            builds.append({"label": label, "priority": priority, "helper": helper, "finish_s": t,
                           "seconds": round(seconds or 0.0, 2)})
    for priority, found in sorted(by_priority.items()):
        out[f"build_finish_{priority}"] = {"first_s": min(found), "last_s": max(found), "count": len(found)}
    if builds:  # the long poles: what the last builds to finish were, and how long each took
        out["last_builds"] = sorted(builds, key=lambda b: b["finish_s"])[-5:]
        out["longest_builds"] = sorted(builds, key=lambda b: b["seconds"])[-5:]
    return out


def _collect_warnings() -> list[str]:
    import logging

    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(self.format(record)[:400])

    handler = Collect(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logging.getLogger("jit_ahead").addHandler(handler)
    return lines


def versions() -> dict:
    import torch
    import triton
    import transformers

    out = {"python": sys.version.split()[0], "torch": torch.__version__, "triton": triton.__version__,
           "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name(0),
           "cpus": len(os.sched_getaffinity(0))}
    for dist in ("liger-kernel", "flash-linear-attention", "fla-core"):
        try:
            from importlib.metadata import version
            out[dist] = version(dist)
        except Exception:
            out[dist] = None
    return out


def write_report(out: str | None, stem: str, report: dict, title: str, table: list[str]) -> None:
    """``report`` as ``out/stem.json`` and, under ``title`` and a line of its command, seed, date and
    versions, ``table`` as ``out/stem.md``; the Markdown is printed in any case."""
    lines = [title, "", f"`{report['command']}`; seed {report['seed']}; {report['date']}; "
             + ", ".join(f"{k} {v}" for k, v in report["versions"].items()), "", *table]
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{stem}.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(out, f"{stem}.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="a results/<date>-<what> folder")
    parser.add_argument("--models", default="qwen3-liger,gated-deltanet")
    parser.add_argument("--arms", default="cold,warm,cold-jit",
                        help="arms in order; without 'cold', 'warm' runs on the cache the first cold-jit* arm "
                             "left (list that arm first then)")
    parser.add_argument("--arm-timeout", type=float, default=590, help="seconds before an arm is stopped")
    parser.add_argument("--padded", action="store_true",
                        help="prompts of random lengths, padded, with an attention mask (as generate serves a batch)")
    parser.add_argument("--stats-logs", action="store_true",
                        help="keep each jit_ahead arm's stats log in --out as stats_<model>_<arm>.jsonl.gz")
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:  # one arm, in this fresh process
        print("ARM " + json.dumps(run_arm(args.model, args.arm, args.padded)), flush=True)
        return 0
    results = []
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as plain, tempfile.TemporaryDirectory() as with_jit, \
                tempfile.TemporaryDirectory() as scratch:
            arms = args.arms.split(",")
            caches = {"cold": plain, "cold-jit": with_jit}
            # the warm arm reuses the cache the cold arm left, else that of the first jit_ahead arm
            first_cold = "cold" if "cold" in arms else next((a for a in arms if a.startswith("cold-jit")), "cold")
            records = tempfile.mkdtemp(prefix="records_", dir=scratch) if "cold-jit-replay" in arms else None
            for index, arm in enumerate(arms):
                if arm == "warm":
                    cache = caches.setdefault(first_cold, plain)
                else:
                    # a cold arm listed again starts from an empty cache again (repeated starts)
                    if arm not in caches or arm in arms[:index]:
                        caches[arm] = tempfile.mkdtemp(prefix=f"{arm}_", dir=scratch)  # empty
                    cache = caches[arm]
                env = dict(os.environ, TRITON_CACHE_DIR=cache)
                if records and arm in ("cold-jit", "cold-jit-replay"):
                    env["JIT_AHEAD_RECORD_DIR"] = records
                repeat = f"_{index}" if arms.count(arm) > 1 else ""
                stats_log = os.path.join(scratch, f"stats_{model}_{arm}{repeat}.jsonl")
                if args.stats_logs and arm not in ("warm", "cold"):
                    env["JIT_AHEAD_STATS"] = stats_log
                t0 = time.perf_counter()
                try:
                    command = [sys.executable, __file__, "--arm", arm, "--model", model] + ["--padded"] * args.padded
                    proc = subprocess.run(command,
                                          env=env, capture_output=True, text=True, timeout=args.arm_timeout)
                except subprocess.TimeoutExpired:
                    results.append({"model": model, "arm": arm, "padded": args.padded,
                                    "error": f"did not finish within {args.arm_timeout:.0f} s"})
                    print(json.dumps(results[-1]), flush=True)
                    continue
                wall = time.perf_counter() - t0
                line = next((l for l in proc.stdout.splitlines() if l.startswith("ARM ")), None)
                result = json.loads(line[4:]) if line else {"model": model, "arm": arm, "padded": args.padded,
                                                            "error": proc.stderr[-500:]}
                if "error" in result:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    os.makedirs(args.out, exist_ok=True)  # the whole of it: the cause is often not at the end
                    with open(os.path.join(args.out, f"{model}_{arm}{repeat}.stderr.txt"), "w") as f:
                        f.write(proc.stderr)
                result["process_wall_s"] = wall
                if os.path.exists(stats_log):
                    os.makedirs(args.out, exist_ok=True)
                    with open(stats_log, "rb") as f, gzip.open(os.path.join(args.out, os.path.basename(stats_log)
                                                                            + ".gz"), "wb") as g:
                        shutil.copyfileobj(f, g)
                results.append(result)
                print(json.dumps(result), flush=True)
    previous = {}
    try:  # results of other models and arms from earlier runs are kept
        with open(os.path.join(args.out, "serving_loop.json")) as f:
            previous = json.load(f)
    except (OSError, ValueError):
        pass
    def run_key(r: dict) -> tuple:
        return r["model"], r["arm"], r.get("padded", False)

    ran = set(map(run_key, results))
    results = [r for r in previous.get("results", []) if run_key(r) not in ran] + results
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": versions(), "limits": LIMITS, "requests": REQUESTS, "new_tokens": NEW_TOKENS,
              "results": results}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "serving_loop.json"), "w") as f:
        json.dump(report, f, indent=1)
    lines = [f"# Serving loop, cold with jit_ahead vs warm and cold without ({report['date']})", "",
             "`" + " ".join(sys.argv) + "`; " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
             f"; {REQUESTS} random requests (prefill + {NEW_TOKENS} decode steps) after warmup"
             + (", prompts of random lengths padded with an attention mask (`--padded`)." if args.padded else "."), "",
             "| model | arm | process wall s | ready s | planning done s | warmup end s | end s "
             "| executor compiles warmup / serving | worst request s | jit_ahead / warm (end) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['arm']} | {r['error'][:60]} | | | | | | | |")
            continue
        warm = next((w for w in results if run_key(w) == (r["model"], "warm", r.get("padded", False))
                     and "error" not in w), None)
        ratio = f"{r['end_s'] / warm['end_s']:.2f}" if warm and r["arm"].startswith("cold-jit") else ""
        arm = r["arm"] + (" (padded)" if r.get("padded") else "")
        # planning done after ready: warmup ran while planning still enumerated BACKGROUND shapes
        planned = r.get("milestones", {}).get("planned", {}).get("last_s")
        lines.append(f"| {r['model']} | {arm} | {r['process_wall_s']:.1f} | {r['ready_s']:.1f} | "
                     f"{'' if planned is None else f'{planned:.1f}'} | {r['warmup_end_s']:.1f} | {r['end_s']:.1f} | "
                     f"{r['executor_compiles_warmup']} / {r['executor_compiles_serving']} | {r['worst_request_s']:.2f} | {ratio} |")
    with open(os.path.join(args.out, "serving_loop.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
