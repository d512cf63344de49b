"""Built-in providers: what they plan covers what real calls of the model produce, shape by shape."""
import dataclasses
import itertools
import random

import torch

from jit_ahead import demo_models
from jit_ahead.core.planning.limits import EngineLimits
from jit_ahead.core.priority import Priority
from jit_ahead.providers.fla import FlaGatedDeltaNetProvider, padded_prefill_batches
from jit_ahead.providers.liger import LigerProvider, RopeSite, RowWiseSite
from jit_ahead.providers.meta import MetaCaller, MetaScalars, int_class_representatives
from jit_ahead.triton import capture, plan_launch
from jit_ahead.triton.compile_inputs import on_disk

from .conftest import wait_all
from .kernels import basic as k

LIMITS = EngineLimits(max_num_tokens=160, max_batch_size=3, max_seq_len=128, cuda_graph_batch_sizes=(1, 2))


def planned_keys(provider, model, limits):
    sites = provider.find_layers(model)
    assert sites, f"{provider.name} found nothing to plan in {type(model).__name__}"
    with capture() as plan:
        for launch in provider.launches(sites, limits):
            launch.run()
    return plan


def misses(planned, shapes, run):
    """Real calls at each shape, in capture mode; every request not planned, with the shape that made it."""
    keys = {r.predicted_hash for r in planned.requests}
    found = []
    for shape in shapes:
        with capture() as real:
            run(*shape)
        assert len(real) > 0
        found += [(shape, r.name) for r in real.requests if r.predicted_hash not in keys]
    return found


