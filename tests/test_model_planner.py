"""The model-level planner: models no provider knows by class are planned through their own forward;
what a real call makes at random shapes across the whole limits was planned."""
import dataclasses
import functools
import random

import pytest
import torch

from jit_ahead import demo_models
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.providers.base import Claims
from jit_ahead.providers.builtin import builtin_providers
from jit_ahead.providers.device_gates import meta_stands_for_the_gpu
from jit_ahead.providers.meta import MetaCaller, meta_reads_answered
from jit_ahead.providers.model import ModelProvider, ModelSite, decode_lengths
from jit_ahead.triton import capture

from . import any_models
from .test_providers import misses as provider_misses


def plan(model, limits, providers=None):
    """Every provider's launches, run as PlanningRun runs them (the model planner last, with the claims);
    the capture, and each provider's sites."""
    providers = builtin_providers() if providers is None else providers
    claims, sites = Claims(), {}
    with capture() as planned:
        for provider in sorted(providers, key=lambda p: p.sees_claims):
            found = (provider.find_layers(model, claims, limits) if provider.sees_claims
                     else provider.find_layers(model))
            claims |= provider.claims(model, found)
            sites[provider.name] = found
            for launch in provider.launches(found, limits):
                launch.run()
    return planned, sites


@torch.no_grad()
def serve(model, batch, prompt, decode, padded=False):
    """What a server runs: a prefill with the model's own cache, then ``decode`` steps on it; or a
    prefill without a cache when ``decode`` is None."""
    caller = MetaCaller(model, inference=True)
    ids = lambda b, t: torch.empty(b, t, dtype=torch.long, device="meta")  # noqa: E731
    keyword = "cache" if "cache" in caller.replica.forward.__code__.co_varnames else "past_key_values"
    with meta_reads_answered():
        if decode is None:
            caller(input_ids=ids(batch, prompt), use_cache=False)
            return
        out = caller(input_ids=ids(batch, prompt), use_cache=True)
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        for _ in range(decode):
            out = caller(input_ids=ids(batch, 1), use_cache=True, **{keyword: cache})
            cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None) or cache


