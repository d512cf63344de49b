"""The model-level planner: what a model's own forward launches, for any model that takes token ids.

No provider has to know the model's layers: transformers', vLLM's or an engine's own layer classes that
call Liger, fla or any other Triton library are planned through the model's forward, on a meta replica,
at every shape within the limits:
- prefill, every (batch, prompt length) within the limits, without a cache and with the cache the model
  makes (``use_cache=True``), then one decode step on that cache: every batch size at every cache length
  a prefill within the limits leaves;
- decode at the longer cache lengths a batch reaches by decoding (beyond what one prefill of that batch
  can hold): the cache is filled by one prefill of that length whose launches are not kept, then one
  step is decoded. The lengths are those that change a Triton specialization or a power-of-two
  bucket: 1..64, each power of two and its neighbours, and ``max_seq_len - 1``;
- padded batches (an attention mask), when a padded probe launches anything an unpadded one does not:
  one left-padded batch per (batch, length), every row but the first one token long;
- explicit position ids (``position_ids``, one row per sequence, as ``generate`` and engines pass them),
  when a probe with them launches anything one without does not (Liger's RoPE takes cos/sin per row
  then): every request above again with position ids, padded ones too.

What makes it affordable, each checked before it is used: the launches of the probe shapes (a short
and a longer prefill, the longest prefill and the largest decode batch within the limits) with the
stand-ins below must equal those without, or the stand-ins are dropped, the quiet modules' first, then
the providers', and planning stays exact at the cost of running those modules:
- layers of a stack with equal settings launch the same variants: all but the first of each kind are
  replaced by a stand-in that passes its input through (the model still runs its own per-layer code);
- modules a provider plans in full (``Provider.claims``) are stood in for, and their kernels, wherever a
  provider claims them, are left to that provider;
- modules that launched no kernel at any probe shape (attention through torch's SDPA, projections,
  embeddings...) are stood in for: a module that launches a kernel only at shapes none of the probes
  reaches is missed. ``EngineLimits(extra={"model_planner": False})`` or ``JIT_AHEAD_MODEL_PLANNER=off``
  turns the model planner off.
A stand-in replaces a module only if its output, in the probe, was one of its inputs, a tensor of an
input's shape and dtype, or a constant (or a tuple of those). When nothing outside the providers'
claims launches a kernel, the model planner plans nothing.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from ..core.planning.limits import EngineLimits
from ..core.priority import Priority
from . import forked_planning, shape_classes
from .base import Claims, PlannedLaunch, Provider, is_warmup_shape, warmup_shapes
from .device_gates import meta_stands_for_the_gpu
from .meta import MetaCaller, layer_settings, meta_reads_answered, with_host_indices_if_needed

log = logging.getLogger("jit_ahead.providers.model")

# attributes that number a layer in its stack without changing what it launches
POSITION_ATTRIBUTES = ("layer_idx", "layer_id", "layer_number", "layer_index", "idx")


# -- forwards ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Calling:
    """How the model's forward is called: the keyword its cache goes by (None: it takes none), whether
    it takes ``use_cache``, an ``attention_mask`` and ``position_ids``."""

    cache_keyword: str | None
    use_cache: bool
    mask: bool = False
    positions: bool = False

    @classmethod
    def of(cls, model: torch.nn.Module) -> "Calling | None":
        try:
            parameters = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            return None
        if "input_ids" not in parameters:
            return None
        keyword = next((k for k in ("cache", "past_key_values") if k in parameters), None)
        return cls(keyword, "use_cache" in parameters, "attention_mask" in parameters, "position_ids" in parameters)


@dataclass(frozen=True)
class Convention:
    """What a request passes beside the token ids: a left-padded attention mask, position ids."""

    padded: bool = False
    positions: bool = False


PLAIN = Convention()


def _ids(batch: int, tokens: int) -> torch.Tensor:
    return torch.empty(batch, tokens, dtype=torch.long, device="meta")


def _extra(batch: int, tokens: int, mask: torch.Tensor | None, positions: bool) -> dict:
    """The keywords beside the token ids: the mask, and position ids of this step's tokens (only their
    shape and dtype reach a kernel; values read back are answered on meta)."""
    extra = {} if mask is None else {"attention_mask": mask}
    if positions:
        extra["position_ids"] = _ids(batch, tokens)
    return extra


def _cache_of(output):
    for name in ("cache", "past_key_values"):
        cache = getattr(output, name, None)
        if cache is not None:
            return cache
    return None


@dataclass(frozen=True)
class Forwards:
    """The forwards the sweep runs on one meta replica of the model."""

    caller: MetaCaller
    calling: Calling

    @torch.no_grad()
    def prefill(self, batch: int, tokens: int, mask: torch.Tensor | None = None, positions: bool = False):
        """One prefill without a cache; with a cache (when the model takes one), that cache."""
        extra = _extra(batch, tokens, mask, positions)
        with meta_reads_answered(), meta_stands_for_the_gpu():
            if self.calling.use_cache:
                self.caller(input_ids=_ids(batch, tokens), use_cache=False, **extra)
                return _cache_of(self.caller(input_ids=_ids(batch, tokens), use_cache=True, **extra))
            self.caller(input_ids=_ids(batch, tokens), **extra)
            return None

    @torch.no_grad()
    def extend(self, cache, batch: int, tokens: int, mask: torch.Tensor | None = None, positions: bool = False):
        """``tokens`` more per row onto ``cache`` (a decode step when 1); the cache after."""
        extra = _extra(batch, tokens, mask, positions)
        with meta_reads_answered(), meta_stands_for_the_gpu():
            out = self.caller(input_ids=_ids(batch, tokens), use_cache=True, **{self.calling.cache_keyword: cache},
                              **extra)
        after = _cache_of(out)
        return cache if after is None else after

    @property
    def cached(self) -> bool:
        return self.calling.use_cache and self.calling.cache_keyword is not None


def left_padded_mask(batch: int, tokens: int) -> torch.Tensor:
    """A host mask of ``batch`` rows padded on the left to ``tokens``: the first row full, the others one
    token long (as generate pads a batch with one long prompt)."""
    mask = torch.zeros(batch, tokens, dtype=torch.long)
    mask[0] = 1
    mask[1:, -1] = 1
    return mask


def _untraced(phase: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def _request(forwards: Forwards, batch: int, tokens: int, longest: int, convention: Convention,
             phase: Callable[[str], contextlib.AbstractContextManager] = _untraced) -> None:
    """A prefill of (batch, tokens), and one decode step on its cache while it stays within ``longest``;
    each inside ``phase("prefill")`` and ``phase("decode")`` (shape classes trace them there)."""
    mask = left_padded_mask(batch, tokens) if convention.padded else None
    with phase("prefill"):
        cache = forwards.prefill(batch, tokens, mask, convention.positions)
    if cache is not None and forwards.cached and tokens < longest:
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
        with phase("decode"):
            forwards.extend(cache, batch, 1, mask, convention.positions)


def request(forwards: Forwards, batch: int, tokens: int, longest: int, convention: Convention = PLAIN,
            phase: Callable[[str], contextlib.AbstractContextManager] = _untraced) -> None:
    with_host_indices_if_needed(lambda: _request(forwards, batch, tokens, longest, convention, phase),
                                convention.padded)


def long_decode(forwards: Forwards, batch: int, length: int, positions: bool = False,
                phase: Callable[[str], contextlib.AbstractContextManager] = _untraced) -> None:
    """One decode step of ``batch`` rows on a cache of ``length`` tokens (inside ``phase("decode")``). The
    cache is filled by one prefill of ``length`` tokens whose launches are not kept: it may exceed the token
    limit (a server reaches that cache by decoding), and its launches are not planned here."""
    from ..triton import capture

    with capture():  # the inner capture keeps the filling launches out of the planning one
        cache = forwards.prefill(batch, length, positions=positions)
    with phase("decode"):
        forwards.extend(cache, batch, 1, positions=positions)


def decode_lengths(upper: int) -> list[int]:
    """Cache lengths 1..upper that change an integer's Triton class or a power-of-two bucket."""
    found = set(range(1, min(upper, 64) + 1)) | {upper}
    power = 64
    while power <= upper:
        found |= {power - 1, power, power + 1}
        power *= 2
    return sorted(n for n in found if 1 <= n <= upper)