def serving_shapes(limits, count, seed):
    """Random (batch, prompt length, position ids?) within the limits, with short and long prompts."""
    rng = random.Random(seed)
    shapes = []
    for i in range(count):
        batch = rng.randint(1, limits.max_batch_size)
        longest = min(limits.max_seq_len, limits.max_num_tokens // batch)
        prompt = rng.randint(65, longest) if i % 2 and longest > 64 else rng.randint(1, min(64, longest))
        shapes.append((batch, prompt, bool(rng.getrandbits(1))))
    return shapes


def test_liger_qwen3_plan_covers_random_prefill_and_decode():
    model = demo_models.liger_qwen3()
    planned = planned_keys(LigerProvider(), model, LIMITS)
    names = {r.name for r in planned.requests}
    assert {"_rms_norm_forward_kernel", "_swiglu_forward_kernel", "_triton_rope"} <= names
    # RoPE: batch size is constexpr, so every batch size has its own variants
    assert len([r for r in planned.requests if r.name == "_triton_rope"]) >= LIMITS.max_batch_size * 2
    shapes = serving_shapes(LIMITS, 8, seed=3)
    assert misses(planned, shapes, lambda b, s, pos: demo_models.serve(
        model, b, s, 2, device="meta", position_ids=pos)) == []


def _liger_qwen3_with_heads(heads: int, kv_heads: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    demo_models.liger_qwen3(layers=1)  # applies Liger's patches to transformers' Qwen3
    config = Qwen3Config(hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, head_dim=64, vocab_size=512)
    with torch.device("meta"):
        return Qwen3ForCausalLM(config).to(torch.bfloat16).eval()


def test_liger_models_probed_at_once_in_two_threads_each_find_their_own_rope():
    """Each model is planned in a thread of its own, so probes overlap: each must see the RoPE calls of its
    own forward, and only those. (A probe that swapped Liger's ``rope_forward`` and put back what it had
    found left the later probe with no RoPE at all, and recorded the other model's calls.)"""
    import threading

    import liger_kernel.ops.rope as rope_ops

    original = rope_ops.rope_forward
    heads = {"a": (8, 4), "b": (4, 2)}
    models = {name: _liger_qwen3_with_heads(*h) for name, h in heads.items()}
    for round_ in range(3):
        start = threading.Barrier(len(models))
        found: dict[str, set] = {}

        def probe(name):
            start.wait()
            found[name] = {(s.q_heads, s.kv_heads) for s in LigerProvider().find_layers(models[name])
                           if isinstance(s, RopeSite)}

        threads = [threading.Thread(target=probe, args=(name,)) for name in models]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert found == {name: {h} for name, h in heads.items()}, f"round {round_}"
    assert rope_ops.rope_forward is original  # put back, once no probe runs


def test_liger_layers_are_enumerated_through_the_ops_they_ran():
    sites = [s for s in LigerProvider().find_layers(demo_models.liger_qwen3(layers=1)) if isinstance(s, RowWiseSite)]
    ops = {s.label: [op.function.__name__ for op in s.ops] for s in sites}
    assert ops["model.layers.0.mlp"] == ["LigerSiLUMulFunction"]
    assert ops["model.layers.0.input_layernorm"] == ops["model.layers.0.self_attn.q_norm"] == ["LigerRMSNormFunction"]
    assert all(s.caller is None for s in sites)  # replayed ops need no meta replica of the layer


class StridedNormModel(torch.nn.Module):
    """Real (CPU) weights; its Liger RMSNorm gets a transposed view of (batch, tokens, 8, 4)."""

    def __init__(self):
        from liger_kernel.transformers import LigerRMSNorm

        super().__init__()
        self.embed = torch.nn.Embedding(16, 32)
        self.norm = LigerRMSNorm(8)

    def forward(self, input_ids, use_cache=False):
        hidden = self.embed(input_ids).view(*input_ids.shape, 8, 4).transpose(-1, -2)
        return self.norm(hidden)


def test_a_liger_op_fed_a_strided_view_is_enumerated_through_its_layer():
    model = StridedNormModel()
    limits = EngineLimits(max_num_tokens=40, max_batch_size=2, max_seq_len=40)
    (site,) = LigerProvider().find_layers(model)
    assert site.ops is None  # templates are contiguous: replaying the op alone could launch another variant
    assert site.caller is not None  # so the layer's own forward runs, on a meta replica
    planned = planned_keys(LigerProvider(), model, limits)
    assert "_rms_norm_forward_kernel" in {r.name for r in planned.requests}

    def forward(batch, tokens):
        with torch.no_grad():
            MetaCaller(model)(input_ids=torch.zeros(batch, tokens, dtype=torch.long, device="meta"))

    assert misses(planned, [(1, 1), (2, 16), (1, 37), (2, 20)], forward) == []


def test_liger_plans_the_block_rms_norm_for_large_row_counts():
    # q_norm sees tokens x heads rows (8 heads here): past 32768 rows Liger switches kernels
    model = demo_models.liger_qwen3(layers=1)
    limits = EngineLimits(max_num_tokens=4200, max_batch_size=1, max_seq_len=4200)
    planned = planned_keys(LigerProvider(), model, limits)
    assert "_block_rms_norm_forward_kernel" in {r.name for r in planned.requests}
    assert misses(planned, [(1, 4100), (1, 4097)], lambda b, s: demo_models.serve(model, b, s, 0, device="meta")) == []


def test_item_reads_are_planned_once_per_integer_specialization_class():
    # parity with Triton: the classes of an int argument over 0..40 are the classes of the representatives
    x = torch.empty(64, device="meta", dtype=torch.float32)

    def variants(values):
        return {r.predicted_hash for n in values for r in plan_launch(k.add_kernel, x, x, x, n, BLOCK=64)}

    assert variants(range(41)) == variants(int_class_representatives(40))


def test_liger_losses_cover_training_steps_with_random_label_masks():
    model = demo_models.liger_qwen3(layers=1).train()
    limits = EngineLimits(max_num_tokens=40, max_batch_size=1, max_seq_len=40, extra={"liger_losses": True})
    planned = planned_keys(LigerProvider(), model, limits)
    assert "liger_cross_entropy_kernel" in {r.name for r in planned.requests}
    rng = random.Random(5)

    def train_step(tokens, ignored):
        labels = torch.randint(0, 100, (1, tokens))
        labels[:, :ignored] = -100
        counted = int((torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:] != -100).sum())
        with MetaScalars(counted):  # the real count, answered to the launcher's .item()
            model(input_ids=torch.empty(1, tokens, dtype=torch.long, device="meta"),
                  labels=labels.to("meta"))

    shapes = [(t, rng.randint(0, t)) for t in (1, 16, 17, 33, 40)]
    assert misses(planned, shapes, train_step) == []


def test_fla_gated_deltanet_plan_covers_random_prefill_and_decode():
    model = demo_models.fla_gated_deltanet()
    planned = planned_keys(FlaGatedDeltaNetProvider(), model, LIMITS)
    names = {r.name for r in planned.requests}
    for kernel in ("causal_conv1d_fwd_kernel", "causal_conv1d_update_kernel", "l2norm_fwd_kernel",
                   "layer_norm_gated_fwd_kernel", "chunk_fwd_kernel_o", "fused_recurrent_gated_delta_rule_fwd_kernel",
                   "layer_norm_fwd_kernel", "swiglu_fwd_kernel"):
        assert kernel in names
    shapes = serving_shapes(LIMITS, 6, seed=7)
    assert misses(planned, shapes, lambda b, s, pos: demo_models.serve(model, b, s, 2, device="meta")) == []


def _module_sites(model, by_rows=None):
    import dataclasses

    from jit_ahead.providers.fla import ModuleSite

    provider = FlaGatedDeltaNetProvider()
    sites = [s for s in provider.find_layers(model) if isinstance(s, ModuleSite)]
    assert sites
    return provider, sites if by_rows is None else [dataclasses.replace(s, by_rows=by_rows) for s in sites]


def _planned_hashes(provider, sites, limits):
    with capture() as plan:
        launches = list(provider.launches(sites, limits))
        for launch in launches:
            launch.run()
    return {r.predicted_hash for r in plan.requests}, len(launches)


def test_fla_row_wise_modules_planned_per_token_total_launch_what_every_shape_launches():
    # the model's norms and gated MLP, planned once per batch x tokens total, against the same modules
    # run at every (batch, tokens) shape, past batch 16 and past 2048 rows (NB of fla's layer norm)
    model = demo_models.fla_gated_deltanet()
    # (the totals and shapes themselves, not the shape classes that pick a few of each: those are checked
    # against these below and in test_shape_classes.py)
    classes = EngineLimits(max_num_tokens=4608, max_batch_size=24, max_seq_len=2304, cuda_graph_batch_sizes=(1, 24))
    limits = dataclasses.replace(classes, extra={"shape_classes": False})
    provider, sites = _module_sites(model)
    assert all(site.by_rows for site in sites), [site.label for site in sites]
    by_total, launches = _planned_hashes(provider, sites, limits)
    every_shape, reference_launches = _planned_hashes(provider, _module_sites(model, by_rows=False)[1], limits)
    assert by_total == every_shape
    assert launches * 2 < reference_launches
    assert _planned_hashes(provider, sites, classes)[0] == every_shape


class BatchReadingRMSNorm(torch.nn.Module):
    """A norm in fla's norm folder whose launch reads the batch: planned at every shape."""

    __module__ = "fla.modules.norm.batch_reading"

    def __init__(self, hidden):
        super().__init__()
        from fla.modules import RMSNorm

        self.norm = RMSNorm(hidden)

    def forward(self, x):
        # a batch of more than one sequence is normed sequence by sequence beyond the first
        return self.norm(x) if x.shape[0] == 1 else torch.cat([self.norm(x[:1]), self.norm(x[1:])], 0)


def test_an_fla_module_whose_launches_read_the_batch_is_planned_at_every_shape():
    model = demo_models.fla_gated_deltanet()
    model.model.norm = BatchReadingRMSNorm(model.config.hidden_size).to(torch.bfloat16)
    provider, sites = _module_sites(model)
    odd = [s for s in sites if s.label == "model.norm"]
    assert odd and not odd[0].by_rows
    assert all(s.by_rows for s in sites if s.label != "model.norm")
    planned = planned_keys(provider, model, LIMITS)
    shapes = serving_shapes(LIMITS, 6, seed=11)
    assert misses(planned, shapes, lambda b, s, pos: demo_models.serve(model, b, s, 2, device="meta")) == []


def padded_batches(limits, count, seed):
    """Random padded prompt batches within the limits, as ``generate`` pads them: (batch, padded length,
    each prompt's length), one prompt at the padded length; short and long, one-token batches among them."""
    rng = random.Random(seed)
    batches = []
    for i in range(count):
        batch = rng.randint(1, limits.max_batch_size)
        longest = min(limits.max_seq_len, limits.max_num_tokens // batch)
        padded = [1, rng.randint(2, 64), rng.randint(65, longest) if longest > 64 else longest][i % 3]
        batches.append((batch, padded, demo_models.prompt_lengths(batch, padded, seed=rng.getrandbits(32))))
    return batches


def test_fla_plan_covers_padded_batches_with_an_attention_mask():
    # real calls on the CPU: fla unpads with the real mask (nonzero, cu_seqlens, chunk indices), and the
    # varlen launches are captured, not run
    model = demo_models.fla_gated_deltanet(device="cpu")
    shapes = padded_batches(LIMITS, 9, seed=11)
    assert any(len(set(lengths)) > 1 for _, _, lengths in shapes)

    def serve(batch, padded, lengths):
        demo_models.serve(model, batch, padded, 2, device="cpu", lengths=lengths)

    planned = planned_keys(FlaGatedDeltaNetProvider(), demo_models.fla_gated_deltanet(), LIMITS)
    assert misses(planned, shapes, serve) == []
    # packed sequences with explicit int32 cu_seqlens launch as a padded batch of the same total does
    layer = next(m for m in model.modules() if type(m).__name__ == "GatedDeltaNet")
    rng = random.Random(3)
    packed = []
    for _ in range(8):
        total = rng.randint(2, LIMITS.max_num_tokens)
        cuts = sorted(rng.sample(range(1, total), rng.randint(0, LIMITS.max_batch_size - 1)))
        packed.append((tuple(b - a for a, b in zip([0, *cuts], [*cuts, total])),))

    @torch.no_grad()
    def run_packed(lengths):
        from fla.models.utils import Cache

        offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        layer(torch.randn(1, sum(lengths), layer.hidden_size, dtype=torch.bfloat16), cu_seqlens=offsets,
              past_key_values=Cache(), use_cache=True)

    assert misses(planned, packed, run_packed) == []
    # the padded batches launch varlen variants that unpadded shapes do not reach
    unpadded = EngineLimits(**{**vars(LIMITS), "extra": {"fla_padded": False}})
    planned = planned_keys(FlaGatedDeltaNetProvider(), demo_models.fla_gated_deltanet(), unpadded)
    assert {name for _, name in misses(planned, shapes, serve)} >= {"fused_recurrent_gated_delta_rule_fwd_kernel",
                                                                    "chunk_fwd_kernel_o"}


def test_fla_continued_prefills_are_planned_on_request():
    # a next prompt onto a cache that holds a state launches the convolution and the chunk kernels with an
    # initial state; real calls on the CPU, plain and padded (fla unpads with the real mask)
    model = demo_models.fla_gated_deltanet(device="cpu")
    rng = random.Random(17)
    shapes = []
    for _ in range(6):
        batch = rng.randint(1, LIMITS.max_batch_size)
        # the first prompt (2 tokens) and one decoded token come first, within the sequence limit
        turn = rng.randint(2, min(LIMITS.max_num_tokens // batch, LIMITS.max_seq_len) - 3)
        lengths = tuple(rng.randint(1, 2) for _ in range(batch)) if rng.random() < 0.5 else None
        shapes.append((batch, turn, lengths))
    assert any(s[2] for s in shapes) and any(not s[2] for s in shapes) and any(s[1] > 64 for s in shapes)

    def next_turn(batch, turn, lengths):
        demo_models.serve(model, batch, 2, 0, device="cpu", lengths=lengths, next_turn=turn)

    continued = EngineLimits(**{**vars(LIMITS), "extra": {"fla_continued_prefill": True}})
    planned = planned_keys(FlaGatedDeltaNetProvider(), demo_models.fla_gated_deltanet(), continued)
    assert misses(planned, shapes, next_turn) == []
    # off by default, and then these calls miss the initial-state variants
    planned = planned_keys(FlaGatedDeltaNetProvider(), demo_models.fla_gated_deltanet(), LIMITS)
    assert "causal_conv1d_fwd_kernel" in {name for _, name in misses(planned, shapes, next_turn)}


def test_padded_planning_leaves_fla_index_memo_to_serving_threads():
    # fla memoizes prepare_chunk_indices & co. in one deque per function for all threads; a serving thread
    # iterating one while planning appends would raise "deque mutated during iteration"
    import collections

    from fla.ops.utils.index import prepare_chunk_indices

    memo = next(c.cell_contents for c in prepare_chunk_indices.__closure__
                if isinstance(c.cell_contents, collections.deque))
    memo.clear()
    small = EngineLimits(max_num_tokens=130, max_batch_size=2, max_seq_len=130, cuda_graph_batch_sizes=(1,))
    planned = planned_keys(FlaGatedDeltaNetProvider(), demo_models.fla_gated_deltanet(), small)
    assert "chunk_fwd_kernel_o" in {r.name for r in planned.requests}  # chunk mode ran its index helpers
    assert len(memo) == 0
    offsets = torch.tensor([0, 70, 130], dtype=torch.int32)  # outside planning the memo still works
    assert prepare_chunk_indices(offsets, 64) is prepare_chunk_indices(offsets, 64) and len(memo) == 1


def test_padded_prefill_batches_reach_every_class_within_the_limits():
    limits = EngineLimits(max_num_tokens=300, max_batch_size=5, max_seq_len=100)
    batches = list(padded_prefill_batches(limits))
    for shape in batches:
        assert shape.batch <= 5 and shape.padded <= 100 and shape.batch * shape.padded <= 300
        assert max(shape.lengths) == shape.padded and min(shape.lengths) >= 1
        assert shape.mask().sum().item() == sum(shape.lengths)
    classes = {(min(s.padded, 2) if s.padded <= 64 else 65, sum(s.lengths)) for s in batches}
    assert {t for c, t in classes if c == 1} == set(range(1, 6))
    assert {t for c, t in classes if c == 2} == set(range(2, 300 + 1))  # 5 x 64 > 300 tokens
    assert {t for c, t in classes if c == 65} == set(range(65, 300 + 1))


def watch_untouched(model, layer_types):
    """Hooks on ``model``'s layers of ``layer_types`` that record, whenever such a layer runs (planning
    runs their replicas, which keep the hooks), whether the model still holds its own parameters and
    training flags."""
    own = {name: p for name, p in model.named_parameters()}
    seen = []

    def check(module, args):
        seen.append(module is not model and all(p is own[n] and not p.is_meta for n, p in model.named_parameters())
                    and all(m.training for m in model.modules()))

    for module in model.modules():
        if type(module).__name__ in layer_types:
            module.register_forward_pre_hook(check)
    return seen


def test_planning_a_model_with_weights_leaves_the_model_alone():
    # a server loads weights into its model and runs it while planning goes on in another thread: planning
    # runs meta replicas, never swapping the model's parameters or flipping its training flags
    small = EngineLimits(max_num_tokens=24, max_batch_size=2, max_seq_len=24, cuda_graph_batch_sizes=(1,))
    fla_model = demo_models.fla_gated_deltanet(device="cpu").train()
    seen = watch_untouched(fla_model, {"GatedDeltaNet", "GatedMLP"})
    planned = planned_keys(FlaGatedDeltaNetProvider(), fla_model, small)
    assert seen and all(seen)
    on_meta = planned_keys(FlaGatedDeltaNetProvider(), demo_models.fla_gated_deltanet(), small)
    assert {r.predicted_hash for r in planned.requests} == {r.predicted_hash for r in on_meta.requests}

    from liger_kernel.transformers import apply_liger_kernel_to_qwen3

    qwen = demo_models.liger_qwen3(device="cpu").train()
    apply_liger_kernel_to_qwen3(model=qwen)  # Liger binds forwards to the model's own modules
    seen = watch_untouched(qwen, {"Qwen3DecoderLayer", "LigerRMSNorm"})
    planned = planned_keys(LigerProvider(), qwen, small)
    assert seen and all(seen)
    on_meta = planned_keys(LigerProvider(), demo_models.liger_qwen3(), small)
    assert {r.predicted_hash for r in planned.requests} == {r.predicted_hash for r in on_meta.requests}


def test_plan_model_with_builtin_providers_builds_warmup_first(session_factory):
    session = session_factory(workers=1)
    limits = EngineLimits(max_num_tokens=64, max_batch_size=2, max_seq_len=64, cuda_graph_batch_sizes=(1, 2))
    run = session.plan_model(demo_models.liger_qwen3(), limits)  # providers=None: the built-in ones
    assert session.wait_ready(timeout=600)
    assert run.errors == [] and run.variants[Priority.WARMUP] > 0
    warm = [t for t in run.tickets if t.priority == Priority.WARMUP]
    assert warm and all(r.ok for r in wait_all(warm))
    for ticket in warm:
        assert on_disk(ticket.request.key, ticket.request.payload.name)
