"""vLLM's warmup and configuration, as the providers of vLLM's kernels read them."""
from __future__ import annotations

from ..core.planning.limits import EngineLimits
from ..core.priority import Priority
from .base import token_counts

# the EngineLimits.extra key the vLLM engine adapter fills (engines/vllm/limits.py)
EXTRA_LIMITS = {"vllm": "vLLM's engine settings (engines/vllm/limits.py): its CUDA-graph capture sizes are planned "
                        "at WARMUP"}


def worker_config(vllm_config):
    """The worker's ``VllmConfig`` a provider was given, or the current one (vLLM's model construction sets
    it)."""
    if vllm_config is not None:
        return vllm_config
    from vllm.config import get_current_vllm_config

    return get_current_vllm_config()


def vllm_token_counts(limits: EngineLimits) -> list[tuple[int, Priority]]:
    """``token_counts`` with vLLM's warmup: every CUDA-graph capture size (up to twice max_num_seqs, not
    only the batch sizes) and its profiling run at max_num_batched_tokens, whatever the model length."""
    captured = limits.extra.get("vllm", {}).get("cudagraph_capture_sizes", ())
    return token_counts(limits, (*captured, limits.max_num_tokens))
