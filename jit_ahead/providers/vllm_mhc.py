"""vLLM's DeepSeek-V4 mHC TileLang kernels (``vllm/model_executor/kernels/mhc/tilelang_kernels.py``), as
the NVIDIA DeepSeek-V4 model launches them: the kernels the seeds found compiling during inference.

Each decoder layer calls vLLM's mHC ops around its attention and its MoE (``mhc_pre_tilelang`` on the first
layer, ``mhc_fused_post_pre_tilelang`` before each attention and MoE), the model calls ``mhc_post_tilelang``
after the last layer and ``hc_head_fused_kernel_tilelang`` before its final norm. An op calls several
kernels, and which ones, with which split count and tile sizes, follows the number of tokens: vLLM derives
the split count from the token count and the GPU's SM count, with or without DeepGEMM's pre-norm GEMM.
So each launch here runs vLLM's own ops, in the order and with the arguments the layer's ``forward`` passes
them (its own parameters, its norms' weights and epsilons), on meta tensors for one token count, with
TileLang's calls going on past each captured kernel (``tilelang.plan.calls_go_on``): vLLM's code makes
every choice, and nothing of it is re-derived here. Every token count from 1 to ``max_num_batched_tokens``
is run (a kernel met before is not elaborated again, so a count costs a fraction of a millisecond).

DeepGEMM's pre-norm GEMM, which the ops call first where DeepGEMM is supported, is DeepGEMM's own JIT
kernel, not TileLang's: it is skipped here (``tf32_hc_prenorm_gemm`` does nothing in the planning thread).

Not planned: the AMD and XPU DeepSeek-V4 layers (their mHC ops are not TileLang's), and any other use of
the mHC ops. WARMUP: vLLM's CUDA-graph capture sizes and its profiling run's ``max_num_batched_tokens``.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..core.planning.limits import EngineLimits
from ..core.thread_patch import patched_in_this_thread
from .base import PlannedLaunch, distinct_sites, imported
from .vllm_fused_moe import WeightSpec
from .vllm_platform import VllmProvider
from .vllm_warmup import EXTRA_LIMITS, vllm_token_counts

log = logging.getLogger("jit_ahead.providers.vllm")

MODEL_MODULE = "vllm.models.deepseek_v4.nvidia.model"
OPS_MODULE = "vllm.model_executor.kernels.mhc.tilelang"
DEEP_GEMM_MODULE = "vllm.utils.deep_gemm"


@dataclass(frozen=True)
class MixSpec:
    """What one mHC mix of a layer passes the ops: its function, scale and base, and the fused norm."""

    fn: WeightSpec
    scale: WeightSpec
    base: WeightSpec
    norm_weight: WeightSpec
    norm_eps: float

    @classmethod
    def of(cls, layer, mix: str, norm) -> "MixSpec":
        return cls(WeightSpec.of(getattr(layer, f"hc_{mix}_fn")), WeightSpec.of(getattr(layer, f"hc_{mix}_scale")),
                   WeightSpec.of(getattr(layer, f"hc_{mix}_base")), WeightSpec.of(norm.weight.data),
                   float(norm.variance_epsilon))


@dataclass(frozen=True)
class _Site:
    """What every mHC op of the model is called with."""

    label: str
    hidden_size: int
    hc_mult: int
    residual_dtype: torch.dtype
    rms_norm_eps: float
    hc_eps: float

    @property
    def form(self) -> tuple:
        """What makes two sites launch the same variants: everything but the label."""
        return (type(self),) + tuple(getattr(self, name) for name in self.__dataclass_fields__ if name != "label")


@dataclass(frozen=True)
class LayerSite(_Site):
    """One distinct ``DeepseekV4DecoderLayer``: the mHC ops of its ``forward``, and ``mhc_post`` after it."""

    hc_post_alpha: float
    hc_sinkhorn_iters: int
    attn: MixSpec
    ffn: MixSpec


@dataclass(frozen=True)
class HeadSite(_Site):
    """The ``DeepseekV4Model``'s ``hc_head``."""

    fn: WeightSpec
    scale: WeightSpec
    base: WeightSpec


