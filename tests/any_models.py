"""Models no provider knows by class, for the model-level planner's tests: transformers hybrids whose own
layers call fla's ops, and a plain ``nn.Module`` that calls Liger's and fla's ops itself."""
from __future__ import annotations

from dataclasses import dataclass

import torch


def olmo_hybrid(layers: int = 4, hidden: int = 256):
    """transformers' OLMo hybrid: its own linear-attention layers call fla's gated delta rule; no Liger."""
    from transformers import OlmoHybridConfig, OlmoHybridForCausalLM

    config = OlmoHybridConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                              num_attention_heads=4, num_key_value_heads=2, vocab_size=512, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                              linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=64,
                              linear_value_head_dim=64,
                              layer_types=[("full_attention" if i % 4 == 3 else "linear_attention")
                                           for i in range(layers)])
    with torch.device("meta"):
        return OlmoHybridForCausalLM(config).to(torch.bfloat16).eval()


@dataclass
class PlainOutput:
    logits: torch.Tensor
    cache: dict | None


class PlainBlock(torch.nn.Module):
    """RMSNorm and SwiGLU through Liger's functional ops, a gated delta rule through fla's (chunked for a
    prompt, recurrent for one token with a state), keeping its state in a plain dict."""

    def __init__(self, hidden: int, heads: int, head_dim: int, index: int) -> None:
        super().__init__()
        self.layer_idx, self.heads, self.head_dim = index, heads, head_dim
        self.norm = torch.nn.Parameter(torch.ones(hidden))
        self.qkv = torch.nn.Linear(hidden, 3 * heads * head_dim, bias=False)
        self.gates = torch.nn.Linear(hidden, 2 * heads, bias=False)
        self.out = torch.nn.Linear(heads * head_dim, hidden, bias=False)
        self.up = torch.nn.Linear(hidden, 4 * hidden, bias=False)
        self.down = torch.nn.Linear(2 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, cache: dict | None) -> torch.Tensor:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        from liger_kernel.transformers.functional import liger_rms_norm, liger_swiglu

        batch, tokens, _ = x.shape
        h = liger_rms_norm(x, self.norm, 1e-6)
        q, k, v = self.qkv(h).view(batch, tokens, 3, self.heads, self.head_dim).unbind(2)
        g, beta = self.gates(h).float().view(batch, tokens, 2, self.heads).unbind(2)
        state = None if cache is None else cache.get(self.layer_idx)
        rule = fused_recurrent_gated_delta_rule if state is not None and tokens == 1 else chunk_gated_delta_rule
        o, state = rule(q.contiguous(), k.contiguous(), v.contiguous(), torch.nn.functional.logsigmoid(g),
                        beta.sigmoid(), initial_state=state, output_final_state=cache is not None,
                        use_qk_l2norm_in_kernel=True)
        if cache is not None:
            cache[self.layer_idx] = state
        x = x + self.out(o.reshape(batch, tokens, -1))
        gate, up = self.up(liger_rms_norm(x, self.norm, 1e-6)).chunk(2, dim=-1)
        return x + self.down(liger_swiglu(gate.contiguous(), up.contiguous()))


class PlainHybrid(torch.nn.Module):
    """Token ids in, logits out; ``cache`` a dict of each block's state, made when ``use_cache``; the
    final norm is fla's functional RMSNorm."""

    def __init__(self, layers: int = 3, hidden: int = 128, heads: int = 2, head_dim: int = 64, vocab: int = 256):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.blocks = torch.nn.ModuleList(PlainBlock(hidden, heads, head_dim, i) for i in range(layers))
        self.norm = torch.nn.Parameter(torch.ones(hidden))
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids, cache: dict | None = None, use_cache: bool = False):
        if use_cache and cache is None:
            cache = {}
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, cache)
        from fla.modules.layernorm import rms_norm  # its kernels' constexprs follow the row count

        return PlainOutput(self.head(rms_norm(x, self.norm, None)), cache)


def plain_hybrid(**settings) -> PlainHybrid:
    with torch.device("meta"):
        return PlainHybrid(**settings).to(torch.bfloat16).eval()


def qwen3_next_liger(layers: int = 4, hidden: int = 512):
    """transformers' Qwen3-Next (gated DeltaNet through fla, gated attention, a sparse MoE block in every
    layer) with Liger's RMSNorm and SwiGLU patched in: a MoE hybrid no provider knows by class."""
    from liger_kernel.transformers.monkey_patch import apply_liger_kernel_to_qwen3_next
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    apply_liger_kernel_to_qwen3_next(rope=False, rms_norm=True, swiglu=True)
    config = Qwen3NextConfig(hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=hidden // 2,
                             shared_expert_intermediate_size=hidden // 2, num_experts=8, num_experts_per_tok=2,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
                             linear_value_head_dim=64, vocab_size=1024, max_position_embeddings=32768,
                             layer_types=[("full_attention" if i % 4 == 3 else "linear_attention")
                                          for i in range(layers)])
    with torch.device("meta"):
        return Qwen3NextForCausalLM(config).to(torch.bfloat16).eval()


def qwen3_liger(layers: int = 4, hidden: int = 512):
    """transformers' dense Qwen3 (grouped-query attention with q/k norms) with Liger's RoPE, RMSNorm and SwiGLU
    patched in."""
    from liger_kernel.transformers.monkey_patch import apply_liger_kernel_to_qwen3
    from transformers import Qwen3Config, Qwen3ForCausalLM

    apply_liger_kernel_to_qwen3(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=False)
    config = Qwen3Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=64, vocab_size=1024,
                         max_position_embeddings=32768)
    with torch.device("meta"):
        return Qwen3ForCausalLM(config).to(torch.bfloat16).eval()


def qwen3_moe_liger(layers: int = 4, hidden: int = 512):
    """transformers' Qwen3-MoE (Qwen3-30B-A3B's architecture: a sparse MoE block in every layer, grouped-query
    attention with q/k norms) with Liger's RoPE, RMSNorm and SwiGLU patched in."""
    from liger_kernel.transformers.monkey_patch import apply_liger_kernel_to_qwen3_moe
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    apply_liger_kernel_to_qwen3_moe(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=False)
    config = Qwen3MoeConfig(hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=hidden // 2,
                            num_experts=8, num_experts_per_tok=2, num_hidden_layers=layers, num_attention_heads=8,
                            num_key_value_heads=2, head_dim=64, vocab_size=1024, max_position_embeddings=32768)
    with torch.device("meta"):
        return Qwen3MoeForCausalLM(config).to(torch.bfloat16).eval()


def fla_kda(layers: int = 2, hidden: int = 256):
    """fla's Kimi Delta Attention model (KDA layers, fla's norms and gated MLP)."""
    from fla.models import KDAConfig, KDAForCausalLM

    config = KDAConfig(hidden_size=hidden, num_hidden_layers=layers, num_heads=2, head_dim=64, vocab_size=1024)
    with torch.device("meta"):
        return KDAForCausalLM(config).to(torch.bfloat16).eval()