# -- stand-ins -----------------------------------------------------------------------------------------------
Where = tuple  # ("arg", index) or ("kw", name)


@dataclass(frozen=True)
class OutputPlan:
    """How a stand-in makes a module's output from its inputs: ("same", where) the input itself,
    ("like", where) a new meta tensor of that input's shape and dtype, ("const", value), or
    ("seq", type, parts)."""

    kind: str
    value: object = None
    parts: tuple = ()

    @classmethod
    def of(cls, args: tuple, kwargs: dict, output) -> "OutputPlan | None":
        inputs = [(("arg", i), v) for i, v in enumerate(args)] + [(("kw", k), v) for k, v in kwargs.items()]

        def plan(value) -> OutputPlan | None:
            if value is None or isinstance(value, (bool, int, float, str)):
                return cls("const", value)
            for where, given in inputs:
                if given is value:
                    return cls("same", where)
            if isinstance(value, torch.Tensor):
                for where, given in inputs:
                    if isinstance(given, torch.Tensor) and given.shape == value.shape and given.dtype == value.dtype:
                        return cls("like", where)
                return None
            if type(value) in (tuple, list):
                parts = [plan(v) for v in value]
                return None if any(p is None for p in parts) else cls("seq", type(value), tuple(parts))
            return None

        return plan(output)

    def make(self, args: tuple, kwargs: dict):
        if self.kind == "const":
            return self.value
        if self.kind == "seq":
            return self.value(part.make(args, kwargs) for part in self.parts)
        side, key = self.value
        given = (args[key] if key < len(args) else None) if side == "arg" else kwargs.get(key)
        if not isinstance(given, torch.Tensor) and self.kind == "like":
            raise LookupError(key)
        if self.kind == "same":
            return given
        return torch.empty(given.shape, dtype=given.dtype, device="meta")


