"""The vLLM plugin against the real vLLM 0.25 package: its entry point, the worker hooks it installs, the
limits it reads from a real ``VllmConfig``, the Triton cache folder it keeps, vLLM's JIT monitor after
it, and a vLLM it does not know. Each case runs in a fresh interpreter, as vLLM's processes do: vLLM's
import changes process-wide settings the other tests must not see.

vLLM is installed in CI's Triton 3.6 environment only: 0.25 pins torch 2.11, whose Triton is 3.6."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from .conftest import REPO, without_jit_ahead

pytest.importorskip("vllm", reason="vLLM 0.25 is installed in CI's Triton 3.6 environment only")

# What every case does first, as a CPU machine must to import vLLM's kernels (``tests/vllm_layers.cpu_vllm``):
# Triton imported first, as a server imports it (with JIT_AHEAD=1 the session starts there), with a driver
# that answers (vLLM replaces Triton by a placeholder where none does; CUDA_VISIBLE_DEVICES='' lets it wait
# for one), and vLLM's own CPU platform (its CUDA platform loads vllm._C, which needs libcuda).
PRELUDE = """
import json, logging, os, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from tests.vllm_layers import cpu_vllm
cpu_vllm()
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
        environ.update(JIT_AHEAD="1", JIT_AHEAD_RECORD_DIR=str(tmp_path / "records"),
                       JIT_AHEAD_PLAN_DIR=str(tmp_path / "plans"))  # a plan of this test's own, never a saved one
    proc = subprocess.run([sys.executable, "-c", PRELUDE + code], cwd=tmp_path, env=environ, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def attention_model_dir(path) -> None:
    """A one-layer Qwen3 configuration (6 heads, 3 KV heads of 128) saved at ``path``, for EngineArgs."""
    from transformers import Qwen3Config

    config = Qwen3Config(hidden_size=768, intermediate_size=512, num_hidden_layers=1, num_attention_heads=6,
                         num_key_value_heads=3, head_dim=128, vocab_size=4096, max_position_embeddings=32768)
    config.architectures = ["Qwen3ForCausalLM"]
    config.save_pretrained(path)


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
session.families["triton"].submit(planned, Priority.WARMUP)
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


@pytest.mark.parametrize("nvml, limit", [("answers", 16384), ("fails in planners", 2048)])
def test_fused_moe_variants_planned_equal_those_vllms_moe_layers_launch(tmp_path, nvml, limit):
    # Planned through the session as the worker plans (its providers), against every token count of
    # vLLM's own layer method after its weights are processed (the modular kernel vLLM builds then); the
    # WARMUP variants are built by a helper, which imports vLLM's kernel module itself. The platform names
    # an H200, as vLLM's CUDA platform does there: vLLM then reads its tuned config file for the Qwen3-MoE
    # experts (E=128, N=768) and its defaults for the other shape. "fails in planners": the platform's
    # device name raises in planner processes, as NVML does in a process forked from an H200 worker (vLLM
    # names its config file after the device); planners then answer from the server's device view.
    seed = random.randrange(2**31)
    code = f"""
from vllm.platforms.cpu import CpuPlatform
from jit_ahead.core.planning import planners
def device_name(cls, device_id=0):
    if {nvml == "fails in planners"} and planners.in_planner():
        raise RuntimeError("NVMLError_OperatingSystem: The operating system has blocked the request.")
    return "NVIDIA H200"
CpuPlatform.get_device_name = classmethod(device_name)
from vllm.model_executor.layers.fused_moe import fused_moe
assert fused_moe.get_moe_configs(128, 768, None) and not fused_moe.get_moe_configs(8, 1024, None)
fused_moe.get_moe_configs.cache_clear()  # planners must ask the platform again, as a worker's first ones do
from tests.vllm_layers import moe_model, on_triton_experts
model = moe_model({{"mixtral-like": (8, 2, 512, 1024), "qwen3-moe-like": (128, 8, 2048, 768)}})
experts = on_triton_experts(model)
LIMIT = {limit}
import random, torch
import jit_ahead
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.core.priority import Priority
from jit_ahead.engines.vllm import worker
from jit_ahead.providers import vllm_meta_ops
from jit_ahead.providers.vllm_fused_moe import workspaces_on_meta
from jit_ahead.triton import capture
session = jit_ahead.current()
run = session.plan_model(model, EngineLimits(max_num_tokens=LIMIT, max_batch_size=256, max_seq_len=32768),
                         providers=worker.providers())
assert session.wait_ready(600, priority=Priority.WARMUP)
planned = {{r.predicted_hash: r for r in session.families["triton"].executor.planned_requests()}}
warm = [t for t in run.tickets if t.priority == Priority.WARMUP]
vllm_meta_ops.install()
rng = random.Random({seed})
reached = {{}}
for layer in experts:
    layer.quant_method.process_weights_after_loading(layer)
    hidden, top_k = layer.moe_config.hidden_dim, layer.moe_config.experts_per_token
    counts = list(range(1, LIMIT + 1))
    rng.shuffle(counts)
    with capture() as real, workspaces_on_meta():
        for tokens in counts:
            layer.quant_method.apply(layer, torch.empty(tokens, hidden, dtype=torch.bfloat16, device="meta"),
                                     torch.empty(tokens, top_k, dtype=torch.float32, device="meta"),
                                     torch.empty(tokens, top_k, dtype=torch.int32, device="meta"), None, None)
    reached.update((r.predicted_hash, r.name) for r in real.requests)
print("MOE " + json.dumps({{"planned": sorted(planned), "reached": sorted(reached), "names": sorted(set(reached.values())),
                           "warm": [[t.state.value, t.request.label] for t in warm]}}))
jit_ahead.stop()
"""
    proc = run_vllm(code, tmp_path, JIT_AHEAD_TRITON_WORKERS="1", TRITON_CACHE_DIR=str(tmp_path / "cache"),
                    JIT_AHEAD_PLANNERS="2")
    result = printed(proc, "MOE")
    assert "provider vllm-fused-moe" not in proc.stderr, proc.stderr[-3000:]  # no launch failed
    assert result["names"] == ["fused_moe_kernel"], f"seed {seed}"
    assert len(result["reached"]) > 40  # both shapes, several configs and specializations each
    assert result["planned"] == result["reached"], f"seed {seed}"
    assert result["warm"] and all(state == "done" for state, _ in result["warm"]), result["warm"]


def test_attention_variants_planned_equal_those_vllms_attention_layers_launch(tmp_path):
    # vLLM's own Attention layers on its Triton backend (a full and a sliding-window one, 3 KV heads: the 3D
    # threshold moves to a CUDA-graph capture size, as a GPU worker's configuration with full decode graphs
    # has it), planned through the session as the worker plans them, against a random batch of every size
    # up to max_num_seqs, decode-only and with prefills of random lengths up to max_num_batched_tokens,
    # through each layer's own forward in vLLM's forward context, as vLLM's runner sets it up.
    seed = random.randrange(2**31)
    code = f"""
import random
from vllm.config import CUDAGraphMode, set_current_vllm_config
from vllm.engine.arg_utils import EngineArgs
from tests.vllm_layers import AttentionRunner, attention_model, moe_model
moe_model({{}})  # vLLM's configuration context and a one-process distributed group
TOKENS, SEQS, LENGTH = 16384, 256, 32768
args = EngineArgs(model={str(tmp_path / "model")!r}, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
                  max_num_batched_tokens=TOKENS, max_num_seqs=SEQS, max_model_len=LENGTH, block_size=16)
config = args.create_engine_config()
config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
config.compilation_config.cudagraph_capture_sizes = [1, 2, 4] + list(range(8, 257, 8))
context = set_current_vllm_config(config)  # kept: a context manager collected would leave it
context.__enter__()
heads = dict(num_heads=6, head_size=128, scale=128 ** -0.5, num_kv_heads=3)
model = attention_model(config, {{"full": heads, "window": dict(heads, per_layer_sliding_window=1024)}})
cpu = attention_model(config, {{"platform": heads}}, triton=False)  # the platform's own backend: not planned
import jit_ahead
from jit_ahead.engines.vllm import worker
from jit_ahead.engines.vllm.limits import limits_from
from jit_ahead.triton import capture
session = jit_ahead.current()
session.plan_model(torch.nn.ModuleDict({{"model": model, "other": cpu}}), limits_from(config),
                   providers=worker.providers(config))
assert session.wait_planned(300, priority=None)
planned = {{r.predicted_hash: r.name for r in session.families["triton"].executor.planned_requests()}}
rng = random.Random({seed})
runner = AttentionRunner(config, model)
draws = [(n, decode) for n in range(1, SEQS + 1) for decode in (True, False)]
rng.shuffle(draws)
with capture() as real:
    for sequences, decode in draws:
        lens = [1] * sequences
        if not decode:  # the rest of a random token budget spread at random, one prefill at least
            for _ in range(rng.randint(sequences + 1, TOKENS) - sequences):
                lens[rng.randrange(sequences)] += 1
        runner.step(lens, [rng.randint(q, LENGTH) for q in lens])
reached = {{r.predicted_hash: r.name for r in real.requests}}
print("ATTENTION " + json.dumps({{"planned": sorted(planned), "reached": sorted(reached),
                                 "names": sorted(set(reached.values()))}}))
jit_ahead.stop()
"""
    attention_model_dir(tmp_path / "model")
    # the V1 runner (vLLM's for MoE and hybrid models), whose block table and slot mapping AttentionRunner sets up
    proc = run_vllm("import torch\n" + code, tmp_path, JIT_AHEAD_TRITON_WORKERS="0", VLLM_USE_V2_MODEL_RUNNER="0")
    result = printed(proc, "ATTENTION")
    assert result["names"] == ["_compute_slot_mapping_kernel", "kernel_unified_attention", "reduce_segments",
                               "reshape_and_cache_kernel_flash"], f"seed {seed}"
    assert len(result["reached"]) > 12  # both layers, both paths, each class of sequence count
    assert result["planned"] == result["reached"], f"seed {seed}"
    said = [line for line in proc.stderr.splitlines() if "is not planned" in line]
    assert len(said) == 1 and "platform" in said[0] and "not vLLM's Triton attention" in said[0], said


def test_moe_layers_that_are_not_planned_are_named_once_per_reason(tmp_path):
    # Two layers as vLLM's CPU platform builds them (its CPU MoE kernels, not the Triton experts), and one on
    # the Triton experts whose parallel configuration says 2 data-parallel ranks: its experts would see the
    # tokens of both ranks, gathered through the engine's collectives, which planning cannot run.
    code = """
import dataclasses
from tests.vllm_layers import moe_model, on_triton_experts
model = moe_model({"a": (8, 2, 512, 1024), "b": (8, 2, 512, 1024)})
data_parallel = moe_model({"c": (8, 2, 512, 1024)})
for layer in on_triton_experts(data_parallel):
    moe = layer.quant_method.moe
    layer.quant_method.moe = dataclasses.replace(
        moe, moe_parallel_config=dataclasses.replace(moe.moe_parallel_config, dp_size=2))
from jit_ahead.engines.vllm import worker
sites = [site for provider in worker.providers() for site in provider.find_layers(model)]
sites += [site for provider in worker.providers() for site in provider.find_layers(data_parallel)]
print("SITES " + json.dumps(len(sites)))
"""
    proc = run_vllm(code, tmp_path)
    assert printed(proc, "SITES") == 0
    said = [line for line in proc.stderr.splitlines() if "is not planned" in line]
    assert len(said) == 2, said
    assert "not vLLM's Triton experts" in said[0] and "compile where they are launched" in said[0]
    assert "data parallelism" in said[1]


def test_the_worker_plans_the_moe_and_attention_layers_of_the_model_vllm_builds(tmp_path):
    # vLLM's own model loader builds a Qwen3-MoE model from a local config (meta tensors: no weights); the
    # plugin's hook after it plans the model with the worker's limits, before any weight would load. The
    # MoE backend selection is given the sm_90 GPU's answer (the Triton experts), as in the tests above.
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_experts=8,
                            num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=64, vocab_size=4096, max_position_embeddings=32768)
    config.architectures = ["Qwen3MoeForCausalLM"]
    config.save_pretrained(tmp_path / "model")
    code = f"""
import torch
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
from vllm.model_executor.layers.fused_moe.oracle import unquantized
import vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method as method_module
method_module.select_unquantized_moe_backend = lambda moe_config: (unquantized.UnquantizedMoeBackend.TRITON, TritonExperts)
from vllm.platforms.cpu import CpuPlatform  # the attention backend a GPU worker gets with --attention-backend TRITON_ATTN
CpuPlatform.get_attn_backend_cls = classmethod(lambda cls, *args, **kwargs: "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend")
from tests.vllm_layers import moe_model
moe_model({{}})  # vLLM's configuration context and a one-process distributed group
from vllm.plugins import load_general_plugins
load_general_plugins()
import vllm.v1.worker.gpu_worker  # a worker's process: the hooks go in with it
from vllm.model_executor.model_loader import base_loader
import jit_ahead
planned = []
jit_ahead.current().stats.subscribe(lambda record: planned.append(record) if record["event"] == "planned" else None)
args = EngineArgs(model={str(tmp_path / "model")!r}, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
                  max_num_batched_tokens=8192, max_num_seqs=256, max_model_len=32768)
vllm_config = args.create_engine_config()
with torch.device("meta"):
    model = base_loader.initialize_model(vllm_config=vllm_config, model_config=vllm_config.model_config)
session = jit_ahead.current()
assert session.wait_planned(300, priority=None)
print("WORKER " + json.dumps([type(model).__name__, sorted({{e["provider"] for e in planned}}),
                              sum(e["launches"] for e in planned), sorted({{k for e in planned for k in e["kernels"]}}),
                              len(session.families["triton"].executor.planned_requests())]))
jit_ahead.stop()
"""
    proc = run_vllm(code, tmp_path, JIT_AHEAD_TRITON_WORKERS="0")
    name, providers, launches, kernels, variants = printed(proc, "WORKER")
    assert name == "Qwen3MoeForCausalLM" and providers == ["vllm-fused-moe", "vllm-triton-attention"]
    # the worker's max_num_batched_tokens for the one distinct MoE layer (both alike), every count; the one
    # distinct attention layer's batches
    assert launches > 8192
    assert kernels == ["_compute_slot_mapping_kernel", "fused_moe_kernel", "kernel_unified_attention",
                       "reduce_segments", "reshape_and_cache_kernel_flash"] and variants > 20
    assert "planning it within" in proc.stderr


