"""flash-linear-attention (``fla``): the GatedDeltaNet layer family.

Each distinct GatedDeltaNet layer (layers of a stack with equal settings launch the same variants) runs
its own forward on meta tensors, in eval mode and without gradients as a server runs it, with a fresh
fla ``Cache`` as transformers generation passes it:
- prefill: every batch size with every sequence length it can have within the limits. The layer picks
  ``fused_recurrent`` for up to 64 tokens and ``chunk`` beyond, so both modes and the switch are reached
  through its own logic. This runs the short convolutions (with their final-state kernels), l2norm of
  q/k, the gates and the gated RMSNorm; every pruned config of each autotuned kernel is requested by the
  capture;
- decode: every batch size, one token with the state a one-token prefill left (convolution update and
  recurrent step with an initial state).
The model's other fla modules (RMSNorm with its residual, GatedMLP...) are probed once in a meta forward
of the model and called with the same arguments at every prefill shape.
Not planned: padded batches with an attention mask (fla unpads them to varlen with ``cu_seqlens``, whose
chunk indices are read back with ``.tolist()``), and prefill continuing from a state (chunked prefill).
Planning cost is one layer forward per shape, about 2.4 ms on meta on the H200 host; see
scripts/bench/planning_cost.py.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from ..core.limits import EngineLimits
from ..core.priority import Priority
from .base import PlannedLaunch, Provider, is_warmup_shape
from .meta import MetaCaller, ProbedCall, layer_settings, probe

log = logging.getLogger("jit_ahead.providers.fla")


@dataclass(frozen=True)
class GatedDeltaNetSite:
    caller: MetaCaller
    hidden: int
    dtype: torch.dtype
    cached: bool  # the layer has a layer_idx, so it can take a generation cache
    label: str


@dataclass(frozen=True)
class ModuleSite:
    """An fla module outside the GatedDeltaNet layers (the model's RMSNorm, GatedMLP...) and the call it
    got in the probe forward."""

    caller: MetaCaller
    call: ProbedCall
    label: str


def prefill_shapes(limits: EngineLimits) -> Iterator[tuple[int, int]]:
    """(batch, tokens per sequence) of every prefill within the limits."""
    for batch in range(1, limits.max_batch_size + 1):
        for seq in range(1, max(1, min(limits.max_seq_len, limits.max_num_tokens // batch)) + 1):
            yield batch, seq


class FlaGatedDeltaNetProvider(Provider):
    name = "fla-gated-deltanet"
    library = "fla"
    modules = ("fla.ops.gated_delta_rule", "fla.modules")

    def find_layers(self, model) -> list:
        try:
            from fla.layers import GatedDeltaNet
        except ImportError:  # fla-core alone has the ops but not the layers
            return []
        layers = [(name, m) for name, m in model.named_modules() if isinstance(m, GatedDeltaNet)]
        if not layers:
            return []
        distinct: dict[tuple, object] = {}
        for name, module in layers:
            distinct.setdefault(layer_settings(module), GatedDeltaNetSite(
                MetaCaller(module, inference=True), module.hidden_size, module.q_proj.weight.dtype,
                getattr(module, "layer_idx", None) is not None, name or type(module).__name__))
        others = _outer_fla_modules(model, GatedDeltaNet)
        if others and hasattr(model, "config"):
            try:
                seen = probe(model, [m for _, m in others]).calls
            except Exception as exc:
                log.warning("fla: probe forward of %s on meta failed (%s: %s); only its GatedDeltaNet "
                            "layers are planned", type(model).__name__, type(exc).__name__, exc)
                seen = {}
            for name, module in others:
                for call in seen.get(id(module), {}):
                    if call.follows_tokens:
                        distinct.setdefault((layer_settings(module), call),
                                            ModuleSite(MetaCaller(module, inference=True), call, name))
        return list(distinct.values())

    def launches(self, layers: list, limits: EngineLimits) -> Iterable[PlannedLaunch]:
        graphs = set(limits.cuda_graph_batch_sizes)
        for site in layers:
            for batch, seq in prefill_shapes(limits):
                first = is_warmup_shape(limits, batch, seq)
                priority = Priority.WARMUP if first else Priority.BACKGROUND
                if isinstance(site, ModuleSite):
                    yield PlannedLaunch(priority, lambda b=batch, s=seq, site=site: _module(site, b, s),
                                        f"{site.label} B={batch} T={seq}")
                else:
                    yield PlannedLaunch(priority, lambda b=batch, s=seq, site=site: _prefill(site, b, s),
                                        f"{site.label} prefill B={batch} T={seq}")
            if isinstance(site, GatedDeltaNetSite) and site.cached:
                for batch in range(1, limits.max_batch_size + 1):
                    yield PlannedLaunch(Priority.WARMUP if batch in graphs else Priority.BACKGROUND,
                                        lambda b=batch, site=site: _decode(site, b),
                                        f"{site.label} decode B={batch}")


def _outer_fla_modules(model, layer_class) -> list:
    """fla.modules layers not inside a GatedDeltaNet layer or another such module (those are planned
    through their parent's forward)."""
    found, covered = [], []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in covered):
            continue
        if isinstance(module, layer_class):
            covered.append(name)
        elif type(module).__module__.startswith("fla.modules"):
            found.append((name, module))
            covered.append(name)
    return found


@torch.no_grad()
def _module(site: ModuleSite, batch: int, seq: int) -> None:
    args, kwargs = site.call.at(batch, seq)
    site.caller(*args, **kwargs)


def _hidden(site: GatedDeltaNetSite, batch: int, seq: int) -> torch.Tensor:
    return torch.empty(batch, seq, site.hidden, dtype=site.dtype, device="meta")


@torch.no_grad()
def _prefill(site: GatedDeltaNetSite, batch: int, seq: int):
    from fla.models.utils import Cache

    if not site.cached:
        return site.caller(_hidden(site, batch, seq))
    cache = Cache()
    site.caller(_hidden(site, batch, seq), past_key_values=cache, use_cache=True)
    return cache


@torch.no_grad()
def _decode(site: GatedDeltaNetSite, batch: int) -> None:
    cache = _prefill(site, batch, 1)
    site.caller(_hidden(site, batch, 1), past_key_values=cache, use_cache=True)
