#!/usr/bin/env python3
"""vLLM 0.25 starts with and without ``JIT_AHEAD=1``, cold and warm (issue 36): what compiles after ready.

Each arm is a fresh process running ``vllm.LLM`` in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so
that one listener sees every Triton compile of the worker) on a small random-weight model saved to a
local folder (``load_format="dummy"``), with the Triton attention backend, at the limits given
(``max_num_batched_tokens``, ``max_num_seqs``, ``max_model_len``), then a mix of REQUESTS prompts of
random token ids drawn across the limits with a new seed per run (prompt lengths 1 up to what the
limits allow, 1-16 new tokens, submitted together so that vLLM batches and chunks them as it serves).
Arms: plain-cold (empty Triton cache), jit-cold (empty cache, plans and records), jit-warm and
plain-warm (the cache jit-cold left). Reported per arm: seconds to ``LLM`` returned (ready), Triton
compiles during the start and after ready (those missing the disk cache, and those loaded from it),
the kernels compiled after ready, the mix's wall seconds, and with ``--monitor error`` whether vLLM's JIT
monitor raised. Writes vllm_starts.json / .md to --out, and each arm's log (armN-NAME.log).

``--sampling mixed``: about half the requests sample with temperature, top-k and/or top-p, which vLLM hands
to FlashInfer's sampler on an H100/H200 (its first such request builds FlashInfer's sampling module with
nvcc); the jit arms then run the FlashInfer family too (``JIT_AHEAD_FAMILIES=triton,flashinfer``), each
cold arm has a FlashInfer workspace of its own, and FlashInfer's module builds (``JitSpec.build`` calls)
are counted during the start and after ready.

``--attention flashinfer``: vLLM's FlashInfer attention backend instead of its Triton one (its prefill and
decode modules are FlashInfer JIT modules, built with nvcc in the server's warmup without jit_ahead); the
jit arms run the FlashInfer family, and FlashInfer's module builds are counted as with ``--sampling mixed``.

``--speculative eagle3``: the model gets a one-layer Eagle3 draft of random weights (3 speculative tokens);
vLLM runs a MoE target's speculative decoding on its V1 runner, with the proposer's and the rejection
sampler's Triton kernels each step.

    python scripts/gpu/vllm_starts.py --out $OUT/vllm [--model qwen3] [--tokens 8192] [--seqs 256] [--len 32768]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serving_loop import versions, write_report  # noqa: E402

REQUESTS = 64
MODELS = {
    # a dense Qwen3-style model and a MoE one, small, in bf16; weights are vLLM's dummy ones
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024, intermediate_size=3072,
                  num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4, head_dim=64),
    "qwen3-moe": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=1024,
                      intermediate_size=3072, moe_intermediate_size=512, num_experts=16, num_experts_per_tok=4,
                      num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                      decoder_sparse_step=1, norm_topk_prob=True),
}


def write_model(folder: str, name: str, max_len: int) -> str:
    path = os.path.join(folder, name)
    os.makedirs(path, exist_ok=True)
    config = dict(MODELS[name], vocab_size=32000, max_position_embeddings=max_len, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, torch_dtype="bfloat16", tie_word_embeddings=False, bos_token_id=1,
                  eos_token_id=2)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def write_draft(folder: str, target: str, max_len: int) -> str:
    """A one-layer Eagle3 draft (Llama-style) for the target model, its hidden size and vocabulary."""
    path = os.path.join(folder, "eagle3-draft")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(target, "config.json")) as f:
        hidden = json.load(f)["hidden_size"]
    config = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_size=hidden,
                  intermediate_size=2 * hidden, num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=4,
                  head_dim=64, vocab_size=32000, max_position_embeddings=max_len, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, torch_dtype="bfloat16", tie_word_embeddings=False)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def _count_flashinfer_builds(events: dict, phase: list) -> None:
    """FlashInfer's ``JitSpec.build`` calls (ninja runs: what a server without built modules pays), by phase."""
    try:
        from flashinfer.jit import core
    except ImportError:
        return
    original = core.JitSpec.build

    def build(self, *args, **kwargs):
        events.setdefault(f"flashinfer_{phase[0]}", []).append(self.name)
        return original(self, *args, **kwargs)

    core.JitSpec.build = build