def random_requests(limits, count, rng):
    """(batch, prompt, decode steps or None) across the whole limits, long prompts included."""
    shapes = []
    for i in range(count):
        batch = rng.randint(1, limits.max_batch_size)
        longest = max(1, min(limits.max_seq_len - 4, limits.max_num_tokens // batch))
        prompt = rng.randint(max(1, longest // 2), longest) if i % 2 else rng.randint(1, longest)
        shapes.append((batch, prompt, None if i % 5 == 4 else rng.randint(0, 3)))
    return shapes


def misses(model, planned, shapes):
    """``test_providers.misses`` with each shape served by ``serve``; transformers' device gates take the
    meta tensors as the GPU the model runs on (from transformers 5.25 they would take the torch path)."""
    def served(*shape):
        with meta_stands_for_the_gpu():
            return serve(model, *shape)

    return provider_misses(planned, shapes, served)


MODELS = {
    "qwen35-hybrid": lambda: demo_models.qwen35_hybrid(hidden=256),
    "olmo-hybrid": any_models.olmo_hybrid,
    "plain-hybrid": any_models.plain_hybrid,
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_model_no_provider_knows_is_planned_whole(name):
    seed = random.randrange(2**32)
    model = MODELS[name]()
    limits = EngineLimits(max_num_tokens=288, max_batch_size=4, max_seq_len=200, cuda_graph_batch_sizes=(1, 2, 4))
    planned, sites = plan(model, limits)
    (site,) = sites["model"]
    assert isinstance(site, ModelSite) and site.standing_in > 0  # repeated layers are stood in for
    names = {r.name for r in planned.requests}
    assert {"chunk_fwd_kernel_o", "fused_recurrent_gated_delta_rule_fwd_kernel"} <= names
    shapes = random_requests(limits, 10, random.Random(seed))
    assert misses(model, planned, shapes) == [], f"seed {seed}"


def test_requests_with_position_ids_are_planned_where_they_launch_other_variants():
    """Liger's RoPE takes cos/sin per row when a request passes position ids (as ``generate`` and engines
    do), and those are other variants. With no provider claiming RoPE, the model planner plans them."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    liger = demo_models.liger_qwen3(layers=1)
    limits = EngineLimits(max_num_tokens=128, max_batch_size=3, max_seq_len=96, cuda_graph_batch_sizes=(1, 2))
    planned, sites = plan(liger, limits, providers=[ModelProvider()])
    shapes = [(batch, rng.randint(1, min(limits.max_seq_len - 3, limits.max_num_tokens // batch)), True)
              for batch in (rng.randint(2, limits.max_batch_size) for _ in range(6))]
    assert provider_misses(planned, shapes, lambda b, s, pos: demo_models.serve(
        liger, b, s, 2, device="meta", position_ids=pos)) == [], f"seed {seed}"
    assert sites["model"][0].positions
    # where position ids launch nothing else (RoPE in torch), requests are not planned twice
    _, sites = plan(demo_models.qwen35_hybrid(hidden=256), limits, providers=[ModelProvider()])
    assert not sites["model"][0].positions


def test_large_limits_reach_value_derived_variants():
    # one sequence of up to 4200 tokens: fla's chunk kernels and Liger's RMSNorm change variants with
    # the token count far beyond what small limits reach
    seed = random.randrange(2**32)
    model = any_models.plain_hybrid(layers=2)
    limits = EngineLimits(max_num_tokens=4200, max_batch_size=1, max_seq_len=4200, cuda_graph_batch_sizes=(1,))
    planned, _ = plan(model, limits)
    small, _ = plan(model, EngineLimits(max_num_tokens=300, max_batch_size=1, max_seq_len=300,
                                        cuda_graph_batch_sizes=(1,)))
    assert len(planned) > len(small)  # variants only large token counts launch
    rng = random.Random(seed)
    shapes = [(1, rng.randint(300, 4195), rng.choice([None, 1])) for _ in range(6)] + [(1, 4200, None)]
    assert misses(model, planned, shapes) == [], f"seed {seed}"


def test_what_a_provider_claims_is_left_to_it():
    # the fla demo model: its GatedDeltaNet layers and fla modules are the fla provider's, so the model
    # planner finds nothing more to plan; the Qwen3 + Liger one likewise (RMSNorm, SwiGLU, RoPE)
    for model in (demo_models.fla_gated_deltanet(), demo_models.liger_qwen3()):
        _, sites = plan(model, EngineLimits(max_num_tokens=64, max_batch_size=2, max_seq_len=64))
        assert sites["model"] == []


class IndexedBlock(torch.nn.Module):
    """Equal settings, but what it launches depends on its position, read from outside the layer."""

    def __init__(self, hidden):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))

    def forward(self, x, wide):
        from liger_kernel.transformers.functional import liger_rms_norm

        return liger_rms_norm(torch.cat([x, x], -1) if wide else x, torch.cat([self.weight] * (1 + wide)), 1e-6)[..., :x.shape[-1]]


class Indexed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 64)
        self.blocks = torch.nn.ModuleList(IndexedBlock(64) for _ in range(3))

    def forward(self, input_ids, use_cache=False):
        x = self.embed(input_ids)
        for i, block in enumerate(self.blocks):
            x = block(x, wide=i == 2)
        return x


def test_stand_ins_that_change_the_launches_are_dropped(caplog):
    with torch.device("meta"):
        model = Indexed()
    limits = EngineLimits(max_num_tokens=40, max_batch_size=2, max_seq_len=40)
    planned, sites = plan(model, limits, [ModelProvider()])
    (site,) = sites["model"]
    assert site.standing_in == 0  # the third block differs only by where it is: it runs
    assert "changed the probe's launches" in caplog.text
    assert misses(model, planned, [(2, 17, None), (1, 40, None), (2, 3, None)]) == []


def test_a_model_whose_forward_fails_on_meta_is_skipped_with_one_line(caplog):
    class Broken(torch.nn.Module):
        def forward(self, input_ids, use_cache=False):
            raise RuntimeError("needs real weights")

    assert ModelProvider().find_layers(Broken()) == []
    assert "a meta forward of Broken failed (RuntimeError: needs real weights)" in caplog.text


def test_decode_lengths_reach_every_integer_class_and_power_of_two_bucket():
    lengths = decode_lengths(4095)
    assert lengths[:64] == list(range(1, 65)) and lengths[-1] == 4095
    for power in (128, 256, 2048):
        assert {power - 1, power, power + 1} <= set(lengths)
    assert all(n <= 4095 for n in lengths)


def test_large_batches_and_decodes_past_one_prefill_are_planned():
    # batches up to 32 (decode at every batch size, short prompts), and caches that grow by decoding
    # beyond what one prefill of that batch holds (the long-decode launches: filled, then one step)
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    model = any_models.plain_hybrid(layers=2)
    limits = EngineLimits(max_num_tokens=128, max_batch_size=32, max_seq_len=48, cuda_graph_batch_sizes=(1, 32))
    planned, sites = plan(model, limits)
    every_shape = dataclasses.replace(limits, extra={"shape_classes": False})
    labels = [launch.label for launch in ModelProvider().launches(sites["model"], every_shape)]
    assert "PlainHybrid decode B=32 cache=47" in labels
    shapes = [(b, rng.randint(1, max(1, 128 // b)), rng.randint(0, 2)) for b in rng.sample(range(2, 33), 6)]
    shapes.append((32, 1, 1))
    assert misses(model, planned, shapes) == [], f"seed {seed}"
    # a batch of 16 whose cache grows to 44 tokens by decoding (one prefill holds at most 8 per row)
    keys = {r.predicted_hash for r in planned.requests}
    with capture() as real:
        serve(model, 16, 8, 36)
    assert [r.name for r in real.requests if r.predicted_hash not in keys] == [], f"seed {seed}"


CB_MODELS = {"qwen3-liger": any_models.qwen3_liger, "qwen3-moe-liger": any_models.qwen3_moe_liger}
CB_LIMITS = EngineLimits(max_num_tokens=8192, max_batch_size=64, max_seq_len=4096)  # CB's default token budget


@functools.lru_cache(maxsize=None)
def cb_plan(name):
    model = CB_MODELS[name]()
    planned, _ = plan(model, CB_LIMITS)
    return model, {r.predicted_hash for r in planned.requests}


@pytest.mark.parametrize("padded", [False, True], ids=["exact", "padded"])
@pytest.mark.parametrize("name", sorted(CB_MODELS))
def test_continuous_batching_steps_launch_only_planned_variants(name, padded):
    # transformers' continuous batching (``transformers serve --continuous-batching``) packs every request of
    # a step into one (1, T) forward with position ids and its paged cache: T up to its token budget (past
    # the context length when many requests share a step), exact on sdpa, padded to 64 (prefill) or a power
    # of two under CUDA graphs. The model is planned as JIT_AHEAD=1 plans it (the padded forwards of
    # generate); the steps are built by transformers' own batch machinery, at random across the limits.
    from .transformers_cb import ContinuousBatching, random_step

    model, keys = cb_plan(name)
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    cb = ContinuousBatching(model, CB_LIMITS.max_num_tokens, CB_LIMITS.max_batch_size, CB_LIMITS.max_seq_len,
                            padded)
    missed, launched = {}, 0
    for _ in range(25):
        step = random_step(rng, CB_LIMITS.max_num_tokens, CB_LIMITS.max_batch_size, CB_LIMITS.max_seq_len)
        inputs = cb.step_inputs(step)
        with capture() as real, meta_stands_for_the_gpu(), meta_reads_answered(), torch.no_grad():
            model(**inputs)
        launched += len(real.requests)
        missed.update((r.predicted_hash, (r.label, step[:4])) for r in real.requests if r.predicted_hash not in keys)
    assert launched >= 25, "Liger's kernels were not launched"
    assert not missed, f"seed {seed}: {missed}"
