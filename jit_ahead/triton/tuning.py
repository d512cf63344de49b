"""Tuning tasks: what tune-ahead needs to benchmark one autotuner at one tuning key on the GPU.

Helpers build every config of an autotuned kernel, but the benchmark that picks one needs the GPU: Triton's
``Autotuner.run`` times the pruned configs the first time it meets a tuning key, and on a server that is a
stall on the request that meets it. Planning meets every autotuned launch the model can make within the
limits; for each (kernel, tuning key) it meets first, a capture keeps a ``TuningTask``: the arguments of
``Autotuner.run`` as metadata (tensors by shape, strides and dtype; scalars and constexprs by value) and
the launch grid of every config, evaluated where planning had the launcher's grid function.

``tune_ahead.py`` gives the tasks back to the autotuners on the GPU, with tensors of those shapes (values
like activations in floating-point ones), so that the autotuner makes its own choice (its configs, pruning, hooks and ``do_bench``) before
serving. A task whose timings would depend on values planning did not have (an integer tensor on meta:
offsets, indices, sequence lengths) says so in ``unsupported`` and is left to its first launch.
"""
from __future__ import annotations

from dataclasses import dataclass

from triton.runtime.autotuner import Autotuner

from ..core.records import is_dotted_name
from .compile_inputs import unwrap_jit_function

_SCALARS = (int, float, bool, str, type(None))
_VALUES_KEPT = 1 << 16  # host index tensors up to this many elements travel with their values
_RUN_ONLY = ("grid", "warmup")  # Autotuner.run keywords that are not the kernel's arguments


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument by its metadata; ``values``: the contents of a host tensor planning passed for a
    device one (an index tensor a padded batch made), so that tuning reads what the launch read."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str  # str(torch.dtype), as Triton's tuning key names it
    offset: int = 0
    values: tuple | None = None

    @property
    def torch_dtype(self):
        import torch  # not at import: a process that only imports Triton imports no torch

        return getattr(torch, self.dtype.removeprefix("torch."))

    @property
    def integral(self) -> bool:
        return not (self.torch_dtype.is_floating_point or self.torch_dtype.is_complex)

    @property
    def storage_elements(self) -> int:
        """Elements of the storage the view reaches: offset plus its furthest element."""
        if any(n == 0 for n in self.shape):
            return self.offset
        return self.offset + 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride))

    @property
    def nbytes(self) -> int:
        return self.storage_elements * self.torch_dtype.itemsize


@dataclass(frozen=True)
class TuningTask:
    """One autotuner at one tuning key, as planning met it."""

    module: str
    qualname: str  # of the @triton.jit function under the autotuner
    source_key: str  # JITFunction.cache_key
    key: tuple  # the tuning key, as Triton's Autotuner.run computes it
    configs: tuple[str, ...]  # str() of the autotuner's configs: which autotuner of that kernel
    args: tuple  # Autotuner.run's positional arguments: TensorSpec or a scalar
    kwargs: tuple[tuple[str, object], ...]  # its keyword arguments but grid and warmup
    grids: tuple[tuple[tuple[tuple[str, object], ...], tuple[int, ...]], ...]  # (config kwargs, grid)
    unsupported: str | None = None  # why it cannot be tuned ahead; left to its first launch

    @property
    def identity(self) -> tuple:
        return (self.module, self.qualname, self.source_key, self.key, self.configs)

    @property
    def label(self) -> str:
        return f"{self.module}.{self.qualname} {list(self.key)}"

    @property
    def nbytes(self) -> int:
        """GPU memory its tensors take when tuned."""
        return sum(a.nbytes for a in self.tensors())

    def tensors(self) -> list[TensorSpec]:
        return [v for v in (*self.args, *(v for _, v in self.kwargs)) if isinstance(v, TensorSpec)]


def tuning_key(autotuner: Autotuner, args: tuple, kwargs: dict) -> tuple:
    """Triton's tuning key for these arguments: the ``key`` arguments' values, then the dtype of every
    argument that has one, in argument order (``Autotuner.run``; tests/test_tuning.py checks it against
    the key Triton's own run computes, on both supported Triton releases)."""
    named = dict(zip(autotuner.arg_names, args))
    named.update((k, v) for k, v in kwargs.items() if k in autotuner.arg_names)
    key = [named[k] for k in autotuner.keys if k in named]
    key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
    return tuple(key)


class _Unsupported(Exception):
    pass


def _spec(value):
    import torch

    if isinstance(value, torch.Tensor):
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            raise _Unsupported(f"a tensor subclass ({type(value).__name__})")
        values = None
        if value.device.type == "cpu" and value.numel() <= _VALUES_KEPT:
            values = tuple(value.flatten().tolist())
        return TensorSpec(tuple(value.shape), tuple(value.stride()), str(value.dtype), value.storage_offset(), values)
    if isinstance(value, _SCALARS):
        return value
    raise _Unsupported(f"an argument of type {type(value).__name__}")


