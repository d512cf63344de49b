"""What each Triton launch of a planning call passes, value by value, for the shape-class planner.

Inside ``with trace() as launches:`` (itself inside a capture) every ``JITFunction.run`` reached is noted as
one :class:`TracedLaunch`: where it was launched from (the kernel, the Python lines of the call stack up to
the traced call, and how many launches from the same place came before it) and the raw value of each of
its arguments and launch options. Only what can change the compile request or the tuning task is kept:
an integer as it is, a tensor as its dtype and byte offset (its alignment on meta), anything else as its
value. Whether an integer's exact value matters (a constexpr, a tuning-key argument) or only Triton's
class of it is said per value: ``jit_ahead.providers.shape_classes`` decides the rest.

Autotuned launches normally skip repeats within one capture (``plan.py``); a trace turns that off so that
every launch of the call is seen.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

from ..core.shared_patch import SharedPatch


@dataclass(frozen=True)
class Raw:
    """One argument's raw value: kind "int" (``exact``: its value decides the variant, not only its class),
    "ptr" (a tensor: ``what`` its dtype, ``value`` its byte offset) or "value" (compared as it is)."""

    kind: str
    value: object
    what: object = None
    exact: bool = False

    def __reduce__(self):
        # planning calls send thousands of these back from forked processes: a plain tuple of fields
        # unpickles several times faster than a dataclass's state dict
        return Raw, (self.kind, self.value, self.what, self.exact)


@dataclass(frozen=True)
class TracedLaunch:
    site: tuple  # (kernel, code lines of the stack, occurrence)
    values: tuple[tuple[str, Raw], ...]

    def __reduce__(self):
        return TracedLaunch, (self.site, self.values)


class _Trace:
    def __init__(self, root) -> None:
        self.root = root  # the frame the trace was entered from: stacks stop there
        self.launches: list[TracedLaunch] = []
        self._seen: Counter = Counter()
        self._last: tuple | None = None  # (kernel, args, kwargs, frame's caller, site, raw values) of the last launch

    def add(self, kernel: JITFunction, args: tuple, kwargs: dict, frame) -> None:
        last = self._last
        tuning, launch = _autotuned.get()
        if last is not None and launch is not None and last[0] is kernel and last[3] is launch:
            # the next config of an autotuned launch: the same arguments but for the config's own values
            _, _, before, _, (name, stack, _), raws = last
            exact = _exact_names(kernel, tuning)
            raws = dict(raws)
            for key, value in kwargs.items():
                if before.get(key, _MISSING) is not value:
                    raws[key] = _shared_raw(value, key in exact)
            place = (kernel, stack, "config")
            occurrence = self._seen[place]
            self._seen[place] += 1
            site = (name, stack, ("config", occurrence))
            self.launches.append(TracedLaunch(site, _shared_values(raws)))
            self._last = (kernel, args, kwargs, launch, last[4], raws)
            return
        stack = []
        while frame is not None and frame is not self.root:
            if not frame.f_code.co_filename.endswith(_TRANSPARENT):
                stack.append((frame.f_code, frame.f_lineno))
            frame = frame.f_back
        place = (kernel, tuple(stack))
        occurrence = self._seen[place]
        self._seen[place] += 1
        exact = _exact_names(kernel, tuning)
        values = dict(zip(kernel.arg_names, args))
        values.update(kwargs)
        site = _shared((_kernel_name(kernel), _shared(tuple(_shared((c.co_filename, c.co_firstlineno, line))
                                                              for c, line in stack)), occurrence))
        raws = {name: _shared_raw(value, name in exact) for name, value in values.items()}
        self.launches.append(TracedLaunch(site, _shared_values(raws)))
        self._last = (kernel, args, kwargs, launch, site, raws)


_constexpr_names: dict = {}
# Frames a launch passes through only while some thread has a function patched for a probe (the
# dispatchers of core/thread_patch.py, e.g. around torch.autograd.Function.apply during Liger's probe):
# left out of the site, which must not depend on what another thread is probing meanwhile.
_TRANSPARENT = (os.path.join("jit_ahead", "core", "thread_patch.py"),)
_interned: dict = {}


def _shared(value, key=None):
    """One object for equal sites, stacks and values across launches and calls: a batch of traced calls
    sent back from a forked process then pickles each once (pickle's memo), not once per launch. Bounded:
    the table starts again once it is large."""
    if len(_interned) > 100_000:
        _interned.clear()
    return _interned.setdefault(value if key is None else key, value)


def _shared_raw(value, exact: bool) -> "Raw":
    raw = raw_of(value, exact)
    # keyed with the value's type: True == 1 == 1.0, and a flag must not come back as a float
    return _shared(raw, ("raw", raw.kind, type(raw.value), raw.value, raw.what, raw.exact))


def _shared_values(raws: dict) -> tuple:
    values = tuple(sorted(raws.items()))
    # the raws are shared already, so their identity says what they are
    return _shared(values, ("values",) + tuple((name, id(raw)) for name, raw in values))


def _exact_names(kernel: JITFunction, tuning: tuple[str, ...]) -> frozenset:
    """Arguments whose exact value decides the variant or the tuning task: constexprs, tuning-key names."""
    key = (id(kernel), tuning)
    found = _constexpr_names.get(key)
    if found is None:
        found = _constexpr_names[key] = frozenset(tuning) | {p.name for p in kernel.params if p.is_constexpr}
    return found


def _kernel_name(kernel: JITFunction) -> str:
    fn = getattr(kernel, "fn", None)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', kernel)}"


def raw_of(value, exact: bool) -> Raw:
    if value is None:
        return _NONE
    if isinstance(value, bool):
        return Raw("value", value)
    if isinstance(value, int):
        return Raw("int", value, exact=exact)
    if isinstance(value, torch.Tensor):
        return Raw("ptr", value.storage_offset() * value.element_size(), str(value.dtype))
    try:
        hash(value)
        return Raw("value", value)
    except TypeError:
        return Raw("value", repr(value))


_NONE = Raw("value", None)
_MISSING = object()
_active: contextvars.ContextVar[_Trace | None] = contextvars.ContextVar("jit_ahead_launch_trace", default=None)
# inside an autotuned launch: its tuning-key names and a token of that one launch
_autotuned: contextvars.ContextVar[tuple[tuple[str, ...], object]] = contextvars.ContextVar(
    "jit_ahead_autotuned", default=((), None))
_original_jit_run = JITFunction.run
_autotuner_run_below = None


def _traced_jit_run(self, *args, **kwargs):
    trace = _active.get()
    if trace is None:
        return _original_jit_run(self, *args, **kwargs)
    # noted, not run: a traced call only tells what it passes (the capture around it would neither
    # compile nor launch it either)
    options = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
    trace.add(self, args, options, sys._getframe(1))
    return None


def _traced_autotuner_run(self, *args, **kwargs):
    token = _autotuned.set((tuple(self.keys), object())) if _active.get() is not None else None
    try:
        return _autotuner_run_below(self, *args, **kwargs)
    finally:
        if token is not None:
            _autotuned.reset(token)


def _apply() -> None:
    global _autotuner_run_below
    if JITFunction.run is not _traced_jit_run:
        JITFunction.run = _traced_jit_run
    if Autotuner.run is not _traced_autotuner_run:
        _autotuner_run_below = Autotuner.run  # the capture's own pass, installed by the capture around us
        Autotuner.run = _traced_autotuner_run


def _restore() -> None:
    global _autotuner_run_below
    if JITFunction.run is _traced_jit_run:
        JITFunction.run = _original_jit_run
    if Autotuner.run is _traced_autotuner_run:
        Autotuner.run = _autotuner_run_below
    _autotuner_run_below = None


# held by each trace; the last one out puts Triton back
_patch = SharedPatch(_apply, _restore)


@contextlib.contextmanager
def trace(root=None) -> Iterator[list[TracedLaunch]]:
    """Note every Triton launch made in this context (use inside a capture: nothing runs). Stacks stop at
    ``root`` (default: the frame that entered this context)."""
    from . import hook

    plan = hook.capturing.get()
    if plan is None:
        raise RuntimeError("launch_trace.trace() is used inside a capture")
    # the caller's frame by default (this one is the context manager's generator, then its __enter__)
    state = _Trace(root if root is not None else sys._getframe(2))
    _patch.hold()
    token = _active.set(state)
    skipping, plan.skip_autotune_repeats = plan.skip_autotune_repeats, False
    try:
        yield state.launches
    finally:
        plan.skip_autotune_repeats = skipping
        _active.reset(token)
        _patch.let_go()


def traced(call) -> list[TracedLaunch]:
    """The launches ``call()`` makes, noted in a capture of its own (nothing compiles or runs)."""
    from .plan import capture

    with capture():
        with trace() as launches:
            call()
    return launches
