"""Third-party kernel workloads (Liger-Kernel, flash-linear-attention) used by the tests, the
build-throughput benchmark and the helpers round trip on the GPU (scripts put the repository on their path).

Each workload calls the library's real Python launcher, so planning on meta tensors and running on a GPU
go through exactly the code a server runs; each also has a plain-torch reference for correctness checks.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Workload:
    name: str
    library: str  # the importable package it needs
    make_inputs: Callable[[str, int], tuple]  # (device, seed) -> inputs
    run: Callable[..., torch.Tensor]  # the library's launcher
    reference: Callable[..., torch.Tensor]  # plain torch, for checking results on a GPU
    atol: float = 2e-2
    rtol: float = 2e-2

    def max_violation(self, out: torch.Tensor, ref: torch.Tensor) -> float:
        """max(|out - ref| - (atol + rtol |ref|)); <= 0 means the output is correct."""
        out, ref = out.float(), ref.float()
        return float(((out - ref).abs() - (self.atol + self.rtol * ref.abs())).max())


def _randn(device: str, seed: int, *shape, dtype=torch.bfloat16) -> torch.Tensor:
    if device == "meta":
        return torch.empty(*shape, dtype=dtype, device="meta")
    g = torch.Generator(device="cpu").manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype=dtype, device=device)


# -- Liger-Kernel -------------------------------------------------------------------------------------------
def _rms_inputs(rows: int, cols: int):
    return lambda device, seed: (_randn(device, seed, rows, cols), _randn(device, seed + 1, cols))


def _liger_rms(x, w):
    from liger_kernel.ops.rms_norm import rms_norm_forward

    return rms_norm_forward(x, w, 1e-6, 0.0, "llama", None)[0]


def _ref_rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def _rope_inputs(device, seed, batch=2, seq=9, q_heads=16, kv_heads=4, head_dim=128):
    q = _randn(device, seed, batch, q_heads, seq, head_dim)
    k = _randn(device, seed + 1, batch, kv_heads, seq, head_dim)
    if device == "meta":
        cos = sin = torch.empty(1, seq, head_dim, dtype=torch.bfloat16, device="meta")
    else:
        pos = torch.arange(seq, dtype=torch.float32)
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.cat([torch.outer(pos, inv)] * 2, dim=-1)
        cos = freqs.cos()[None].to(torch.bfloat16).to(device)
        sin = freqs.sin()[None].to(torch.bfloat16).to(device)
    return q, k, cos, sin


def _liger_rope(q, k, cos, sin):
    from liger_kernel.ops.rope import rope_forward

    q_out, k_out, _, _ = rope_forward(q.clone(), k.clone(), cos, sin)
    return torch.cat([q_out.flatten(), k_out.flatten()])


def _ref_rope(q, k, cos, sin):
    def rotate(x):
        half = x.shape[-1] // 2
        return torch.cat([-x[..., half:], x[..., :half]], dim=-1)

    c, s = cos[:, None].float(), sin[:, None].float()
    q_out = (q.float() * c + rotate(q.float()) * s).to(q.dtype)
    k_out = (k.float() * c + rotate(k.float()) * s).to(k.dtype)
    return torch.cat([q_out.flatten(), k_out.flatten()])


def _glu_inputs(rows: int, cols: int):
    return lambda device, seed: (_randn(device, seed, rows, cols), _randn(device, seed + 1, rows, cols))


def _liger_swiglu(a, b):
    from liger_kernel.ops.swiglu import swiglu_forward

    return swiglu_forward(a, b)[2]


def _liger_geglu(a, b):
    from liger_kernel.ops.geglu import geglu_forward

    return geglu_forward(a, b)[2]


def _ln_inputs(rows: int, cols: int):
    return lambda device, seed: (_randn(device, seed, rows, cols), _randn(device, seed + 1, cols),
                                 _randn(device, seed + 2, cols))


def _liger_ln(x, w, b):
    from liger_kernel.ops.layer_norm import layer_norm_forward

    return layer_norm_forward(x, w, b, 1e-5)[0]


# -- flash-linear-attention ---------------------------------------------------------------------------------------
def _l2_inputs(batch: int, seq: int, heads: int, dim: int):
    return lambda device, seed: (_randn(device, seed, batch, seq, heads, dim),)


def _fla_l2norm(x):
    from fla.modules.norm.l2norm import l2norm_fwd

    return l2norm_fwd(x)[0]


def _ref_l2norm(x):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + 1e-6)).to(x.dtype)


def _gdn_inputs(batch: int, seq: int, heads: int, dim: int):
    def make(device, seed):
        q = _ref_l2norm(_randn(device, seed, batch, seq, heads, dim)) if device != "meta" else \
            _randn(device, seed, batch, seq, heads, dim)
        k = _ref_l2norm(_randn(device, seed + 1, batch, seq, heads, dim)) if device != "meta" else \
            _randn(device, seed + 1, batch, seq, heads, dim)
        v = _randn(device, seed + 2, batch, seq, heads, dim)
        g = _randn(device, seed + 3, batch, seq, heads, dtype=torch.float32)
        beta = _randn(device, seed + 4, batch, seq, heads)
        if device != "meta":
            g = torch.nn.functional.logsigmoid(g)
            beta = beta.sigmoid()
        return q, k, v, g, beta

    return make


def _fla_recurrent(q, k, v, g, beta):
    from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd

    return fused_recurrent_gated_delta_rule_fwd(q=q, k=k, v=v, g=g, beta=beta, scale=q.shape[-1] ** -0.5,
                                                initial_state=None, output_final_state=False)[0]


def _fla_chunk(q, k, v, g, beta):
    from fla.ops.gated_delta_rule.chunk import chunk_gated_delta_rule_fwd

    return chunk_gated_delta_rule_fwd(q=q, k=k, v=v, g=g, beta=beta, scale=q.shape[-1] ** -0.5,
                                      initial_state=None, output_final_state=False)[1]


def _ref_gated_delta(q, k, v, g, beta):
    """The gated delta rule, one token at a time (fla's naive recurrence)."""
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    batch, seq, heads, dim = q.shape
    state = torch.zeros(batch, heads, dim, v.shape[-1], device=q.device)
    out = torch.empty_like(v)
    scale = dim ** -0.5
    for t in range(seq):
        state = state * g[:, t, :, None, None].exp()
        kt, vt = k[:, t], v[:, t]
        delta = vt - torch.einsum("bhk,bhkv->bhv", kt, state)
        state = state + torch.einsum("bhk,bhv->bhkv", kt, delta * beta[:, t, :, None])
        out[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, state)
    return out.to(torch.bfloat16)


LIGER = (
    Workload("liger.rms_norm", "liger_kernel", _rms_inputs(7, 1024), _liger_rms, _ref_rms),
    Workload("liger.rms_norm_rows", "liger_kernel", _rms_inputs(40000, 128), _liger_rms, _ref_rms),
    Workload("liger.rope", "liger_kernel", _rope_inputs, _liger_rope, _ref_rope),
    Workload("liger.swiglu", "liger_kernel", _glu_inputs(9, 2048), _liger_swiglu,
             lambda a, b: (torch.nn.functional.silu(a.float()) * b.float()).to(a.dtype)),
    Workload("liger.geglu", "liger_kernel", _glu_inputs(9, 2048), _liger_geglu,
             lambda a, b: (torch.nn.functional.gelu(a.float(), approximate="tanh") * b.float()).to(a.dtype)),
    Workload("liger.layer_norm", "liger_kernel", _ln_inputs(9, 1024), _liger_ln,
             lambda x, w, b: torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(),
                                                            1e-5).to(x.dtype)),
)

