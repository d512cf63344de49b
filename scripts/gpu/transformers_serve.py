#!/usr/bin/env python3
"""``transformers serve --continuous-batching`` with and without ``JIT_AHEAD=1`` (issue 36 item 4): Triton
compiles after the first request, for a mix of concurrent HTTP requests.

transformers' own models launch no Triton kernel on this path; Liger's do, once patched into the model's
classes. Each arm is a fresh ``transformers serve`` process (``--child`` applies Liger's Qwen3 patches to the
classes, then runs transformers' CLI: transformers 5.17, the GPU image's, loads the model in that process;
from 5.25 a spawned process loads it, which the patches do not reach) of a random-weight
Qwen3 saved to a local folder with a word-level tokenizer of its own (no download), at a token budget of
``--tokens`` per step (``--cb-max-batch-tokens``; jit arms plan within the same budget:
``JIT_AHEAD_MAX_NUM_TOKENS``). Cold arms start from an empty Triton cache of their own; warm arms reuse it.

An arm: start the server and time it until ``/health`` answers (ready); send one short request (what
the first request compiles is the server's warmup); snapshot the Triton cache; send REQUESTS requests,
CONCURRENT at a time, with prompts of random length drawn across the budget (1 up to ``--tokens`` words)
and 1-16 new tokens, a new seed per run; snapshot again. New Triton cache entries (``*.json`` metadata groups)
since the first snapshot are the server's compiles without jit_ahead; with it, helpers also write the plan's
BACKGROUND builds there, so jit arms report the server's own compiles from its stats log as well
(``compile`` events that were no disk hit, after the first request).
Reported: seconds to ready, the first request's seconds, the mix's wall and worst request, compiles
during the first request and after it, and jit_ahead's own lines.

    python scripts/gpu/transformers_serve.py --out $OUT/serve [--tokens 8192] [--arms plain-cold,jit-cold,jit-warm,plain-warm]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serving_loop import versions, write_report  # noqa: E402

REQUESTS = 48
CONCURRENT = 16
VOCAB = 2048


def write_model(folder: str) -> str:
    """A random-weight Qwen3 (bf16) and a word-level tokenizer ("w0".."w2047", split on spaces)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    path = os.path.join(folder, "qwen3-liger")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    config = Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=4, num_attention_heads=16,
                         num_key_value_heads=4, head_dim=64, vocab_size=VOCAB, max_position_embeddings=32768,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(path)
    return path


def child(argv: list[str]) -> None:
    """The server: Liger's kernels patched into Qwen3's classes, then transformers' own CLI."""
    from liger_kernel.transformers import apply_liger_kernel_to_qwen3

    apply_liger_kernel_to_qwen3(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=False)
    from transformers.cli.transformers import main as transformers_main

    sys.argv = ["transformers", "serve", *argv]
    transformers_main()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, model: str, prompt: str, max_tokens: int, timeout: float) -> float:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout) as response:
        json.loads(response.read())
    return time.perf_counter() - t0


def cache_entries(folder: str) -> set[str]:
    found = set()
    for root, _, files in os.walk(folder):
        found.update(os.path.join(root, f) for f in files if f.startswith("__grp__") and f.endswith(".json"))
    return found


def server_compiled_after(stats_path: str, since: float) -> list[str]:
    """The kernels the server process compiled (Triton's compile(), not a disk hit) after ``since``."""
    kernels = []
    with open(stats_path) as f:
        for line in f:
            event = json.loads(line)
            if event.get("event") == "compile" and not event.get("cache_hit") and event.get("time", 0) > since:
                kernels.append(event.get("kernel", "?"))
    return kernels


