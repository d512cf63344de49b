#!/usr/bin/env python3
"""Serving while jit_ahead plans and builds another model in the same process (issue 35 item 3), on the CPU.

What the serving thread of a server loses while jit_ahead's planning thread forks planners, takes in what
they find and queues builds for a model that is not the one being served. Arms, in fresh processes,
ROUNDS rounds, each starting with another arm:
  plain  a transformers Llama on the CPU (a model no test uses) serves REQUESTS requests in the main thread
  jit    the same, with ``jit_ahead.start()``, then ``plan_model`` of the fla GatedDeltaNet (hidden 1024) at
         EngineLimits(16384, 32, 8192) on meta tensors, a short warmup, ``mark_serving()``, then the
         same requests while that model's planning and builds go on (Triton's stand-in driver; helpers
         build for sm_90 at nice 19, into a Triton cache of their own, empty at each start)
  jit-before  (with --before TREE) the jit arm with the jit_ahead of TREE: a change's before and after
Each process first holds HEAP_GB of Python objects, as a server process does (model and engine
state), so that what a fork costs its parent shows. Requests: batch and prompt length drawn at random
with a new seed per run (the same in both arms); each is one forward with an attention mask and 2 decode
steps with a KV cache, as transformers serves. Per arm: every request's latency, the worst, the total;
for jit also the planning thread's CPU while serving and how far planning got. Then, per jit arm and
round, the busy model planned with nothing served: the planning thread's CPU seconds and the wall. Writes
serving_while_planning.json and .md to --out.

    python scripts/bench/serving_while_planning.py --out results/<date>-cpu-serving-while-planning [--rounds 4]
        [--before /tmp/before]   (git worktree add /tmp/before <commit>)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time


REQUESTS = 150
WARMUP_S = 2.0
HEAP_GB = 1.0
BUSY_LIMITS = dict(max_num_tokens=16384, max_batch_size=32, max_seq_len=8192)


def serving_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=2048, max_position_embeddings=4096)
    return LlamaForCausalLM(config).eval()


def request(model, batch: int, prompt: int) -> None:
    import torch

    ids = torch.randint(0, 2048, (batch, prompt))
    mask = torch.ones(batch, prompt, dtype=torch.long)
    mask[0, : prompt // 3] = 0  # one left-padded row
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        cache = out.past_key_values
        for _ in range(2):
            mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.long)], dim=1)
            out = model(input_ids=out.logits[:, -1:].argmax(-1), attention_mask=mask, past_key_values=cache,
                        use_cache=True)


def busy_model():
    import torch
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    with torch.device("meta"):
        model = GatedDeltaNetForCausalLM(GatedDeltaNetConfig(hidden_size=1024, num_hidden_layers=4, num_heads=8,
                                                             head_dim=128, expand_v=1.0, vocab_size=4096))
    return model.to(torch.bfloat16).eval()


def planning_only(arm: str) -> dict:
    """The busy model planned with nothing served: the planning thread's own CPU seconds (what it takes
    from the server's GIL), sampled until it ends, and the planning wall."""
    import threading

    import jit_ahead
    from jit_ahead.core.planning.limits import EngineLimits
    from jit_ahead.triton.standin import ensure_driver

    ensure_driver()
    session = jit_ahead.start()
    t0 = time.perf_counter()
    run = session.plan_model(busy_model(), EngineLimits(**BUSY_LIMITS))
    planning = next(t for t in threading.enumerate() if t.name.startswith("jit_ahead-planning"))
    cpu = 0.0
    while not run.done:
        cpu = _thread_cpu(planning) or cpu
        time.sleep(0.05)
    result = {"arm": arm, "planning_thread_cpu_s": round(cpu, 3), "planning_wall_s": round(time.perf_counter() - t0, 2),
              "variants": sum(run.variants.values()), "jit_ahead": os.path.dirname(jit_ahead.__file__)}
    session.close(grace=0.5)
    return result


