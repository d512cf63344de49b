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
  recurrent step with an initial state);
- padded batches (an ``attention_mask``, as transformers' ``generate`` always passes one): the layer
  unpads them to one packed sequence with ``cu_seqlens`` (varlen kernels). The mask is given on the host
  with real values under ``HostIndices``, so fla's own unpadding and chunk-index code runs; activations
  stay on meta (and fla's index memo, shared by all threads, is off in the planning thread). A padded
  batch launches by the mode its padded length picks, its number of valid tokens and whether every
  sequence has one token (the convolution's update path); one batch per such class is planned
  (``padded_prefill_batches``), and every decode batch size with a mask. Off with
  ``EngineLimits(extra={"fla_padded": False})``.
- continued prefills, on request (``EngineLimits(extra={"fla_continued_prefill": True})``): a prompt
  prefilled onto a cache that already holds a state (a chat's next turn reusing its cache, chunked
  prefill) launches the convolution and the chunk kernels with an initial state, variants no plain
  prefill reaches. Every prefill shape (and padded batch, unless those are off) is planned again onto the
  state a one-token prefill leaves, all BACKGROUND. Off by default: it doubles the layer's planning
  forwards, and a server that starts every request from an empty cache never launches them.
The model's other fla modules (RMSNorm with its residual, GatedMLP...) are probed once in a meta forward
of the model and called with the same arguments at every prefill shape; those of fla's row-wise folders
(norms, MLPs, activations), which view their input as (rows, hidden), at every batch x tokens total
instead (one sequence of that many tokens), once a check at a few shapes confirms that a batch launches
what one sequence of its total does.
Not planned: explicit ``cu_seqlens`` of dtype int64 (the mask path makes int32 offsets; packed int32
``cu_seqlens`` launch as a padded batch of the same total does, except more than 64 one-token sequences
packed together).
Planning cost is one layer forward per shape on meta (a padded one costs more: fla's unpadding runs on the
host); scripts/bench/planning_cost.py measures it, docs/benchmarks.md has the figures.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from ..core.planning.limits import EngineLimits
from ..core.planning.planners import in_planner
from ..core.priority import Priority
from ..core.processes import fork_safe_lock
from .base import Claims, PlannedLaunch, Provider, imported, is_warmup_shape, warmup_token_counts
from .meta import MetaCaller, ProbedCall, layer_settings, probe, with_host_indices_if_needed

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
    members: tuple[int, ...] = ()  # ``id`` of every module whose every probed call this site plans
    by_rows: bool = False  # its launches depend on the token total alone (``launches_follow_rows``)


def prefill_shapes(limits: EngineLimits) -> Iterator[tuple[int, int]]:
    """(batch, tokens per sequence) of every prefill within the limits."""
    for batch in range(1, limits.max_batch_size + 1):
        for seq in range(1, max(1, min(limits.max_seq_len, limits.max_num_tokens // batch)) + 1):
            yield batch, seq


def token_totals(limits: EngineLimits) -> list[int]:
    """Every batch x tokens product some prefill shape within the limits has, ascending."""
    return sorted({batch * seq for batch, seq in prefill_shapes(limits)})


# fla modules that view their input as (rows, hidden): norms, gated MLPs and their activations
ROW_WISE_MODULES = ("fla.modules.norm", "fla.modules.mlp", "fla.modules.activations")
# (batch, tokens) shapes at which a row-wise module's launches are checked against one sequence of the
# same total: batches of each integer class (2, 3, 16, 17), token counts on both sides of fla's
# recurrent/chunk switch, and a total past 2048 rows (block counts such as cdiv(rows, 2048))
ROW_CHECK_SHAPES = ((2, 40), (3, 11), (16, 1), (17, 70), (5, 129), (3, 1400))


# GatedDeltaNet.forward (eval) runs fused_recurrent for a padded length up to this, chunk beyond
FUSED_RECURRENT_MAX_LEN = 64


@dataclass(frozen=True)
class PaddedBatch:
    """A padded prefill: each sequence's valid tokens, and the padded length of the batch."""

    lengths: tuple[int, ...]
    padded: int

    @property
    def batch(self) -> int:
        return len(self.lengths)

    def mask(self) -> torch.Tensor:
        """The host attention mask, padded on the left as generation pads decoder-only prompts."""
        mask = torch.zeros(self.batch, self.padded, dtype=torch.long)
        for row, length in enumerate(self.lengths):
            mask[row, self.padded - length:] = 1
        return mask


def padded_prefill_batches(limits: EngineLimits) -> Iterator[PaddedBatch]:
    """One padded batch per class that launches differently: the mode its padded length picks
    (one token; up to FUSED_RECURRENT_MAX_LEN: fused_recurrent; beyond: chunk), with every total of valid
    tokens that class reaches within the limits. Where sequences split those tokens does not change a
    launch (the varlen kernels take offsets as pointers); tests/test_providers.py checks this against
    random masks."""
    for shortest, longest, top in padded_modes(limits):
        for total in range(shortest, top + 1):
            found = _padded_batch(total, shortest, longest, limits)
            if found is not None:
                yield found


def padded_modes(limits: EngineLimits) -> Iterator[tuple[int, int, int]]:
    """(shortest, longest padded length, most valid tokens) of each mode a padded batch can launch by."""
    for shortest, longest in ((1, 1), (2, FUSED_RECURRENT_MAX_LEN), (FUSED_RECURRENT_MAX_LEN + 1, limits.max_seq_len)):
        longest = min(longest, limits.max_seq_len)
        if shortest <= longest:
            yield shortest, longest, min(limits.max_num_tokens, limits.max_batch_size * longest)


def _padded_batch(total: int, shortest: int, longest: int, limits: EngineLimits) -> PaddedBatch | None:
    """The batch with the fewest rows that has ``total`` valid tokens and a padded length in
    [shortest, longest]: one full row, the rest spread over rows of at least one token."""
    for batch in range(1, min(limits.max_batch_size, total) + 1):
        padded = max(shortest, -(-total // batch))
        if padded > longest or batch * padded > limits.max_num_tokens or total < padded + batch - 1:
            continue
        lengths, rest = [padded], total - padded
        for row in range(batch - 1):
            take = min(padded, rest - (batch - 2 - row))  # leave at least one token for each later row
            lengths.append(take)
            rest -= take
        return PaddedBatch(tuple(lengths), padded)
    return None


class FlaGatedDeltaNetProvider(Provider):
    name = "fla-gated-deltanet"
    library = "fla"
    modules = ("fla.ops.gated_delta_rule", "fla.modules")
    extra_limits = {"fla_padded": "plan padded batches (attention masks: varlen kernels); default True",
                    "fla_continued_prefill": "plan prefills onto a cache holding a state; default False"}

    def find_layers(self, model) -> list:
        GatedDeltaNet = getattr(imported("fla.layers"), "GatedDeltaNet", None)
        if GatedDeltaNet is None:  # fla's layers not imported (or fla-core alone): none in the model
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
            members: dict[tuple, list[int]] = {}
            for name, module in others:
                calls = seen.get(id(module), {})
                for call in calls:
                    if call.follows_tokens:
                        key = (layer_settings(module), call)
                        distinct.setdefault(key, ModuleSite(MetaCaller(module, inference=True), call, name))
                        if all(c.follows_tokens for c in calls):  # every call of it is planned
                            members.setdefault(key, []).append(id(module))
            for key, site in distinct.items():
                if isinstance(site, ModuleSite):
                    distinct[key] = dataclasses.replace(site, members=tuple(members.get(key, ())),
                                                        by_rows=launches_follow_rows(site))
        return list(distinct.values())

    def claims(self, model, sites: list) -> Claims:
        """Every GatedDeltaNet layer (one per settings is planned; the others launch the same), and the
        outer fla modules whose every probed call is planned at every shape."""
        GatedDeltaNet = getattr(imported("fla.layers"), "GatedDeltaNet", None)
        if GatedDeltaNet is None or not sites:
            return Claims()
        layers = [id(m) for m in model.modules() if isinstance(m, GatedDeltaNet)]
        outer = [member for site in sites if isinstance(site, ModuleSite) for member in site.members]
        return Claims(modules=frozenset(layers + outer))

    def launches(self, layers: list, limits: EngineLimits) -> Iterable[PlannedLaunch]:
        graphs = set(limits.cuda_graph_batch_sizes)
        warm = warmup_token_counts(limits)
        self.sampled = {}
        found = _class_points(layers, limits, self.sampled)
        for site in layers:
            if isinstance(site, ModuleSite) and site.by_rows:
                for total in _totals(site, limits, found.get((id(site), "totals"))):
                    yield PlannedLaunch(Priority.WARMUP if total in warm else Priority.BACKGROUND,
                                        lambda t=total, site=site: _module(site, 1, t), f"{site.label} tokens={total}")
                continue
            for batch, seq in _prefills(site, limits, found.get((id(site), "prefill"))):
                first = is_warmup_shape(limits, batch, seq)
                priority = Priority.WARMUP if first else Priority.BACKGROUND
                if isinstance(site, ModuleSite):
                    yield PlannedLaunch(priority, lambda b=batch, s=seq, site=site: _module(site, b, s),
                                        f"{site.label} B={batch} T={seq}")
                else:
                    yield PlannedLaunch(priority, lambda b=batch, s=seq, site=site: _prefill(site, b, s),
                                        f"{site.label} prefill B={batch} T={seq}")
            if not isinstance(site, GatedDeltaNetSite):
                continue
            padded = limits.extra.get("fla_padded", True)
            if padded:
                for shape in _padded_batches(site, limits, found):
                    first = is_warmup_shape(limits, shape.batch, shape.padded)
                    yield PlannedLaunch(Priority.WARMUP if first else Priority.BACKGROUND,
                                        lambda shape=shape, site=site: _padded_prefill(site, shape),
                                        f"{site.label} padded prefill lengths={list(shape.lengths)}")
            if site.cached and limits.extra.get("fla_continued_prefill", False):
                yield from _continued_prefills(site, limits, padded)
            if site.cached:
                for batch in range(1, limits.max_batch_size + 1):
                    priority = Priority.WARMUP if batch in graphs else Priority.BACKGROUND
                    yield PlannedLaunch(priority, lambda b=batch, site=site: _decode(site, b),
                                        f"{site.label} decode B={batch}")
                    if padded:
                        yield PlannedLaunch(priority, lambda b=batch, site=site: _decode(site, b, padded=True),
                                            f"{site.label} padded decode B={batch}")


def _class_points(layers: list, limits: EngineLimits,
                  sampled: dict[str, int]) -> dict[tuple, list[tuple[int, int]] | None]:
    """Per (site, part): the points whose calls reach every shape class of the part's launches
    (``shape_classes``, every part of every site searched together), or None where a value is unexplained;
    {} where shape classes are off. Parts: "prefill" (batch, tokens), "totals" (a row-wise site, as batch x
    tokens), and ("padded", shortest, longest) per padded mode (a space of one batch whose length is the
    valid-token total). ``sampled`` gets the calls each part's search made."""
    if not limits.extra.get("shape_classes", True):
        return {}
    from ..triton.launch_trace import traced
    from . import shape_classes

    prefill = shape_classes.Space("prefill", 1, limits.max_batch_size, limits.max_seq_len, limits.max_num_tokens)
    parts = []

    def add(site, part, label: str, space, launches_at) -> None:
        parts.append(((id(site), part), shape_classes.Problem(f"fla provider: {site.label}{label}", (space,),
                                                              lambda point: {space.name: launches_at(point)})))

    for site in layers:
        if isinstance(site, ModuleSite):
            rows = site.by_rows
            add(site, "totals" if rows else "prefill", "", prefill,
                lambda point, site=site, rows=rows: traced(lambda: _module(site, 1, point[0] * point[1]) if rows
                                                           else _module(site, *point)))
            continue
        add(site, "prefill", "", prefill, lambda point, site=site: traced(lambda: _prefill(site, *point)))
        if isinstance(site, GatedDeltaNetSite) and limits.extra.get("fla_padded", True):
            for shortest, longest, top in padded_modes(limits):
                def padded_at(point, site=site, shortest=shortest, longest=longest):
                    shape = _padded_batch(point[1], shortest, longest, limits)
                    return [] if shape is None else traced(lambda: _padded_prefill(site, shape))

                add(site, ("padded", shortest, longest), f" padded, lengths {shortest}-{longest}",
                    shape_classes.Space("padded", 1, 1, top), padded_at)
    return shape_classes.search_parts(parts, sampled)


def _prefills(site, limits: EngineLimits, points: list | None) -> Iterable[tuple[int, int]]:
    """The prefill shapes a site is called at: the warmup shape, then those that reach every class
    (``points``; every shape where None)."""
    if points is None:
        return prefill_shapes(limits)
    return list(dict.fromkeys([(1, min(limits.max_num_tokens, limits.max_seq_len))] + points))


def _padded_batches(site: GatedDeltaNetSite, limits: EngineLimits, found: dict) -> Iterable[PaddedBatch]:
    """The padded batches planned: per mode, those of the valid-token totals that reach every shape class;
    every total where shape classes are off or that mode is unexplained."""
    if not found:
        return padded_prefill_batches(limits)
    batches = []
    for shortest, longest, top in padded_modes(limits):
        points = found.get((id(site), ("padded", shortest, longest)))
        totals = range(shortest, top + 1) if points is None else sorted(n for _, n in points)
        batches.extend(b for b in (_padded_batch(t, shortest, longest, limits) for t in totals) if b is not None)
    return batches


def _totals(site: ModuleSite, limits: EngineLimits, points: list | None) -> Iterable[int]:
    """The token totals a row-wise site is called at (it launches what one sequence of the total does):
    the warmup totals, then those of the prefill shapes that reach every class (``points``; every total
    where None)."""
    if points is None:
        return token_totals(limits)
    warm = sorted(t for t in warmup_token_counts(limits) if t <= limits.max_num_tokens)
    return list(dict.fromkeys(warm + [batch * seq for batch, seq in points]))


def _continued_prefills(site: GatedDeltaNetSite, limits: EngineLimits, padded: bool) -> Iterator[PlannedLaunch]:
    """Every prefill shape (and padded batch) again, onto a cache holding a state; BACKGROUND: warmup
    starts from empty caches."""
    for batch, seq in prefill_shapes(limits):
        yield PlannedLaunch(Priority.BACKGROUND, lambda b=batch, s=seq: _continued_prefill(site, b, s),
                            f"{site.label} continued prefill B={batch} T={seq}")
    if padded:
        for shape in padded_prefill_batches(limits):
            yield PlannedLaunch(Priority.BACKGROUND,
                                lambda shape=shape: _continued_prefill(site, shape.batch, shape.padded, shape.mask()),
                                f"{site.label} padded continued prefill lengths={list(shape.lengths)}")


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


def launches_follow_rows(site: ModuleSite) -> bool:
    """Whether the module's launches at (batch, tokens) are those of one sequence of batch x tokens
    tokens, so that it is planned once per token total instead of once per shape. Only for fla's
    row-wise modules (``ROW_WISE_MODULES``: their launchers view the input as (rows, hidden), so a batch
    can enter a launch only through the row count), and checked at ``ROW_CHECK_SHAPES``, so that a module
    of those folders that reads the batch anyway (another fla version) keeps the per-shape plan."""
    from ..triton import capture

    module = type(site.caller.replica).__module__
    if not any(module == folder or module.startswith(folder + ".") for folder in ROW_WISE_MODULES):
        return False
    try:
        for batch, seq in ROW_CHECK_SHAPES:
            launched = []
            for shape in ((batch, seq), (1, batch * seq)):
                with capture() as plan:
                    _module(site, *shape)
                launched.append({r.predicted_hash for r in plan.requests})
            if launched[0] != launched[1]:
                log.info("fla: %s launches differently for a batch of %d x %d tokens than for one sequence of %d; "
                         "planned at every shape", site.label, batch, seq, batch * seq)
                return False
    except Exception as exc:  # the per-shape plan reports the failure where it happens
        log.info("fla: row check of %s failed (%s: %s); planned at every shape", site.label, type(exc).__name__, exc)
        return False
    return True


@torch.no_grad()
def _module(site: ModuleSite, batch: int, seq: int) -> None:
    args, kwargs = site.call.at(batch, seq)
    site.caller(*args, **kwargs)


def _hidden(site: GatedDeltaNetSite, batch: int, seq: int) -> torch.Tensor:
    return torch.empty(batch, seq, site.hidden, dtype=site.dtype, device="meta")


class _TensorCacheSwitch:
    """Stands in for ``fla.utils.FLA_DISABLE_TENSOR_CACHE``: true in a thread planning padded batches, the
    user's setting everywhere else.

    fla memoizes its varlen index helpers (``prepare_chunk_indices``...) in one deque per function, shared
    by every thread; a serving thread iterating one while planning appends to it raises "deque mutated
    during iteration". So planning threads skip the memo and recompute those small host tensors."""

    def __init__(self, setting) -> None:
        self.setting = setting
        self.local = threading.local()

    def __bool__(self) -> bool:
        return getattr(self.local, "planning", False) or bool(self.setting)


_switch_lock = fork_safe_lock()


@contextlib.contextmanager
def _padded_planning(padded: bool) -> Iterator[None]:
    """For a call with a host mask (``padded``): fla's shared index memo off in this thread; nothing
    otherwise, nor in a planner process, where no serving thread shares the memo."""
    if not padded or in_planner():
        yield
        return
    import fla.utils

    with _switch_lock:
        switch = getattr(fla.utils, "FLA_DISABLE_TENSOR_CACHE", False)
        if not isinstance(switch, _TensorCacheSwitch):
            switch = fla.utils.FLA_DISABLE_TENSOR_CACHE = _TensorCacheSwitch(switch)
    before = getattr(switch.local, "planning", False)
    switch.local.planning = True
    try:
        yield
    finally:
        switch.local.planning = before


def _prefill(site: GatedDeltaNetSite, batch: int, seq: int, mask: torch.Tensor | None = None):
    return with_host_indices_if_needed(lambda: _prefill_once(site, batch, seq, mask), mask is not None)


@torch.no_grad()
def _prefill_once(site: GatedDeltaNetSite, batch: int, seq: int, mask: torch.Tensor | None = None):
    from fla.models.utils import Cache

    padded = {} if mask is None else {"attention_mask": mask}
    with _padded_planning(mask is not None):
        if not site.cached:
            return site.caller(_hidden(site, batch, seq), **padded)
        cache = Cache()
        site.caller(_hidden(site, batch, seq), past_key_values=cache, use_cache=True, **padded)
        return cache


def _padded_prefill(site: GatedDeltaNetSite, shape: PaddedBatch):
    return _prefill(site, shape.batch, shape.padded, shape.mask())


def _continued_prefill(site: GatedDeltaNetSite, batch: int, seq: int, mask: torch.Tensor | None = None) -> None:
    """A prefill of ``seq`` tokens onto the state a one-token prefill left; ``mask``: the new tokens'
    columns of a padded batch (the earlier token's column is all ones, as generate extends a mask)."""
    with_host_indices_if_needed(lambda: _continued_prefill_once(site, batch, seq, mask), mask is not None)


@torch.no_grad()
def _continued_prefill_once(site: GatedDeltaNetSite, batch: int, seq: int, mask: torch.Tensor | None) -> None:
    first = None if mask is None else torch.ones(batch, 1, dtype=torch.long)
    cache = _prefill_once(site, batch, 1, first)
    extra = {} if mask is None else {"attention_mask": torch.cat([first, mask], dim=1)}
    with _padded_planning(mask is not None):
        site.caller(_hidden(site, batch, seq), past_key_values=cache, use_cache=True, **extra)


@torch.no_grad()
def _decode(site: GatedDeltaNetSite, batch: int, padded: bool = False) -> None:
    """One decode step after a one-token prefill (a one-token continued prefill); ``padded``: with the
    attention mask generation passes (one column per token so far)."""
    _continued_prefill(site, batch, 1, torch.ones(batch, 1, dtype=torch.long) if padded else None)