MHC_CASE = """
import random, time
from tests.vllm_layers import deepseek_v4_model, moe_model, tilelang_kernels_for_gpu
from vllm.config import set_current_vllm_config
from vllm.engine.arg_utils import EngineArgs
moe_model({{}})  # vLLM's configuration context and a one-process distributed group
config = EngineArgs(model={model!r}, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
                    max_num_batched_tokens={tokens}, max_num_seqs=256, max_model_len=32768).create_engine_config()
context = set_current_vllm_config(config)  # kept: a context manager collected would leave it
context.__enter__()
import jit_ahead
session = jit_ahead.current()
tilelang_kernels_for_gpu()
import vllm.utils.deep_gemm as deep_gemm
deep_gemm.is_deep_gemm_supported = lambda: {deep_gemm}  # as on an sm_90 server with DeepGEMM installed, or not
model = deepseek_v4_model(config)
from jit_ahead.engines.vllm import worker
from jit_ahead.engines.vllm.limits import limits_from
session.plan_model(model, limits_from(config), providers=worker.providers(config))
assert session.wait_planned(300, priority=None)
planned = session.families["tilelang"].executor.planned_requests()
# What vLLM's own forward reaches, on the GPU the planners see; DeepGEMM's pre-norm GEMM (its own JIT kernel,
# another family's) does nothing.
import torch
from jit_ahead.core import device_view
from jit_ahead.tilelang.plan import Captured, calls_go_on, capture
from tilelang.jit import JITImpl
device_view.pin(device_view.current())
deep_gemm.tf32_hc_prenorm_gemm = lambda *args, **kwargs: None
def forward(tokens):
    ids = torch.zeros(tokens, dtype=torch.long, device="meta")
    model(ids, ids, None)
# every token count, each kernel elaborated once
with capture() as swept, calls_go_on():
    for tokens in range(1, {tokens} + 1):
        forward(tokens)
# random counts, each in a capture of its own, every kernel call going on past its capture (TileLang's own
# __call__, nothing skipped)
original = JITImpl.__call__
def going_on(kernel, *args, **kwargs):
    try:
        return original(kernel, *args, **kwargs)
    except Captured:
        return None
JITImpl.__call__ = going_on
rng = random.Random({seed})
counts = sorted({{rng.randint(1, {tokens}) for _ in range(12)}} | {{1, {tokens}}})
reached = set()
for tokens in counts:
    with capture() as real:
        forward(tokens)
    reached |= {{r.key for r in real.requests}}
JITImpl.__call__ = original
print("MHC " + json.dumps({{"planned": sorted(r.key for r in planned), "swept": sorted(r.key for r in swept.requests),
                           "reached": sorted(reached), "names": sorted({{r.qualname for r in planned}})}}))
jit_ahead.stop()
"""