def child(arm: str, seed: int) -> dict:
    import threading

    import torch

    torch.set_num_threads(1)
    heap = [[i, str(i), (i, i)] for i in range(int(HEAP_GB * 2**30 / 200))]  # noqa: F841 - a server's objects
    model = serving_model()
    rng = random.Random(seed)
    shapes = [(rng.randint(1, 8), rng.randint(16, 256)) for _ in range(REQUESTS)]
    session = run = None
    marks = _Marks()
    if arm.startswith("jit"):
        import jit_ahead
        from jit_ahead.core.planning.limits import EngineLimits
        from jit_ahead.triton.standin import ensure_driver

        ensure_driver()
        session = jit_ahead.start()
        run = session.plan_model(busy_model(), EngineLimits(**BUSY_LIMITS))
    t_warm = time.perf_counter()
    while time.perf_counter() - t_warm < WARMUP_S:  # warmup: the serving model's own shapes
        request(model, 2, 32)
    if session is not None:
        session.mark_serving(tune_ahead=False)
    planning = next((t for t in threading.enumerate() if t.name.startswith("jit_ahead-planning")), None)
    planning_cpu0 = _thread_cpu(planning)
    latencies, began = [], []
    for batch, prompt in shapes:
        t0 = time.perf_counter()
        request(model, batch, prompt)
        began.append(t0)
        latencies.append(time.perf_counter() - t0)
    result = {"arm": arm, "seed": seed, "request_s": [round(x, 4) for x in latencies],
              "serving_s": round(sum(latencies), 3), "worst_request_s": round(max(latencies), 4),
              "median_request_s": round(statistics.median(latencies), 4),
              "slow_requests": marks.inside(began, latencies, 2 * statistics.median(latencies))}
    if session is not None:
        result["jit_ahead"] = os.path.dirname(jit_ahead.__file__)  # which tree's (--before)
        planning_cpu = _thread_cpu(planning)  # None once the thread ended: its CPU time went with it
        result.update(planning_thread_cpu_s=None if planning_cpu is None or planning_cpu0 is None
                      else round(planning_cpu - planning_cpu0, 3),
                      planning_done=run.done, planned=sum(run.variants.values()),
                      pending=session.families["triton"].table.pending())
        session.close(grace=0.5)
    return result


class _Marks:
    """When this process forked and when a full collection ran (perf_counter, seconds): what a slow
    request overlapped."""

    def __init__(self) -> None:
        import gc

        self.spans: list[tuple[str, float, float]] = []
        fork = os.fork

        def timed_fork():
            t0 = time.perf_counter()
            pid = fork()
            if pid:
                self.spans.append(("fork", t0, time.perf_counter()))
            return pid

        os.fork = timed_fork
        self._gc0 = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._gc0 = time.perf_counter()
        else:
            self.spans.append(("gc2", self._gc0, time.perf_counter()))

    def inside(self, began: list[float], latencies: list[float], slow: float) -> list[dict]:
        out = []
        for t0, seconds in zip(began, latencies):
            if seconds < slow:
                continue
            within = [(kind, round(b - a, 4)) for kind, a, b in self.spans if a < t0 + seconds and b > t0]
            out.append({"request_s": round(seconds, 4), "forks": sum(k == "fork" for k, _ in within),
                        "fork_s": round(sum(s for k, s in within if k == "fork"), 4),
                        "gc2": sum(k == "gc2" for k, _ in within), "gc2_s": round(sum(s for k, s in within if k == "gc2"), 4)})
        return out


def _thread_cpu(thread) -> float | None:
    if thread is None or thread.native_id is None or not thread.is_alive():
        return None
    import psutil

    for t in psutil.Process().threads():
        if t.id == thread.native_id:
            return t.user_time + t.system_time
    return None


def run_arm(arm: str, seed: int, before: str | None, mode: str = "--one") -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(scratch, "cache"), JIT_AHEAD_PLAN_DIR=os.path.join(scratch, "plans"),
                   JIT_AHEAD_TUNING_DIR=os.path.join(scratch, "tuning"))
        env.pop("JIT_AHEAD_RECORD_DIR", None)
        if arm == "jit-before":  # jit_ahead of another tree (a checkout), found before the installed one
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [before, env.get("PYTHONPATH")]))
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, mode, arm, str(seed)], env=env, capture_output=True,
                              text=True, timeout=900)
        line = next((l for l in proc.stdout.splitlines() if l.startswith("ARM ")), None)
        if line is None:
            raise RuntimeError(f"{arm} failed:\n{proc.stderr[-3000:]}")
        result = json.loads(line[4:])
        result["process_s"] = round(time.perf_counter() - t0, 2)
        return result


