"""The executor side of the TileLang family: a TileLang compile in the server finds its entry on disk
(TileLang loads it, milliseconds) instead of lowering and running nvcc.

Not on disk: the core decides, as for Triton, between waiting for the helper that builds it (raised to
URGENT) and building it in place (the same build a helper runs, published for the other ranks); then
TileLang's own call loads it. A build that fails, or a wait that times out, leaves the compile to TileLang,
as without jit_ahead. A kernel TileLang holds in memory already is TileLang's: nothing to do here.
"""
from __future__ import annotations

import logging

from ..core.building.executor import ExecutorBase, JitAfterReadyError, refuse_fallback_if_strict
from .request import FAMILY

log = logging.getLogger("jit_ahead.tilelang.executor")

# TileLang's execution backends whose kernels its cache writes to disk and loads (torch's: no disk cache)
CACHED_BACKENDS = ("tvm_ffi", "cython", "nvrtc", "cutedsl")


class TileLangExecutor(ExecutorBase):
    """Handles the server's TileLang compiles for one pool."""

    family, dsl = FAMILY, "TileLang"

    def on_miss(self, cache, describe, in_place):
        """The hook's handler. If handling the compile fails, TileLang compiles it in place (the hook logs
        why), unless ``refuse_fallback_if_strict`` refuses it."""
        from tilelang import env

        if not env.is_cache_enabled():  # nothing on disk to load (a helper's build would not be found)
            return in_place()
        try:
            request = describe()
        except Exception as exc:
            refuse_fallback_if_strict(self.guard, self.stats.phase, "a TileLang compile", exc)
            raise
        if request.execution_backend not in CACHED_BACKENDS or request.key in cache._memory_cache:
            return in_place()  # a backend TileLang keeps no disk cache for, or a kernel it holds in memory
        try:
            return self.serve_miss(request, built=request.is_built(cache), load=in_place, compile_here=in_place)
        except JitAfterReadyError:
            raise
        except Exception as exc:
            refuse_fallback_if_strict(self.guard, self.stats.phase, request.label, exc)
            raise