@pytest.mark.parametrize("hidden,tokens,deep_gemm", [(7168, 16384, True), (4096, 8192, False)])
def test_mhc_variants_planned_equal_those_vllms_deepseek_v4_forward_reaches(tmp_path, hidden, tokens, deep_gemm):
    # vLLM's NVIDIA DeepSeek-V4 model (its mHC parameters, norms and forward; attention and MoE return their
    # input), planned through the session as the worker plans it, against the model's own forward at every
    # token count up to max_num_batched_tokens, and at random counts each captured alone. The split counts
    # follow the H200's 132 SMs, with DeepGEMM's pre-norm GEMM (split-k) or TileLang's (no split).
    from vllm.transformers_utils.configs.deepseek_v4 import DeepseekV4Config

    config = DeepseekV4Config(hidden_size=hidden, hc_mult=4, hc_eps=1e-6, hc_sinkhorn_iters=20, rms_norm_eps=1e-6,
                              num_hidden_layers=2, vocab_size=1024, index_topk=64)
    config.architectures = ["DeepseekV4ForCausalLM"]
    config.save_pretrained(tmp_path / "model")
    seed = random.randrange(2**31)
    code = MHC_CASE.format(model=str(tmp_path / "model"), tokens=tokens, deep_gemm=deep_gemm, seed=seed)
    proc = run_vllm(code, tmp_path, JIT_AHEAD_FAMILIES="triton,tilelang", JIT_AHEAD_TILELANG_WORKERS="0",
                    JIT_AHEAD_TRITON_WORKERS="0")
    result = printed(proc, "MHC")
    prenorm_gemm = [] if deep_gemm else ["hc_prenorm_gemm_block_m_tilelang", "hc_prenorm_gemm_tilelang"]
    assert result["names"] == sorted(["hc_head_fuse_tilelang", "mhc_fused_tilelang", "mhc_post_tilelang",
                                      "mhc_pre_big_fuse_with_norm_tilelang", *prenorm_gemm])
    assert result["planned"] == result["swept"], f"seed {seed}"
    assert set(result["reached"]) <= set(result["planned"]), f"seed {seed}"
    if deep_gemm:  # one big-fuse kernel per split count the token counts reach on 132 SMs
        assert len(result["planned"]) > 20


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_block_table_variants_planned_equal_those_vllms_runner_launches_where_its_own_warmup_leaves_them_cold(
        tmp_path, runner):
    # vLLM's V1 runner computes each step's slot mapping with its block table's Triton kernel; the table's
    # row stride is cdiv(max_model_len, block_size), 264 at a model length of 4224: not a multiple of 16, a
    # variant vLLM's own block-table warmup (its table rounded up to 16 blocks) never compiles. Planned through
    # the session with an attention layer as the worker plans it, against the runner's table at every batch
    # size up to max_num_seqs, with random token counts up to max_num_batched_tokens. The V2 runner (vLLM's
    # default for this dense model) launches other kernels, and the V1 one is not planned for it.
    seed = random.randrange(2**31)
    code = f"""
import random
from vllm.config import set_current_vllm_config
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.warmup.v1_block_table_warmup import warm_v1_block_table_kernels
from vllm.utils.math_utils import cdiv
from vllm.v1.worker.block_table import MultiGroupBlockTable
from tests.vllm_layers import attention_model, moe_model
moe_model({{}})  # vLLM's configuration context and a one-process distributed group
TOKENS, SEQS, LENGTH, BLOCK = 8192, 256, 4224, 16
config = EngineArgs(model={str(tmp_path / "model")!r}, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
                    max_num_batched_tokens=TOKENS, max_num_seqs=SEQS, max_model_len=LENGTH,
                    block_size=BLOCK).create_engine_config()
context = set_current_vllm_config(config)  # kept: a context manager collected would leave it
context.__enter__()
model = attention_model(config, {{"full": dict(num_heads=6, head_size=128, scale=128 ** -0.5, num_kv_heads=3)}})
import jit_ahead
from jit_ahead.engines.vllm import worker
from jit_ahead.engines.vllm.limits import limits_from
from jit_ahead.triton import capture
session = jit_ahead.current()
session.plan_model(model, limits_from(config), providers=worker.providers(config))
assert session.wait_planned(300, priority=None)
planned = sorted(r.predicted_hash for r in session.families["triton"].executor.planned_requests()
                 if r.name == "_compute_slot_mapping_kernel")
meta = torch.device("meta")
# the runner's table (gpu_model_runner.may_reinitialize_input_batch: one attention group)
table = MultiGroupBlockTable(max_num_reqs=SEQS, max_model_len=LENGTH, max_num_batched_tokens=TOKENS, pin_memory=False,
                             device=meta, block_sizes=[BLOCK], kernel_block_sizes=[BLOCK],
                             max_num_blocks=[cdiv(LENGTH, BLOCK)])
rng = random.Random({seed})
with capture() as real:
    for sequences in range(1, SEQS + 1):
        tokens = rng.choice([sequences, rng.randint(sequences, TOKENS)])
        table.compute_slot_mapping(sequences, torch.empty(sequences + 1, dtype=torch.int32, device=meta),
                                   torch.empty(tokens, dtype=torch.int64, device=meta))
with capture() as warmed:  # vLLM's own kernel_warmup step for the V1 runner
    warm_v1_block_table_kernels(meta, TOKENS)
print("BLOCKS " + json.dumps({{"planned": planned, "reached": sorted(r.predicted_hash for r in real.requests),
                             "warmed": sorted(r.predicted_hash for r in warmed.requests),
                             "stride": table[0].block_table.gpu.stride(0)}}))
jit_ahead.stop()
"""
    attention_model_dir(tmp_path / "model")
    result = printed(run_vllm("import torch\n" + code, tmp_path, JIT_AHEAD_TRITON_WORKERS="0",
                              VLLM_USE_V2_MODEL_RUNNER="1" if runner == "v2" else "0"), "BLOCKS")
    if runner == "v2":
        assert result["planned"] == []
        return
    assert result["stride"] == 264
    assert len(result["reached"]) == 1, f"seed {seed}"  # the kernel does not specialize on the token count
    assert result["planned"] == result["reached"], f"seed {seed}"
    assert set(result["reached"]) - set(result["warmed"]), "vLLM's warmup now covers the runner's stride"


