"""The CuTe DSL family: its pool, its hook on ``cute.compile`` and its executor side, wired together.

Enabled with ``Session(families=("triton", "cute"))`` or ``JIT_AHEAD_FAMILIES=triton,cute``; needs
``pip install jit_ahead[cute-dsl]``. Records and replay are not implemented for this family yet.
"""
from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable

from ..core import device_view
from ..core import knobs as core_knobs
from ..core.pool import FamilySpec, HelperPool
from ..core.priority import Priority
from ..core.stats import Stats
from ..core.table import Ticket
from . import hook
from .build import CACHE_KNOB, cache_root, object_path
from .library_cache import LibraryCacheRequest
from .load import CuteExecutor
from .plan import Capture, arch_of, capture
from .request import FAMILY, CuteCompileRequest

log = logging.getLogger("jit_ahead.cute")

SPEC = FamilySpec(name=FAMILY, builder="jit_ahead.cute.build", workers_knob="JIT_AHEAD_CUTE_WORKERS",
                  preload_knob="JIT_AHEAD_CUTE_PRELOAD")


class CuteFamily:
    name = FAMILY

    def __init__(self, stats: Stats, *, workers: int | None = None, wait_timeout: float | None = None,
                 preload: tuple[str, ...] | None = None) -> None:
        importlib.import_module("cutlass")  # the DSL (jit_ahead[cute-dsl]); without it the family is not available
        self.device_view = device_view.current()
        self.arch = arch_of(self.device_view)
        self.cache_dir = str(cache_root())  # helpers publish where this process loads from
        self.pool = HelperPool(
            SPEC, workers=core_knobs.worker_count(SPEC.workers_knob) if workers is None else workers,
            stats=stats, env_overrides={CACHE_KNOB: self.cache_dir},
            device_view=self.device_view, build_timeout=core_knobs.build_timeout_s(),
            start_mode=core_knobs.helper_start_mode(), serving_workers=core_knobs.serving_worker_count())
        self.pool.preload(core_knobs.preload_modules(SPEC.preload_knob) if preload is None else preload)
        self.executor = CuteExecutor(self.pool, self.arch,
                                     core_knobs.wait_timeout_s() if wait_timeout is None else wait_timeout,
                                     guard=core_knobs.guard_mode())
        self._handler = self.executor.on_compile  # one bound method, so it can be removed again

    def start(self) -> None:
        self.pool.start()
        hook.install(self._handler)
        log.info("cute: %d helpers, arch %s, cache %s", self.pool.workers, self.arch, self.cache_dir)

    def capture(self, target=None):
        return capture(target or self.arch)

    def submit(self, requests: Iterable[CuteCompileRequest | LibraryCacheRequest] | Capture,
               priority: Priority = Priority.BACKGROUND, source: str = "plan") -> list[Ticket]:
        """Queue what is not built yet; helpers preload the kernels' modules before building."""
        if isinstance(requests, Capture):
            requests = requests.requests
        requests = list(requests)
        self.executor.note_planned(requests, source)
        missing = [r for r in requests if not is_built(r)]
        self.pool.preload(sorted({r.module for r in missing}))
        return [self.pool.submit(r.build_request(), priority) for r in missing]

    def wait_replay(self, timeout: float | None = None) -> bool:
        return True  # nothing is replayed for this family yet

    def close(self, grace: float = 2.0) -> None:
        hook.clear_handler(self._handler)
        self.pool.close(grace)


def is_built(request: CuteCompileRequest | LibraryCacheRequest) -> bool:
    if isinstance(request, LibraryCacheRequest):
        return request.path.exists()
    return object_path(request, cache_root()).exists()
