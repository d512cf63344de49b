"""The executor side of the CuTe DSL family: a ``cute.compile`` call in the server loads the helper-built
object (``cute.runtime.load_module``, milliseconds) instead of compiling.

On disk: load it. Otherwise the core decides, as for Triton: wait for the helper that builds it (raised to
URGENT) or build it in place (the same build a helper runs, published for the other ranks), then load.
A call that cannot be described as a request, or a build that fails, compiles in place as without
jit_ahead. Loaded callables are kept per key: a library calling ``cute.compile`` again for a variant
gets the same object.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from ..core.observing import events
from ..core.building.executor import ExecutorBase, JitAfterReadyError, refuse_fallback_if_strict
from ..core.building.pool import HelperPool
from ..core.observing.stats import Stats
from .build import object_path
from .call import request_from_call
from .request import FAMILY, CuteCompileRequest
from .arg_specs import UnsupportedCall

log = logging.getLogger("jit_ahead.cute.executor")


def load(request: CuteCompileRequest, root: Path | None = None):
    """The callable for ``request`` from its object, or FileNotFoundError if it is not built."""
    import cutlass.cute as cute

    path = object_path(request, root)
    if not path.exists():
        raise FileNotFoundError(f"no CuTe DSL object for {request.label} at {path}")
    if request.tvm_ffi:
        return cute.runtime.load_module(str(path), enable_tvm_ffi=True)[request.symbol]
    return getattr(cute.runtime.load_module(str(path)), request.symbol)


class CuteExecutor(ExecutorBase):
    """Handles the server's ``cute.compile`` calls for one pool."""

    family = FAMILY

    def __init__(self, pool: HelperPool, stats: Stats, arch: str, wait_timeout: float, guard: str = "warn") -> None:
        super().__init__(pool, stats, wait_timeout, guard)
        self.arch = arch
        self._loaded: dict[str, object] = {}
        self._unsupported_seen: set[str] = set()

    def on_miss(self, compile_callable, func, args, kwargs, in_place):
        """The hook's handler. If handling the call fails, the DSL compiles it in place (the hook logs
        why), unless ``refuse_fallback_if_strict`` refuses it."""
        compiled_in_place = []

        def dsl_compile():
            compiled_in_place.append(True)
            return in_place()

        try:
            return self._on_miss(compile_callable, func, args, kwargs, dsl_compile)
        except JitAfterReadyError:
            raise
        except Exception as exc:
            if not compiled_in_place:  # the DSL's own compile error is the caller's, as without jit_ahead
                refuse_fallback_if_strict(self.guard, self.stats.phase,
                                          str(getattr(func, "__qualname__", func)), exc)
            raise

    def _on_miss(self, compile_callable, func, args, kwargs, in_place):
        t0 = time.perf_counter()
        try:
            request = request_from_call(compile_callable, func, args, kwargs, self.arch)
        except UnsupportedCall as why:
            name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', type(func).__qualname__)}"
            self._unsupported(name, str(why), time.perf_counter() - t0)
            if self.guarding():
                self.report_unplanned(name, None, f"{name} cannot be built ahead ({why}) and needs a compile "
                                      "after serving started")
            return in_place()
        with self._lock:
            loaded = self._loaded.get(request.key)
        if loaded is not None:
            return loaded
        return self.serve_miss(request, built=request.is_built(), load=lambda: self._load(request),
                               compile_here=in_place, t0=t0)

    def _load(self, request: CuteCompileRequest):
        """Loaded once per key: a library calling ``cute.compile`` again for a variant gets the same object."""
        compiled = load(request)
        with self._lock:
            return self._loaded.setdefault(request.key, compiled)

    def _unsupported(self, name: str, why: str, seconds: float) -> None:
        self.stats.emit(events.ExecutorMiss(family=FAMILY, key=None, label=name, kernel=name,
                                            outcome="unsupported", planned=False, seconds=seconds, reason=why))
        with self._lock:
            first = name not in self._unsupported_seen
            self._unsupported_seen.add(name)
        if first:  # once per function: a library may compile it for every shape
            log.warning("cute.compile(%s) is compiled in place, not by jit_ahead: %s", name, why)
