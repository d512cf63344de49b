"""vLLM's Triton attention backend (``TRITON_ATTN``), as a vLLM worker runs it each step: the KV-cache
write (``reshape_and_cache_kernel_flash``), the unified attention kernel on its 2D path (any batch with a
prefill, or more sequences than the backend's threshold) and its 3D path (decode batches up to the
threshold, then ``reduce_segments``), and the V1 runner's slot mapping (``_compute_slot_mapping_kernel``:
its block table's row stride reaches the kernel as an integer, so a model length whose table is not a
multiple of 16 blocks wide is another variant, one vLLM's own block-table warmup does not compile). The V2
runner, vLLM's default for dense models, computes slot mappings with kernels of its own that take strides
as tensors and do not specialize on the batch: its warmup compiles their one variant each, and the V1
kernel is not planned for it.

Each launch runs vLLM's own code on meta tensors, as the runner would for one batch: the runner's block
table (``MultiGroupBlockTable``, sized by the engine's limits, with the kernel block size vLLM's
``select_common_block_size`` picks for the layer's backend), vLLM's ``TritonAttentionMetadataBuilder``
for the layer's KV-cache spec (it decides the 2D/3D threshold and its segment buffers from the worker's
``VllmConfig``), then the layer's own ``TritonAttentionImpl``: ``do_kv_cache_update`` and ``forward``.

What a batch's variants depend on is its number of sequences (Triton specializes an integer argument
by whether it is 1 or a multiple of 16), whether it holds a prefill (2D or 3D), and the layer; not its
token counts or sequence lengths, which reach the kernels only as grid sizes and tensor contents. So
the batches planned are, for both kinds, every sequence count up to 32, around the 3D threshold and up
to ``max_num_seqs``: each integer class on each side of every boundary, whatever the limits. vLLM's
parity test (``tests/test_vllm_plugin.py``) checks this against random real batches through vLLM's own
``Attention.forward``.

Not planned (one line per reason, naming the first such layer): layers on another backend (but FlashInfer's:
``vllm_flashinfer_attention`` plans those), encoder
attention, quantized KV caches, and KV-cache specs other than full and sliding-window attention (a hybrid
model's attention block size is only settled with its KV-cache configuration, after planning).
WARMUP: decode batches at vLLM's CUDA-graph capture sizes, and one prefill.
"""
from __future__ import annotations

import logging
import types
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..core.planning.limits import EngineLimits
from ..core.priority import Priority
from .base import PlannedLaunch, distinct_sites, imported
from .vllm_flashinfer_attention import on_flashinfer
from .vllm_platform import VllmProvider
from .vllm_warmup import EXTRA_LIMITS, worker_config

log = logging.getLogger("jit_ahead.providers.vllm")

ATTENTION_MODULE = "vllm.model_executor.layers.attention.attention"
TRITON_ATTN_MODULE = "vllm.v1.attention.backends.triton_attn"
SMALL_BATCHES = 32  # every sequence count up to here: 1, the multiples of 16 and the others, twice over


@dataclass(frozen=True, eq=False)
class AttentionSite:
    """One distinct attention layer: its impl, its KV-cache spec and what vLLM's builder reads."""

    label: str
    impl: object  # the layer's TritonAttentionImpl
    backend: type  # its attention backend class
    spec: object  # its KV-cache spec, as the layer gives it for the worker's configuration
    vllm_config: object
    query_dtype: torch.dtype
    scales: tuple[tuple[str, tuple[int, ...], torch.dtype], ...]  # the layer's q/k/v scale tensors
    clamp_sliding_window: bool
    v1_runner: bool  # the worker runs vLLM's V1 model runner (its slot mapping kernel), not the V2 one

    @property
    def form(self) -> tuple:
        impl = self.impl
        return (type(impl), impl.num_heads, impl.head_size, impl.num_kv_heads, impl.sliding_window,
                impl.alibi_slopes is not None, impl.logits_soft_cap, None if impl.sinks is None else
                (tuple(impl.sinks.shape), impl.sinks.dtype), impl.kv_cache_dtype, impl.chunk_lookback, impl.use_td,
                impl.kv_sharing_target_layer_name is not None, self.spec, self.query_dtype, self.scales,
                self.clamp_sliding_window, self.v1_runner)


