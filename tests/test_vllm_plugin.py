"""The vLLM plugin against the real vLLM 0.25 package: its entry point, the worker hooks it installs, the
limits it reads from a real ``VllmConfig``, the Triton cache folder it keeps, vLLM's JIT monitor after
it, and a vLLM it does not know. Each case runs in a fresh interpreter, as vLLM's processes do: vLLM's
import changes process-wide settings the other tests must not see.

vLLM is installed in CI's Triton 3.6 environment only: 0.25 pins torch 2.11, whose Triton is 3.6."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import REPO, without_jit_ahead

pytest.importorskip("vllm", reason="vLLM 0.25 is installed in CI's Triton 3.6 environment only")

# What every case does first, as a CPU machine must to import vLLM's kernels: a Triton driver that answers
# (vLLM replaces Triton by a placeholder where none does; CUDA_VISIBLE_DEVICES='' lets it wait for one),
# and vLLM's own CPU platform (its CUDA platform loads vllm._C, which needs libcuda).
PRELUDE = """
import json, logging, os, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import triton  # first, as a server imports it (with JIT_AHEAD=1 the session starts here)
from jit_ahead.triton.standin import ensure_driver
ensure_driver()
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform
vllm.platforms._current_platform = CpuPlatform()
"""

HOOKED = """
from vllm.compilation import compiler_interface
from vllm.model_executor.model_loader import base_loader
from vllm.utils import jit_monitor
from vllm.v1.worker import gpu_worker
mark = "_jit_ahead_vllm_hook"
print("HOOKS " + json.dumps({
    "initialize_model": getattr(base_loader.initialize_model, mark, False),
    "compile_or_warm_up_model": getattr(gpu_worker.Worker.compile_or_warm_up_model, mark, False),
    "jit_monitor.activate": getattr(jit_monitor.activate, mark, False),
    "InductorAdaptor.initialize_cache": getattr(compiler_interface.InductorAdaptor.initialize_cache, mark, False)}))
"""


def run_vllm(code: str, tmp_path, jit_ahead: bool = True, **env) -> subprocess.CompletedProcess:
    environ = without_jit_ahead(os.environ)
    environ.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO), VLLM_NO_USAGE_STATS="1", **env)
    if jit_ahead:
        environ.update(JIT_AHEAD="1", JIT_AHEAD_RECORD_DIR=str(tmp_path / "records"))
    proc = subprocess.run([sys.executable, "-c", PRELUDE + code], cwd=tmp_path, env=environ, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def printed(proc, tag: str):
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith(tag + " "))[len(tag) + 1:])


def test_vllm_loads_the_plugin_which_hooks_the_worker_only_with_jit_ahead_on(tmp_path):
    load = "from vllm.plugins import load_general_plugins\nload_general_plugins()\n"
    on = printed(run_vllm(load + HOOKED, tmp_path), "HOOKS")
    assert on == dict.fromkeys(on, True) and len(on) == 4
    off = printed(run_vllm(load + HOOKED, tmp_path, jit_ahead=False), "HOOKS")
    assert off == dict.fromkeys(off, False)


def test_the_limits_are_read_from_a_real_vllm_config(tmp_path):
    from transformers import Qwen3Config

    config = Qwen3Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, vocab_size=4096, max_position_embeddings=32768)
    config.architectures = ["Qwen3ForCausalLM"]
    config.save_pretrained(tmp_path / "model")
    code = f"""
from vllm.engine.arg_utils import EngineArgs
from jit_ahead.engines.vllm.limits import limits_from
args = EngineArgs(model={str(tmp_path / "model")!r}, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
                  max_num_batched_tokens=16384, max_num_seqs=256, max_model_len=32768)
limits = limits_from(args.create_engine_config())
print("LIMITS " + json.dumps([limits.max_num_tokens, limits.max_batch_size, limits.max_seq_len, limits.dtypes,
                               limits.cuda_graph_batch_sizes, limits.extra["vllm"]]))
