"""vLLM's FlashInfer attention backend (``--attention-backend FLASHINFER``) on sm_90: the FlashInfer modules
its attention layers load, each minutes of nvcc at its first use in the server unless built ahead.

On an H100/H200 a layer form needs two modules, both fixed by the model and the engine's configuration,
never by the batch (the mask mode and the batch's shape are run-time arguments of one module):
- prefill, and every step's non-decode tokens: the paged prefill wrapper's ``plan()`` asks for
  ``get_batch_prefill_module(backend, q, kv, o, int32, head_dim, head_dim, 0, swa, softcap, False)``, with
  the backend FlashInfer's ``determine_attention_backend`` picks (fa3 on sm_90);
- decode: XQA (``get_xqa_module``) where vLLM selects it (FlashInfer's cubins installed or its artifactory
  reachable), else the tensor-core decode wrapper's module, the same prefill module on FlashInfer's fa2.

vLLM decides everything that goes into them: the layer's own ``FlashInferMetadataBuilder`` is made for it
as the runner makes it (the layer's KV-cache spec at the kernel block size vLLM selects; meta device; host
buffers not pinned in a planner), and its resolved query and KV-cache dtypes, head size, page size,
window, soft cap and decode kernel are read from it. FlashInfer makes every spec through its own
``get_*_module`` with the arguments its wrappers and ``xqa()`` pass (FlashInfer 0.6, the release vLLM
0.25 pins). The wrappers themselves cannot run in a planner: their constructors pin host memory.

Not planned, with one line naming the first such layer: other backends, decode context parallelism,
NVFP4 KV caches and GPUs other than sm_90 (trtllm-gen's cubins, not JIT modules). Needs the FlashInfer
family in the session (``JIT_AHEAD_FAMILIES=triton,flashinfer``). WARMUP: vLLM's warmup runs both.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..core.planning.limits import EngineLimits
from ..core.priority import Priority
from .base import PlannedLaunch, distinct_sites, imported
from .vllm_platform import VllmProvider
from .vllm_warmup import worker_config

log = logging.getLogger("jit_ahead.providers.vllm")

ATTENTION_MODULE = "vllm.model_executor.layers.attention.attention"
FLASHINFER_BACKEND_MODULE = "vllm.v1.attention.backends.flashinfer"
FP8 = {torch.float8_e4m3fn, torch.float8_e5m2}


@dataclass(frozen=True, eq=False)
class FlashInferAttentionSite:
    """One distinct attention layer on vLLM's FlashInfer backend."""

    label: str  # the layer's name in vLLM's forward context: its builder reads the layer's parameters there
    backend: type
    spec: object  # its KV-cache spec at the kernel block size vLLM selects for FlashInfer
    vllm_config: object

    @property
    def form(self) -> tuple:
        impl = self.vllm_config.compilation_config.static_forward_context[self.label].impl
        return (self.spec, impl.num_heads, impl.num_kv_heads, impl.sliding_window, impl.logits_soft_cap,
                impl.kv_cache_dtype, impl.sinks is not None)


@dataclass(frozen=True)
class ModuleArguments:
    """What vLLM's builder resolved for a layer: everything FlashInfer's module requests are made of."""

    q_prefill: torch.dtype
    q_decode: torch.dtype
    kv: torch.dtype
    out: torch.dtype
    head_dim: int
    page_size: int
    head_group_ratio: int  # query heads per KV head, as XQA reads it from the query and cache shapes
    window_left: int
    soft_cap: bool
    xqa_decode: bool


def on_flashinfer(layer) -> bool:
    """Whether the attention layer runs vLLM's FlashInfer backend."""
    flashinfer = imported(FLASHINFER_BACKEND_MODULE)
    return flashinfer is not None and isinstance(getattr(layer, "impl", None), flashinfer.FlashInferImpl)


def _why_not_planned(layer, spec, vllm_config) -> str | None:
    impl = layer.impl
    if getattr(layer, "attn_type", "decoder") != "decoder":
        return "it is encoder attention"
    if type(spec).__name__ not in ("FullAttentionSpec", "SlidingWindowSpec"):
        return f"its KV-cache spec is {type(spec).__name__}, not full or sliding-window attention"
    if impl.kv_cache_dtype == "nvfp4":
        return "its KV cache is NVFP4 (trtllm-gen's cubins)"
    if vllm_config.parallel_config.decode_context_parallel_size > 1:
        return "decode context parallelism"
    from vllm.platforms import current_platform

    if not current_platform.is_device_capability_family(90):
        return f"the GPU is sm_{current_platform.get_device_capability().to_int()}, not sm_90"
    return None