def _grid_of(grid, named: dict) -> tuple[int, ...]:
    value = grid(named) if callable(grid) else grid
    value = tuple(int(v) for v in value)
    return value + (1,) * (3 - len(value))


def task_of(autotuner: Autotuner, args: tuple, kwargs: dict, configs: list, key: tuple) -> TuningTask | None:
    """The task of an autotuned launch met in planning (on meta tensors); None for a kernel without a
    JITFunction under it."""
    kernel = unwrap_jit_function(autotuner)
    if kernel is None:
        return None
    names = (kernel.module, kernel.fn.__qualname__, kernel.cache_key, key, tuple(str(c) for c in autotuner.configs))
    unsupported = None
    try:
        arg_specs = tuple(_spec(v) for v in args)
        kwarg_specs = tuple((k, _spec(v)) for k, v in kwargs.items() if k not in _RUN_ONLY)
    except _Unsupported as why:
        return TuningTask(*names, (), (), (), unsupported=f"it takes {why}, which a tuning task cannot hold")
    named = {**dict(zip(autotuner.arg_names, args)), **{k: v for k, v in kwargs.items() if k not in _RUN_ONLY}}
    grids = []
    try:
        for config in configs:
            grids.append((tuple(sorted(config.kwargs.items())), _grid_of(kwargs.get("grid"), {**named, **config.all_kwargs()})))
    except Exception as exc:  # a grid function that needs more than planning had
        unsupported = f"its grid could not be computed in planning ({type(exc).__name__})"
    if unsupported is None:
        names_given = [*autotuner.arg_names[:len(arg_specs)], *(k for k, _ in kwarg_specs)]
        reads = [name for name, spec in zip(names_given, [*arg_specs, *(v for _, v in kwarg_specs)])
                 if isinstance(spec, TensorSpec) and spec.integral and spec.values is None]
        if reads:
            unsupported = (f"its timings depend on the values of integer tensor {', '.join(reads)}, "
                           "which planning on meta tensors does not have")
    return TuningTask(*names, arg_specs, kwarg_specs, tuple(grids), unsupported)


# -- saved plans (core/planning/plan_cache.py): a task as JSON ---------------------------------------------------------
def _encode_value(value):
    if isinstance(value, TensorSpec):
        return {"tensor": [list(value.shape), list(value.stride), value.dtype, value.offset,
                           None if value.values is None else list(value.values)]}
    return value


def _decode_value(value):
    if isinstance(value, dict):
        shape, stride, dtype, offset, values = value["tensor"]
        if not (isinstance(dtype, str) and dtype.startswith("torch.") and is_dotted_name(dtype)
                and all(isinstance(n, int) for n in (*shape, *stride, offset))):
            raise TypeError("bad tensor argument")
        return TensorSpec(tuple(shape), tuple(stride), dtype, offset, None if values is None else tuple(values))
    if not isinstance(value, _SCALARS):
        raise TypeError(f"bad argument {value!r}")
    return value


def encode_task(task: TuningTask) -> dict:
    return {"module": task.module, "qualname": task.qualname, "source_key": task.source_key, "key": list(task.key),
            "configs": list(task.configs), "args": [_encode_value(a) for a in task.args],
            "kwargs": [[k, _encode_value(v)] for k, v in task.kwargs],
            "grids": [[[list(item) for item in kwargs], list(grid)] for kwargs, grid in task.grids],
            "unsupported": task.unsupported}


def decode_task(entry: dict) -> TuningTask:
    """A saved task; raises ValueError/TypeError/KeyError for one that is not (the plan is then unusable)."""
    module, qualname = entry["module"], entry["qualname"]
    if not (is_dotted_name(module) and isinstance(qualname, str) and qualname):
        raise ValueError(f"not a kernel name: {module!r} {qualname!r}")
    key, configs, unsupported = entry["key"], entry["configs"], entry["unsupported"]
    if not (isinstance(key, list) and all(isinstance(v, _SCALARS) for v in key) and isinstance(configs, list)
            and all(isinstance(c, str) for c in configs) and isinstance(entry["source_key"], str)
            and (unsupported is None or isinstance(unsupported, str))):
        raise TypeError("bad tuning key, configs or source key")
    grids = []
    for kwargs, grid in entry["grids"]:
        items = tuple((str(k), _decode_value(v)) for k, v in kwargs)
        if not all(isinstance(n, int) for n in grid):
            raise TypeError("bad grid")
        grids.append((items, tuple(grid)))
    return TuningTask(module, qualname, entry["source_key"], tuple(key), tuple(configs),
                      tuple(_decode_value(a) for a in entry["args"]),
                      tuple((str(k), _decode_value(v)) for k, v in entry["kwargs"]), tuple(grids), unsupported)
