"""The TileLang family: its pool, its hook on TileLang's kernel cache and its executor side, wired together.

Enabled with ``Session(families=("triton", "tilelang"))`` or ``JIT_AHEAD_FAMILIES=triton,tilelang``; needs
``pip install jit_ahead[tilelang]``. Helpers build into ``TILELANG_CACHE_DIR`` as this process resolves it
(TileLang's default, ``~/.tilelang/cache``, when unset). With ``JIT_AHEAD_RECORD_DIR`` it records each
compile the server makes and replays it at REPLAY on the next start.
"""
from __future__ import annotations

import logging

from ..core.family import Family
from ..core.building.pool import FamilySpec
from ..core.records import RecordFormat
from ..core.observing.stats import Stats
from ..registry import workers_knob
from . import build, hook
from .executor import TileLangExecutor
from .plan import capture
from .record import record_format
from .request import FAMILY

log = logging.getLogger("jit_ahead.tilelang")

SPEC = FamilySpec(name=FAMILY, builder="jit_ahead.tilelang.build", workers_knob=workers_knob(FAMILY),
                  preload_knob="JIT_AHEAD_TILELANG_PRELOAD")


class TileLangFamily(Family):
    """TileLang kernels: no autotune groups or tuning tasks. TileLang's autotuner compiles its candidates in
    threads of its own, outside any capture: they are not planned (the chosen kernel is, when a provider
    plans the call with its config)."""

    name, spec, executor_class, hook = FAMILY, SPEC, TileLangExecutor, hook

    def __init__(self, stats: Stats, *, preload: tuple[str, ...] | None = None, **options) -> None:
        from tilelang import env  # the DSL (jit_ahead[tilelang]); without it the family is not available

        self.cache_dir = str(env.TILELANG_CACHE_DIR)  # helpers publish where this process loads from
        super().__init__(stats, preload=("tilelang", *(preload or ())), env_overrides={build.CACHE_KNOB: self.cache_dir},
                         **options)

    def start(self) -> None:
        super().start()
        log.info("tilelang: %d helpers, cache %s", self.pool.workers, self.cache_dir)

    def _remove_hooks(self) -> None:
        super()._remove_hooks()
        self.executor.recorder = None

    def enter_planner(self) -> None:
        """In a planner forked from the server: compiles outside captures are not the server's executor's
        (its pool has no threads here); TileLang compiles them as it would alone."""
        hook.forget_handler()

    def capture(self, target=None):
        return capture(target)

    def record_format(self) -> RecordFormat:
        return record_format()
