"""vLLM's speculative-decoding Triton kernels on its V1 model runner: the Eagle proposer's per-step kernels
and the rejection sampler's.

vLLM 0.25 runs speculative decoding of MoE and hybrid targets (DeepSeek MTP, Qwen3-MoE, Mixtral, Qwen3-Next)
on its V1 runner. There each step launches, beside the models' forwards:
- the proposer's kernels (``v1/spec_decode/utils.py``), each with the step's request count as an integer
  argument, so a variant per class of that count (1, a multiple of 16, another):
  ``eagle_prepare_next_token_padded_kernel`` (every step, also with the number of sampled tokens per
  request: 1 without drafts, up to the speculative token count + 1 with them),
  ``eagle_prepare_inputs_padded_kernel`` (steps with drafts) and ``eagle_step_slot_mapping_metadata_kernel``
  (each draft step after the first, with the draft's block size, the model length and the block table's
  width as constants);
- the rejection sampler's (``v1/sample/rejection_sampler.py``), whose variants follow the batch's sampling
  mix (all greedy, mixed, all random), its top-k (int32) and top-p, and whether the drafts carry
  probabilities.
vLLM's own warmup runs the draft model but none of the proposer's kernels, and its sampler warmup only a
mixed batch with an int64 top-k: the all-greedy rejection (the common case), int32 top-k and every proposer
variant compile at their first real step.

Each launch runs vLLM's own functions on meta tensors for one request count or sampling mix:
``SpecDecodeBaseProposer.prepare_next_token_ids_padded`` and ``prepare_inputs_padded`` (with the one pinned
buffer they read replaced by a meta tensor), ``eagle_step_update_slot_mapping_and_metadata`` on the
runner's ``MultiGroupBlockTable``, ``apply_sampling_constraints`` and ``rejection_sample``. The V2 runner
(dense models) has kernels of its own that take no integer that varies with the batch, so its warmup
compiles each variant; nothing is planned for it. Not planned: the draft-model and parallel-drafting
input kernel, DFlash's, the Mamba state kernels of hybrid MTP, and the Inductor-compiled bookkeeping of
asynchronous spec decode. WARMUP: every launch (a few dozen small kernels).
"""
from __future__ import annotations

import logging
import types
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..core.planning.limits import EngineLimits
from ..core.priority import Priority
from .base import PlannedLaunch
from .vllm_platform import VllmProvider
from .vllm_warmup import EXTRA_LIMITS, worker_config

log = logging.getLogger("jit_ahead.providers.vllm")

EAGLE_METHODS = ("eagle", "eagle3", "mtp")
MIXES = ("all_greedy", "mixed", "all_random")


@dataclass(frozen=True)
class SpecDecodeSite:
    """What the V1 runner's speculative decoding launches depend on, from the worker's configuration."""

    method: str
    draft_tokens: int  # num_speculative_tokens
    vocab_size: int
    block_size: int
    max_model_len: int
    proposer: bool  # Eagle-style drafting with the padded drafter batch: its kernels run each step
    draft_probs: bool  # probabilistic drafts reach the rejection sampler with their probabilities
    synthetic_rates: tuple[float, ...] | None  # synthetic rejection's conditional rates
    use_fp64_gumbel: bool

    @property
    def label(self) -> str:
        return f"{self.method} k={self.draft_tokens}"


