"""Small third-party models for the demo, the tests and the GPU scripts: a Qwen3-style transformers model
patched with Liger-Kernel and a flash-linear-attention GatedDeltaNet model (random weights, no downloads),
and the serving step they all use (prefill a batch, then decode with the model's cache)."""
from __future__ import annotations

import contextlib
import random

import torch


def liger_qwen3(device="meta", dtype=torch.bfloat16, layers: int = 2):
    """Qwen3ForCausalLM with Liger's RMSNorm (incl. q_norm/k_norm), RoPE and SwiGLU."""
    from liger_kernel.transformers import apply_liger_kernel_to_qwen3
    from transformers import Qwen3Config, Qwen3ForCausalLM

    apply_liger_kernel_to_qwen3(rope=True, rms_norm=True, swiglu=True)
    config = Qwen3Config(hidden_size=512, intermediate_size=1536, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=4096,
                         max_position_embeddings=8192)
    with torch.device(device):
        return Qwen3ForCausalLM(config).to(dtype).eval()


def fla_gated_deltanet(device="meta", dtype=torch.bfloat16, layers: int = 2):
    """fla's GatedDeltaNetForCausalLM: short convolutions, gated RMSNorm, chunk and fused-recurrent."""
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    config = GatedDeltaNetConfig(hidden_size=512, num_hidden_layers=layers, num_heads=4, head_dim=64,
                                 vocab_size=4096)
    with torch.device(device):
        return GatedDeltaNetForCausalLM(config).to(dtype).eval()


def qwen35_hybrid(device="meta", dtype=torch.bfloat16, layers: int = 4, hidden: int = 1024):
    """transformers' Qwen3.5 text model, a hybrid no provider knows by class: transformers' own
    GatedDeltaNet layers (three of every four) call fla's ops, the fourth is full attention; Liger's
    RMSNorm and SwiGLU patched in."""
    from liger_kernel.transformers import apply_liger_kernel_to_qwen3_5
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    apply_liger_kernel_to_qwen3_5(rope=False, rms_norm=True, swiglu=True)  # Liger has no Qwen3.5 RoPE
    config = Qwen3_5TextConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                               num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                               linear_num_value_heads=8, linear_num_key_heads=4, linear_key_head_dim=128,
                               linear_value_head_dim=128, vocab_size=4096, max_position_embeddings=32768,
                               layer_types=[("full_attention" if i % 4 == 3 else "linear_attention")
                                            for i in range(layers)])
    with torch.device(device):
        return Qwen3_5ForCausalLM(config).to(dtype).eval()


MODELS = {"qwen3-liger": liger_qwen3, "gated-deltanet": fla_gated_deltanet, "qwen35-hybrid": qwen35_hybrid}


def new_cache(model):
    if type(model).__module__.startswith("fla."):
        from fla.models.utils import Cache

        return Cache()
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


@torch.no_grad()
def serve(model, batch: int, prompt: int, new_tokens: int, *, device, position_ids: bool = False,
          seed: int = 0, lengths: tuple[int, ...] | None = None, next_turn: int = 0) -> torch.Tensor:
    """One request batch as a server runs it: prefill ``batch`` prompts of ``prompt`` tokens, then decode
    ``new_tokens`` greedily with the cache. ``position_ids=True`` passes them as ``generate`` does.
    ``lengths``: the prompts' own lengths (at most ``prompt``); they are padded on the left to ``prompt``
    and an attention mask is passed at every step, as ``generate`` pads a batch of prompts.
    ``next_turn``: then prefill a further ``next_turn`` tokens per row onto the same cache, as a chat
    server that keeps a conversation's cache runs its next turn."""
    from .providers.fla import PaddedBatch
    from .providers.meta import MetaScalars

    vocab = model.config.vocab_size
    if device == "meta":
        ids = torch.empty(batch, prompt, dtype=torch.long, device="meta")
    else:
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (batch, prompt), generator=generator).to(device)
    mask = None
    if lengths is not None:
        if len(lengths) != batch or not all(1 <= n <= prompt for n in lengths):
            raise ValueError(f"lengths {lengths} must be {batch} prompt lengths in 1..{prompt}")
        mask = PaddedBatch(tuple(lengths), prompt).mask().to(device)
    cache = new_cache(model)
    # on meta, transformers' mask code reads ``(mask == 0).all()`` back: MetaScalars answers it
    with MetaScalars() if device == "meta" else contextlib.nullcontext():
        tokens = []
        step, start = ids, 0
        turns = [None] * (new_tokens + 1) + ([next_turn] if next_turn else [])
        for turn in turns:
            if turn:  # the next prompt, after the last decoded token
                step = ids[:, :1].expand(batch, turn).contiguous()
                if mask is not None:
                    mask = torch.cat([mask, mask.new_ones(batch, turn - 1)], dim=1)
            kwargs = {}
            if position_ids:
                kwargs["position_ids"] = torch.arange(start, start + step.shape[1], device=device).expand(batch, -1)
            if mask is not None:
                kwargs["attention_mask"] = mask
            out = model(input_ids=step, past_key_values=cache, use_cache=True, **kwargs)
            cache = out.past_key_values
            start += step.shape[1]
            step = out.logits[:, -1:].argmax(-1)
            tokens.append(step)
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
        return torch.cat(tokens, dim=1)


def warmup(model, limits, device, padded: bool = False) -> None:
    """What an engine's warmup runs: decode at the CUDA-graph batch sizes and one full-length prefill;
    ``padded``: with the attention mask ``generate`` passes (all ones: no prompt is shorter)."""
    def run(batch: int, prompt: int) -> None:
        serve(model, batch, prompt, 1, device=device, lengths=(prompt,) * batch if padded else None)

    for batch in limits.cuda_graph_batch_sizes:
        run(batch, 1)
    run(1, min(limits.max_seq_len, limits.max_num_tokens))


def request_shapes(limits, count: int, seed: int) -> list[tuple[int, int]]:
    """``count`` random (batch size, prompt length) pairs within the limits."""
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        batch = rng.randint(1, limits.max_batch_size)
        shapes.append((batch, rng.randint(1, min(limits.max_seq_len, limits.max_num_tokens // batch))))
    return shapes


def prompt_lengths(batch: int, prompt: int, seed: int) -> tuple[int, ...]:
    """Random lengths of ``batch`` prompts padded to ``prompt`` tokens (the longest has ``prompt``)."""
    rng = random.Random(seed)
    lengths = [rng.randint(1, prompt) for _ in range(batch)]
    lengths[rng.randrange(batch)] = prompt
    return tuple(lengths)


class CompileCounter:
    """Triton's compilation listener counting compile() calls that really compiled (``cache_hit`` False),
    by phase ("warmup", then "serving"), chained to any listener already installed (jit_ahead's own)."""

    def __init__(self) -> None:
        self.phase = "warmup"
        self.compiled: dict[str, list[str]] = {"warmup": [], "serving": []}
        self._previous = None

    def __call__(self, *, src, cache_hit, **kwargs) -> None:
        if self._previous is not None:
            self._previous(src=src, cache_hit=cache_hit, **kwargs)
        if not cache_hit:
            self.compiled[self.phase].append(getattr(src, "name", "?"))

    def install(self) -> "CompileCounter":
        from triton import knobs

        self._previous, knobs.compilation.listener = knobs.compilation.listener, self
        return self

    def uninstall(self) -> None:
        from triton import knobs

        if knobs.compilation.listener is self:
            knobs.compilation.listener = self._previous