def _why_not_planned(layer, spec) -> str | None:
    triton_attn = imported(TRITON_ATTN_MODULE)
    impl = getattr(layer, "impl", None)
    if triton_attn is None or not isinstance(impl, triton_attn.TritonAttentionImpl):
        return f"its attention backend is {type(impl).__name__}, not vLLM's Triton attention"
    if spec is None or type(spec).__name__ not in ("FullAttentionSpec", "SlidingWindowSpec"):
        return f"its KV-cache spec is {type(spec).__name__}, not full or sliding-window attention"
    if impl.kv_cache_dtype != "auto" or getattr(impl, "_is_per_token_head_quant", False):
        return f"its KV cache is quantized ({impl.kv_cache_dtype})"
    if getattr(layer, "query_quant", None) is not None:
        return "its queries are quantized"
    return None


def _site(name: str, layer, vllm_config) -> AttentionSite | str:
    """The layer's site, or why it is not planned."""
    if getattr(layer, "attn_type", "decoder") != "decoder":
        return "it is encoder attention"
    spec = layer.get_kv_cache_spec(vllm_config)
    why = _why_not_planned(layer, spec)
    if why is not None:
        return why
    scales = tuple((attr, tuple(getattr(layer, attr).shape), getattr(layer, attr).dtype)
                   for attr in ("_q_scale", "_k_scale", "_v_scale") if hasattr(layer, attr))
    return AttentionSite(name, layer.impl, layer.attn_backend, spec, vllm_config, vllm_config.model_config.dtype,
                         scales, bool(getattr(layer, "mm_prefix_clamp_sliding_window", False)),
                         not vllm_config.use_v2_model_runner)


class VllmTritonAttentionProvider(VllmProvider):
    name = "vllm-triton-attention"
    library = "vllm"
    modules = ("vllm.v1.attention.ops.triton_unified_attention", "vllm.v1.attention.ops.triton_reshape_and_cache_flash",
               "vllm.v1.worker.block_table")
    extra_limits = EXTRA_LIMITS

    def find_layers(self, model) -> list:
        attention = imported(ATTENTION_MODULE)
        if attention is None:
            return []
        vllm_config = worker_config(self.vllm_config)
        return distinct_sites(((name, _site(name, layer, vllm_config)) for name, layer in model.named_modules()
                               if isinstance(layer, attention.Attention) and not on_flashinfer(layer)),
                              "vllm attention", log)

    def launches(self, layers: list, limits: EngineLimits) -> Iterator[PlannedLaunch]:
        captured = set(limits.extra.get("vllm", {}).get("cudagraph_capture_sizes", ())) | set(
            limits.cuda_graph_batch_sizes)
        for site in layers:
            threshold = _parts(site, limits).builder.seq_threshold_3D
            counts = sequence_counts(limits, threshold)
            for sequences in counts:
                yield PlannedLaunch(Priority.WARMUP if sequences in captured else Priority.BACKGROUND,
                                    lambda site=site, n=sequences: run_batch(site, limits, n, prefill=False),
                                    f"vllm attention {site.label} decode sequences={sequences}")
            for sequences in counts:
                if sequences < limits.max_num_tokens:  # a prefill of 2 tokens beside sequences - 1 decodes
                    yield PlannedLaunch(Priority.WARMUP if sequences == 1 else Priority.BACKGROUND,
                                        lambda site=site, n=sequences: run_batch(site, limits, n, prefill=True),
                                        f"vllm attention {site.label} prefill sequences={sequences}")


def sequence_counts(limits: EngineLimits, threshold: int) -> list[int]:
    """The sequence counts planned: each integer class (1, a multiple of 16, another) below and above the
    3D threshold and at the limit, whatever ``max_num_seqs`` is."""
    top = max(1, min(limits.max_batch_size, limits.max_num_tokens))
    counts = set(range(1, SMALL_BATCHES + 1))
    for edge in (threshold, top):
        counts.update(range(edge - SMALL_BATCHES, edge + SMALL_BATCHES + 1))
    return sorted(n for n in counts if 1 <= n <= top)


@dataclass
class _Parts:
    builder: object
    block_table: object
    kv_cache: torch.Tensor
    layer: object


_parts_of: "weakref.WeakKeyDictionary[AttentionSite, dict]" = weakref.WeakKeyDictionary()