def spec_decode_site(vllm_config) -> SpecDecodeSite | None:
    """The site of the worker's speculative decoding on the V1 runner; None without any, or on the V2
    runner."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None:
        return None
    if vllm_config.use_v2_model_runner:
        return None  # the V2 runner's warmup compiles its one variant of each kernel
    model = vllm_config.model_config
    rates = None
    if spec.rejection_sample_method == "synthetic":
        from vllm.v1.spec_decode.utils import unconditional_to_conditional_rates

        rates = tuple(unconditional_to_conditional_rates(spec.synthetic_acceptance_rates))
    parallel = bool(getattr(spec, "parallel_drafting", False))
    return SpecDecodeSite(spec.method, spec.num_speculative_tokens, model.get_vocab_size(),
                          vllm_config.cache_config.block_size, model.max_model_len,
                          spec.method in EAGLE_METHODS and not spec.disable_padded_drafter_batch and not parallel,
                          spec.draft_sample_method == "probabilistic", rates,
                          bool(getattr(model, "use_fp64_gumbel", False)))


class VllmSpecDecodeProvider(VllmProvider):
    name = "vllm-spec-decode"
    library = "vllm"
    modules = ("vllm.v1.spec_decode.utils", "vllm.v1.sample.rejection_sampler", "vllm.v1.sample.ops.topk_topp_triton")
    extra_limits = EXTRA_LIMITS

    def find_layers(self, model) -> list:
        # the worker's configuration says whether its runner speculates (and so imports the rejection sampler)
        site = spec_decode_site(worker_config(self.vllm_config))
        if site is None:
            return []
        if not site.proposer:
            log.info("vllm spec decode: the %s proposer's kernels are not planned (only Eagle, Eagle3 and MTP "
                     "with the padded drafter batch and no parallel drafting are); the rejection sampler's are",
                     site.method)
        return [site]

    def launches(self, layers: list, limits: EngineLimits) -> Iterator[PlannedLaunch]:
        for site in layers:
            for step in rejection_steps(site, limits):
                yield PlannedLaunch(Priority.WARMUP, lambda s=site, step=step: run_rejection(s, step),
                                    f"vllm spec decode rejection {step}")
            if not site.proposer:
                continue
            for requests in request_counts(limits):
                for sampled in range(1, site.draft_tokens + 2):
                    yield PlannedLaunch(Priority.WARMUP,
                                        lambda s=site, b=requests, n=sampled: run_next_tokens(s, limits, b, n),
                                        f"vllm spec decode next tokens requests={requests} sampled={sampled}")
                yield PlannedLaunch(Priority.WARMUP, lambda s=site, b=requests: run_draft_steps(s, limits, b),
                                    f"vllm spec decode draft steps requests={requests}")


def request_counts(limits: EngineLimits) -> list[int]:
    """One request count of each integer class Triton specializes on (1, a multiple of 16, another)."""
    top = max(1, min(limits.max_batch_size, limits.max_num_tokens))
    return sorted({n for n in (1, 2, 16) if n <= top})


def _meta(*shape: int, dtype=torch.int32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


@dataclass(frozen=True)
class RejectionStep:
    """One verification step as the rejection sampler sees it: the drafts of each request, the sampling
    mix, which of top-k and top-p its random requests use, and whether drafts carry probabilities."""

    drafts: tuple[int, ...]
    mix: str
    top_k: bool
    top_p: bool
    draft_probs: bool

    def __str__(self) -> str:
        return (f"{self.mix} drafts={sum(self.drafts)}{' top-k' if self.top_k else ''}{' top-p' if self.top_p else ''}"
                f"{' draft probs' if self.draft_probs else ''}")


def rejection_steps(site: SpecDecodeSite, limits: EngineLimits) -> list[RejectionStep]:
    """Every sampling mix, top-k/top-p choice and draft-probability case, at draft token counts of each
    integer class the top-k/top-p kernel specializes its row count on (1, a multiple of 16, another above
    the 8 rows from which vLLM samples with it)."""
    top = max(1, min(limits.max_batch_size, limits.max_num_tokens))
    totals = sorted({t for t in (1, 9, 16) if t <= top * site.draft_tokens})
    steps = []
    for total in totals:
        requests = -(-total // site.draft_tokens)
        drafts = tuple(min(site.draft_tokens, total - i * site.draft_tokens) for i in range(requests))
        for mix in MIXES:
            both = [(k, p) for k in (False, True) for p in (False, True)]
            choices = [(False, False)] if mix == "all_greedy" else both
            for top_k, top_p in choices:
                for draft_probs in sorted({False, site.draft_probs}):
                    steps.append(RejectionStep(drafts, mix, top_k, top_p, draft_probs))
    return steps


@torch.no_grad()
def run_rejection(site: SpecDecodeSite, step: RejectionStep) -> None:
    """vLLM's sampling constraints, then its rejection, for one verification step."""
    from vllm.v1.sample.rejection_sampler import apply_sampling_constraints, rejection_sample

    requests, tokens, vocab = len(step.drafts), sum(step.drafts), site.vocab_size
    random = step.mix != "all_greedy"
    sampling = types.SimpleNamespace(
        all_greedy=not random, all_random=step.mix == "all_random", generators={},
        temperature=_meta(requests, dtype=torch.float32) if random else None,
        top_k=_meta(requests) if random and step.top_k else None,  # the input batch's int32 top-k
        top_p=_meta(requests, dtype=torch.float32) if random and step.top_p else None)
    cu_draft_tokens = _meta(requests)
    logits = apply_sampling_constraints(_meta(tokens, vocab, dtype=torch.float32), cu_draft_tokens, sampling)
    rates = None if site.synthetic_rates is None else torch.tensor(site.synthetic_rates, device="meta")
    rejection_sample(_meta(tokens), list(step.drafts), site.draft_tokens, cu_draft_tokens,
                     _meta(tokens, vocab, dtype=torch.float32) if step.draft_probs else None, logits,
                     _meta(requests, 1), sampling, synthetic_mode=rates is not None,
                     synthetic_conditional_rates=rates, use_fp64_gumbel=site.use_fp64_gumbel)