FLA = (
    Workload("fla.l2norm", "fla", _l2_inputs(2, 100, 4, 128), _fla_l2norm, _ref_l2norm),
    Workload("fla.l2norm_wide", "fla", _l2_inputs(2, 100, 4, 1024), _fla_l2norm, _ref_l2norm),
    Workload("fla.gated_delta_recurrent", "fla", _gdn_inputs(1, 9, 4, 128), _fla_recurrent, _ref_gated_delta,
             atol=6e-2),
    Workload("fla.gated_delta_chunk", "fla", _gdn_inputs(1, 300, 4, 128), _fla_chunk, _ref_gated_delta,
             atol=1e-1),
)

ALL = LIGER + FLA


_MODULES = {"liger_kernel": ("liger_kernel.ops.rms_norm", "liger_kernel.ops.rope", "liger_kernel.ops.swiglu",
                             "liger_kernel.ops.geglu", "liger_kernel.ops.layer_norm"),
            "fla": ("fla.modules", "fla.ops.gated_delta_rule")}


def import_libraries(workloads=ALL) -> None:
    """Import the workloads' kernel modules up front (timings then exclude imports). On a machine without
    a GPU, call ``jit_ahead.triton.ensure_driver()`` first: flash-linear-attention reads the device when
    it is imported, and must see the same GPU as the helpers and the server."""
    for library in sorted({w.library for w in workloads}):
        if importlib.util.find_spec(library) is not None:
            for module in _MODULES.get(library, ()):
                importlib.import_module(module)


