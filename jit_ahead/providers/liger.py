"""Liger-Kernel as patched into transformers models (``apply_liger_kernel_to_*``).

How the reachable space is found:
- One probe forward of the model on meta tensors (one sequence of ``PROBE_TOKENS`` tokens) records, for
  each Liger layer, the shape and dtype of what it receives, and each call of Liger's RoPE. This is how a
  q_norm/k_norm RMSNorm is known to see ``tokens x heads`` rows, without knowing the architecture.
- Row-wise layers (RMSNorm incl. its block variant past 32768 rows, LayerNorm, SwiGLU, GeGLU) view their
  input as ``(rows, hidden)``: a batch of ``B`` sequences of ``S`` tokens launches exactly what one
  sequence of ``B*S`` tokens launches, so every token count 1..max(max_num_tokens, max_batch_size) is
  enumerated once. The probe also records the Liger ops (autograd Functions) each layer ran, with their
  arguments as templates; each token count calls those ops at that shape, which launches what the layer
  would without running its meta linears at every token count (much cheaper; docs/benchmarks.md). A
  layer whose ops got a non-contiguous view, or that ran none, is enumerated through its own forward.
- RoPE has the batch size and head counts as constexpr and the sequence length as a specialized int:
  every batch size with every sequence length it can have within the limits, prefill and decode, with
  cos/sin shared across the batch (no position ids) or batched (position ids, as ``generate`` passes).
- Both are planned with shape classes (``shape_classes``): a few traced calls explain how each launch's
  arguments follow the token count (or batch and sequence length), and only calls that reach every
  class are planned, the warmup shapes too; a value no form explains plans that part at every shape.
  ``EngineLimits(extra={"shape_classes": False})`` plans every shape.
- Cross entropy and fused linear cross entropy run in training only; with ``extra["liger_losses"]`` they
  are planned through transformers' loss function (CE) and Liger's causal LM loss (FLCE). Both read the
  number of non-ignored labels with ``.item()``, which becomes an int kernel argument: the launcher runs
  under ``MetaScalars`` once per integer specialization class of that count.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from ..core.planning.limits import EngineLimits
from ..core.priority import Priority
from ..core.thread_patch import patched_in_this_thread
from .base import Claims, PlannedLaunch, Provider, imported, is_warmup_shape, warmup_shapes, warmup_token_counts
from .meta import (FunctionCall, MetaCaller, MetaScalars, ProbedCall, int_class_representatives, layer_settings,
                   probe)

log = logging.getLogger("jit_ahead.providers.liger")

ROW_WISE = ("LigerRMSNorm", "LigerLayerNorm", "LigerSwiGLUMLP", "LigerGEGLUMLP")


def _row_wise_classes() -> tuple[type, ...]:
    lt = imported("liger_kernel.transformers")
    return tuple(getattr(lt, name) for name in ROW_WISE if hasattr(lt, name)) if lt is not None else ()


@dataclass(frozen=True)
class RowWiseSite:
    """A row-wise Liger layer and the call it gets (its input is ``(tokens, heads, head_dim)`` for q_norm),
    with the Liger ops that call ran (None: enumerated through the layer's own forward, by ``caller``)."""

    caller: MetaCaller | None  # only where there are no ops to replay: a replica costs a copy of the layer
    call: ProbedCall
    ops: tuple[FunctionCall, ...] | None
    label: str
    members: tuple[int, ...] = ()  # ``id`` of every layer that gets this call (the site plans them all)


@dataclass(frozen=True)
class RopeSite:
    q_heads: int
    kv_heads: int
    head_dim: int
    rotary_width: int  # last dim of cos/sin
    q_seq_major: bool  # q arrives as a (B, S, H, D) tensor transposed to (B, H, S, D), as transformers does
    dtype: torch.dtype
    cos_dtype: torch.dtype
    unsqueeze_dim: int
    rotary_dim: int | None  # passed explicitly by some models (GPT-OSS), else inferred from cos


@dataclass(frozen=True)
class LossSite:
    kind: str  # "cross_entropy" (over logits) or "fused_linear_cross_entropy" (over hidden states)
    hidden: int
    vocab: int
    dtype: torch.dtype
    lm_head: MetaCaller


def _recording_rope(calls: list) -> contextlib.AbstractContextManager:
    """Records each RoPE call this thread makes (another model's probe may run in another thread)."""
    import liger_kernel.ops.rope as rope_ops

    def recording(original, q, k, cos, sin, position_ids=None, unsqueeze_dim=1, rotary_dim=None):
        calls.append(RopeSite(q_heads=q.shape[1], kv_heads=k.shape[1], head_dim=q.shape[-1],
                              rotary_width=cos.shape[-1], q_seq_major=q.transpose(1, 2).is_contiguous(),
                              dtype=q.dtype, cos_dtype=cos.dtype, unsqueeze_dim=unsqueeze_dim,
                              rotary_dim=rotary_dim))
        return original(q, k, cos, sin, position_ids, unsqueeze_dim, rotary_dim)

    return patched_in_this_thread(rope_ops, "rope_forward", recording)


def _uses_liger_loss(model) -> bool:
    forward = getattr(type(model), "forward", None)
    bound = getattr(model, "forward", None)
    return any(getattr(f, "__module__", "").startswith("liger_kernel.")
               for f in (forward, getattr(bound, "__func__", None)))


def _liger_cross_entropy_patched() -> bool:
    """``apply_liger_kernel_to_*(cross_entropy=True)`` swaps transformers' loss cross entropy."""
    try:
        from transformers.loss.loss_utils import nn
    except ImportError:
        return False
    return getattr(nn.functional.cross_entropy, "__module__", "").startswith("liger_kernel.")


class LigerProvider(Provider):
    name = "liger-kernel"
    library = "liger_kernel"
    modules = ("liger_kernel.ops",)
    extra_limits = {"liger_losses": "plan cross entropy and fused linear cross entropy; default False"}

    def find_layers(self, model) -> list:
        if imported("liger_kernel") is None:  # nothing of the model's comes from Liger
            return []
        classes = _row_wise_classes()
        layers = [(name, m) for name, m in model.named_modules() if isinstance(m, classes)]
        if not layers and not _uses_liger_loss(model):
            return []
        rope_calls: list[RopeSite] = []
        try:
            seen = probe(model, [m for _, m in layers], _recording_rope(rope_calls), functions_from="liger_kernel.")
        except Exception as exc:
            log.warning("liger-kernel: probe forward of %s on meta failed (%s: %s); its layers are not "
                        "planned", type(model).__name__, type(exc).__name__, exc)
            return []
        distinct: dict[tuple, RowWiseSite] = {}
        members: dict[tuple, list[int]] = {}
        for name, module in layers:
            for call, ops in seen.calls.get(id(module), {}).items():
                if not call.follows_tokens:
                    log.warning("liger-kernel: %s got no input with a token dimension in the probe; "
                                "not planned", name)
                    continue
                signature = (layer_settings(module), call, ops)
                if signature not in distinct:  # the layers of a stack launch the same variants: plan one
                    distinct[signature] = RowWiseSite(None if ops else MetaCaller(module), call, ops, name)
                members.setdefault(signature, []).append(id(module))
        partly = {id(module) for _, module in layers
                  if any(not call.follows_tokens for call in seen.calls.get(id(module), {}))}
        sites: list = [dataclasses.replace(site, members=tuple(m for m in members[signature] if m not in partly))
                       for signature, site in distinct.items()]
        sites.extend(dict.fromkeys(rope_calls))  # one site per distinct RoPE layout
        lm_head = getattr(model, "lm_head", None)
        config = getattr(model, "config", None)
        if isinstance(lm_head, torch.nn.Linear) and config is not None:
            dtype = lm_head.weight.dtype
            hidden, vocab = lm_head.in_features, lm_head.out_features
            kind = ("fused_linear_cross_entropy" if _uses_liger_loss(model)
                    else "cross_entropy" if _liger_cross_entropy_patched() else None)
            if kind:
                sites.append(LossSite(kind, hidden, vocab, dtype, MetaCaller(lm_head)))
        return sites

    def claims(self, model, sites: list) -> Claims:
        """The row-wise layers whose every probed call is planned at every token count, and RoPE's
        kernel wherever it is called from (every RoPE call of the probe is planned at every shape)."""
        modules = {member for site in sites if isinstance(site, RowWiseSite) for member in site.members}
        kernels = {"_triton_rope"} if any(isinstance(site, RopeSite) for site in sites) else set()
        return Claims(frozenset(modules), frozenset(kernels))

    def launches(self, layers: list, limits: EngineLimits) -> Iterable[PlannedLaunch]:
        warm = warmup_token_counts(limits)
        self.sampled = {}
        found = _class_points(layers, limits, self.sampled)
        for site in layers:
            if isinstance(site, RowWiseSite):
                yield from _row_wise(site, limits, warm, found.get((id(site), "rows")))
            elif isinstance(site, RopeSite):
                yield from _rope(site, limits, found)
            elif isinstance(site, LossSite) and limits.extra.get("liger_losses"):
                yield from _losses(site, limits)


def _class_points(layers: list, limits: EngineLimits,
                  sampled: dict[str, int]) -> dict[tuple, list[tuple[int, int]] | None]:
    """Per (site, part): the points whose calls reach every shape class of the part's launches
    (``shape_classes``, all parts searched together), or None where a value is unexplained; {} where
    shape classes are off. Parts: "rows" (a row-wise site: (1, token count)), ("rope", shared) (RoPE at
    (batch, sequence length), cos/sin shared across the batch or not). ``sampled`` gets the calls each
    part's search made."""
    if not limits.extra.get("shape_classes", True):
        return {}
    from ..triton.launch_trace import traced
    from . import shape_classes

    rows = shape_classes.Space("rows", 1, 1, max(limits.max_num_tokens, limits.max_batch_size))
    rope = shape_classes.Space("rope", 1, limits.max_batch_size, limits.max_seq_len, limits.max_num_tokens)
    parts = []
    for site in layers:
        if isinstance(site, RowWiseSite):
            parts.append(((id(site), "rows"), shape_classes.Problem(
                f"liger provider: {site.label}", (rows,),
                lambda point, site=site: {"rows": traced(lambda: _run_rows(site, point[1]))})))
        elif isinstance(site, RopeSite):
            for shared in (True, False):
                parts.append(((id(site), ("rope", shared)), shape_classes.Problem(
                    f"liger provider: rope{' (cos/sin per row)' if not shared else ''}", (rope,),
                    lambda point, site=site, shared=shared: {"rope": traced(
                        lambda: _run_rope(site, point[0], point[1], 1 if shared else point[0]))})))
    return shape_classes.search_parts(parts, sampled)


@torch.no_grad()
def _run_rows(site: RowWiseSite, tokens: int) -> None:
    if site.ops:  # the ops the layer ran in the probe, at this shape: the layer's launches, faster
        for op in site.ops:
            op.at(1, tokens)
        return
    args, kwargs = site.call.at(1, tokens)
    site.caller(*args, **kwargs)


def _row_wise(site: RowWiseSite, limits: EngineLimits, warm: set[int],
              points: list | None) -> Iterator[PlannedLaunch]:
    """Every token count, or (``points``) the warmup ones and those that reach every shape class."""
    top = max(limits.max_num_tokens, limits.max_batch_size)
    counts = range(1, top + 1) if points is None else \
        dict.fromkeys(sorted(t for t in warm if t <= top) + [n for _, n in points])
    for tokens in counts:
        yield PlannedLaunch(Priority.WARMUP if tokens in warm else Priority.BACKGROUND,
                            lambda t=tokens: _run_rows(site, t), f"{site.label} tokens={tokens}")


def rope_shapes(limits: EngineLimits) -> Iterator[tuple[int, int]]:
    """(batch, sequence length) pairs a forward can pass to RoPE: decode (S=1) up to max_batch_size,
    prefill up to max_num_tokens tokens in all and max_seq_len per sequence."""
    for batch in range(1, limits.max_batch_size + 1):
        longest = max(1, min(limits.max_seq_len, limits.max_num_tokens // batch))
        for seq in range(1, longest + 1):
            yield batch, seq


@torch.no_grad()
def _run_rope(site: RopeSite, batch: int, seq: int, cos_batch: int) -> None:
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    if site.q_seq_major:
        q = torch.empty(batch, seq, site.q_heads, site.head_dim, dtype=site.dtype, device="meta").transpose(1, 2)
        k = torch.empty(batch, seq, site.kv_heads, site.head_dim, dtype=site.dtype, device="meta").transpose(1, 2)
    else:
        q = torch.empty(batch, site.q_heads, seq, site.head_dim, dtype=site.dtype, device="meta")
        k = torch.empty(batch, site.kv_heads, seq, site.head_dim, dtype=site.dtype, device="meta")
    cos = torch.empty(cos_batch, seq, site.rotary_width, dtype=site.cos_dtype, device="meta")
    liger_rotary_pos_emb(q, k, cos, cos, None, site.unsqueeze_dim, site.rotary_dim)


def _rope(site: RopeSite, limits: EngineLimits, found: dict) -> Iterator[PlannedLaunch]:
    """Every (batch, sequence length) with cos/sin shared across the batch and per row; or (``found``)
    the warmup shapes and those that reach every shape class, per sharing."""
    for shared in (True, False):
        points = found.get((id(site), ("rope", shared)))
        shapes = rope_shapes(limits) if points is None else dict.fromkeys(warmup_shapes(limits) + points)
        for batch, seq in shapes:
            cos_batch = 1 if shared else batch
            if not shared and batch == 1:  # the same call as shared
                continue
            first = is_warmup_shape(limits, batch, seq)
            yield PlannedLaunch(Priority.WARMUP if first else Priority.BACKGROUND,
                                lambda b=batch, s=seq, c=cos_batch: _run_rope(site, b, s, c),
                                f"rope B={batch} S={seq} cos_batch={cos_batch}")


def _losses(site: LossSite, limits: EngineLimits) -> Iterator[PlannedLaunch]:
    from transformers.loss.loss_utils import ForCausalLMLoss

    from liger_kernel.transformers.model.loss_utils import LigerForCausalLMLoss

    def run(tokens: int, labelled: int) -> None:
        labels = torch.empty(1, tokens, dtype=torch.long, device="meta")
        with MetaScalars(labelled):
            if site.kind == "fused_linear_cross_entropy":
                hidden = torch.empty(1, tokens, site.hidden, dtype=site.dtype, device="meta", requires_grad=True)
                LigerForCausalLMLoss(hidden, site.lm_head.tensor("weight"), labels, site.hidden)
            else:
                logits = torch.empty(1, tokens, site.vocab, dtype=site.dtype, device="meta", requires_grad=True)
                ForCausalLMLoss(logits, labels, site.vocab)

    for tokens in range(1, limits.max_num_tokens + 1):
        for labelled in int_class_representatives(tokens):
            yield PlannedLaunch(Priority.BACKGROUND, lambda t=tokens, n=labelled: run(t, n),
                                f"{site.kind} tokens={tokens} labelled={labelled}")
