"""Issue 36 item 3: how many of DeepSeek-V4's mHC TileLang variants vLLM's own warmup compiles, against
every variant the token counts an engine serves reach, worked out with vLLM's own code (CPU only).

What it runs, all from the installed vLLM package:
- ``deepseek_v4_mhc_warmup``'s layer search (``_find_first_mhc_layer``) over one DeepseekV4DecoderLayer of
  each vLLM model implementation (NVIDIA, AMD, XPU), the object made without its ``__init__`` (which needs a
  whole engine configuration) and given the six ``hc_*`` parameters that ``__init__`` sets: does the warmup
  find the layer at all?
- the warmup's token sizes (``_select_mhc_warmup_token_sizes``) for vLLM's default CUDA-graph capture sizes at
  256 sequences (``[1, 2, 4] + 8..248 by 8 + 256..512 by 16``, vLLM's ``VllmConfig._set_cudagraph_sizes``);
- the split count of the mHC kernels that take one (``_compute_mhc_pre_num_split``, the formula of
  ``compute_num_split`` on the DeepGEMM path) at every token count from 1 to ``max_num_batched_tokens``,
  and at the warmup's sizes, for a 132-SM GPU (H100 SXM, H200).

Prints one JSON line per case and writes ``vllm_mhc_buckets.json`` under ``--out``.
    python scripts/bench/vllm_mhc_buckets.py --out results/<date>-cpu-vllm-mhc-buckets
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # a CPU process: vLLM picks its CPU platform

HIDDEN_SIZES = (7168, 4096)  # DeepSeek-V4 sizes the research names (tilelang.md, engines-and-peers.md)
HC_MULT = 4
NUM_SMS = 132
MAX_TOKENS = (8192, 16384)
MAX_NUM_SEQS = 256


def default_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM 0.25's default CUDA-graph capture sizes (``VllmConfig._set_cudagraph_sizes``)."""
    largest = min(max_num_seqs * 2, 512)
    return [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, largest + 1, 16))


def layer_found_by_the_warmup(module_name: str) -> bool | str:
    """Whether vLLM's own warmup finds a DeepseekV4DecoderLayer of this implementation."""
    import torch

    from vllm.model_executor.warmup.deepseek_v4_mhc_warmup import _find_first_mhc_layer

    try:
        cls = importlib.import_module(module_name).DeepseekV4DecoderLayer
    except Exception as exc:  # an implementation this CPU install cannot import
        return f"not importable here ({type(exc).__name__})"
    layer = cls.__new__(cls)
    torch.nn.Module.__init__(layer)
    for name in ("hc_attn_fn", "hc_ffn_fn", "hc_attn_base", "hc_ffn_base", "hc_attn_scale", "hc_ffn_scale"):
        setattr(layer, name, torch.nn.Parameter(torch.empty(1, device="meta"), requires_grad=False))
    return _find_first_mhc_layer(torch.nn.ModuleList([layer])) is layer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import vllm
    from vllm.model_executor.warmup import deepseek_v4_mhc_warmup as warmup

    found = {impl: layer_found_by_the_warmup(f"vllm.models.deepseek_v4.{impl}.model") for impl in ("nvidia", "amd", "xpu")}
    print(json.dumps({"warmup_finds_the_layer": found}))
    cases = []
    captures = default_capture_sizes(MAX_NUM_SEQS)
    for hidden in HIDDEN_SIZES:
        for max_tokens in MAX_TOKENS:
            def split(tokens: int) -> int:
                return warmup._compute_mhc_pre_num_split(num_tokens=tokens, hidden_size=hidden, hc_mult=HC_MULT,
                                                         num_sms=NUM_SMS)

            sizes = warmup._select_mhc_warmup_token_sizes(max_tokens=max_tokens, cudagraph_capture_sizes=captures)
            reached = {split(t) for t in range(1, max_tokens + 1)}
            warmed = {split(t) for t in sizes}
            cold = sorted(reached - warmed)
            first_cold = {s: min(t for t in range(1, max_tokens + 1) if split(t) == s) for s in cold}
            case = {"hidden_size": hidden, "hc_mult": HC_MULT, "num_sms": NUM_SMS, "max_num_batched_tokens": max_tokens,
                    "warmup_token_sizes": len(sizes), "split_counts_reached": sorted(reached),
                    "split_counts_warmed": sorted(warmed), "cold": cold,
                    "token_counts_in_cold_buckets": sum(split(t) in cold for t in range(1, max_tokens + 1)),
                    "first_token_count_of_each_cold_split": first_cold}
            cases.append(case)
            print(json.dumps(case))
    report = {"vllm": vllm.__version__, "python": platform.python_version(), "capture_sizes": captures,
              "warmup_finds_the_layer": found, "cases": cases}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "vllm_mhc_buckets.json"), "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
