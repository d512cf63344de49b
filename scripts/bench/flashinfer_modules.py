#!/usr/bin/env python3
"""FlashInfer modules per minute (issue 39): a set of FlashInfer's own nvcc modules built from an empty
workspace by jit_ahead's helpers (1 and N), against FlashInfer alone building them one after another in the
process (what a server without jit_ahead pays at the first call of each op). Each arm is a fresh process with
a workspace of its own (FlashInfer fixes its JIT folder at import).

    python scripts/bench/flashinfer_modules.py --out results/<date>-cpu-flashinfer-modules [--workers 1,2]

The modules: the activation ops' (silu, gelu, gelu_tanh), the paged KV-cache append (page) and RoPE, the ones
that build without cuBLAS or cuRAND headers on a CPU-only machine; made by FlashInfer's gen_* functions.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ARM = r"""
import json, os, sys, time
mode, workers = sys.argv[1], int(sys.argv[2])
from flashinfer.jit.activation import gen_act_and_mul_module
from flashinfer.jit import rope, page
specs = [gen_act_and_mul_module(a) for a in ("silu", "gelu", "gelu_tanh")] + [page.gen_page_module(), rope.gen_rope_module()]
t0 = time.perf_counter()
if mode == "flashinfer":  # FlashInfer alone: each module built where it is first asked for, one after another
    for spec in specs:
        spec.build_and_load()
else:
    from jit_ahead.core.priority import Priority
    from jit_ahead.flashinfer.request import FlashInferModule
    from jit_ahead.session import Session
    session = Session(families=("flashinfer",), flashinfer={"workers": workers}).start()
    session.families["flashinfer"].submit([FlashInferModule.of(s) for s in specs], Priority.WARMUP)
    assert session.wait_ready(1800, priority=Priority.WARMUP)
    session.close()
    assert all(FlashInferModule.of(s).is_built() for s in specs)
print("ARM " + json.dumps({"modules": [s.name for s in specs], "seconds": round(time.perf_counter() - t0, 1)}))
"""


def run_arm(mode: str, workers: int, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as workspace:
        out = subprocess.run([sys.executable, "-c", ARM, mode, str(workers)], capture_output=True, text=True,
                             timeout=3600, env={**env, "FLASHINFER_WORKSPACE_BASE": workspace})
    line = next((l for l in out.stdout.splitlines() if l.startswith("ARM ")), None)
    if line is None:
        return {"mode": mode, "workers": workers, "error": out.stderr[-2000:]}
    result = json.loads(line[4:])
    result.update(mode=mode, workers=workers,
                  modules_per_minute=round(60 * len(result["modules"]) / result["seconds"], 2))
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--workers", default="1,2")
    args = parser.parse_args()
    from jit_ahead.flashinfer import toolchain

    import flashinfer

    env = {k: v for k, v in os.environ.items() if not k.startswith("JIT_AHEAD")}
    env.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    with tempfile.TemporaryDirectory() as scratch:  # what a server with a working toolkit has, for FlashInfer alone
        import pathlib

        env.update(toolchain.helper_environment((9, 0), pathlib.Path(scratch), env))
        results = [run_arm("flashinfer", 0, env)]
        results += [run_arm("jit_ahead", int(w), env) for w in args.workers.split(",")]
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "flashinfer": flashinfer.__version__,
              "python": platform.python_version(), "cpus": os.cpu_count(), "arch": env["FLASHINFER_CUDA_ARCH_LIST"],
              "results": results}
    print(json.dumps(report, indent=1))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "flashinfer_modules.json"), "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
