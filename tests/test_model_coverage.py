"""The model-level planner, exact at the limits engines use: three models no provider knows by class
(transformers' Qwen3.5 and OLMo hybrids, whose own layers call fla's ops, and a plain ``nn.Module``
calling Liger's and fla's ops itself), each planned whole by the session (planner processes, every
built-in provider, the model planner for what they leave) at a large limit set: batches to 256, prompts
to 8192 tokens, or 16 x 4096. Random real calls across the whole space (prefill with and without a
cache, decode steps, position ids, padded batches with an attention mask where the model takes one)
launch nothing the plan lacks.

The request shapes are drawn with a new seed on every run; a miss names the seed and the request.
"""
import random

import pytest

from jit_ahead import demo_models
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.providers.device_gates import meta_stands_for_the_gpu

from . import any_models
from .test_coverage import missing, planned
from .test_model_planner import serve as serve_plain


def transformers_request(model, batch, prompt, decode, rng):
    """What a transformers server runs: a prefill without a cache, or one with the model's cache and
    ``decode`` steps on it, with position ids or not, left-padded with an attention mask or not."""
    if decode is None:
        return lambda: serve_plain(model, batch, prompt, None), "no cache"
    positions = bool(rng.getrandbits(1))
    lengths = demo_models.prompt_lengths(batch, prompt, rng.randrange(2**32)) if batch > 1 and rng.random() < 0.4 else None
    return (lambda: demo_models.serve(model, batch, prompt, decode, device="meta", position_ids=positions, lengths=lengths),
            f"decode {decode}, position ids {positions}, lengths {lengths}")


def plain_request(model, batch, prompt, decode, rng):
    return lambda: serve_plain(model, batch, prompt, decode), f"decode {decode}"


CASES = {
    "qwen3.5 hybrid, hidden 512, batches to 256": (
        lambda: demo_models.qwen35_hybrid(hidden=512),
        EngineLimits(max_num_tokens=4096, max_batch_size=256, max_seq_len=16, cuda_graph_batch_sizes=(1, 8, 64, 256)),
        transformers_request),
    "olmo hybrid, prompts to 8192": (
        any_models.olmo_hybrid,
        EngineLimits(max_num_tokens=8192, max_batch_size=1, max_seq_len=8192, cuda_graph_batch_sizes=(1,)),
        transformers_request),
    "plain nn.Module, 16 x 4096": (
        any_models.plain_hybrid,
        EngineLimits(max_num_tokens=8192, max_batch_size=16, max_seq_len=4096, cuda_graph_batch_sizes=(1, 2, 4, 8, 16)),
        plain_request),
}


def requests(limits: EngineLimits, count: int, rng: random.Random) -> list[tuple[int, int, int | None]]:
    """(batch, prompt, decode steps or None for no cache) across the whole limits: the largest batch and
    the longest prompt each at least once, half the prompts in the upper half of what the batch allows."""
    out = [(limits.max_batch_size, 1, rng.randint(1, 3)),
           (1, limits.max_seq_len - 3, rng.choice([None, 3]))]
    while len(out) < count:
        batch = rng.randint(1, limits.max_batch_size)
        longest = max(1, min(limits.max_seq_len - 3, limits.max_num_tokens // batch))
        prompt = rng.randint(max(1, longest // 2), longest) if rng.getrandbits(1) else rng.randint(1, longest)
        out.append((batch, prompt, None if rng.random() < 0.2 else rng.randint(0, 3)))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_the_model_planner_plans_every_variant_of_random_real_calls_at_large_limits(planning_session, name):
    make, limits, request = CASES[name]
    model = make()
    keys = planned(planning_session, model, limits)
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for batch, prompt, decode in requests(limits, 12, rng):
        call, about = request(model, batch, prompt, decode, rng)
        with meta_stands_for_the_gpu():  # transformers 5.25+ would take the torch path for meta inputs
            missed = missing(keys, call)
        assert not missed, f"seed {seed}: batch {batch}, prompt {prompt}, {about}: {missed}"