def arm(name: str, model: str, scratch: str, tokens: int, seed: int, timeout: float) -> dict:
    port = free_port()
    cache = os.path.join(scratch, "cache-" + name.split("-")[0])
    env = dict(os.environ, TRITON_CACHE_DIR=cache, PYTHONUNBUFFERED="1")
    env.pop("JIT_AHEAD", None)
    if name.startswith("jit"):
        env.update(JIT_AHEAD="1", JIT_AHEAD_MAX_NUM_TOKENS=str(tokens), JIT_AHEAD_MAX_SEQ_LEN=str(tokens),
                   JIT_AHEAD_MAX_BATCH_SIZE="64", JIT_AHEAD_PLAN_DIR=os.path.join(scratch, "plans"),
                   JIT_AHEAD_RECORD_DIR=os.path.join(scratch, "records"),
                   JIT_AHEAD_STATS=os.path.join(scratch, f"{name}-stats.jsonl"))
    log_path = os.path.join(scratch, f"{name}.log")
    command = [sys.executable, __file__, "--child", model, "--continuous-batching", "--port", str(port),
               "--cb-max-batch-tokens", str(tokens), "--log-level", "info"]
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    result: dict = {"arm": name}
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode}")
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError("not ready in time")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except OSError:
                time.sleep(0.2)
        result["ready_s"] = round(time.perf_counter() - t0, 2)
        before = cache_entries(cache)
        result["first_request_s"] = round(post(port, model, "w5 w6 w7", 4, timeout), 3)
        first = cache_entries(cache)
        first_done = time.time()
        rng = random.Random(seed)
        prompts = [(" ".join(f"w{rng.randrange(3, VOCAB)}" for _ in range(rng.randint(1, tokens - 16))),
                    rng.randint(1, 16)) for _ in range(REQUESTS)]
        t1 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(CONCURRENT) as pool:
            latencies = list(pool.map(lambda p: post(port, model, p[0], p[1], timeout), prompts))
        result["mix_s"] = round(time.perf_counter() - t1, 2)
        result["worst_request_s"] = round(max(latencies), 3)
        after = cache_entries(cache)
        result.update(compiles_first_request=len(first - before), compiles_after_first=len(after - first),
                      kernels_after_first=sorted({os.path.basename(os.path.dirname(p)) for p in after - first})[:20])
        if name.startswith("jit"):
            # With jit_ahead, helpers go on building the plan's BACKGROUND variants into the same cache while
            # the server serves: new cache entries are not the server's compiles. Its own are the compile()
            # calls of the server process that were not disk hits (its stats log).
            server_compiles = server_compiled_after(os.path.join(scratch, f"{name}-stats.jsonl"), first_done)
            result.update(server_compiles_after_first=len(server_compiles),
                          server_kernels_after_first=sorted(set(server_compiles))[:20])
    except Exception as exc:  # noqa: BLE001 - the arm's failure is reported with its log
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    result["process_s"] = round(time.perf_counter() - t0, 2)
    with open(log_path) as f:
        text = f.read()
    result["log"] = [line for line in text.splitlines() if "jit_ahead" in line or "Traceback" in line][-30:]
    if "error" in result:
        result["log_tail"] = text[-3000:]
    return result


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--arms", default="plain-cold,jit-cold,jit-warm,plain-warm")
    parser.add_argument("--arm-timeout", type=float, default=300)
    parser.add_argument("--state", metavar="FOLDER", default=None,
                        help="keep the model and caches in FOLDER for a later call on the same machine")
    args = parser.parse_args()
    seed = random.randrange(2**31)
    print(f"request seed {seed}", flush=True)
    scratch = args.state or tempfile.mkdtemp(prefix="serve-")
    os.makedirs(scratch, exist_ok=True)
    model = write_model(scratch)
    results = []
    for name in args.arms.split(","):
        result = arm(name, model, scratch, args.tokens, seed, args.arm_timeout)
        print(json.dumps(result), flush=True)
        results.append(result)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "seed": seed,
              "versions": versions(), "tokens": args.tokens, "requests": REQUESTS, "concurrent": CONCURRENT,
              "command": " ".join(sys.argv), "results": results}
    table = ["| arm | process s | ready s | first request s | new cache entries first request / after | "
             "server compiles after first request | mix s | worst request s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            table.append(f"| {r['arm']} | {r['process_s']} | error: {r['error']} ||||||")
            continue
        table.append(f"| {r['arm']} | {r['process_s']} | {r['ready_s']} | {r['first_request_s']} | "
                     f"{r['compiles_first_request']} / {r['compiles_after_first']} | "
                     f"{r.get('server_compiles_after_first', r['compiles_after_first'])} | {r['mix_s']} | "
                     f"{r['worst_request_s']} |")
    write_report(args.out, "transformers_serve", report,
                 f"# transformers serve --continuous-batching, Liger Qwen3, {args.tokens} tokens per step", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
