"""transformers' continuous batching (what ``transformers serve --continuous-batching`` and ``generate_batch``
run), one scheduled step at a time on a meta model: the packed forward its batch processor makes, built by
transformers' own machinery (its paged cache, its inputs and outputs, its model runner), for a mix of
requests given as (tokens already cached, tokens to process now)."""
from __future__ import annotations

import torch

PAGE = 256


class ContinuousBatching:
    """transformers' CB state for ``model`` (on meta) within ``max_batch_tokens``, room for ``requests``
    requests of ``max_len`` tokens each. ``padded`` pads the step as transformers does under CUDA graphs (its
    default with flash attention on a GPU)."""

    def __init__(self, model, max_batch_tokens: int, requests: int, max_len: int, padded: bool = False) -> None:
        from transformers import ContinuousBatchingConfig, GenerationConfig
        from transformers.generation.continuous_batching import cache as cb_cache
        from transformers.generation.continuous_batching.cb_logits_processors import (
            ContinuousBatchingLogitsProcessorList)
        from transformers.generation.continuous_batching.distributed import DistributedHelper
        from transformers.generation.continuous_batching.initialization import (
            resolve_continuous_batching_config, update_cb_config_after_cache_creation)
        from transformers.generation.continuous_batching.input_outputs import ContinuousBatchingIOs
        from transformers.generation.continuous_batching.model_runner import ModelRunner

        # the cache's size is given; transformers would also measure this machine's free memory for it
        cb_cache.PagedAttentionMemoryHandler.get_available_memory = lambda self: 1 << 62
        meta, text = torch.device("meta"), model.config.get_text_config()
        processors = ContinuousBatchingLogitsProcessorList(
            model._get_logits_processor(GenerationConfig(do_sample=False, eos_token_id=-1)))
        config = ContinuousBatchingConfig(page_size=PAGE, num_blocks=requests * (max_len // PAGE + 2) + 8,
                                          max_batch_tokens=max_batch_tokens, max_memory_percent=1.0)
        config = resolve_continuous_batching_config(text, config, None, processors.do_processing, device=meta)
        self.cache = cb_cache.PagedAttentionCache(text, config, meta, DistributedHelper(None, None), model.dtype,
                                                  model_supports_logits_to_keep=True)
        update_cb_config_after_cache_creation(config, self.cache.num_blocks, self.cache.max_batch_tokens)
        self.io = ContinuousBatchingIOs(self.cache, text, config, meta, model.dtype, processors)
        self.runner = ModelRunner(processors, config, self.io, self.cache, do_sample=False, return_logprobs=False)
        if padded:
            self.runner.pad_inputs = True
            self.io.use_cuda_graph_varlen = True
        self.model, self.processors, self.steps = model, processors, 0

    def step_inputs(self, requests: list[tuple[int, int]]) -> dict:
        """The model's keyword arguments for one step of ``requests`` ((cached, new) tokens each), as the
        batch processor passes them."""
        from transformers.generation.continuous_batching.requests import (FutureRequestState, RequestState,
                                                                           RequestStatus)

        self.steps += 1
        futures = []
        for i, (cached, new) in enumerate(requests):
            state = RequestState(request_id=f"s{self.steps}-{i}", initial_tokens=[0] * (cached + new), max_new_tokens=1)
            state._status = RequestStatus.DECODING if new == 1 else RequestStatus.PREFILLING
            state.tokens_to_process = [0] * new
            state.position_offset = cached
            if not self.cache.can_store_request_tokens(state, new):
                raise ValueError(f"no room in the paged cache for {cached}+{new} tokens")
            futures.append(FutureRequestState(state, has_new_token=True, complete_blocks=0, query_length=new))
        tokens, read = self.runner.maybe_pad_inputs(sum(n for _, n in requests), sum(c for c, _ in requests),
                                                   use_decode_fast_path=False)
        self.io.prepare_batch_tensors(futures, self.processors, False, tokens, read, use_padding=self.runner.pad_inputs)
        inputs = self.io.get_model_kwargs(use_padding=self.runner.pad_inputs)
        if self.runner.supports_logits_to_keep(self.model):
            inputs["logits_to_keep"] = inputs["logits_indices"]
        for i in range(len(requests)):
            self.cache.free_blocks(f"s{self.steps}-{i}")
        return inputs


def random_step(rng, max_batch_tokens: int, requests: int, max_len: int) -> list[tuple[int, int]]:
    """A step a scheduler may make: up to ``requests`` requests, some decoding one token at a long cached
    length, some prefilling a chunk, within the token budget."""
    step, budget = [], max_batch_tokens
    for _ in range(rng.randint(1, requests)):
        if budget <= 0:
            break
        cached = rng.randint(0, max_len - 2)
        new = 1 if rng.random() < 0.5 else rng.randint(1, max(1, min(budget, max_len - cached - 1)))
        budget -= new
        step.append((cached, new))
    return step