@torch.no_grad()
def run_next_tokens(site: SpecDecodeSite, limits: EngineLimits, requests: int, sampled: int) -> None:
    """The proposer's next-token step for ``requests`` requests with ``sampled`` tokens sampled each."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    slots = max(limits.max_batch_size, requests)
    # the proposer's pinned buffer of backup tokens, as the step reads it (filled on the host, then copied)
    backup = types.SimpleNamespace(np=np.zeros(slots, dtype=np.int32), gpu=_meta(slots),
                                   copy_to_gpu=lambda n=None: None)
    proposer = types.SimpleNamespace(backup_next_token_ids=backup)
    ids = [f"r{i}" for i in range(requests)]
    state = types.SimpleNamespace(get_token_id=lambda index: 0)
    batch = types.SimpleNamespace(num_reqs=requests, req_ids=ids, num_tokens_no_spec=np.ones(requests, dtype=np.int64),
                                  vocab_size=site.vocab_size)
    SpecDecodeBaseProposer.prepare_next_token_ids_padded(proposer, _meta(requests, sampled), dict.fromkeys(ids, state),
                                                         batch, _meta(slots, dtype=torch.bool))


@torch.no_grad()
def run_draft_steps(site: SpecDecodeSite, limits: EngineLimits, requests: int) -> None:
    """A step with drafts for ``requests`` requests: the inputs padded for the proposer, then (with more
    than one draft token) a draft step's slot mapping on the runner's block table."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.spec_decode.utils import eagle_step_update_slot_mapping_and_metadata

    k = site.draft_tokens
    tokens = requests * (k + 1)
    table = _block_table(site, limits)
    common = types.SimpleNamespace(
        num_reqs=requests, query_start_loc=_meta(requests + 1),
        query_start_loc_cpu=torch.arange(requests + 1, dtype=torch.int32) * (k + 1), seq_lens=_meta(requests),
        _seq_lens_cpu=None, _num_computed_tokens_cpu=None, seq_lens_cpu_upper_bound=None,
        max_seq_len=site.max_model_len, block_table_tensor=table.get_device_tensor(requests),
        slot_mapping=_meta(tokens, dtype=torch.int64), dcp_local_seq_lens=None)
    drafts = types.SimpleNamespace(cu_num_draft_tokens=_meta(requests))
    SpecDecodeBaseProposer.prepare_inputs_padded(None, common, drafts, _meta(requests))
    if k > 1:
        eagle_step_update_slot_mapping_and_metadata(
            _meta(requests, dtype=torch.int64), table.get_device_tensor(requests), _meta(requests), site.block_size,
            site.max_model_len, _meta(requests, dtype=torch.int64), _meta(requests, dtype=torch.int64), requests)


def _block_table(site: SpecDecodeSite, limits: EngineLimits):
    """The runner's block table of the draft's KV-cache group, on meta."""
    from vllm.v1.worker.block_table import MultiGroupBlockTable

    tables = MultiGroupBlockTable(max_num_reqs=max(1, limits.max_batch_size), max_model_len=site.max_model_len,
                                  max_num_batched_tokens=limits.max_num_tokens, pin_memory=False,
                                  device=torch.device("meta"), block_sizes=[site.block_size],
                                  kernel_block_sizes=[site.block_size])
    return tables[0]