class _StandIn:
    """Replaces one replica module's forward: its output made from its inputs by ``plan``; a call that
    does not have the input the plan names runs the module's own forward."""

    def __init__(self, plan: OutputPlan, forward) -> None:
        self.plan = plan
        self.forward = forward

    def __call__(self, *args, **kwargs):
        try:
            return self.plan.make(args, kwargs)
        except (LookupError, IndexError):
            return self.forward(*args, **kwargs)


def repeated_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Layers of a ``ModuleList`` whose settings equal an earlier layer's in it (all but the first of
    each kind)."""
    found = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1:
            kinds: set = set()
            for layer in module:
                kind = layer_settings(layer, POSITION_ATTRIBUTES)
                if kind in kinds:
                    found.append(layer)
                kinds.add(kind)
    return found


# -- the provider --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSite:
    forwards: Forwards
    padded: bool  # a padded probe launched something an unpadded one did not
    standing_in: int  # modules replaced by stand-ins
    label: str
    positions: bool = False  # a probe with position ids launched something one without did not

    @property
    def conventions(self) -> list[Convention]:
        return [Convention(padded, positions) for positions in (False, True)[:1 + self.positions]
                for padded in (False, True)[:1 + self.padded]]


@dataclass
class _Reference:
    """What the full replica launched at the probe shapes: all of it, and what it launched outside the
    claimed modules; for each module, its first call's output plan and whether it launched anything."""

    everything: set = field(default_factory=set)
    outside: set = field(default_factory=set)
    names: dict = field(default_factory=dict)  # predicted hash -> kernel name
    outputs: dict = field(default_factory=dict)  # id(model's module) -> OutputPlan or None
    launching: set = field(default_factory=set)  # id(model's module) of modules that launched a kernel
    launching_unclaimed: set = field(default_factory=set)  # ... one no provider claims

    def unclaimed(self, launched: set, claims: Claims) -> set:
        return {h for h in launched if self.names.get(h) not in claims.kernels}


@dataclass
class _Running:
    """A module in its forward during the reference probe."""

    key: int
    capture: object
    stack: contextlib.ExitStack
    claimed: bool  # it or a module around it is claimed
    args: tuple
    kwargs: dict
    launched: bool = False
    launched_unclaimed: bool = False


def probe_shapes(limits: EngineLimits) -> list[tuple[int, int]]:
    """(batch, tokens) where stand-ins are checked, each a prefill without and with a cache and a
    decode step: a short sequence, a batch of two past 64 tokens (where chunked kernels take over from
    recurrent ones), the longest prefill and the largest batch within the limits. Only compared, never
    planned."""
    longest = max(1, min(limits.max_seq_len - 1, limits.max_num_tokens))
    return list(dict.fromkeys([(1, min(11, longest)), (2, 70), (1, longest), (limits.max_batch_size, 1)]))


