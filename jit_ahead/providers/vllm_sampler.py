"""vLLM's sampler on FlashInfer (``vllm/v1/sample/ops/topk_topp_sampler.py``): where vLLM samples top-k/top-p
requests with FlashInfer (its default on a CUDA GPU FlashInfer supports, ``VLLM_USE_FLASHINFER_SAMPLER``),
the first such request builds FlashInfer's sampling module with nvcc in the server, minutes of it, unless a
prebuilt one is installed. vLLM decides with its own ``flashinfer_sampler_supported()`` and the model's
``logprobs_mode``, both read here; the launches are vLLM's own ``flashinfer_sample`` on meta tensors, for
top-k with top-p, top-p alone and top-k alone, so the modules are the ones FlashInfer's ops ask for.

Needs the FlashInfer family in the session (``JIT_AHEAD_FAMILIES=triton,flashinfer``). WARMUP: vLLM's
sampler runs in its warmup.
"""
from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..core.planning.limits import EngineLimits
from ..core.priority import Priority
from .base import PlannedLaunch, imported
from .vllm_platform import VllmProvider
from .vllm_warmup import worker_config

SAMPLER_MODULE = "vllm.v1.sample.ops.topk_topp_sampler"


@dataclass(frozen=True)
class SamplerSite:
    vocab_size: int


class VllmFlashInferSamplerProvider(VllmProvider):
    name = "vllm-flashinfer-sampler"
    library = "vllm"
    family = "flashinfer"

    def find_layers(self, model) -> list:
        sampler = imported(SAMPLER_MODULE)
        if sampler is None:
            return []
        model_config = worker_config(self.vllm_config).model_config
        if getattr(model_config, "logprobs_mode", None) in ("processed_logits", "processed_logprobs"):
            return []  # vLLM samples these natively
        if not sampler.flashinfer_sampler_supported():
            return []
        return [SamplerSite(int(model_config.get_vocab_size()))]

    def launches(self, layers: list, limits: EngineLimits) -> Iterator[PlannedLaunch]:
        for site in layers:
            for top_k, top_p in ((True, True), (False, True), (True, False)):
                yield PlannedLaunch(Priority.WARMUP, functools.partial(run_sample, site, top_k, top_p),
                                    f"vllm FlashInfer sampler top_k={top_k} top_p={top_p}")


@torch.no_grad()
def run_sample(site: SamplerSite, top_k: bool, top_p: bool, requests: int = 2) -> None:
    """vLLM's ``flashinfer_sample`` for a batch of ``requests`` with top-k and/or top-p."""
    from vllm.v1.sample.ops.topk_topp_sampler import flashinfer_sample

    from ..flashinfer.plan import planned_call

    meta = torch.device("meta")
    logits = torch.empty(requests, site.vocab_size, dtype=torch.float32, device=meta)
    k = torch.empty(requests, dtype=torch.int32, device=meta) if top_k else None
    p = torch.empty(requests, dtype=torch.float32, device=meta) if top_p else None
    planned_call(flashinfer_sample, logits, k, p)
