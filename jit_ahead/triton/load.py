"""The executor side: what an in-memory miss does before Triton's own ``compile()`` runs.

On disk: nothing to do, Triton loads it. Otherwise the core decides: wait for the helper that builds it
(raised to URGENT), or build it in place on this thread, whichever is faster by measurement; a helper that
dies releases its claim and the launch builds in place at once. Either way Triton then loads the
finished entry from disk. Failures fall back to Triton's normal in-place compile.
"""
from __future__ import annotations

import logging
import time

from ..core.executor import Outcome, obtain
from ..core.pool import HelperPool
from ..core.requests import BuildRequest, BuildResult
from .build import compile_request
from .plan import request_from_hook
from .spec import on_disk

log = logging.getLogger("jit_ahead.triton.load")


def build_in_place(request: BuildRequest) -> BuildResult:
    t0 = time.perf_counter()
    try:
        compiled = compile_request(request.payload)
        return BuildResult(request.key, True, time.perf_counter() - t0, "executor", details={"hash": compiled.hash})
    except Exception as exc:
        return BuildResult(request.key, False, time.perf_counter() - t0, "executor", f"{type(exc).__name__}: {exc}")


class TritonExecutor:
    """Handles the executor's misses for one pool."""

    def __init__(self, pool: HelperPool, wait_timeout: float) -> None:
        self.pool = pool
        self.wait_timeout = wait_timeout

    def on_miss(self, *, fn, compile: dict) -> None:
        t0 = time.perf_counter()
        request = request_from_hook(fn, compile)
        stats = self.pool.stats
        if on_disk(request.predicted_hash, request.name):
            stats.emit("executor_miss", family="triton", key=request.predicted_hash, label=request.label,
                       outcome="disk", seconds=time.perf_counter() - t0)
            return
        outcome, waited = obtain(self.pool, request.build_request(), build_in_place, self.wait_timeout)
        stats.emit("executor_miss", family="triton", key=request.predicted_hash, label=request.label,
                   outcome=outcome.value, seconds=waited)
        if outcome is Outcome.FALLBACK:
            log.warning("%s: no build ahead (see above); Triton compiles it in place", request.label)
