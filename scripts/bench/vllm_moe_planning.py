#!/usr/bin/env python3
"""Issue 36 item 5: how long planning vLLM's fused-MoE kernels takes at vLLM's real limits, on this machine.

Each case is a fresh process, as a vLLM worker is: vLLM's own MoE layers (``FusedMoE``, on meta tensors, on
the Triton experts an sm_90 GPU selects; ``tests/vllm_layers.py``) at the shapes of real MoE models, planned
as the vLLM plugin plans them (``worker.providers()``) at ``max_num_batched_tokens`` 8192 and 16384 (256
sequences, model length 32768), with no saved plan and no helper (planning only). Reported: wall seconds from
``plan_model`` until every launch is listed, launches, variants, the planner count, and the process's own
start (imports, building the layers) apart.

    python scripts/bench/vllm_moe_planning.py --out results/<date>-cpu-vllm-moe-planning [--planners 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from first_build import tree, versions  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# (experts, top_k, hidden, intermediate per expert) of real MoE models, as their vLLM layers are built at TP=1
MODELS = {"Qwen3-30B-A3B": (128, 8, 2048, 768), "Mixtral-8x7B": (8, 2, 4096, 14336),
          "DeepSeek-V2-Lite": (64, 6, 2048, 1408), "Qwen1.5-MoE-A2.7B": (60, 4, 2048, 1408)}
TOKENS = (8192, 16384)

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from tests.vllm_layers import cpu_vllm, moe_model, on_triton_experts
cpu_vllm()
model = moe_model({"moe": tuple(json.loads(sys.argv[1]))})
on_triton_experts(model)
import jit_ahead
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.engines.vllm import worker
session = jit_ahead.start()
started = time.perf_counter() - t0
t1 = time.perf_counter()
run = session.plan_model(model, EngineLimits(max_num_tokens=int(sys.argv[2]), max_batch_size=256, max_seq_len=32768),
                         providers=worker.providers())
assert session.wait_planned(1200, priority=None)
wall = time.perf_counter() - t1
print("RESULT " + json.dumps({"start_s": round(started, 2), "planning_s": round(wall, 2), "launches": run.launches,
                              "variants": sum(run.variants.values()), "errors": run.errors}))
jit_ahead.stop()
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--planners", default=str(max(1, (os.cpu_count() or 2))))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for name, shape in MODELS.items():
        for tokens in TOKENS:
            with tempfile.TemporaryDirectory() as scratch:
                env = {k: v for k, v in os.environ.items() if not k.startswith("JIT_AHEAD")}
                env.update(CUDA_VISIBLE_DEVICES="", VLLM_NO_USAGE_STATS="1", PYTHONPATH=REPO, JIT_AHEAD_TRITON_WORKERS="0",
                           JIT_AHEAD_PLANNERS=args.planners, JIT_AHEAD_PLAN_DIR=scratch, TRITON_CACHE_DIR=scratch)
                proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(shape), str(tokens)], env=env, cwd=REPO,
                                      capture_output=True, text=True, timeout=1800)
            line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
            row = {"model": name, "shape": shape, "max_num_batched_tokens": tokens, "planners": int(args.planners),
                   **(json.loads(line[7:]) if line else {"failed": proc.stderr[-2000:]})}
            rows.append(row)
            print(json.dumps(row), flush=True)
    from importlib.metadata import version

    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "tree": tree(), "versions": {**versions(), "vllm": version("vllm")},
              "command": " ".join(sys.argv), "rows": rows}
    with open(os.path.join(args.out, "vllm_moe_planning.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "vllm_moe_planning.md"), "w") as f:
        f.write(f"# vLLM fused-MoE planning at vLLM's limits\n\n`{report['command']}`; tree {report['tree']}\n\n")
        f.write("| model | (E, top_k, hidden, inter) | max_num_batched_tokens | planners | planning s | launches | "
                "variants | process start s |\n|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['model']} | {tuple(r['shape'])} | {r['max_num_batched_tokens']} | {r['planners']} | "
                    f"{r.get('planning_s', 'failed')} | {r.get('launches', '')} | {r.get('variants', '')} | "
                    f"{r.get('start_s', '')} |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