class _Stopped(Exception):
    """Planning was cancelled during the probe."""


class ModelProvider(Provider):
    """Plans any model through its own forward; it runs after the library providers and leaves out what
    they claim (``Provider.claims``)."""

    name = "model"
    library = "torch"
    extra_limits = {"model_planner": "plan the model's own forward beyond what providers claim; default True",
                    "shape_classes": "plan a few calls per shape class instead of every shape; default True"}
    sees_claims = True
    modules = ()
    _stop: Callable[[], bool] = staticmethod(lambda: False)

    def find_layers(self, model, claims: Claims = Claims(), limits: EngineLimits = EngineLimits(),
                    stop: Callable[[], bool] = lambda: False) -> list:
        """``stop``: true once planning is cancelled (the process is closing); the probe forwards end at
        the next shape."""
        try:
            return self._find(model, claims, limits, stop)
        except _Stopped:
            return []

    def _find(self, model, claims: Claims, limits: EngineLimits, stop: Callable[[], bool]) -> list:
        self._stop = stop
        calling = Calling.of(model)
        if calling is None:
            log.info("model planner: %s.forward takes no input_ids; not planned as a whole", type(model).__name__)
            return []
        if not limits.extra.get("model_planner", True):
            return []
        shapes = probe_shapes(limits)
        claimed = [m for m in model.modules() if id(m) in claims.modules]
        try:
            if claimed and self._claims_cover(model, calling, claims, claimed, shapes):
                log.info("model planner: %s launches nothing beyond what providers plan", type(model).__name__)
                return []
            reference = self._reference(model, calling, claims, shapes)
        except _Stopped:
            raise
        except Exception as exc:
            log.warning("model planner: a meta forward of %s failed (%s: %s); only what providers found is "
                        "planned", type(model).__name__, type(exc).__name__, exc)
            return []
        if not reference.unclaimed(reference.outside, claims):
            log.info("model planner: %s launches nothing beyond what providers plan", type(model).__name__)
            return []
        repeated = repeated_layers(model)
        skip = {id(m) for m in claimed + repeated}
        quiet_beside_claims = _outermost(model, lambda m: id(m) not in reference.launching_unclaimed
                                         and reference.outputs.get(id(m)), skip)
        quiet = _outermost(model, lambda m: id(m) not in reference.launching and reference.outputs.get(id(m)), skip)
        candidates = [(claimed + repeated + quiet_beside_claims, reference.outside),
                      (claimed + repeated, reference.outside),
                      (repeated + quiet, reference.everything), (repeated, reference.everything)]
        # every candidate is probed at once (in forked processes); the first that launches what the full
        # replica does is taken
        tried = [(stand_ins, expected, {id(m): reference.outputs.get(id(m)) for m in stand_ins})
                 for stand_ins, expected in candidates if stand_ins]
        tried = [(stand_ins, expected, plans) for stand_ins, expected, plans in tried
                 if all(p is not None for p in plans.values())]
        replicas = [Forwards(self._replica(model, stand_ins, plans), calling) for stand_ins, _, plans in tried]
        for (stand_ins, expected, _), forwards, launched in zip(tried, replicas, self._launched_each(replicas, shapes)):
            if isinstance(launched, str):
                log.info("model planner: with %d stand-ins the probe failed (%s)", len(stand_ins), launched)
                continue
            if reference.unclaimed(set(launched), claims) == reference.unclaimed(expected, claims):
                break
            log.info("model planner: %d stand-ins changed the probe's launches; trying fewer", len(stand_ins))
        else:  # every layer runs its own forward
            stand_ins, forwards = [], Forwards(MetaCaller(model, inference=True), calling)
        conventions = [c for c, asked in ((Convention(padded=True), forwards.cached and calling.mask),
                                          (Convention(positions=True), calling.positions)) if asked]
        differs = dict(zip(conventions, forked_planning.call_all(lambda c: self._differs(forwards, c), conventions)))
        padded = differs.get(Convention(padded=True), False)
        positions = differs.get(Convention(positions=True), False)
        log.info("model planner: %s planned through its forward, %d modules stood in for%s%s", type(model).__name__,
                 len(stand_ins), ", padded batches too" if padded else "",
                 ", with and without position ids" if positions else "")
        return [ModelSite(forwards, padded, len(stand_ins), type(model).__name__, positions)]

    def launches(self, layers: list, limits: EngineLimits) -> Iterable[PlannedLaunch]:
        self.sampled = {}
        for site in layers:
            classified = None
            if limits.extra.get("shape_classes", True):
                classified = _classified(site, limits, self._stop, self.sampled)
            yield from (_sweep(site, limits) if classified is None else classified)

    # -- checks -------------------------------------------------------------------------------------------
    def _replica(self, model, stand_ins: list, plans: dict) -> MetaCaller:
        caller = MetaCaller(model, inference=True)
        for module in stand_ins:
            replica = caller.replica_of(module)
            replica.forward = _StandIn(plans[id(module)], replica.forward)
        return caller

    def _reference(self, model, calling: Calling, claims: Claims, shapes) -> _Reference:
        """The full replica at the probe shapes with every module's launches in a capture of its own:
        which modules launch, what launches outside the claimed ones, each module's first call."""
        from ..triton import capture

        current = [_Reference()]  # what the shape being probed launched, in this process
        caller = MetaCaller(model, inference=True)
        running: list[_Running] = []  # the modules in their forward, innermost last

        def enter(module, args, kwargs):
            key = id_of[id(module)]
            stack = contextlib.ExitStack()
            inner = stack.enter_context(capture())
            claimed = key in claims.modules or bool(running and running[-1].claimed)
            running.append(_Running(key, inner, stack, claimed, args, kwargs))

        def leave(module, args, kwargs, output):
            if not running:
                return
            call = running.pop()
            reference = current[0]
            requests = call.capture.requests
            call.stack.close()
            reference.names.update({r.predicted_hash: r.name for r in requests})
            hashes = {r.predicted_hash for r in requests}
            unclaimed = set() if call.claimed else {r.predicted_hash for r in requests if r.name not in claims.kernels}
            reference.everything |= hashes
            reference.outside |= set() if call.claimed else hashes
            call.launched |= bool(hashes)
            call.launched_unclaimed |= bool(unclaimed)
            if call.launched:
                reference.launching.add(call.key)
            if call.launched_unclaimed:
                reference.launching_unclaimed.add(call.key)
            if running:
                running[-1].launched |= call.launched
                running[-1].launched_unclaimed |= call.launched_unclaimed
            if call.key not in reference.outputs:
                reference.outputs[call.key] = OutputPlan.of(args, kwargs, output)

        id_of = {}
        for module in model.modules():
            replica = caller.replica_of(module) if module is not model else caller.replica
            id_of[id(replica)] = id(module)
            replica.register_forward_pre_hook(enter, with_kwargs=True)
            replica.register_forward_hook(leave, with_kwargs=True, always_call=True)
        forwards = Forwards(caller, calling)

        def at(shape) -> _Reference:
            if self._stop():
                raise _Stopped
            current[0] = _Reference()
            running.clear()
            with capture():
                request(forwards, shape[0], shape[1], shape[1] + 1)
            return current[0]

        # each shape in a forked process of its own; merged in shape order (a module's first call is
        # the first shape's)
        reference = _Reference()
        for part in forked_planning.call_all(at, shapes):
            reference.everything |= part.everything
            reference.outside |= part.outside
            reference.names.update(part.names)
            reference.launching |= part.launching
            reference.launching_unclaimed |= part.launching_unclaimed
            for key, plan in part.outputs.items():
                reference.outputs.setdefault(key, plan)
        return reference

    def _claims_cover(self, model, calling: Calling, claims: Claims, claimed: list, shapes) -> bool:
        """Whether, with every claimed module stood in, the probe shapes launch only claimed kernels: then
        the providers plan the whole model, and the full reference probe (every module at every shape,
        claimed layers included) is not needed. Claimed modules' outputs come from one short forward."""
        from ..triton import capture

        outputs: dict = {}
        caller = MetaCaller(model, inference=True)
        for module in claimed:
            def record(replica, args, kwargs, output, key=id(module)):
                outputs.setdefault(key, OutputPlan.of(args, kwargs, output))

            caller.replica_of(module).register_forward_hook(record, with_kwargs=True)
        with capture():
            request(Forwards(caller, calling), *shapes[0], shapes[0][1] + 1)
        plans = {id(m): outputs.get(id(m)) for m in claimed}
        if any(plan is None for plan in plans.values()):
            return False
        launched = self._launched(Forwards(self._replica(model, claimed, plans), calling), shapes)
        return all(name in claims.kernels for name in launched.values())

    def _launched(self, forwards: Forwards, shapes) -> dict:
        """Predicted hash -> kernel name of what the probe shapes launch: each prefill and a decode step
        after it. Raises where a probe forward fails."""
        launched = self._launched_each([forwards], shapes)[0]
        if isinstance(launched, str):
            raise RuntimeError(launched)
        return launched

    def _launched_each(self, each: list[Forwards], shapes) -> list[dict | str]:
        """``_launched`` of each forwards, every (forwards, shape) probed at once in forked processes; a
        forwards whose probe failed gives the error, as text."""
        from ..triton import capture

        def probe(item) -> dict | str:
            index, (batch, tokens) = item
            if self._stop():
                raise _Stopped
            try:
                with capture() as plan:
                    request(each[index], batch, tokens, tokens + 1)
            except _Stopped:
                raise
            except Exception as exc:  # said by the caller, which then does without these stand-ins
                return f"{type(exc).__name__}: {exc}"
            return {r.predicted_hash: r.name for r in plan.requests}

        items = [(index, shape) for index in range(len(each)) for shape in shapes]
        found: list[dict | str] = [{} for _ in each]
        for (index, _), launched in zip(items, forked_planning.call_all(probe, items)):
            if isinstance(found[index], dict):
                found[index] = launched if isinstance(launched, str) else {**found[index], **launched}
        return found

    def _differs(self, forwards: Forwards, convention: Convention) -> bool:
        """Whether requests passing ``convention`` launch anything plain ones do not, at a batch of two
        sequences past 64 tokens (a mask and per-row positions only show with more than one row)."""
        from ..triton import capture

        batch, tokens = 2, 70
        try:
            with capture() as plain:
                request(forwards, batch, tokens, tokens + 1)
            with capture() as other:
                request(forwards, batch, tokens, tokens + 1, convention)
        except Exception as exc:
            what = "padded batches" if convention.padded else "requests with position ids"
            log.info("model planner: a probe of %s failed (%s: %s); they are planned as plain ones", what,
                     type(exc).__name__, exc)
            return False
        return bool({r.predicted_hash for r in other.requests} - {r.predicted_hash for r in plain.requests})