def arm(model_path: str, tokens: int, seqs: int, max_len: int, seed: int, monitor: str | None,
        sampling: str = "greedy", draft: str | None = None, attention: str = "triton") -> dict:
    t0 = time.perf_counter()
    from triton import knobs

    events = {"start": [], "serving": []}
    phase = ["start"]
    previous = knobs.compilation.listener

    def listener(*, src, metadata, metadata_group, times, cache_hit, **kwargs):
        events[phase[0]].append((getattr(src, "name", str(src)), bool(cache_hit)))
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit,
                     **kwargs)

    knobs.compilation.listener = listener
    if sampling == "mixed" or attention == "flashinfer":
        _count_flashinfer_builds(events, phase)
    from vllm import LLM, SamplingParams

    backend = "FLASHINFER" if attention == "flashinfer" else "TRITON_ATTN"
    kwargs = dict(model=model_path, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                  max_num_batched_tokens=tokens, max_num_seqs=seqs, max_model_len=max_len,
                  attention_backend=backend, gpu_memory_utilization=0.85, seed=0)
    if monitor:
        kwargs["jit_monitor_mode"] = monitor
    if draft:
        # the draft's attention backend is chosen apart from the target's (vLLM's own choice is FlashAttention,
        # whose extension the offline wheel set lacks): the same as the target's
        kwargs["speculative_config"] = {"method": "eagle3", "model": draft, "num_speculative_tokens": 3,
                                        "attention_backend": backend}
    llm = LLM(**kwargs)
    ready = time.perf_counter() - t0
    phase[0] = "serving"
    rng = random.Random(seed)
    prompts, params = [], []
    for _ in range(REQUESTS):
        length = rng.randint(1, min(max_len - 16, tokens))
        prompts.append({"prompt_token_ids": [rng.randrange(3, 32000) for _ in range(length)]})
        sample = {}
        if sampling == "mixed" and rng.random() < 0.5:  # top-k and/or top-p: FlashInfer's sampler on the GPU
            sample = dict(temperature=0.8, top_k=rng.choice([-1, 20]), top_p=rng.choice([1.0, 0.9]))
            if sample["top_k"] == -1 and sample["top_p"] == 1.0:
                sample["top_p"] = 0.95
        params.append(SamplingParams(max_tokens=rng.randint(1, 16), ignore_eos=True, **{"temperature": 0.0, **sample}))
    t1 = time.perf_counter()
    error = None
    try:
        llm.generate(prompts, params, use_tqdm=False)
    except RuntimeError as exc:  # vLLM's JIT monitor in error mode
        error = str(exc)[:500]
    serving = time.perf_counter() - t1
    after = events["serving"]
    return {"ready_s": round(ready, 2), "serving_s": round(serving, 2), "monitor_error": error,
            "start_compiles": sum(not hit for _, hit in events["start"]),
            "start_loads": sum(hit for _, hit in events["start"]),
            "serving_compiles": sum(not hit for _, hit in after), "serving_loads": sum(hit for _, hit in after),
            "serving_kernels": sorted({name for name, _ in after}),
            "flashinfer_builds_start": events.get("flashinfer_start", []),
            "flashinfer_builds_after_ready": events.get("flashinfer_serving", [])}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--model", default="qwen3", choices=sorted(MODELS))
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--len", dest="max_len", type=int, default=32768)
    parser.add_argument("--arms", default="plain-cold,jit-cold,jit-warm,plain-warm",
                        help="comma-separated; an arm ending in ':error' or ':warn' runs with vLLM's JIT monitor so")
    parser.add_argument("--monitor", choices=("warn", "error"), default=None)
    parser.add_argument("--arm-timeout", type=float, default=400)
    parser.add_argument("--state", metavar="FOLDER", default=None,
                        help="keep the model and the arms' caches in FOLDER, so that a later call on the same warm "
                             "machine adds arms on them (default: a temporary folder)")
    parser.add_argument("--sampling", choices=("greedy", "mixed"), default="greedy")
    parser.add_argument("--speculative", choices=("none", "eagle3"), default="none")
    parser.add_argument("--attention", choices=("triton", "flashinfer"), default="triton")
    parser.add_argument("--draft", help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, seed = args.child
        print("ARM " + json.dumps(arm(path, args.tokens, args.seqs, args.max_len, int(seed), args.monitor, args.sampling,
                                      args.draft, args.attention)), flush=True)
        return 0
    seed = random.randrange(2**31)
    print(f"request seed {seed}", flush=True)
    results = []
    with (contextlib.nullcontext(args.state) if args.state else tempfile.TemporaryDirectory()) as scratch:
        os.makedirs(scratch, exist_ok=True)
        model_path = write_model(scratch, args.model, args.max_len)
        draft = write_draft(scratch, model_path, args.max_len) if args.speculative == "eagle3" else None
        folders = {n: os.path.join(scratch, n) for n in ("cache", "cold", "plans", "records", "tuning")}
        for index, name in enumerate(args.arms.split(",")):
            name, _, monitor = name.partition(":")
            monitor = monitor or args.monitor
            env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_NO_USAGE_STATS="1",
                       TRITON_CACHE_DIR=folders["cold" if name == "plain-cold" else "cache"],
                       # vLLM's own compile cache: empty for each cold arm, that arm's for its warm one
                       VLLM_CACHE_ROOT=os.path.join(scratch, f"vllm-{name.split('-')[0]}-cold"),
                       FLASHINFER_WORKSPACE_BASE=os.path.join(scratch, f"flashinfer-{name.split('-')[0]}"))
            env.pop("JIT_AHEAD", None)
            if name.startswith("jit"):
                env.update(JIT_AHEAD="1", JIT_AHEAD_PLAN_DIR=folders["plans"], JIT_AHEAD_RECORD_DIR=folders["records"],
                           JIT_AHEAD_TUNING_DIR=folders["tuning"])
                if args.sampling == "mixed" or args.attention == "flashinfer":
                    env["JIT_AHEAD_FAMILIES"] = "triton,flashinfer"
            cmd = [sys.executable, __file__, "--child", model_path, str(seed), "--tokens", str(args.tokens), "--seqs",
                   str(args.seqs), "--len", str(args.max_len), "--sampling", args.sampling, "--attention", args.attention] + (
                       ["--monitor", monitor] if monitor else []) + (["--draft", draft] if draft else [])
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.arm_timeout)
                line = next((l for l in proc.stdout.splitlines() if l.startswith("ARM ")), None)
                if args.out:  # the arm's whole log, the end of it where it is long (one file per arm comes back)
                    os.makedirs(args.out, exist_ok=True)
                    with open(os.path.join(args.out, f"arm{index}-{name}.log"), "w") as f:
                        f.write(proc.stderr[-4_000_000:])
                result = json.loads(line[4:]) if line else {"error": proc.stderr[-3000:]}
                # jit_ahead's lines (planning's and its providers': what failed, what is not planned), whatever vLLM's
                # log format
                result["log"] = [l for l in proc.stderr.splitlines()
                                 if any(w in l for w in ("jit_ahead", "not planned", "planning", "provider ",
                                                         "Traceback"))][-80:]
            except subprocess.TimeoutExpired:
                result = {"error": "timed out"}
            result.update(arm=name + (f" (monitor {monitor})" if monitor else ""),
                          process_s=round(time.perf_counter() - t0, 2))
            results.append(result)
            print(json.dumps(result), flush=True)
    from importlib.metadata import version

    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "seed": seed,
              "versions": {**versions(), "vllm": version("vllm")},
              "model": args.model, "config": MODELS[args.model], "speculative": args.speculative, "attention": args.attention, "limits": [args.tokens, args.seqs, args.max_len],
              "requests": REQUESTS, "command": " ".join(sys.argv), "results": results}
    table = ["| arm | process s | ready s | serving s | compiles start / after ready | loads start / after ready | "
             "FlashInfer builds start / after ready | monitor error | kernels compiled or loaded after ready |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            table.append(f"| {r['arm']} | {r['process_s']} | error: {r['error'][-200:]!r} ||||||")
            continue
        table.append(f"| {r['arm']} | {r['process_s']} | {r['ready_s']} | {r['serving_s']} | {r['start_compiles']} / "
                     f"{r['serving_compiles']} | {r['start_loads']} / {r['serving_loads']} | "
                     f"{len(r['flashinfer_builds_start'])} / {len(r['flashinfer_builds_after_ready'])} | {bool(r['monitor_error'])} | "
                     f"{', '.join(r['serving_kernels'][:12])} |")
    write_report(args.out, "vllm_starts", report,
                 f"# vLLM starts, {args.model}, limits {args.tokens} tokens, {args.seqs} sequences, length {args.max_len}",
                 table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