@pytest.mark.parametrize("flashinfer_sampler", [True, False])
def test_the_worker_plans_flashinfers_sampling_module_where_vllms_sampler_uses_flashinfer(tmp_path, flashinfer_sampler):
    # vLLM samples top-k/top-p requests with FlashInfer on a CUDA GPU FlashInfer supports (its own
    # flashinfer_sampler_supported(), answered here as on an H100/H200, or not); its first such request would
    # build FlashInfer's sampling module with nvcc. Planned through the session with the FlashInfer family,
    # against what vLLM's own sampler (TopKTopPSampler.forward_cuda) asks FlashInfer for, for random batches
    # with top-k, top-p or both.
    pytest.importorskip("flashinfer", reason="flashinfer-python is installed in CI's Triton 3.6 environment")
    seed = random.randrange(2**31)
    code = f"""
import random
from vllm.config import set_current_vllm_config
from vllm.engine.arg_utils import EngineArgs
from tests.vllm_layers import moe_model
moe_model({{}})
config = EngineArgs(model={str(tmp_path / "model")!r}, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
                    max_num_batched_tokens=8192, max_num_seqs=256, max_model_len=32768).create_engine_config()
context = set_current_vllm_config(config)
context.__enter__()
import vllm.v1.sample.ops.topk_topp_sampler as sampler
sampler.flashinfer_sampler_supported = lambda: {flashinfer_sampler}
import jit_ahead
from jit_ahead.engines.vllm import worker
from jit_ahead.engines.vllm.limits import limits_from
from jit_ahead.flashinfer.plan import capture, planned_call
session = jit_ahead.current()
session.plan_model(torch.nn.Linear(2, 2, device="meta"), limits_from(config), providers=worker.providers(config))
assert session.wait_planned(300, priority=None)
planned = sorted(r.key for r in session.families["flashinfer"].executor.planned_requests())
rng, vocab = random.Random({seed}), config.model_config.get_vocab_size()
topk_topp = sampler.TopKTopPSampler()
with capture() as real:
    for _ in range(12):
        n = rng.randint(1, 256)
        k = torch.empty(n, dtype=torch.int32, device="meta") if rng.random() < 0.7 else None
        p = torch.empty(n, dtype=torch.float32, device="meta") if k is None or rng.random() < 0.5 else None
        planned_call(topk_topp.forward_cuda, torch.empty(n, vocab, dtype=torch.float32, device="meta"), {{}}, k, p)
print("SAMPLER " + json.dumps({{"planned": planned, "reached": sorted(r.key for r in real.requests),
                              "names": sorted(r.name for r in real.requests)}}))
jit_ahead.stop()
"""
    attention_model_dir(tmp_path / "model")
    result = printed(run_vllm("import torch\n" + code, tmp_path, JIT_AHEAD_FAMILIES="triton,flashinfer",
                              JIT_AHEAD_TRITON_WORKERS="0", JIT_AHEAD_FLASHINFER_WORKERS="0",
                              FLASHINFER_CUDA_ARCH_LIST="9.0a", FLASHINFER_WORKSPACE_BASE=str(tmp_path)), "SAMPLER")
    assert result["names"] == ["sampling"], f"seed {seed}"
    assert result["planned"] == (result["reached"] if flashinfer_sampler else []), f"seed {seed}"


