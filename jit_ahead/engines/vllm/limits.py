"""The limits a vLLM worker serves within, read from its ``VllmConfig``."""
from __future__ import annotations

from ...core.planning.limits import EngineLimits


def limits_from(vllm_config) -> EngineLimits:
    """``max_num_batched_tokens``, ``max_num_seqs`` and ``max_model_len`` as jit_ahead's limits; the
    CUDA-graph capture sizes that are batch sizes (decode batches up to ``max_num_seqs``) first; what else
    a vLLM kernel's variants depend on (the KV-cache block size, parallelism, speculative tokens, eager
    mode, every capture size) under ``extra["vllm"]``."""
    scheduler = vllm_config.scheduler_config
    model = vllm_config.model_config
    compilation = vllm_config.compilation_config
    cache = vllm_config.cache_config
    parallel = vllm_config.parallel_config
    speculative = vllm_config.speculative_config
    batch = int(scheduler.max_num_seqs)
    captured = sorted({int(s) for s in (compilation.cudagraph_capture_sizes or ())})
    dtype = str(model.dtype).removeprefix("torch.")
    extra = {"block_size": int(cache.block_size) if cache.block_size else None,
             "cache_dtype": str(cache.cache_dtype),
             "cudagraph_capture_sizes": captured,
             "enforce_eager": bool(model.enforce_eager),
             "tensor_parallel_size": int(parallel.tensor_parallel_size),
             "pipeline_parallel_size": int(parallel.pipeline_parallel_size),
             "num_speculative_tokens": int(speculative.num_speculative_tokens) if speculative is not None else 0}
    return EngineLimits(max_num_tokens=int(scheduler.max_num_batched_tokens), max_batch_size=batch,
                        max_seq_len=int(model.max_model_len), dtypes=(dtype,),
                        cuda_graph_batch_sizes=tuple(s for s in captured if s <= batch), extra={"vllm": extra})
