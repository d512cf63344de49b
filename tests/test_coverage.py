"""Exact over the whole space at the limits engines use: random real calls of the built-in providers'
models (prefill with and without a cache, position ids, decode steps, padded batches) at large limits
and several model configurations launch nothing the plan lacks, value-derived constexprs included.

Each plan is the session's own (planners, saved plans), made once per model and limits for this module.
The request shapes are drawn with a new seed on every run; a miss names the seed and the shape.
"""
import random

import pytest
import torch

from jit_ahead import demo_models
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.providers.fla import FlaGatedDeltaNetProvider
from jit_ahead.providers.liger import LigerProvider
from jit_ahead.triton import capture

ENGINE = EngineLimits(max_num_tokens=8192, max_batch_size=16, max_seq_len=4096, cuda_graph_batch_sizes=(1, 2, 4, 8, 16))
LONG = EngineLimits(max_num_tokens=16384, max_batch_size=64, max_seq_len=16384, cuda_graph_batch_sizes=(1, 8, 64))
DEEP = EngineLimits(max_num_tokens=8192, max_batch_size=4, max_seq_len=8192, cuda_graph_batch_sizes=(1, 4))


def qwen3(hidden: int, heads: int, kv_heads: int, head_dim: int):
    from liger_kernel.transformers import apply_liger_kernel_to_qwen3
    from transformers import Qwen3Config, Qwen3ForCausalLM

    apply_liger_kernel_to_qwen3(rope=True, rms_norm=True, swiglu=True)
    config = Qwen3Config(hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                         vocab_size=1024, max_position_embeddings=32768)
    with torch.device("meta"):
        return Qwen3ForCausalLM(config).to(torch.bfloat16).eval()


def gated_deltanet(hidden: int, heads: int, head_dim: int, expand_v: float, device: str = "meta"):
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    config = GatedDeltaNetConfig(hidden_size=hidden, num_hidden_layers=2, num_heads=heads, head_dim=head_dim,
                                 expand_v=expand_v, vocab_size=1024)
    with torch.device(device):
        return GatedDeltaNetForCausalLM(config).to(torch.bfloat16).eval()


def planned(session, model, limits, providers=None) -> set[str]:
    """The variants the session plans for ``model`` (with ``providers``, default: the built-in ones)."""
    run = session.plan_model(model, limits, providers)
    assert run.wait(1800) and not run.errors, run.errors
    return {r.predicted_hash for r in run.requests}


def shapes(limits: EngineLimits, count: int, rng: random.Random) -> list[tuple[int, int]]:
    """(batch, prompt) across the whole space: half with long prompts, some at the largest batch."""
    out = []
    for i in range(count):
        batch = limits.max_batch_size if i % 5 == 0 else rng.randint(1, limits.max_batch_size)
        longest = min(limits.max_seq_len, limits.max_num_tokens // batch)
        prompt = rng.randint(max(1, longest // 2), longest) if i % 2 else rng.randint(1, longest)
        out.append((batch, prompt))
    return out


def missing(keys: set[str], call) -> list[str]:
    with capture() as real:
        call()
    assert len(real) > 0
    return [r.label for r in real.requests if r.predicted_hash not in keys]


CONFIGS = {
    "qwen3 hidden 512, 8/4 heads of 64": (lambda: qwen3(512, 8, 4, 64), ENGINE),
    "qwen3 hidden 1024, 16/8 heads of 128": (lambda: qwen3(1024, 16, 8, 128), LONG),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_liger_plans_every_variant_of_random_real_calls_at_large_limits(planning_session, name):
    make, limits = CONFIGS[name]
    model = make()
    keys = planned(planning_session, model, limits, [LigerProvider()])
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for batch, prompt in shapes(limits, 24, rng):
        position_ids = bool(rng.getrandbits(1))
        missed = missing(keys, lambda: demo_models.serve(model, batch, prompt, 2, device="meta",
                                                         position_ids=position_ids))
        assert not missed, f"seed {seed}: batch {batch}, prompt {prompt}, position ids {position_ids}: {missed}"


FLA_CONFIGS = {
    "gated deltanet hidden 512, 4 heads of 64, expand_v 2": ((512, 4, 64, 2.0), ENGINE),
    "gated deltanet hidden 512, 4 heads of 128, expand_v 1": ((512, 4, 128, 1.0), DEEP),
}


@pytest.mark.parametrize("name", list(FLA_CONFIGS))
def test_fla_plans_every_variant_of_random_real_calls_at_large_limits(planning_session, name):
    settings, limits = FLA_CONFIGS[name]
    model = gated_deltanet(*settings)
    # padded batches run on the CPU: fla unpads with the real mask (nonzero, offsets, chunk indices),
    # which meta tensors cannot hold; the launches are captured there as on meta
    on_cpu = gated_deltanet(*settings, device="cpu")
    keys = planned(planning_session, model, limits, [FlaGatedDeltaNetProvider()])
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for i, (batch, prompt) in enumerate(shapes(limits, 15, rng)):
        if i % 3 == 2:
            lengths = demo_models.prompt_lengths(batch, prompt, rng.randrange(2**32))
            call = lambda: demo_models.serve(on_cpu, batch, prompt, 2, device="cpu", lengths=lengths)  # noqa: E731
        else:
            lengths = None
            call = lambda: demo_models.serve(model, batch, prompt, 2, device="meta")  # noqa: E731
        missed = missing(keys, call)
        assert not missed, f"seed {seed}: batch {batch}, prompt {prompt}, lengths {lengths}: {missed}"


def test_value_derived_constexprs_are_reached_at_large_limits(planning_session):
    # fla's layer norm picks NB = cdiv(rows, 2048): 1..4 within 8192 tokens, a constexpr of its kernel
    import json

    run = planning_session.plan_model(gated_deltanet(512, 4, 64, 2.0), ENGINE, [FlaGatedDeltaNetProvider()])
    assert run.wait(1800)
    nb = set()
    for request in run.requests:
        if request.name == "layer_norm_fwd_kernel":
            nb |= _constexpr(json.loads(request.specialization_data), "NB")
    assert nb == {1, 2, 3, 4}


def _constexpr(spec: dict, name: str) -> set:
    """The value of constexpr ``name`` in Triton's specialization JSON (signature keys are arg names)."""
    names = list(spec["signature"])
    return {value for key, value in zip(spec["constant_keys"], spec["constant_vals"])
            if len(key) == 1 and names[key[0]] == name}
