"""The one place jit_ahead enters CuTe DSL: ``CompileCallable._compile``, which every ``cute.compile(...)``
and ``cute.compile[options](...)`` call goes through.

In a thread that is capturing (a ContextVar) a call becomes a build request and returns a
``PlannedCompile`` that compiles nothing and cannot run. Elsewhere the executor's handler decides: load
the helper-built object, wait for it, or build in place; any trouble there and the DSL compiles as it
would without jit_ahead. Calls jit_ahead cannot describe (a function defined in ``__main__``, a real
tensor argument...) compile in place, as before.
"""
from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable

from ..core.building.executor import JitAfterReadyError
from ..core.shared_patch import SharedPatch, swap_in, swap_out

log = logging.getLogger("jit_ahead.cute")

# The capture collector of the current thread/context; None outside planning.
capturing: contextvars.ContextVar = contextvars.ContextVar("jit_ahead_cute_capture", default=None)

# handler(compile_callable, func, args, kwargs, compile_in_place) -> the compiled callable
Handler = Callable[..., object]

_original = None  # CompileCallable._compile as the DSL defined it (kept once seen: a call in flight uses it)


def _patch_dsl() -> None:
    global _original
    from cutlass.base_dsl.compiler import CompileCallable

    _original = swap_in(CompileCallable, "_compile", _compile, _original)


def _unpatch_dsl() -> None:
    from cutlass.base_dsl.compiler import CompileCallable

    swap_out(CompileCallable, "_compile", _compile, _original)


_patch: SharedPatch[Handler] = SharedPatch(_patch_dsl, _unpatch_dsl)


class PlannedCompile:
    """What ``cute.compile`` returns inside a capture: the request, and no kernel."""

    def __init__(self, request) -> None:
        self.request = request

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.request.label} was only planned (jit_ahead capture): it cannot run")


def _compile(compile_callable, func, *args, **kwargs):
    collector = capturing.get()
    if collector is not None:
        return PlannedCompile(collector.record(compile_callable, func, args, kwargs))
    handler = _patch.handler
    if handler is None:
        return _original(compile_callable, func, *args, **kwargs)

    compiled = False

    def in_place():
        nonlocal compiled
        compiled = True
        return _original(compile_callable, func, *args, **kwargs)

    try:
        return handler(compile_callable, func, args, kwargs, in_place)
    except JitAfterReadyError:  # JIT_AHEAD_MODE=error: the engine asked for this call to fail
        raise
    except Exception:  # never break the caller: the DSL compiles it as it would without jit_ahead
        if compiled:  # it did, and failed: its error is the caller's, and a second try would fail alike
            raise
        log.exception("jit_ahead could not handle cute.compile(%s); compiling in place",
                      getattr(func, "__qualname__", func))
        return in_place()


def install(handler: Handler | None = None) -> None:
    """Hold the DSL patched: the family with its executor's handler, a capture without one. ``release``
    with the same argument lets go; the last to let go puts the DSL's own ``_compile`` back."""
    _patch.hold(handler)


def release(handler: Handler | None = None) -> None:
    _patch.let_go(handler)


def compile_unhooked(func, *args, **kwargs):
    """``cute.compile`` as the DSL defines it: what a build itself calls."""
    import cutlass.cute as cute

    if _original is None:  # never patched in this process
        return cute.compile(func, *args, **kwargs)
    return _original(cute.compile, func, *args, **kwargs)