def report_lines(report: dict) -> list[str]:
    results = report["results"]
    lines = [f"# Serving while jit_ahead plans and builds another model ({report['date']})", "",
             f"`{report['command']}`; seed {report['seed']}; {report['versions']}", "",
             "| arm | serving s | median request s | worst request s | planning thread CPU s | planning done | "
             "variants planned | builds pending at end |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['arm']} | {r['serving_s']} | {r['median_request_s']} | {r['worst_request_s']} | "
                     f"{r.get('planning_thread_cpu_s', '')} | {r.get('planning_done', '')} | {r.get('planned', '')} | "
                     f"{r.get('pending', '')} |")
    by = {arm: [r for r in results if r["arm"] == arm] for arm in dict.fromkeys(r["arm"] for r in results)}
    median = lambda arm, key: statistics.median(r[key] for r in by[arm])  # noqa: E731
    lines += ["", "Planning alone (nothing served): the planning thread's CPU seconds, what it holds of the server's "
              "GIL, and the planning wall, medians:", ""]
    for arm in dict.fromkeys(r["arm"] for r in report.get("planning_only", [])):
        runs = [r for r in report["planning_only"] if r["arm"] == arm]
        lines.append(f"- {arm}: planning thread CPU {statistics.median(r['planning_thread_cpu_s'] for r in runs):.2f} s, "
                     f"wall {statistics.median(r['planning_wall_s'] for r in runs):.2f} s ({len(runs)} runs, "
                     f"{sorted({r['variants'] for r in runs})} variants)")
    lines.append("")
    for arm in by:
        if arm != "plain":
            lines.append(f"{arm} / plain, medians over {len(by[arm])} and {len(by['plain'])} runs: serving time "
                         f"{median(arm, 'serving_s') / median('plain', 'serving_s'):.3f}, median request "
                         f"{median(arm, 'median_request_s') / median('plain', 'median_request_s'):.3f}, worst request "
                         f"{median(arm, 'worst_request_s') / median('plain', 'worst_request_s'):.3f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--before", metavar="TREE", default=None,
                        help="also an arm jit-before: the jit_ahead of TREE (e.g. a git worktree of an earlier commit)")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--plan-one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("ARM " + json.dumps(child(args.one[0], int(args.one[1]))), flush=True)
        return 0
    if args.plan_one:
        print("ARM " + json.dumps(planning_only(args.plan_one[0])), flush=True)
        return 0
    if not args.out:
        parser.error("--out is required")
    seed = random.randrange(2**31)
    print(f"seed {seed}", flush=True)
    results = []
    arms = ["plain", "jit"] + (["jit-before"] if args.before else [])
    for i in range(args.rounds):  # each round in another order: arm k first in round k
        for arm in arms[i % len(arms):] + arms[:i % len(arms)]:
            results.append(run_arm(arm, seed, args.before))
            print(json.dumps({k: v for k, v in results[-1].items() if k not in ("request_s", "slow_requests")}), flush=True)
    planning = []  # the planning thread's CPU, with nothing served
    for i in range(args.rounds):
        for arm in [a for a in arms[i % len(arms):] + arms[:i % len(arms)] if a != "plain"]:
            planning.append(run_arm(arm, seed, args.before, mode="--plan-one"))
            print(json.dumps(planning[-1]), flush=True)
    # imported here, not in the arms' processes: it puts the repository first on sys.path, which would
    # hide the jit_ahead of --before
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from build_throughput import versions

    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": versions(), "seed": seed, "command": " ".join(sys.argv), "results": results,
              "planning_only": planning}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "serving_while_planning.json"), "w") as f:
        json.dump(report, f, indent=1)
    lines = report_lines(report)
    with open(os.path.join(args.out, "serving_while_planning.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