def _outermost(model: torch.nn.Module, chosen, skip: set) -> list[torch.nn.Module]:
    """The outermost submodules ``chosen`` accepts, not inside or among ``skip``; never the model."""
    found = []

    def visit(module: torch.nn.Module) -> None:
        for child in module.children():
            if id(child) in skip:
                continue
            if chosen(child):
                found.append(child)
            else:
                visit(child)

    visit(model)
    return found


def prefill_shapes(limits: EngineLimits) -> Iterator[tuple[int, int]]:
    for batch in range(1, limits.max_batch_size + 1):
        for tokens in range(1, max(1, min(limits.max_seq_len, limits.max_num_tokens // batch)) + 1):
            yield batch, tokens


def coarse_first(shapes: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``shapes`` (batch, length) reordered so that every batch size comes early: lengths that are powers
    of two first, then those with two bits set, and so on, batch-major within each. A sweep stopped
    halfway (serving began) has then met each batch size's variants at a spread of lengths, rather than
    every length at the first few batch sizes."""
    return [shape for _, shape in sorted(enumerate(shapes), key=lambda item: (item[1][1].bit_count(), item[0]))]


def _warmup_priority(limits: EngineLimits, batch: int, tokens: int) -> Priority:
    return Priority.WARMUP if is_warmup_shape(limits, batch, tokens) or (
        tokens == 1 and batch in set(limits.cuda_graph_batch_sizes)) else Priority.BACKGROUND


# -- shape classes: a few calls instead of every shape --------------------------------------------------------
def spaces(limits: EngineLimits, convention: Convention, cached: bool) -> list[shape_classes.Space]:
    """The prefill shapes (batch, tokens) and the decode steps (batch, cache length) a convention takes:
    padded batches have two rows or more and decode only on the cache a prefill left."""
    low = 2 if convention.padded else 1
    found = [shape_classes.Space("prefill", low, limits.max_batch_size, limits.max_seq_len, limits.max_num_tokens)]
    if cached and limits.max_seq_len > 1:
        found.append(shape_classes.Space("decode", low, limits.max_batch_size, limits.max_seq_len - 1,
                                         limits.max_num_tokens if convention.padded else None))
    return found


def traced_call(forwards: Forwards, point: tuple[int, int], limits: EngineLimits, convention: Convention) -> dict:
    """The launches one request makes at ``point``, by space: a prefill of (batch, tokens) and the decode
    step on its cache; a point past what one prefill holds is a decode step on a cache filled unseen
    (``long_decode``): the calls planning makes, each phase traced."""
    from ..triton import capture
    from ..triton.launch_trace import trace

    found: dict = {}

    @contextlib.contextmanager
    def phase(name: str):
        # stacks stop at the frame of _request or long_decode (this generator's caller's caller)
        with trace(root=sys._getframe(2)) as launches:
            yield
        found[name] = launches

    with capture():
        if spaces(limits, convention, forwards.cached)[0].contains(point):
            request(forwards, *point, limits.max_seq_len, convention, phase)
        else:
            long_decode(forwards, *point, convention.positions, phase)
    return found


def _classified(site: ModelSite, limits: EngineLimits, stop: Callable[[], bool],
                sampled: dict[str, int]) -> Iterator[PlannedLaunch] | None:
    """The launches of the points that reach every shape class, per convention (the conventions searched
    together); None (with one line) where a value follows no form the classes know: then every shape is
    planned."""
    forwards = site.forwards
    problems = []
    for convention in site.conventions:
        def sample(point, c=convention):
            return traced_call(forwards, point, limits, c)

        problems.append(shape_classes.Problem(f"model planner: {site.label}{_label(convention)}",
                                              tuple(spaces(limits, convention, forwards.cached)), sample))
    found = shape_classes.search(problems, stop=stop)
    if any(f is None for f in found):
        return None
    chosen = []
    for convention, problem, classified in zip(site.conventions, problems, found):
        sampled[site.label + _label(convention)] = classified.calls
        points = list(dict.fromkeys(classified.points.get("prefill", []) + classified.points.get("decode", [])))
        chosen.append((convention, problem.spaces[0], points))
    return _class_launches(site, limits, chosen)


def _class_launches(site: ModelSite, limits: EngineLimits, chosen: list) -> Iterator[PlannedLaunch]:
    forwards, longest = site.forwards, limits.max_seq_len
    warm = warmup_shapes(limits)
    for convention, prefill, points in chosen:
        for batch, tokens in dict.fromkeys([p for p in warm if prefill.contains(p)] + points):
            label = f"{site.label} B={batch} T={tokens}{_label(convention)}"
            if prefill.contains((batch, tokens)):
                yield PlannedLaunch(_warmup_priority(limits, batch, tokens),
                                    lambda b=batch, t=tokens, c=convention: request(forwards, b, t, longest, c), label)
            else:
                yield PlannedLaunch(Priority.BACKGROUND,
                                    lambda b=batch, n=tokens, p=convention.positions: long_decode(forwards, b, n, p),
                                    f"{site.label} decode B={batch} cache={tokens}{_label(convention)}")


def _sweep(site: ModelSite, limits: EngineLimits) -> Iterator[PlannedLaunch]:
    forwards, longest = site.forwards, limits.max_seq_len
    for batch, tokens in coarse_first(prefill_shapes(limits)):
        priority = _warmup_priority(limits, batch, tokens)
        for convention in site.conventions:
            if convention.padded and batch == 1:  # one row is never padded
                continue
            yield PlannedLaunch(priority, lambda b=batch, t=tokens, c=convention: request(forwards, b, t, longest, c),
                                f"{site.label} B={batch} T={tokens}{_label(convention)}")
    if not forwards.cached:
        return
    for batch in range(1, limits.max_batch_size + 1):
        prefilled = max(1, min(limits.max_seq_len, limits.max_num_tokens // batch))
        for length in decode_lengths(limits.max_seq_len - 1):
            if length > prefilled:  # shorter caches are left by a prefill above, and decoded there
                for positions in (False, True)[:1 + site.positions]:
                    yield PlannedLaunch(Priority.BACKGROUND,
                                        lambda b=batch, n=length, p=positions: long_decode(forwards, b, n, p),
                                        f"{site.label} decode B={batch} cache={length}"
                                        f"{_label(Convention(positions=positions))}")


def _label(convention: Convention) -> str:
    return (" padded" if convention.padded else "") + (" with position ids" if convention.positions else "")