def _sites(model) -> Iterator[tuple[str, object]]:
    module = imported(MODEL_MODULE)
    if module is None:
        return
    # the hidden states have the model's dtype, as its norms' weights do
    for name, layer in model.named_modules():
        if isinstance(layer, module.DeepseekV4DecoderLayer):
            yield name, LayerSite(name, int(layer.hidden_size), int(layer.hc_mult), layer.attn_norm.weight.dtype,
                                  float(layer.rms_norm_eps), float(layer.hc_eps), float(layer.hc_post_alpha), int(layer.hc_sinkhorn_iters),
                                  MixSpec.of(layer, "attn", layer.attn_norm), MixSpec.of(layer, "ffn", layer.ffn_norm))
        elif isinstance(layer, module.DeepseekV4Model) and hasattr(layer.norm, "weight"):  # the last PP rank's
            yield name, HeadSite(name, int(layer.config.hidden_size), int(layer.hc_mult), layer.norm.weight.dtype,
                                 float(layer.rms_norm_eps), float(layer.hc_eps), WeightSpec.of(layer.hc_head_fn),
                                 WeightSpec.of(layer.hc_head_scale), WeightSpec.of(layer.hc_head_base))


class VllmMhcProvider(VllmProvider):
    name = "vllm-mhc"
    library = "vllm"
    family = "tilelang"
    extra_limits = EXTRA_LIMITS

    def find_layers(self, model) -> list:
        return distinct_sites(_sites(model), "vllm mHC", log)

    def launches(self, layers: list, limits: EngineLimits) -> Iterator[PlannedLaunch]:
        counts = vllm_token_counts(limits)
        for site in layers:
            run = run_layer if isinstance(site, LayerSite) else run_head
            for tokens, priority in counts:
                yield PlannedLaunch(priority, functools.partial(run, site, tokens),
                                    f"vllm mHC {site.label} tokens={tokens}")


@contextlib.contextmanager
def _ops_on_meta() -> Iterator[object]:
    """vLLM's mHC ops, with TileLang's calls going on past each captured kernel and DeepGEMM's pre-norm GEMM
    doing nothing, in this thread."""
    from ..tilelang.plan import calls_go_on

    deep_gemm = imported(DEEP_GEMM_MODULE)
    with contextlib.ExitStack() as stack:
        stack.enter_context(calls_go_on())
        if deep_gemm is not None and "tf32_hc_prenorm_gemm" in vars(deep_gemm):
            stack.enter_context(patched_in_this_thread(deep_gemm, "tf32_hc_prenorm_gemm",
                                                       lambda original, *args, **kwargs: None))
        yield imported(OPS_MODULE)


@torch.no_grad()
def run_layer(site: LayerSite, tokens: int) -> None:
    """The mHC ops of the layer's ``forward`` for ``tokens`` tokens: as the first layer (``mhc_pre``) and as
    any other (``mhc_fused_post_pre``) before the attention, before the MoE, then the model's ``mhc_post``.
    The attention's and the MoE's outputs have the shape and dtype of their inputs."""
    residual = torch.empty(tokens, site.hc_mult, site.hidden_size, dtype=site.residual_dtype, device="meta")
    eps = (site.rms_norm_eps, site.hc_eps, site.hc_eps, site.hc_post_alpha, site.hc_sinkhorn_iters)
    with _ops_on_meta() as ops:
        attn, ffn = site.attn, site.ffn
        post_mix, res_mix, x = ops.mhc_pre_tilelang(residual, attn.fn.meta(), attn.scale.meta(), attn.base.meta(),
                                                    *eps, norm_weight=attn.norm_weight.meta(), norm_eps=attn.norm_eps)
        for mix in (attn, ffn):
            residual, post_mix, res_mix, x = ops.mhc_fused_post_pre_tilelang(
                x, residual, post_mix, res_mix, mix.fn.meta(), mix.scale.meta(), mix.base.meta(), *eps,
                n_splits=1, tile_n=1, norm_weight=mix.norm_weight.meta(), norm_eps=mix.norm_eps)
        ops.mhc_post_tilelang(x, residual, post_mix, res_mix)


@torch.no_grad()
def run_head(site: HeadSite, tokens: int) -> None:
    """The model's ``hc_head`` for ``tokens`` tokens."""
    residual = torch.empty(tokens, site.hc_mult, site.hidden_size, dtype=site.residual_dtype, device="meta")
    with _ops_on_meta() as ops:
        ops.hc_head_fused_kernel_tilelang(residual, site.fn.meta(), site.scale.meta(), site.base.meta(),
                                          site.rms_norm_eps, site.hc_eps)