@pytest.mark.parametrize("kv_cache, cubins", [("auto", False), ("auto", True), ("fp8", True)])
def test_the_worker_plans_the_flashinfer_modules_of_vllms_flashinfer_attention_layers(tmp_path, kv_cache, cubins):
    # vLLM's Attention layers on its FlashInfer backend (8 query heads, 2 KV heads of 128), in a process that
    # answers as an H200 worker does (vLLM's platform and torch's device queries; the GPU image's CUDA torch):
    # planned through the session as the worker plans them, one prefill and one decode module per layer form.
    # Decode is XQA where vLLM finds FlashInfer's cubins (VLLM_HAS_FLASHINFER_CUBIN), else FlashInfer's
    # tensor-core decode. Against: FlashInfer's own XQA call on meta tensors shaped as vLLM's forward gives
    # them, and the module names FlashInfer's own URI function gives the paged wrappers' requests (fa3 for
    # prefill, fa2 for decode: their plan() cannot run without pinned host memory, a CUDA machine's).
    pytest.importorskip("flashinfer", reason="flashinfer-python is installed in CI's Triton 3.6 environment")
    code = f"""
import torch
torch.version.cuda = "13.0"  # the GPU image's torch: FlashInfer's fa3 needs CUDA 12.3 or later
from vllm.config import set_current_vllm_config
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.attention.attention import Attention
from tests.vllm_layers import moe_model, viewed_cuda_platform
moe_model({{}})
config = EngineArgs(model={str(tmp_path / "model")!r}, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
                    max_num_batched_tokens=8192, max_num_seqs=256, max_model_len=32768, block_size=16,
                    kv_cache_dtype={kv_cache!r}).create_engine_config()
context = set_current_vllm_config(config)
context.__enter__()
viewed_cuda_platform()
import vllm.platforms, vllm.utils.flashinfer as vllm_flashinfer
import vllm.v1.attention.backends.flashinfer as backend
for module in (vllm_flashinfer, backend):  # imported under vLLM's CPU platform: what a GPU worker's would hold
    module.current_platform = vllm.platforms._current_platform
vllm_flashinfer.supports_trtllm_attention.cache_clear()
with torch.device("meta"):
    model = torch.nn.ModuleDict({{f"layer{{i}}": Attention(8, 128, 128 ** -0.5, num_kv_heads=2, prefix=f"layer{{i}}",
                                                        cache_config=config.cache_config, attn_backend=backend.FlashInferBackend)
                                 for i in range(2)}})
import jit_ahead
from jit_ahead.engines.vllm import worker
from jit_ahead.engines.vllm.limits import limits_from
from jit_ahead.flashinfer.plan import capture, planned_call
session = jit_ahead.current()
session.plan_model(model, limits_from(config), providers=worker.providers(config))
assert session.wait_planned(300, priority=None)
planned = sorted(r.name for r in session.families["flashinfer"].executor.planned_requests())
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.jit.attention.modules import get_batch_prefill_uri
meta, kv = torch.device("meta"), backend.FlashInferBackend.get_dtype_for_flashinfer({kv_cache!r}) if {kv_cache!r} != "auto" else torch.bfloat16
with capture() as xqa:  # vLLM's FlashInferImpl.forward on its decode tokens: query and output in the model's dtype
    query = torch.empty(4, 8, 128, dtype=torch.bfloat16, device=meta)
    planned_call(trtllm_batch_decode_with_kv_cache, query=query, kv_cache=torch.empty(64, 2, 16, 2, 128, dtype=kv, device=meta),
                 workspace_buffer=torch.empty(1 << 20, dtype=torch.uint8, device=meta),
                 block_tables=torch.empty(4, 8, dtype=torch.int32, device=meta),
                 seq_lens=torch.empty(4, dtype=torch.int32, device=meta), max_seq_len=128, bmm1_scale=1.0, bmm2_scale=1.0,
                 window_left=-1, sinks=None, out=torch.empty_like(query), kv_layout="NHD", backend="xqa", q_len_per_req=1)
q_prefill = kv  # vLLM quantizes the prefill query to an FP8 cache's dtype on sm_90
prefill = get_batch_prefill_uri("fa3", q_prefill, kv, torch.bfloat16, torch.int32, 128, 128, 0, False, False, False)
native_decode = get_batch_prefill_uri("fa2", torch.bfloat16, kv, torch.bfloat16, torch.int32, 128, 128, 0, False, False, False)
print("MODULES " + json.dumps({{"planned": planned, "xqa": [r.name for r in xqa.requests], "prefill": prefill,
                               "native_decode": native_decode}}))
jit_ahead.stop()
"""
    attention_model_dir(tmp_path / "model")
    proc = run_vllm(code, tmp_path, JIT_AHEAD_FAMILIES="triton,flashinfer", JIT_AHEAD_TRITON_WORKERS="0",
                    JIT_AHEAD_FLASHINFER_WORKERS="0", JIT_AHEAD_PLANNERS="1", FLASHINFER_CUDA_ARCH_LIST="9.0a",
                    FLASHINFER_WORKSPACE_BASE=str(tmp_path), VLLM_HAS_FLASHINFER_CUBIN="1" if cubins else "0",
                    # no cubins: vLLM asks NVIDIA's artifactory; refused at once here, as offline
                    HTTPS_PROXY="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9")
    result = printed(proc, "MODULES")
    decode = result["xqa"] if cubins else [result["native_decode"]]
    assert result["prefill"].endswith("_sm90") and len(decode) == 1, result
    assert result["planned"] == sorted([result["prefill"], *decode]), result
    assert not [line for line in proc.stderr.splitlines() if "is not planned" in line]


