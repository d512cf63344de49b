"""The CuTe DSL family: its pool, its hook on ``cute.compile`` and its executor side, wired together.

Enabled with ``Session(families=("triton", "cute"))`` or ``JIT_AHEAD_FAMILIES=triton,cute``; needs
``pip install jit_ahead[cute-dsl]``. With ``JIT_AHEAD_RECORD_DIR`` it records the ``cute.compile`` calls the
executor sees and the calls of gated library compile functions (quack's), and replays them at REPLAY on
the next start.
"""
from __future__ import annotations

import importlib
import logging
import sys

from ..core import device_view
from ..core.family import Family
from ..core.building.pool import FamilySpec
from ..core.observing.stats import Stats
from ..core.records import RecordFormat
from ..registry import workers_knob
from . import hook, library_cache
from .arch import arch_of
from .build import CACHE_KNOB, cache_root
from .library_cache import LibraryCacheRequest
from .executor import CuteExecutor
from .plan import capture
from .record import LibraryCall, recordable, record_format
from .record import encode as encode_record
from .request import FAMILY

log = logging.getLogger("jit_ahead.cute")

SPEC = FamilySpec(name=FAMILY, builder="jit_ahead.cute.build", workers_knob=workers_knob(FAMILY),
                  preload_knob="JIT_AHEAD_CUTE_PRELOAD")


class CuteFamily(Family):
    """CuTe DSL kernels have no autotuner: no autotune groups, tuning tasks or tune-ahead (the base
    class's defaults), and a planner needs nothing of its own (the arch is this family's, the device view
    pinned by the planner)."""

    name, spec, executor_class, hook = FAMILY, SPEC, CuteExecutor, hook

    def __init__(self, stats: Stats, **options) -> None:
        importlib.import_module("cutlass")  # the DSL (jit_ahead[cute-dsl]); without it the family is not available
        self.device_view = device_view.current()
        self.arch = arch_of(self.device_view)
        self.cache_dir = str(cache_root())  # helpers publish where this process loads from
        super().__init__(stats, device_view=self.device_view, env_overrides={CACHE_KNOB: self.cache_dir}, **options)

    def _new_executor(self, wait_timeout: float, guard: str) -> CuteExecutor:
        return CuteExecutor(self.pool, self.stats, self.arch, wait_timeout, guard=guard)

    def start(self) -> None:
        super().start()
        log.info("cute: %d helpers, arch %s, cache %s", self.pool.workers, self.arch, self.cache_dir)

    def _start_recording(self) -> None:
        super()._start_recording()
        if "quack" in sys.modules:  # calls of its compile functions are recorded once they are gated
            library_cache.gate_package("quack")
        library_cache.set_recorder(self._record_library_call)

    def _remove_hooks(self) -> None:
        super()._remove_hooks()
        if self._replay_thread is not None:
            library_cache.set_recorder(None)
        library_cache.ungate_all()  # gated for recording, or by a provider for planning

    def capture(self, target=None):
        return capture(target or self.arch)

    # -- records and saved plans (core/planning/plan_cache.py) -------------------------------------------------------------
    def record_format(self) -> RecordFormat:
        return record_format(self.arch)

    def plan_encode(self, request) -> dict:
        """A library call is saved as its call (keyed again by the library when read), as records do."""
        if isinstance(request, LibraryCacheRequest):
            return encode_record(LibraryCall(request.module, request.qualname, request.args, request.kwargs))
        return encode_record(request)

    def _replayable(self, item):
        """A recorded library call becomes a request keyed by the library as it is now (importing its
        module here); one that cannot is skipped with one line."""
        if not isinstance(item, LibraryCall):
            return item
        try:
            wrapper = library_cache.resolve_original(item.module, item.qualname)
            return library_cache.request_for(item.module, wrapper, item.args, dict(item.kwargs), self.arch)
        except Exception as exc:
            log.warning("cute: recorded call %s.%s cannot be replayed (%s: %s); skipped", item.module,
                        item.qualname, type(exc).__name__, exc)
            return None

    def _record_library_call(self, module: str, qualname: str, args: tuple, kwargs: tuple) -> None:
        call = LibraryCall(module, qualname, args, kwargs)
        if recordable(call):
            self._add_record("records", call)
