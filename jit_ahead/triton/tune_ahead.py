"""Tune ahead: the autotuners' benchmarks run on the GPU before serving, for every tuning key planning met.

Each task (``tuning.py``) is given back to the autotuner it came from, in the server: its arguments are
made on the GPU (tensors of the planned shapes, strides and dtypes: floating-point ones hold values like
activations, the others zeros, or the values planning had for a host index tensor), and
``Autotuner.run`` is called with them and a grid that answers each config's grid from the task. The autotuner then does what it would do at the first request that met
the key: prunes, runs its hooks, times every config with its own ``do_bench`` (the configs' variants are
loaded from helpers' builds, or waited for, by the executor's hook), stores the choice where it stores
them (``cache_results``; the records), and launches the chosen config once. Kernel selection stays the
autotuner's own; only the window Triton's default benchmark times each config over is shorter
(``JIT_AHEAD_TUNE_AHEAD_REP_MS``): a start tunes every key the limits allow, not only those requests meet.

A task whose autotuner holds a choice already, or whose first launch will find one an earlier start
recorded (``autotune.KNOWN``), is counted and skipped. A task is left to its first launch,
and named with the reason, when its autotuner is not imported in the server, when its timings would read
values planning did not have, when its tensors exceed the memory budget, or when the tuning run raised. Tasks run one at a time, in the order
planning met them (warmup shapes and CUDA-graph batch sizes first), each task's tensors freed before the
next.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import inspect
import logging
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from triton.runtime.autotuner import Autotuner

from . import autotune
from .compile_inputs import unwrap_jit_function
from .tuning import TensorSpec, TuningTask

log = logging.getLogger("jit_ahead.triton.tune_ahead")
_ahead: contextvars.ContextVar[bool] = contextvars.ContextVar("jit_ahead_tuning_ahead", default=False)


def tuning_ahead() -> bool:
    """True while this thread runs a tune-ahead benchmark (stats tell it from one a request met)."""
    return _ahead.get()


@dataclass(frozen=True)
class Left:
    """A task not tuned ahead, and why."""

    task: TuningTask
    why: str


@dataclass
class TuneAheadResult:
    tuned: list[TuningTask] = field(default_factory=list)  # benchmarked (or loaded from a stored choice) here
    chosen_already: int = 0  # the autotuner held a choice for the key, or an earlier start recorded one
    left: list[Left] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict:
        """Counts, the reasons tasks were left, and per kernel ("module.qualname") the keys tuned and left."""
        reasons: dict[str, int] = {}
        kernels: dict[str, list[int]] = {}
        for item in self.left:
            reasons[item.why] = reasons.get(item.why, 0) + 1
            kernels.setdefault(f"{item.task.module}.{item.task.qualname}", [0, 0])[1] += 1
        for task in self.tuned:
            kernels.setdefault(f"{task.module}.{task.qualname}", [0, 0])[0] += 1
        return {"tuned_ahead": len(self.tuned), "chosen_already": self.chosen_already, "left": len(self.left),
                "seconds": round(self.seconds, 2), "left_why": reasons, "kernels": kernels}


def find_autotuner(task: TuningTask) -> Autotuner | None:
    """The autotuner of the task's kernel among the server's imported modules (none is imported here)."""
    module = sys.modules.get(task.module)
    if module is None:
        return None
    for value in list(vars(module).values()):
        seen = 0
        while value is not None and seen < 16:
            if isinstance(value, Autotuner):
                kernel = unwrap_jit_function(value)
                if (kernel is not None and kernel.fn.__qualname__ == task.qualname
                        and tuple(str(c) for c in value.configs) == task.configs):
                    return value
            value = getattr(value, "fn", None)
            seen += 1
    return None


_UNSET = object()


def windowed_benchmark(rep_ms: int):
    """Triton's default benchmark (the driver's ``do_bench``, which an autotuner without a benchmark of its
    own looks up at its first benchmark) timing each config for ``rep_ms`` after ``rep_ms / 4`` of warmup
    instead of its 100 and 25; None where that benchmark takes no such arguments."""
    from triton.runtime import driver

    try:
        benchmark = driver.active.get_benchmarker()
        parameters = inspect.signature(benchmark).parameters
    except (TypeError, ValueError, AttributeError):
        return None
    if not {"warmup", "rep"} <= parameters.keys():
        return None
    warmup_ms = max(1, rep_ms // 4)

    def windowed(kernel_call, quantiles):
        return benchmark(kernel_call, warmup=warmup_ms, rep=rep_ms, quantiles=quantiles)

    windowed.__wrapped__ = benchmark  # what it times with (the stand-in's times nothing: autotune.py)
    return windowed


@contextlib.contextmanager
def benchmark_window(autotuner: Autotuner, windowed):
    """While tune-ahead runs ``autotuner``: it benchmarks with ``windowed`` (``windowed_benchmark``) if it is on
    Triton's default benchmark (no ``do_bench``, ``warmup``, ``rep`` or CUDA-graph option of its own);
    afterwards the autotuner is as it was."""
    if windowed is None or getattr(autotuner, "_do_bench", _UNSET) is not None:
        yield
        return
    state = vars(autotuner)  # ``do_bench`` is a cached_property: what it cached, if anything, is put back
    cached = state.get("do_bench", _UNSET)
    state["do_bench"] = windowed
    try:
        yield
    finally:
        if cached is _UNSET:
            state.pop("do_bench", None)
        else:
            state["do_bench"] = cached


_DRAWN_IN_PLACE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _tensor(spec: TensorSpec, device: torch.device, generator: torch.Generator | None = None) -> torch.Tensor:
    """A tensor of the planned shape, strides and dtype. Floating-point data is drawn uniformly from
    [-1, 1] (rounded to the dtype), not zeros: the GPU runs arithmetic on zeros at other clocks than on real activations, and a
    kernel may skip work on them, so timings on zeros can rank configs differently from the requests'
    own data; bounded values keep exponentials finite. Integer and boolean tensors are zeros (valid
    indices and masks) unless planning had their values."""
    dtype = spec.torch_dtype
    if dtype in _DRAWN_IN_PLACE:  # no temporary: the inputs stay within the memory budget they were counted in
        storage = torch.empty(spec.storage_elements, dtype=dtype, device=device).uniform_(-1, 1, generator=generator)
    elif dtype.is_floating_point:  # float8: drawn in bfloat16 first (half again its own size)
        storage = torch.empty(spec.storage_elements, dtype=torch.bfloat16, device=device)
        storage = storage.uniform_(-1, 1, generator=generator).to(dtype)
    else:
        storage = torch.zeros(spec.storage_elements, dtype=dtype, device=device)
    tensor = storage.as_strided(spec.shape, spec.stride, spec.offset)
    if spec.values is not None:  # a host index tensor planning had: the launch read these values
        tensor.copy_(torch.tensor(spec.values, dtype=spec.torch_dtype).reshape(spec.shape))
    return tensor


def _argument(value, device: torch.device, generator: torch.Generator | None = None):
    return _tensor(value, device, generator) if isinstance(value, TensorSpec) else value


_META = torch.device("meta")


def _recorded(autotuner: Autotuner, task: TuningTask) -> bool:
    """Whether an earlier start's recorded choice answers this key: the first launch then takes it where
    Triton would look up stored timings (``autotune.KNOWN``), benchmarking nothing, so running the task
    here would only allocate its tensors and launch the chosen config once. Looked up as that launch
    will: over the configs the autotuner prunes to for the planned arguments (made on the meta device,
    on a private copy of the autotuner); a pruning that cannot run there counts as not recorded."""
    if not autotune.KNOWN or not autotuner.cache_results:
        return False
    try:
        args = [_argument(v, _META) for v in task.args]
        kwargs = {k: _argument(v, _META) for k, v in task.kwargs}
        probe = copy.copy(autotuner)  # Triton's run sets nargs on the autotuner; a serving thread may run it
        probe.nargs = dict(zip(autotuner.arg_names, args))
        pruned = probe.prune_configs({**kwargs, "grid": _Grid(task.grids), "warmup": False})
    except Exception:  # a pruning function that reads values: the task runs on the GPU
        return False
    return autotune.KNOWN.config_for(autotuner, task.key, pruned) is not None


class _Grid:
    """The launch grid of each config, as planning computed it with the launcher's own grid function."""

    def __init__(self, grids) -> None:
        self._grids = [(dict(kwargs), grid) for kwargs, grid in grids]

    def __call__(self, meta: dict) -> tuple[int, ...]:
        for kwargs, grid in self._grids:
            if all(meta.get(k) == v for k, v in kwargs.items()):
                return grid
        raise LookupError("a config planning did not see")