def available(workloads=ALL) -> tuple[Workload, ...]:
    return tuple(w for w in workloads if importlib.util.find_spec(w.library) is not None)


def by_name(names) -> tuple[Workload, ...]:
    index = {w.name: w for w in ALL}
    unknown = [n for n in names if n not in index]
    if unknown:
        raise ValueError(f"unknown workloads {unknown}; known: {sorted(index)}")
    return tuple(index[n] for n in names)


def sweep_launches(device: str = "meta"):
    """A larger variant set for build-throughput benchmarks: the workloads' launchers over the shapes,
    dtypes and modes a model zoo reaches (about 250 distinct variants, short and long builds mixed)."""
    from liger_kernel.ops.geglu import geglu_forward
    from liger_kernel.ops.layer_norm import layer_norm_forward
    from liger_kernel.ops.rms_norm import rms_norm_forward
    from liger_kernel.ops.rope import rope_forward
    from liger_kernel.ops.swiglu import swiglu_forward

    launches = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for hidden in (256, 512, 1024, 2048, 4096, 8192):
            x, w = _randn(device, 0, 7, hidden, dtype=dtype), _randn(device, 1, hidden, dtype=dtype)
            for mode in ("llama", "gemma", "none"):
                launches.append(lambda x=x, w=w, m=mode: rms_norm_forward(x, w, 1e-6, 0.0, m, None))
            launches.append(lambda x=x, w=w: layer_norm_forward(x, w, w, 1e-5))
            launches.append(lambda x=x: swiglu_forward(x, x))
            launches.append(lambda x=x: geglu_forward(x, x))
    for dtype in (torch.bfloat16, torch.float16):
        for head_dim in (64, 128):
            for q_heads, kv_heads in ((8, 8), (16, 4), (32, 8), (64, 8)):
                q = _randn(device, 0, 1, q_heads, 5, head_dim, dtype=dtype)
                k = _randn(device, 0, 1, kv_heads, 5, head_dim, dtype=dtype)
                cs = _randn(device, 0, 1, 5, head_dim, dtype=dtype)
                launches.append(lambda q=q, k=k, cs=cs: rope_forward(q, k, cs, cs))
    for dim in (64, 128, 256):
        launches.append(lambda d=dim: _fla_l2norm(_randn(device, 0, 2, 100, 4, d)))
    for dim in (64, 128):
        launches.append(lambda d=dim: _fla_chunk(*_gdn_inputs(1, 300, 4, d)(device, 0)))
    return launches
