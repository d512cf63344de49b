#!/usr/bin/env python3
"""What the model-level planner finds in the Qwen3.5 hybrid built on the GPU (real weights, as a server
builds it): each provider's sites and claims, with the planner's log lines, and its time.

    python scripts/gpu/model_planner_check.py
"""
import logging
import time

import torch

from jit_ahead import demo_models
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.providers.base import Claims
from jit_ahead.providers.builtin import builtin_providers


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    model = demo_models.qwen35_hybrid(device="cuda" if torch.cuda.is_available() else "cpu")
    limits = EngineLimits(max_num_tokens=8192, max_batch_size=16, max_seq_len=4096)
    claims = Claims()
    for provider in builtin_providers():
        t0 = time.perf_counter()
        sites = (provider.find_layers(model, claims, limits) if provider.sees_claims
                 else provider.find_layers(model))
        claims |= provider.claims(model, sites)
        print(f"{provider.name}: {len(sites)} sites in {time.perf_counter() - t0:.2f}s; claims now "
              f"{len(claims.modules)} modules, kernels {sorted(claims.kernels)}", flush=True)


if __name__ == "__main__":
    main()
