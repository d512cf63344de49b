"""The Triton family: its pool, its hook and its executor side, wired together."""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from triton import knobs

from ..core import device_view
from ..core import knobs as core_knobs
from ..core.pool import FamilySpec, HelperPool
from ..core.priority import Priority
from ..core.stats import Stats
from ..core.table import Ticket
from . import hook
from .load import TritonExecutor
from .plan import Capture, capture
from .request import FAMILY, TritonCompileRequest
from .spec import on_disk

log = logging.getLogger("jit_ahead.triton")

SPEC = FamilySpec(name=FAMILY, builder="jit_ahead.triton.build", workers_knob="JIT_AHEAD_TRITON_WORKERS",
                  preload_knob="JIT_AHEAD_TRITON_PRELOAD")


class TritonFamily:
    name = FAMILY

    def __init__(self, stats: Stats, *, workers: int | None = None, wait_timeout: float | None = None,
                 preload: tuple[str, ...] | None = None) -> None:
        # Helpers must write where this process reads: Triton's group files hold absolute paths.
        self.cache_dir = os.path.abspath(knobs.cache.dir)
        self.pool = HelperPool(
            SPEC, workers=core_knobs.worker_count(SPEC.workers_knob) if workers is None else workers,
            stats=stats, env_overrides={"TRITON_CACHE_DIR": self.cache_dir}, device_view=device_view.current(),
            build_timeout=core_knobs.build_timeout_s())
        self.pool.preload(core_knobs.preload_modules(SPEC.preload_knob) if preload is None else preload)
        self.executor = TritonExecutor(self.pool, core_knobs.wait_timeout_s() if wait_timeout is None else wait_timeout,
                                       guard=core_knobs.guard_mode())
        self._on_miss = self.executor.on_miss  # one bound method, so it can be removed again
        self._previous_listener = None

    def start(self) -> None:
        self.pool.start()
        hook.install(self._on_miss)
        self._previous_listener = knobs.compilation.listener
        knobs.compilation.listener = self._on_compile
        log.info("triton: %d helpers, cache %s", self.pool.workers, self.cache_dir)

    def capture(self, target=None):
        return capture(target)

    def submit(self, requests: Iterable[TritonCompileRequest] | Capture,
               priority: Priority = Priority.BACKGROUND) -> list[Ticket]:
        """Queue what is not on disk yet; helpers preload the kernels' modules before building."""
        if isinstance(requests, Capture):
            requests = requests.requests
        requests = list(requests)
        self.executor.note_planned(requests)
        missing = [r for r in requests if not on_disk(r.predicted_hash, r.name)]
        self.pool.preload(sorted({r.module for r in missing}))
        return [self.pool.submit(r.build_request(), priority) for r in missing]

    def _on_compile(self, *, src, metadata, metadata_group, times, cache_hit, **kwargs) -> None:
        """Triton's compilation listener: every compile() of this process, a disk hit or a real compile."""
        previous = self._previous_listener
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit,
                     **kwargs)
        micros = [getattr(times, "ir_initialization", 0) or 0, getattr(times, "store_results", 0) or 0,
                  *(d for _, d in getattr(times, "lowering_stages", None) or ())]
        self.pool.stats.emit("compile", family=FAMILY, kernel=getattr(src, "name", "?"), key=metadata.get("hash"),
                             cache_hit=bool(cache_hit), seconds=sum(micros) / 1e6)

    def close(self, grace: float = 2.0) -> None:
        hook.clear_miss_handler(self._on_miss)
        if knobs.compilation.listener == self._on_compile:
            knobs.compilation.listener = self._previous_listener
        self.pool.close(grace)