def spec_decode_model_dirs(path) -> None:
    """A two-layer Qwen3-MoE target and a one-layer Eagle3 draft for it, saved under ``path``."""
    from transformers import LlamaConfig, Qwen3MoeConfig

    target = Qwen3MoeConfig(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_experts=8,
                            num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=64, vocab_size=4096, max_position_embeddings=32768)
    target.architectures = ["Qwen3MoeForCausalLM"]
    target.save_pretrained(path / "target")
    draft = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=64, vocab_size=4096, max_position_embeddings=32768)
    draft.architectures = ["LlamaForCausalLMEagle3"]
    draft.save_pretrained(path / "draft")


def test_spec_decode_variants_planned_equal_those_vllms_rejection_sampler_and_eagle_proposer_launch(tmp_path):
    # A MoE target with an Eagle3 draft of 3 tokens: vLLM runs it on its V1 runner. Planned through the session
    # (forked planners) from the real VllmConfig; reached: vLLM's own RejectionSampler (with its Sampler for the
    # bonus tokens) on random verification steps (1-256 requests, 0-3 drafts each, any sampling mix, top-k
    # and top-p or not), and the proposer's next-token, padded-input and draft-step functions at random
    # request counts and sampled-token counts.
    spec_decode_model_dirs(tmp_path)
    seed = random.randrange(2**31)
    code = f"""
import random, types, torch
import numpy as np
from vllm.engine.arg_utils import EngineArgs
cfg = EngineArgs(model={str(tmp_path / "target")!r}, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
                 max_num_batched_tokens=8192, max_num_seqs=256, max_model_len=32768,
                 speculative_config={{"method": "eagle3", "model": {str(tmp_path / "draft")!r},
                                      "num_speculative_tokens": 3}}).create_engine_config()
assert not cfg.use_v2_model_runner
import jit_ahead
from jit_ahead.core.priority import Priority
from jit_ahead.engines.vllm.limits import limits_from
from jit_ahead.providers import vllm_spec_decode as sd
from jit_ahead.triton import capture
limits = limits_from(cfg)
session = jit_ahead.current()
session.plan_model(torch.nn.Module(), limits, providers=[sd.VllmSpecDecodeProvider(cfg)])
assert session.wait_ready(600, priority=Priority.WARMUP)
planned = {{r.predicted_hash: r.label for r in session.families["triton"].executor.planned_requests()}}
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
site = sd.spec_decode_site(cfg)
k, vocab, meta = site.draft_tokens, site.vocab_size, torch.device("meta")
sampler = RejectionSampler(Sampler(), cfg.speculative_config)
rng = random.Random({seed})
top = cfg.scheduler_config.max_num_seqs
def requests():  # across the limit, with its integer classes' edges (1, multiples of 16) drawn often
    return rng.choice([rng.randint(1, 4), 16 * rng.randint(1, top // 16), rng.randint(1, top)])
reached = {{}}
with capture() as real, torch.no_grad():
    for _ in range(600):
        drafts = [rng.randint(0, k) for _ in range(requests())]
        drafts[0] = max(drafts[0], 1)
        b, mix = len(drafts), rng.choice(sd.MIXES)
        sampled = mix != "all_greedy"
        sampling = SamplingMetadata(
            temperature=torch.empty(b, device=meta) if sampled else None, all_greedy=not sampled,
            all_random=mix == "all_random",
            top_p=torch.empty(b, device=meta) if sampled and rng.random() < 0.5 else None,
            top_k=torch.empty(b, dtype=torch.int32, device=meta) if sampled and rng.random() < 0.5 else None,
            generators={{}}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
            frequency_penalties=torch.empty(0), presence_penalties=torch.empty(0), repetition_penalties=torch.empty(0),
            output_token_ids=[[] for _ in drafts], allowed_token_ids_mask=None, bad_words_token_ids={{}},
            logitsprocs=LogitsProcessors())
        metadata = SpecDecodeMetadata.make_dummy([[0] * d for d in drafts], meta)
        sampler.forward(metadata, None, torch.empty(sum(drafts) + b, vocab, device=meta), sampling)
    for _ in range(300):
        b = requests()
        sd.run_next_tokens(site, limits, b, rng.randint(1, k + 1))
        sd.run_draft_steps(site, limits, b)
reached = {{r.predicted_hash: r.label for r in real.requests}}
print("SPEC " + json.dumps({{"planned": planned, "reached": reached}}))
jit_ahead.stop()
"""
    proc = run_vllm(code, tmp_path, JIT_AHEAD_TRITON_WORKERS="1", TRITON_CACHE_DIR=str(tmp_path / "cache"),
                    JIT_AHEAD_PLANNERS="2")
    result = printed(proc, "SPEC")
    names = {label.split("[")[0].rsplit(".", 1)[-1] for label in result["reached"].values()}
    assert {"rejection_greedy_sample_kernel", "rejection_random_sample_kernel", "sample_recovered_tokens_kernel",
            "expand_kernel", "_topk_topp_kernel", "eagle_prepare_next_token_padded_kernel",
            "eagle_prepare_inputs_padded_kernel", "eagle_step_slot_mapping_metadata_kernel"} <= names, names
    assert set(result["reached"]) <= set(result["planned"]), \
        f"seed {seed}: not planned {sorted(set(result['reached'].values()) - set(result['planned'].values()))}"
    assert set(result["planned"]) == set(result["reached"]), \
        f"seed {seed}: planned, never reached {sorted(set(result['planned'].values()) - set(result['reached'].values()))}"