def _parts(site: AttentionSite, limits: EngineLimits) -> _Parts:
    """vLLM's metadata builder, the runner's block table and a KV cache for the site, once per process."""
    by_limits = _parts_of.setdefault(site, {})
    key = (limits.max_num_tokens, limits.max_batch_size, limits.max_seq_len)
    parts = by_limits.get(key)
    if parts is None:
        from vllm.v1.worker.block_table import MultiGroupBlockTable
        from vllm.v1.worker.utils import select_common_block_size

        meta = torch.device("meta")
        spec = site.spec
        kernel_block = select_common_block_size(spec.block_size, [site.backend])
        block_table = MultiGroupBlockTable(max_num_reqs=limits.max_batch_size, max_model_len=limits.max_seq_len,
                                           max_num_batched_tokens=limits.max_num_tokens, pin_memory=False,
                                           device=meta, block_sizes=[spec.block_size],
                                           kernel_block_sizes=[kernel_block])
        builder = site.backend.get_builder_cls()(spec, [site.label], site.vllm_config, meta)
        layer = types.SimpleNamespace(mm_prefix_clamp_sliding_window=site.clamp_sliding_window, **{
            attr: torch.empty(shape, dtype=dtype, device=meta) for attr, shape, dtype in site.scales})
        parts = by_limits[key] = _Parts(builder, block_table, _kv_cache(site, kernel_block), layer)
    return parts


def _kv_cache(site: AttentionSite, kernel_block: int, blocks: int = 64) -> torch.Tensor:
    """A layer's KV cache as the runner lays it out: the backend's shape in its stride order, viewed back
    (``GPUModelRunner._reshape_kv_cache_tensors``), in blocks of the kernel's size."""
    spec, backend = site.spec, site.backend
    shape = backend.get_kv_cache_shape(blocks, kernel_block, spec.num_kv_heads, spec.head_size,
                                       cache_dtype_str=site.impl.kv_cache_dtype)
    order = backend.get_kv_cache_stride_order()  # the Triton backend's (the only one planned): NHD or HND
    stored = torch.empty(tuple(shape[i] for i in order), dtype=spec.dtype, device="meta")
    return stored.permute(*[order.index(i) for i in range(len(order))])


@torch.no_grad()
def run_batch(site: AttentionSite, limits: EngineLimits, sequences: int, prefill: bool) -> None:
    """One step of ``sequences`` sequences through the layer: decodes of one token each, or with
    ``prefill`` the first sequence's query two tokens long."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    parts = _parts(site, limits)
    meta = torch.device("meta")
    query_lens = [2 if prefill and i == 0 else 1 for i in range(sequences)]
    tokens = sum(query_lens)
    starts = torch.zeros(sequences + 1, dtype=torch.int32)
    starts[1:] = torch.tensor(query_lens, dtype=torch.int32).cumsum(0)
    starts_gpu = torch.empty(sequences + 1, dtype=torch.int32, device=meta)
    table = parts.block_table[0]
    if site.v1_runner:
        parts.block_table.compute_slot_mapping(sequences, starts_gpu,
                                               torch.empty(tokens, dtype=torch.int64, device=meta))
    common = CommonAttentionMetadata(
        query_start_loc=starts_gpu, query_start_loc_cpu=starts,
        seq_lens=torch.empty(sequences, dtype=torch.int32, device=meta), num_reqs=sequences,
        num_actual_tokens=tokens, max_query_len=max(query_lens), max_seq_len=limits.max_seq_len,
        block_table_tensor=table.get_device_tensor(sequences), slot_mapping=table.slot_mapping.gpu[:tokens])
    metadata = parts.builder.build(0, common)
    impl, spec = site.impl, site.spec
    query = torch.empty(tokens, impl.num_heads, impl.head_size, dtype=site.query_dtype, device=meta)
    key = torch.empty(tokens, impl.num_kv_heads, impl.head_size, dtype=site.query_dtype, device=meta)
    value = torch.empty(tokens, impl.num_kv_heads, getattr(spec, "head_size_v", impl.head_size),
                        dtype=site.query_dtype, device=meta)
    output = torch.empty(tokens, impl.num_heads, value.shape[-1], dtype=site.query_dtype, device=meta)
    if impl.kv_sharing_target_layer_name is None:
        impl.do_kv_cache_update(parts.layer, key, value, parts.kv_cache, metadata.slot_mapping)
    impl.forward(parts.layer, query, key, value, parts.kv_cache, metadata, output)