def _site(layer, vllm_config) -> FlashInferAttentionSite | str:
    spec = layer.get_kv_cache_spec(vllm_config)
    why = _why_not_planned(layer, spec, vllm_config)
    if why is not None:
        return why
    from vllm.v1.worker.utils import select_common_block_size

    kernel_block = select_common_block_size(spec.block_size, [layer.attn_backend])
    if kernel_block != spec.block_size:
        spec = spec.copy_with_new_block_size(kernel_block)
    return FlashInferAttentionSite(layer.layer_name, layer.attn_backend, spec, vllm_config)


class VllmFlashInferAttentionProvider(VllmProvider):
    name = "vllm-flashinfer-attention"
    library = "vllm"
    family = "flashinfer"

    def find_layers(self, model) -> list:
        attention = imported(ATTENTION_MODULE)
        if attention is None or imported(FLASHINFER_BACKEND_MODULE) is None:
            return []
        vllm_config = worker_config(self.vllm_config)
        return distinct_sites(((name, _site(layer, vllm_config)) for name, layer in model.named_modules()
                               if isinstance(layer, attention.Attention) and on_flashinfer(layer)),
                              "vllm FlashInfer attention", log)

    def enter_planner(self) -> None:
        super().enter_planner()
        import vllm.v1.attention.backends.flashinfer as flashinfer_backend

        # the builder's host buffers are pinned unless this says no; pinning needs CUDA, which a process forked
        # from the worker cannot use (their contents are never read here)
        flashinfer_backend.PIN_MEMORY = False

    def launches(self, layers: list, limits: EngineLimits) -> Iterator[PlannedLaunch]:
        for site in layers:
            yield PlannedLaunch(Priority.WARMUP, functools.partial(request_modules, site),
                                f"vllm FlashInfer attention {site.label}")


def resolved_arguments(site: FlashInferAttentionSite) -> ModuleArguments:
    """The layer's metadata builder, made as vLLM's runner makes it, and what it resolved."""
    import vllm.v1.attention.backends.flashinfer as flashinfer_backend
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(site.vllm_config):
        builder = site.backend.get_builder_cls()(site.spec, [site.label], site.vllm_config, torch.device("meta"))
    impl = site.vllm_config.compilation_config.static_forward_context[site.label].impl
    xqa = (builder.use_trtllm_decode_attention and builder.flashinfer_trtllm_api_decode_kernel
           == flashinfer_backend.FlashInferDecodeKernel.XQA)
    return ModuleArguments(builder.q_data_type_prefill, builder.q_data_type_decode, builder.kv_cache_dtype,
                           site.vllm_config.model_config.dtype, builder.head_dim, builder.page_size,
                           impl.num_heads // impl.num_kv_heads, builder.window_left,
                           (builder.logits_soft_cap or 0.0) > 0, xqa)


def request_modules(site: FlashInferAttentionSite) -> None:
    """Ask FlashInfer for the layer's prefill and decode modules, inside the caller's FlashInfer capture."""
    from flashinfer.prefill import get_batch_prefill_module
    from flashinfer.utils import PosEncodingMode, determine_attention_backend
    from flashinfer.xqa import get_xqa_module

    from ..flashinfer.plan import planned_call

    args = resolved_arguments(site)
    cuda, no_rope = torch.device("cuda"), PosEncodingMode.NONE.value

    def backend(q: torch.dtype) -> str:  # the wrappers' "auto", as their plan() resolves it
        return determine_attention_backend(cuda, no_rope, False, False, q, args.kv)

    # BatchPrefillWithPagedKVCacheWrapper.plan(): the window counts from 0
    planned_call(get_batch_prefill_module, backend(args.q_prefill), args.q_prefill, args.kv, args.out, torch.int32,
                 args.head_dim, args.head_dim, no_rope, args.window_left >= 0, args.soft_cap, False)
    if args.xqa_decode:  # xqa(): the query's dtype, the cache's, the output's; one query token per request
        planned_call(get_xqa_module, args.q_decode, args.kv, args.page_size, args.head_dim, args.head_group_ratio,
                     args.window_left >= 0, args.out, 1)
    else:  # BatchDecodeWithPagedKVCacheWrapper.plan() with tensor cores: fa2 unless FP8 is involved
        decode_backend = backend(args.q_decode) if FP8 & {args.q_decode, args.kv} else "fa2"
        planned_call(get_batch_prefill_module, decode_backend, args.q_decode, args.kv, args.out, torch.int32,
                     args.head_dim, args.head_dim, no_rope, args.window_left != -1, args.soft_cap, False)
