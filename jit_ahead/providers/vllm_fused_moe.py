"""vLLM's fused-MoE Triton kernel (``fused_moe_kernel``), as vLLM's own unquantized MoE layers launch it.

A vLLM model holds its routed experts as ``RoutedExperts`` modules whose quantization method picks a
backend at construction (``select_unquantized_moe_backend``: on an sm_90 GPU, the Triton experts; vLLM puts
FlashInfer's MoE last there). The kernel itself is built only when the weights are processed, after they
load; planning runs before, so each launch builds the same modular kernel vLLM will (``make_unquantized_moe_kernel``,
with the layer's own configuration, quantization config and routing tables) and calls its ``apply`` on
meta tensors shaped as the layer's weights, for one token count. That runs vLLM's whole path: its config
choice for the token count (the tuned configs of the server's GPU, read by name, or the defaults), its
expert assignment and both ``fused_moe_kernel`` launches (gate/up and down projections).

What is needed on meta tensors and nowhere else: the CUDA ops on the path (expert alignment, the
activation, the final sum) get a Meta kernel that does nothing (``vllm_meta_ops``), and the modular
kernel's workspaces come from a manager on the meta device, for the calling thread only.

Every token count from 1 to ``max_num_tokens`` is planned (each call is a fraction of a millisecond on
meta, and what a repeat launches is deduplicated by the capture): vLLM's config changes at the tuned
token counts of its config files, and the kernel's integer arguments follow the token count and the
block size the config picks, so no smaller set is exact for every GPU's config file.

Not planned (one line per reason, naming the first such layer): quantized layers, layers with bias, expert
or data parallelism (the experts then see tokens gathered across ranks, through the engine's collectives),
and backends other than the Triton experts. A LoRA layer's own kernels are not planned, only the base
experts'. WARMUP: vLLM's CUDA-graph capture sizes and its profiling run's ``max_num_batched_tokens``.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..core.planning.limits import EngineLimits
from ..core.thread_patch import patched_in_this_thread
from .base import PlannedLaunch, distinct_sites, imported
from .vllm_platform import VllmProvider
from .vllm_warmup import EXTRA_LIMITS, vllm_token_counts

log = logging.getLogger("jit_ahead.providers.vllm")

METHOD_MODULE = "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method"
TRITON_EXPERTS_MODULE = "vllm.model_executor.layers.fused_moe.experts.triton_moe"
MODULAR_KERNEL_MODULE = "vllm.model_executor.layers.fused_moe.modular_kernel"


@dataclass(frozen=True)
class WeightSpec:
    """A weight's layout, for a meta tensor that stands for it."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "WeightSpec":
        return cls(tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)

    def meta(self) -> torch.Tensor:
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device="meta")


@dataclass(frozen=True, eq=False)
class MoESite:
    """One distinct MoE layer: what ``make_unquantized_moe_kernel`` and ``apply`` get from it."""

    label: str
    method: object  # the layer's UnquantizedFusedMoEMethod (its config, backend and experts class)
    quant_config: object
    routing_tables: object
    w13: WeightSpec
    w2: WeightSpec
    activation: object
    global_num_experts: int
    apply_router_weight_on_input: bool

    @property
    def form(self) -> tuple:
        """What makes two layers launch the same variants."""
        moe = self.method.moe
        return (self.method.experts_cls, self.method.unquantized_backend, repr(moe), self.w13, self.w2,
                str(self.activation), self.global_num_experts, self.apply_router_weight_on_input)


def _moe_layers(model) -> Iterator[tuple[str, torch.nn.Module, object]]:
    methods = imported(METHOD_MODULE)
    if methods is None:
        return
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(module, "w13_weight"):
            yield name, module, method


def _why_not_planned(module, method) -> str | None:
    """None for a layer this provider plans exactly, else why it does not."""
    methods = imported(METHOD_MODULE)
    triton_moe = imported(TRITON_EXPERTS_MODULE)
    if methods is None or not isinstance(method, methods.UnquantizedFusedMoEMethod):
        return f"its quantization method {type(method).__name__} is not the unquantized one"
    experts = method.experts_cls
    if triton_moe is None or experts is None or not issubclass(experts, triton_moe.TritonExperts):
        backend = getattr(method.unquantized_backend, "value", method.unquantized_backend)
        return (f"its backend is {backend} ({getattr(experts, '__name__', 'no experts class')}), "
                "not vLLM's Triton experts")
    if method.moe.has_bias:
        return "its experts have a bias"
    if getattr(module, "expert_map", None) is not None:
        return "it runs with expert parallelism (an expert map)"
    parallel = method.moe.moe_parallel_config
    if parallel.dp_size > 1 or parallel.use_all2all_kernels:
        return "it runs with data parallelism (tokens gathered across ranks)"
    return None