"""
    tokens, batch, seq, dtypes, graphs, extra = printed(run_vllm(code, tmp_path), "LIMITS")
    assert (tokens, batch, seq, dtypes) == (16384, 256, 32768, ["bfloat16"])
    assert graphs == [s for s in extra["cudagraph_capture_sizes"] if s <= batch]
    assert extra["block_size"] > 0 and extra["tensor_parallel_size"] == 1 and extra["num_speculative_tokens"] == 0


def test_vllm_moving_the_triton_cache_at_its_first_compile_is_undone(tmp_path):
    # vLLM 0.25's Inductor adaptor sets TRITON_CACHE_DIR to a folder of the compiled model's own, after the
    # helpers built into the one set at start: the server would look for their builds elsewhere.
    code = f"""
from vllm.plugins import load_general_plugins
load_general_plugins()
import vllm.v1.worker.gpu_worker  # a worker's process: the hooks go in with it
from vllm.compilation.compiler_interface import InductorAdaptor
InductorAdaptor().initialize_cache({str(tmp_path / "vllm-cache")!r})
print("CACHE " + json.dumps(os.environ.get("TRITON_CACHE_DIR")))
"""
    pinned = str(tmp_path / "triton-cache")
    assert printed(run_vllm(code, tmp_path, TRITON_CACHE_DIR=pinned), "CACHE") == pinned
    moved = printed(run_vllm(code, tmp_path, jit_ahead=False, TRITON_CACHE_DIR=pinned), "CACHE")
    assert moved == str(tmp_path / "vllm-cache" / "triton_cache")  # what vLLM does without jit_ahead
    unset = run_vllm(code, tmp_path, TRITON_CACHE_DIR="")
    assert printed(unset, "CACHE") in (None, "")


def test_planned_variants_are_in_memory_before_vllms_jit_monitor_which_still_catches_a_real_compile(tmp_path):
    code = """
from vllm.plugins import load_general_plugins
load_general_plugins()
import vllm.v1.worker.gpu_worker  # a worker's process: the hooks go in with it
import torch, jit_ahead
from vllm.utils import jit_monitor
from tests.kernels import basic
from jit_ahead.core.priority import Priority
from jit_ahead.triton import capture
session = jit_ahead.current()
x = torch.empty(4096, device="meta", dtype=torch.float16)
with capture() as planned:  # a variant planned and built by a helper, never launched in this process
    basic.add_kernel[(4,)](x, x, x, 4096, BLOCK=256)
session.triton.submit(planned, Priority.WARMUP)
assert session.wait_ready(300)
basic.add_kernel[(4,)](x, x, x, 4096, BLOCK=1024)  # warmup: a compile the monitor does not see
phase_before = session.stats.phase
jit_monitor.activate(mode="error")
caught = {}
for block in (256, 512):  # the planned variant, then one nothing planned: compiled while serving
    try:
        basic.add_kernel[(4,)](x, x, x, 4096, BLOCK=block)
    except RuntimeError as exc:
        caught[block] = str(exc)
print("MONITOR " + json.dumps([phase_before, session.stats.phase, caught]))
jit_ahead.stop()
"""
    before, after, caught = printed(run_vllm(code, tmp_path), "MONITOR")
    assert before != "serving" and after == "serving"
    # the planned variant was loaded into memory before the monitor was armed; the unplanned one still trips it
    assert list(caught) == ["512"] and "add_kernel" in caught["512"]


def test_a_vllm_the_plugin_does_not_know_gets_one_line_and_no_hook(tmp_path):
    code = """
import vllm
vllm.__version__ = "0.26.1"
from vllm.plugins import load_general_plugins
load_general_plugins()
""" + HOOKED
    proc = run_vllm(code, tmp_path)
    hooks = printed(proc, "HOOKS")
    assert hooks == dict.fromkeys(hooks, False)
    said = [line for line in proc.stderr.splitlines() if "jit_ahead.engines.vllm" in line]
    assert len(said) == 1 and "0.26.1" in said[0] and "not hooked" in said[0] and "replay" in said[0]
    assert "Traceback" not in proc.stderr
