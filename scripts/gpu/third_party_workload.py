#!/usr/bin/env python3
"""A third-party Triton workload that no jit_ahead provider plans: a block of Liger-Kernel ops that the
Liger provider does not cover (fused add + RMSNorm, DyT, PolyNorm, ReLU², softmax, sparsemax) and
flash-linear-attention's GatedLinearAttention layer in its fused-recurrent mode (up to 64 tokens), bf16
on the GPU, random weights.

It knows nothing of jit_ahead except the two lifecycle calls an engine makes when JIT_AHEAD=1 is set
(wait for what the helpers are building, then mark serving) and the demo's compile counter. Warmup at a
few shapes, then REQUESTS forwards at random (batch, length) within the limits, the same sequence for the
same --seed. Triton's compilation listener counts compile() calls with cache_hit False in warmup and in
serving. Prints one line: RESULT {json}.

    python scripts/gpu/third_party_workload.py [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time

T_START = time.perf_counter()
MAX_BATCH, MAX_LEN, HIDDEN, HEADS, REQUESTS = 4, 64, 512, 4, 40
WARMUP_SHAPES = ((1, 1), (4, 1), (1, 64), (4, 64))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from fla.layers import GatedLinearAttention
    from liger_kernel.transformers import (LigerDyT, LigerFusedAddRMSNorm, LigerPolyNorm, LigerReLUSquared,
                                           LigerSoftmax, LigerSparsemax)

    from jit_ahead.demo_models import CompileCounter  # a listener chained to jit_ahead's own when it is on

    counter = CompileCounter().install()
    compiles = counter.compiled
    torch.manual_seed(0)
    modules = {"gla": GatedLinearAttention(hidden_size=HIDDEN, num_heads=HEADS, layer_idx=0),
               "add_norm": LigerFusedAddRMSNorm(HIDDEN), "dyt": LigerDyT(HIDDEN), "poly": LigerPolyNorm(in_place=False),
               "relu2": LigerReLUSquared(), "softmax": LigerSoftmax(), "sparsemax": LigerSparsemax()}
    m = {name: module.to("cuda", torch.bfloat16).eval() for name, module in modules.items()}
    built_s = time.perf_counter() - T_START

    def block(x):
        attn = m["gla"](x)[0]
        h, residual = m["add_norm"](attn, x)
        h = m["relu2"](m["poly"](m["dyt"](h))) + residual
        scores = h.flatten(0, 1)[:, :128].float().contiguous()
        return m["softmax"](scores) + m["sparsemax"](scores)

    def forward(batch: int, length: int) -> float:
        x = torch.randn(batch, length, HIDDEN, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            block(x)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    for batch, length in WARMUP_SHAPES:
        forward(batch, length)
    session = None
    if os.environ.get("JIT_AHEAD") == "1":  # what an engine does at the end of its warmup
        import jit_ahead
        from jit_ahead.core.priority import Priority

        session = jit_ahead.current()
        session.wait_ready(timeout=600, priority=Priority.REPLAY)
        session.mark_serving()
    warmup_end_s = time.perf_counter() - T_START
    counter.phase = "serving"
    rng = random.Random(args.seed)
    latencies = [forward(rng.randint(1, MAX_BATCH), rng.randint(1, MAX_LEN)) for _ in range(REQUESTS)]
    result = {"jit_ahead": session is not None, "model_built_s": built_s, "warmup_end_s": warmup_end_s,
              "end_s": time.perf_counter() - T_START, "executor_compiles_warmup": len(compiles["warmup"]),
              "executor_compiles_serving": len(compiles["serving"]),
              "serving_compiled": sorted(set(compiles["serving"])), "worst_request_s": max(latencies),
              "median_request_s": sorted(latencies)[len(latencies) // 2]}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