def _site(name: str, module, method) -> MoESite | str:
    """The layer's site, or why it is not planned."""
    why = _why_not_planned(module, method)
    if why is not None:
        return why
    return MoESite(name, method, method.get_fused_moe_quant_config(module), module._expert_routing_tables(),
                   WeightSpec.of(module.w13_weight), WeightSpec.of(module.w2_weight), module.activation,
                   int(module.global_num_experts), bool(module.apply_router_weight_on_input))


class VllmFusedMoEProvider(VllmProvider):
    name = "vllm-fused-moe"
    library = "vllm"
    modules = ("vllm.model_executor.layers.fused_moe.fused_moe",)
    extra_limits = EXTRA_LIMITS

    def find_layers(self, model) -> list:
        return distinct_sites(((name, _site(name, module, method)) for name, module, method in _moe_layers(model)),
                              "vllm fused MoE", log)

    def launches(self, layers: list, limits: EngineLimits) -> Iterator[PlannedLaunch]:
        counts = vllm_token_counts(limits)
        for site in layers:
            for tokens, priority in counts:
                yield PlannedLaunch(priority, functools.partial(run_experts, site, tokens),
                                    f"vllm fused_moe {site.label} tokens={tokens}")


_kernels: "weakref.WeakKeyDictionary[MoESite, object]" = weakref.WeakKeyDictionary()


def _kernel(site: MoESite):
    """The modular kernel vLLM builds for the layer once its weights are processed (one per site and
    process, dropped with the site)."""
    kernel = _kernels.get(site)
    if kernel is None:
        from vllm.model_executor.layers.fused_moe.oracle.unquantized import make_unquantized_moe_kernel

        from . import vllm_meta_ops

        vllm_meta_ops.install()  # before the kernel's first call in this process
        method = site.method
        kernel = _kernels[site] = make_unquantized_moe_kernel(
            quant_config=site.quant_config, moe_config=method.moe, backend=method.unquantized_backend,
            experts_cls=method.experts_cls, routing_tables=site.routing_tables)
    return kernel


class _MetaWorkspaces:
    """``WorkspaceManager.get_simultaneous`` on meta tensors. vLLM's manager hands out contiguous views of
    one buffer at 256-byte aligned offsets, which Triton's 16-byte divisibility sees as it sees a fresh
    tensor; its own growth path frees accelerator memory, which a planner must not touch."""

    @staticmethod
    def get_simultaneous(*shapes_and_dtypes: tuple[tuple[int, ...], torch.dtype]) -> list[torch.Tensor]:
        return [torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in shapes_and_dtypes]


@contextlib.contextmanager
def workspaces_on_meta() -> Iterator[None]:
    """The modular kernel's workspaces on the meta device, for this thread's calls only."""
    modular_kernel = imported(MODULAR_KERNEL_MODULE)
    with patched_in_this_thread(modular_kernel, "current_workspace_manager", lambda original: _MetaWorkspaces):
        yield


@torch.no_grad()
def run_experts(site: MoESite, tokens: int) -> None:
    """What the layer's ``forward`` launches for ``tokens`` tokens once routing has picked the experts."""
    kernel = _kernel(site)
    moe = site.method.moe
    top_k = moe.experts_per_token
    # the router's expert ids: int32 unless the kernel's prepare/finalize asks for another dtype
    ids = kernel.prepare_finalize.topk_indices_dtype() or torch.int32
    hidden = torch.empty(tokens, moe.hidden_dim, dtype=moe.in_dtype, device="meta")
    with workspaces_on_meta():
        kernel.apply(hidden_states=hidden, w1=site.w13.meta(), w2=site.w2.meta(),
                     topk_weights=torch.empty(tokens, top_k, dtype=torch.float32, device="meta"),
                     topk_ids=torch.empty(tokens, top_k, dtype=ids, device="meta"),
                     activation=site.activation, apply_router_weight_on_input=site.apply_router_weight_on_input,
                     global_num_experts=site.global_num_experts, expert_map=None)