def tune(tasks: Iterable[TuningTask], device: torch.device, budget_bytes: int, rep_ms: int = 100) -> TuneAheadResult:
    """Run each task's autotuner on ``device``, timing each config for ``rep_ms`` where it uses Triton's default
    benchmark (``windowed_benchmark``); what could not be tuned is in ``left`` with the reason."""
    result = TuneAheadResult()
    start = time.perf_counter()
    windowed = windowed_benchmark(rep_ms)  # one benchmark for every task's autotuner
    seen: set[tuple] = set()
    for task in tasks:
        if task.identity in seen:
            continue
        seen.add(task.identity)
        if task.unsupported:
            result.left.append(Left(task, task.unsupported))
            continue
        autotuner = find_autotuner(task)
        if autotuner is None:
            result.left.append(Left(task, "its autotuner is not imported in this process"))
            continue
        if task.key in autotuner.cache or _recorded(autotuner, task):
            result.chosen_already += 1
            continue
        if task.nbytes > budget_bytes:
            result.left.append(Left(task, f"its tensors ({task.nbytes >> 20} MiB) exceed the tune-ahead "
                                          f"memory budget ({budget_bytes >> 20} MiB)"))
            continue
        try:
            # the same inputs at every start (a meta device, the stand-in driver's, holds no values)
            generator = None if device.type == "meta" else torch.Generator(device=device).manual_seed(0)
            args = [_argument(v, device, generator) for v in task.args]
            kwargs = {k: _argument(v, device, generator) for k, v in task.kwargs}
            token = _ahead.set(True)
            try:
                with benchmark_window(autotuner, windowed):
                    autotuner.run(*args, grid=_Grid(task.grids), warmup=False, **kwargs)
            finally:
                _ahead.reset(token)
            del args, kwargs
        except Exception as exc:  # a failed tuning run must never stop the start: the first launch tunes
            log.warning("tune-ahead of %s failed (%s: %s); its first launch will tune it", task.label,
                        type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
            result.left.append(Left(task, f"the tuning run raised {type(exc).__name__}"))
            continue
        if task.key in autotuner.cache:
            result.tuned.append(task)
        else:
            result.left.append(Left(task, "the autotuner made no choice for the planned key"))
    result.seconds = time.perf_counter() - start
    return result
