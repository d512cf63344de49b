"""The TileLang family: its pool, its hook on TileLang's kernel cache and its executor side, wired together.

Enabled with ``Session(families=("triton", "tilelang"))`` or ``JIT_AHEAD_FAMILIES=triton,tilelang``; needs
``pip install jit_ahead[tilelang]``. Helpers build into ``TILELANG_CACHE_DIR`` as this process resolves it
(TileLang's default, ``~/.tilelang/cache``, when unset). With ``JIT_AHEAD_RECORD_DIR`` it records each
compile the server makes and replays it at REPLAY on the next start.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

from ..core import events
from ..core import knobs as core_knobs
from ..core.family import Family
from ..core.pool import FamilySpec, HelperPool
from ..core.priority import Priority
from ..core.records import RecordFolder, record_folder
from ..core.stats import Stats
from ..core.table import RequestTable, Ticket
from ..registry import workers_knob
from . import build, hook
from .executor import TileLangExecutor
from .plan import Capture, capture
from .record import decode, encode, header, record_format
from .request import FAMILY, TileLangCompileRequest

log = logging.getLogger("jit_ahead.tilelang")

SPEC = FamilySpec(name=FAMILY, builder="jit_ahead.tilelang.build", workers_knob=workers_knob(FAMILY),
                  preload_knob="JIT_AHEAD_TILELANG_PRELOAD")


class TileLangFamily(Family):
    """TileLang kernels: no autotune groups or tuning tasks. TileLang's autotuner compiles its candidates in
    threads of its own, outside any capture: they are not planned (the chosen kernel is, when a provider
    plans the call with its config)."""

    name = FAMILY

    def __init__(self, stats: Stats, *, workers: int | None = None, wait_timeout: float | None = None,
                 preload: tuple[str, ...] | None = None) -> None:
        from tilelang import env  # the DSL (jit_ahead[tilelang]); without it the family is not available

        self.cache_dir = str(env.TILELANG_CACHE_DIR)  # helpers publish where this process loads from
        table = RequestTable()
        pool = HelperPool.from_knobs(SPEC, stats, table, workers=workers, device_view=None,
                                     env_overrides={build.CACHE_KNOB: self.cache_dir})
        pool.preload(("tilelang", *(preload or ())))
        super().__init__(stats, table, pool, TileLangExecutor(pool, table, stats,
                                                              core_knobs.wait_timeout_s(wait_timeout),
                                                              guard=core_knobs.guard_mode()))
        self._handler = self.executor.on_compile  # one bound method, so it can be removed again

    def start(self) -> None:
        super().start()
        log.info("tilelang: %d helpers, cache %s", self.pool.workers, self.cache_dir)

    def _start_recording(self) -> None:
        self.executor.recorder = self._record

    def _install_hooks(self) -> None:
        hook.install(self._handler)

    def _remove_hooks(self) -> None:
        hook.release(self._handler)
        self.executor.recorder = None

    def enter_planner(self) -> None:
        """In a planner forked from the server: compiles outside captures are not the server's executor's
        (its pool has no threads here); TileLang compiles them as it would alone."""
        hook.forget_handler()

    def capture(self, target=None):
        return capture(target)

    def submit(self, requests: Iterable[TileLangCompileRequest] | Capture, priority: Priority = Priority.BACKGROUND,
               source: str = "plan") -> list[Ticket]:
        if isinstance(requests, Capture):
            requests = requests.requests
        requests = list(requests)
        self.executor.note_planned(requests, source)
        return [self.pool.submit(r.build_request(), priority) for r in requests if not build.is_built(r)]

    # -- records and saved plans: the request as it is ----------------------------------------------------------
    def _record(self, request: TileLangCompileRequest) -> None:
        self._add_record("records", request)

    def _open_records(self) -> dict[str, RecordFolder | None]:
        folder = record_folder(record_format())
        items = folder.read() if folder is not None else []
        tickets = self.submit(items, Priority.REPLAY, source="record") if items else []
        self.stats.emit(events.Replay(family=FAMILY, variants=len(items), queued=len(tickets),
                                      folder=str(folder.folder) if folder else None))
        if items:
            log.info("tilelang: replaying %d recorded kernels (%d not built yet) from %s", len(items), len(tickets),
                     folder.folder)
        return {"records": folder}

    def plan_header(self) -> dict:
        return header()

    def plan_encode(self, request: TileLangCompileRequest) -> dict:
        return encode(request)

    def plan_decode(self, entry: dict) -> TileLangCompileRequest:
        return decode(entry)
