"""Running model code on meta tensors for planning.

Two things stand between a library's launcher and a meta tensor:
- the model may hold real weights (on a GPU, where a launch would really run, and a server may be
  loading or running them): ``MetaCaller`` runs a structural copy of a module whose parameters and
  buffers are meta stand-ins, leaving the module itself untouched;
- launchers read a few values back to the host (``.item()``, ``assert (t < n).all()``): meta tensors have
  no values, so ``MetaScalars`` answers those reads with a value the provider picks (booleans read as
  true, so sanity asserts pass). A provider enumerates the values that change a compiled variant, e.g.
  one per integer specialization class of a count that reaches a kernel argument;
- index data computed from values (``nonzero`` of an attention mask, sequence offsets, chunk indices):
  ``HostIndices`` lets a provider pass such inputs as small host tensors with real values, so the
  library's own index code runs on them, while activations stay on meta.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import logging
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..core.processes import fork_safe_lock
from ..core.thread_patch import patched_in_this_thread, set_in_this_thread


def meta_replica(module: torch.nn.Module, copies: dict[int, torch.nn.Module] | None = None) -> torch.nn.Module:
    """A copy of ``module``'s structure whose parameters and buffers are meta stand-ins (same dtype, shape
    and strides; weights tied in the model stay tied).

    Planning calls the replica, never the module: a server loads weights into its model and runs it while
    planning goes on in another thread, so planning must not swap the model's parameters (as
    ``torch.func.functional_call`` does for the length of a call) nor flip its ``training`` flags. Each
    submodule is copied shallowly with its own parameter, buffer, submodule and hook tables; other
    attributes (sizes, configs, eps) are shared and only read. ``copies`` receives each submodule's
    replica by ``id`` of the submodule."""
    stand_ins: dict[int, torch.Tensor] = {}
    copies = {} if copies is None else copies

    def stand_in(tensor: torch.Tensor | None) -> torch.Tensor | None:
        if tensor is None or tensor.is_meta:
            return tensor
        if id(tensor) not in stand_ins:
            meta = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
            stand_ins[id(tensor)] = torch.nn.Parameter(meta, tensor.requires_grad) if isinstance(
                tensor, torch.nn.Parameter) else meta
        return stand_ins[id(tensor)]

    def replicate(original: torch.nn.Module) -> torch.nn.Module:
        if id(original) in copies:
            return copies[id(original)]
        replica = copy.copy(original)
        copies[id(original)] = replica
        for name, value in vars(original).items():
            if isinstance(value, (dict, set, list)):  # hook and attribute tables: the replica's own
                vars(replica)[name] = copy.copy(value)
            else:  # a forward patched onto the instance (Liger's apply_liger_kernel_to_*(model=...)...)
                vars(replica)[name] = _rebound(value, original, replica)
        replica._parameters = {n: stand_in(p) for n, p in original._parameters.items()}
        replica._buffers = {n: stand_in(b) for n, b in original._buffers.items()}
        replica._modules = {n: None if m is None else replicate(m) for n, m in original._modules.items()}
        return replica

    return replicate(module)


def _rebound(value, original: torch.nn.Module, replica: torch.nn.Module):
    """``value`` with ``original`` bound as its first argument rebound to ``replica``: a method bound to
    the instance, or a ``functools.partial`` over it (accelerate's hooked forward); else ``value``."""
    if isinstance(value, types.MethodType) and value.__self__ is original:
        return types.MethodType(value.__func__, replica)
    if isinstance(value, functools.partial) and value.args and value.args[0] is original:
        return functools.partial(value.func, replica, *value.args[1:], **value.keywords)
    return value


class MetaCaller:
    """Calls a meta replica of one module (``meta_replica``) on meta inputs; the module itself is never
    called or changed.

    ``inference=True`` calls it as a server does, with ``training`` off (a model is often still in
    training mode at construction; layers such as fla's pick their kernels by that flag)."""

    def __init__(self, module: torch.nn.Module, inference: bool = False) -> None:
        self._copies: dict[int, torch.nn.Module] = {}
        self.replica = meta_replica(module, self._copies)
        if inference:
            self.replica.train(False)  # the replica's own flags: the model's stay as they are

    def tensor(self, name: str) -> torch.Tensor:
        """The meta stand-in of one parameter or buffer (``"weight"``)."""
        try:
            return self.replica.get_parameter(name)
        except AttributeError:
            return self.replica.get_buffer(name)

    def replica_of(self, submodule: torch.nn.Module) -> torch.nn.Module:
        """The replica of one of the module's submodules."""
        return self._copies[id(submodule)]

    def __call__(self, *args, **kwargs):
        return self.replica(*args, **kwargs)


class MetaScalars(TorchDispatchMode):
    """Answers host reads of meta tensors: integers and floats read as ``value``, booleans as True."""

    def __init__(self, value: int = 1) -> None:
        super().__init__()
        self.value = value
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and args[0].is_meta:
            self.reads += 1
            tensor = args[0]
            if tensor.dtype == torch.bool:
                return True
            return float(self.value) if tensor.dtype.is_floating_point else int(self.value)
        return func(*args, **(kwargs or {}))


class HostIndices(TorchDispatchMode):
    """Host tensors next to meta activations: an op whose tensor arguments mix meta and host tensors runs
    on meta (the host ones are copied to meta for it); an op on host tensors alone runs on the host.

    A padded batch's mask given on the host makes a library's unpadding compute real sequence offsets and
    chunk indices (``nonzero``, ``repeat_interleave``, ``.tolist()``), which meta tensors cannot, and its
    gather of the activations stays on meta. Offsets reach kernels as host tensors: a capture reads only
    their dtype and alignment, as Triton's binder does on the GPU. Dispatch modes are per thread, so a
    planning thread's mode does not touch a serving thread."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _mixes_meta_and_host((*args, *kwargs.values())):
            args, kwargs = pytree.tree_map_only(
                torch.Tensor, lambda t: t if t.is_meta else t.to("meta"), (args, kwargs))
        return func(*args, **kwargs)


def with_host_indices_if_needed(call, host_inputs: bool = True):
    """``call()``, with host tensors among its inputs (``host_inputs``): torch's meta kernels take host
    index tensors in most ops (``gather``, ``index``, ``index_put_``), and a Python dispatch mode costs
    more than the rest of a forward, so the call runs as it is first and again under HostIndices only
    if it raised. Launches captured before the failing op are those it makes under HostIndices too."""
    if not host_inputs:
        return call()
    try:
        return call()
    except Exception:
        with HostIndices():
            return call()


def _mixes_meta_and_host(values) -> bool:
    """Whether these op arguments (tensors, or lists of them as in cat and index) hold both meta and
    non-meta tensors. Every op of a planned forward asks this, so it avoids a full pytree walk."""
    devices = set()
    for value in values:
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, torch.Tensor):
                devices.add(item.is_meta)
    return len(devices) == 2


def int_class_representatives(upper: int) -> tuple[int, ...]:
    """One value per Triton integer specialization class (equal to 1, divisible by 16, neither) among
    0..upper: enough to reach every variant a host-read count can cause when it is passed as an int."""
    return tuple(v for v in (0, 1, 2) if v <= upper)


def layer_settings(module: torch.nn.Module, ignore: tuple[str, ...] = ("layer_idx",)) -> tuple:
    """What can change a layer's launches besides its input: the plain attributes of it and its
    submodules (sizes, eps, modes, backends...) and the dtypes of its weights. Layers of a stack that
    agree on these launch the same variants, so one of them is planned. ``ignore`` names position
    attributes that differ per layer without changing any launch."""
    plain = (bool, int, float, str, type(None))
    attributes = tuple((name, key, value) for name, sub in module.named_modules()
                       for key, value in sorted(vars(sub).items())
                       if not key.startswith("_") and key not in ignore and isinstance(value, plain))
    return type(module), attributes, tuple(str(p.dtype) for p in module.parameters())


# -- probing: what each layer receives in one forward, as templates over (batch, tokens) ------------------
PROBE_TOKENS = 11  # a prime: a leading dimension equal to it is the token dimension


@dataclass(frozen=True)
class TensorTemplate:
    """A probed tensor argument: ``layout`` "batched" for (batch, tokens, *rest), "packed" for
    (tokens, *rest), "fixed" for anything else (kept as probed)."""

    layout: str
    rest: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "TensorTemplate":
        shape = tuple(tensor.shape)
        if len(shape) >= 2 and shape[:2] == (1, PROBE_TOKENS):
            return cls("batched", shape[2:], tensor.dtype, tensor.requires_grad)
        if len(shape) >= 1 and shape[0] == PROBE_TOKENS:
            return cls("packed", shape[1:], tensor.dtype, tensor.requires_grad)
        return cls("fixed", shape, tensor.dtype, tensor.requires_grad)

    def make(self, batch: int, tokens: int) -> torch.Tensor:
        lead = {"batched": (batch, tokens), "packed": (batch * tokens,), "fixed": ()}[self.layout]
        return torch.empty(lead + self.rest, dtype=self.dtype, device="meta", requires_grad=self.requires_grad)


@dataclass(frozen=True)
class ProbedCall:
    """The arguments one layer got in the probe, with tensors as templates; ``at(batch, tokens)`` makes
    the same call for another shape."""

    args: tuple
    kwargs: tuple

    @classmethod
    def of(cls, args: tuple, kwargs: dict) -> "ProbedCall":
        def template(value):
            if isinstance(value, torch.Tensor):
                return TensorTemplate.of(value)
            return tuple(map(template, value)) if isinstance(value, (tuple, list)) else value

        return cls(tuple(map(template, args)), tuple((k, template(v)) for k, v in sorted(kwargs.items())))

    @property
    def tensors(self) -> list[TensorTemplate]:
        def flat(values):
            for v in values:
                yield from flat(v) if isinstance(v, tuple) else (v,)

        return [v for v in flat((*self.args, *(v for _, v in self.kwargs))) if isinstance(v, TensorTemplate)]

    @property
    def follows_tokens(self) -> bool:
        return any(t.layout != "fixed" for t in self.tensors)

    def at(self, batch: int, tokens: int) -> tuple[tuple, dict]:
        def value(v):
            if isinstance(v, TensorTemplate):
                return v.make(batch, tokens)
            return tuple(map(value, v)) if isinstance(v, tuple) else v

        return tuple(map(value, self.args)), {k: value(v) for k, v in self.kwargs}


@dataclass(frozen=True)
class FunctionCall:
    """A call of one of a library's autograd Functions (the op under a layer) seen in the probe.

    Calling the op again at another shape launches what the layer would launch there, without the
    layer's other work (the three meta linears around a SwiGLU op cost twice the op itself)."""

    function: type
    call: ProbedCall

    def at(self, batch: int, tokens: int):
        args, kwargs = self.call.at(batch, tokens)
        return self.function.apply(*args, **kwargs)


def _replayable(tensor: torch.Tensor) -> bool:
    # templates make contiguous tensors at offset 0; a view with other strides would launch differently
    return tensor.is_contiguous() and tensor.storage_offset() == 0


class _FunctionRecorder:
    """While active, records the calls of autograd Functions defined under ``prefix`` (a library's ops)
    this thread makes, against the innermost probed layer running. ``torch.autograd.Function.apply`` is
    wrapped for this thread for the duration of one probe forward; every call still goes to the
    original."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.stack: list[list] = []  # per running probed layer: the FunctionCalls it made, or None

    def active(self) -> contextlib.AbstractContextManager:
        def apply(original, cls, *args, **kwargs):
            if self.stack and self.stack[-1] is not None and cls.__module__.startswith(self.prefix):
                tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
                ops = self.stack[-1]
                if all(_replayable(t) for t in tensors):
                    ops.append(FunctionCall(cls, ProbedCall.of(args, kwargs)))
                else:  # not replayable at other shapes: the layer is enumerated through its own forward
                    self.stack[-1] = None
            return original(cls, *args, **kwargs)

        return patched_in_this_thread(torch.autograd.Function, "apply", apply)


@dataclass(frozen=True)
class Probe:
    """What each probed layer received in one meta forward: ``calls[id(layer)]`` maps each distinct call
    to the ops (``FunctionCall``) it ran, or to None where they were not recorded or not replayable."""

    calls: dict[int, dict[ProbedCall, tuple[FunctionCall, ...] | None]]


def probe(model: torch.nn.Module, layers: list[torch.nn.Module],
          context: contextlib.AbstractContextManager | None = None, functions_from: str | None = None) -> Probe:
    """The distinct calls each of ``layers`` gets in one meta forward of ``model`` on one sequence of
    PROBE_TOKENS tokens, and with ``functions_from`` (a module prefix) the calls of that library's autograd
    Functions each layer makes. Kernel launches in it are captured and dropped."""
    from ..triton import capture

    calls: dict[int, dict[ProbedCall, tuple[FunctionCall, ...] | None]] = {}
    recorder = _FunctionRecorder(functions_from) if functions_from else None
    running: list[ProbedCall] = []  # the call of each probed layer now in its forward, innermost last

    def enter(layer_id, args, kwargs):
        call = ProbedCall.of(args, kwargs)
        calls.setdefault(layer_id, {}).setdefault(call, None)
        running.append(call)
        if recorder is not None:
            recorder.stack.append([])

    def leave(layer_id):
        if not running:  # always_call: the call failed before enter() ran
            return
        call = running.pop()
        if recorder is not None:
            ops = recorder.stack.pop()
            seen = calls[layer_id]
            if ops and seen.get(call) is None:
                seen[call] = tuple(ops)

    # the hooks go on the replica's layers (its own hook tables), keyed by the model's layers
    caller = MetaCaller(model, inference=True)
    for layer in layers:
        replica = caller.replica_of(layer)
        replica.register_forward_pre_hook(lambda m, a, k, key=id(layer): enter(key, a, k), with_kwargs=True)
        replica.register_forward_hook(lambda m, a, k, out, key=id(layer): leave(key), with_kwargs=True,
                                      always_call=True)
    input_ids = torch.zeros(1, PROBE_TOKENS, dtype=torch.long, device="meta")
    # MetaScalars: transformers' mask code asks ``(mask == 0).all()``; it reads as true on meta
    with capture(), torch.no_grad(), context or contextlib.nullcontext(), MetaScalars(), (
            recorder.active() if recorder else contextlib.nullcontext()):
        caller(input_ids=input_ids, use_cache=False)
    return Probe(calls)


# -- host reads answered without a dispatch mode ---------------------------------------------------------------
_reads = threading.local()
_reads_lock = fork_safe_lock()
_reads_library = None


def _meta_scalar(tensor: torch.Tensor):
    value = getattr(_reads, "value", None)
    if value is None:  # not a planning thread: what torch's own meta kernel says
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")
    if tensor.dtype == torch.bool:
        return True
    return float(value) if tensor.dtype.is_floating_point else int(value)


def _replace_meta_scalar_kernel():
    """A library holding ``_meta_scalar`` as the Meta kernel of ``_local_scalar_dense``. torch before
    2.13 refuses to override the Python meta kernel torch registers for it unless its record of Python
    registrations forgets that one first (torch's dispatcher itself lets a later kernel replace it)."""
    library = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - kept for the process
    try:
        library.impl("_local_scalar_dense", _meta_scalar, "Meta")
    except RuntimeError:
        registered = getattr(torch.library, "_impls", None)
        if not isinstance(registered, set) or "aten/_local_scalar_dense/Meta" not in registered:
            raise
        registered.discard("aten/_local_scalar_dense/Meta")
        library.impl("_local_scalar_dense", _meta_scalar, "Meta")
    return library


def release_meta_reads() -> None:
    """Give torch back its own meta kernel of ``_local_scalar_dense`` (the session's close); the next
    ``meta_reads_answered`` replaces it again."""
    global _reads_library
    with _reads_lock:
        library, _reads_library = _reads_library, None
    if library:
        library._destroy()


@contextlib.contextmanager
def meta_reads_answered(value: int = 1) -> Iterator[None]:
    """As ``MetaScalars``, for whole-model forwards: host reads of meta tensors in this thread read as
    ``value`` (booleans as True). A Python dispatch mode sees every op and costs about a third of a meta
    forward; this replaces torch's meta kernel of ``_local_scalar_dense`` alone, once per process, and
    that kernel still raises as before in every thread outside this context. Where torch refuses the
    replacement, MetaScalars is used instead (one log line)."""
    global _reads_library
    with _reads_lock:
        if _reads_library is None:
            try:
                _reads_library = _replace_meta_scalar_kernel()
            except Exception as exc:  # noqa: BLE001 - any refusal: the dispatch mode does the same
                logging.getLogger("jit_ahead.providers").info(
                    "meta reads: torch keeps its own meta kernel (%s: %s); MetaScalars answers them",
                    type(exc).__name__, exc)
                _reads_library = False
    if _reads_library is False:
        with MetaScalars(value):
            yield
        return
    with set_in_this_thread(_reads, "value", value):
        yield
